'use strict';
// sync: `context.with(ctxWithSpan, fn)` with a trivial fn, flat and nested
// three deep (three different spans; bench/lib/nested-with.js). The
// variants take turns in this one process (bench/lib/turns.js), each with
// its own copy of the API, its manager and the workload; time is process
// CPU time, as in the interleave case.
//
// params: { variants, iterations (per turn), cycles }
// Prints { [variant]: { manager, flatNs, nestedNs, flatTurns, nestedTurns } }: the
// manager's class, the median turn's ns per outer call, and every
// cycle's turn.

const path = require('node:path');
const { params, report } = require('../lib/common');
const { isolatedVariant, takeTurns, turnsResult } = require('../lib/turns');

const { variants: kinds = ['stock', 'ours'], iterations = 250000, cycles = 40 } = params();

const WORKLOAD = path.join(__dirname, '..', 'lib', 'nested-with.js');
const variants = kinds.map((kind) => isolatedVariant(kind, () => require(WORKLOAD)));

function turnOf(body) {
  return (variant, n) => {
    if (variant.workload[body](n) !== n) throw new Error('unexpected result');
  };
}

async function main() {
  const flat = await takeTurns(variants, turnOf('flat'), { size: iterations, cycles });
  const nested = await takeTurns(variants, turnOf('nested'), { size: Math.max(1, Math.round(iterations / 3)), cycles });
  report(turnsResult(variants, { flat, nested }));
}

main();
