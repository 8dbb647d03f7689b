'use strict';
// interleave: the per-transition cost where requests interleave, each with
// its own real SDK span (bench/lib/interleave.js):
// - `with()` cycling 16 distinct spans: ns per call (every entry a full
//   record write);
// - 16 loops of bare `await null`, interleaving: ns per continuation;
// - the same with a setImmediate hop every 8th await: ns per continuation.
// Time is the process's CPU time (the phases never idle, so it is their busy
// time, and time other processes take on a shared core does not count),
// and each figure is the fastest of the batches: interference only ever
// adds time, so the minimum is the figure least disturbed by it.
//
// params: { manager, withCalls, awaits (per loop and batch), batches }

const { params, report, installManager, cpuNs } = require('../lib/common');

const { manager, withCalls = 2e6, awaits = 20000, batches = 7 } = params();
installManager(manager);
const { LOOPS, withCycle, awaitLoops } = require('../lib/interleave');

async function measureAsync(body) {
  await body();
  await body();
  const per = [];
  for (let b = 0; b < batches; b++) {
    const start = cpuNs();
    await body();
    per.push((cpuNs() - start) / (LOOPS * awaits));
  }
  return Math.min(...per);
}

function measureWith() {
  let check = withCycle(Math.max(1000, withCalls >> 2)) + withCycle(Math.max(1000, withCalls >> 2));
  const per = [];
  for (let b = 0; b < batches; b++) {
    const start = cpuNs();
    check += withCycle(withCalls);
    per.push((cpuNs() - start) / withCalls);
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
