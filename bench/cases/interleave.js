'use strict';
// interleave: the per-transition cost where requests interleave, each with
// its own real SDK span (bench/lib/interleave.js):
// - `with()` cycling 16 distinct spans: ns per call (every entry a full
//   record write);
// - 16 loops of bare `await null`, interleaving: ns per continuation;
// - the same with a setImmediate hop every 8th await: ns per continuation.
// The await phases never idle, so wall time is busy time. Prints the
// fastest batch of each: on a shared machine other processes only ever add
// time, so the minimum is the figure least disturbed by them.
//
// params: { manager, withCalls, awaits (per loop and batch), batches }

const { params, report, installManager, since } = require('../lib/common');

const { manager, withCalls = 2e6, awaits = 20000, batches = 7 } = params();
installManager(manager);
const { LOOPS, withCycle, awaitLoops } = require('../lib/interleave');

async function measureAsync(body) {
  await body();
  await body();
  const per = [];
  for (let b = 0; b < batches; b++) {
    const start = process.hrtime.bigint();
    await body();
    per.push(since(start) / (LOOPS * awaits));
  }
  return Math.min(...per);
}

function measureWith() {
  let check = withCycle(Math.max(1000, withCalls >> 2)) + withCycle(Math.max(1000, withCalls >> 2));
  const per = [];
  for (let b = 0; b < batches; b++) {
    const start = process.hrtime.bigint();
    check += withCycle(withCalls);
    per.push(since(start) / withCalls);
  }
  if (check <= 0) throw new Error('unexpected result');
  return Math.min(...per);
}

async function main() {
  const withNs = measureWith();
  const awaitNs = await measureAsync(() => awaitLoops(awaits));
  const hopNs = await measureAsync(() => awaitLoops(awaits, 8));
  report({ withNs, awaitNs, hopNs });
}

main();
