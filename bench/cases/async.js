'use strict';
// async: many concurrent request-like chains (bench/lib/chains.js). Prints
// the median over batches of ns per chain of event-loop busy time (wall time
// minus the time the loop sat idle waiting for the setTimeout hops), plus
// wall-clock and process CPU time per chain.
//
// params: { manager, chains, concurrency, batches }

const { params, report, installManager, since, cpuNs, median } = require('../lib/common');

const { manager, chains = 20000, concurrency = 100, batches = 5 } = params();
installManager(manager);
const { runChains } = require('../lib/chains');
const { performance } = require('node:perf_hooks');

async function main() {
  // Warm-up: one untimed batch.
  let first = 0;
  await runChains(chains, concurrency, first);
  first += chains;
  const busy = [];
  const wall = [];
  const cpu = [];
  for (let b = 0; b < batches; b++) {
    const elu0 = performance.eventLoopUtilization();
    const cpu0 = cpuNs();
    const start = process.hrtime.bigint();
    await runChains(chains, concurrency, first);
    wall.push(since(start) / chains);
    cpu.push((cpuNs() - cpu0) / chains);
    busy.push((performance.eventLoopUtilization(elu0).active * 1e6) / chains);
    first += chains;
  }
  report({ nsPerChain: median(busy), wallNsPerChain: median(wall), cpuNsPerChain: median(cpu), busy, wall, cpu });
}

main();
