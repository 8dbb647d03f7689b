'use strict';
// request-spans: request-shaped units of spans (bench/lib/request-spans.js)
// under one manager, each unit followed by an event-loop turn; with `cold`,
// each unit runs right after the eviction step. Warms up unmeasured, then
// times each unit alone.
//
// params: { manager (a kind: bench/lib/common.js), units, cold, warmUps (units) }
// Prints { nsPerUnit (the median unit), meanNsPerUnit, mode }.

const { params, report, installManager } = require('../lib/common');

const { manager: kind, units = 3000, cold = false, warmUps = 20000 } = params();
const manager = installManager(kind);
const { unit, evict, sink } = require('../lib/request-spans');

const eventLoopTurn = () => new Promise((resolve) => setImmediate(resolve));

async function main() {
  for (let i = 0; i < warmUps; i++) {
    await unit();
    if (i % 16 === 0) await eventLoopTurn();
  }
  for (let i = 0; i < 100; i++) evict();
  const times = new Float64Array(units);
  for (let i = 0; i < units; i++) {
    if (cold) evict();
    const start = process.hrtime.bigint();
    await unit();
    times[i] = Number(process.hrtime.bigint() - start);
    await eventLoopTurn();
  }
  const mean = times.reduce((a, b) => a + b, 0) / units;
  times.sort();
  report({ nsPerUnit: times[units >> 1], meanNsPerUnit: mean, mode: manager?.mode ?? null, sink: sink() & 1 });
}

main();
