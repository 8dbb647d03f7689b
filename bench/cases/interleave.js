'use strict';
// interleave: the per-transition cost where requests interleave, each with
// its own real SDK span (bench/lib/interleave.js):
// - `with()` cycling 16 distinct spans: ns per call (every entry a full
//   record write);
// - 16 loops of bare `await null`, interleaving: ns per continuation;
// - the same with a setImmediate hop every 8th await: ns per continuation.
// The variants take turns in this one process (bench/lib/turns.js), each
// with its own copy of the API, its manager and the workload. Time is the
// process's CPU time (the turns never idle, so it is their busy time, and
// time other processes take on a shared core does not count).
//
// params: { variants, withCalls (per turn), awaits (per loop and turn), cycles }
// Prints { [variant]: { manager, withNs, awaitNs, hopNs, withTurns, awaitTurns, hopTurns } }:
// its manager's class, the median turn's ns per operation, and every
// cycle's turn.

const path = require('node:path');
const { params, report } = require('../lib/common');
const { isolatedVariant, takeTurns, turnsResult } = require('../lib/turns');

const { variants: kinds = ['stock', 'floor', 'store', 'write', 'ours'], withCalls = 250000, awaits = 4000, cycles = 40 } = params();

const WORKLOAD = path.join(__dirname, '..', 'lib', 'interleave.js');
const variants = kinds.map((kind) => isolatedVariant(kind, () => require(WORKLOAD)));

function withTurn(variant, calls) {
  if (variant.workload.withCycle(calls) !== calls) throw new Error('unexpected result');
}

async function main() {
  const { LOOPS } = variants[0].workload;
  const loopAwaits = (continuations) => Math.max(1, Math.round(continuations / LOOPS));
  const continuations = awaits * LOOPS;
  const phases = {
    with: await takeTurns(variants, withTurn, { size: withCalls, cycles }),
    await: await takeTurns(variants, (v, n) => v.workload.awaitLoops(loopAwaits(n)), { size: continuations, cycles }),
    hop: await takeTurns(variants, (v, n) => v.workload.awaitLoops(loopAwaits(n), 8), { size: continuations, cycles }),
  };
  report(turnsResult(variants, phases));
}

main();
