'use strict';
// workers: the async chains (bench/lib/chains.js) in several worker_threads
// at once, each worker with its own enabled context manager (and, for ours,
// its own record slot). All workers warm up, then start together on a
// signal. Prints process CPU time per chain (every thread counted) and the
// wall-clock time per chain of the whole group.
//
// params: { manager, workers, chains (per worker and batch), concurrency, batches }

const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads');
const { params, report, installManager, since, cpuNs, median } = require('../lib/common');

if (isMainThread) {
  const p = params();
  const { workers = 4, chains = 10000, batches = 3 } = p;
  main(workers, chains, batches, p).catch((err) => {
    console.error(err);
    process.exit(1);
  });
} else {
  worker(workerData);
}

async function main(count, chains, batches, p) {
  const pool = [];
  for (let i = 0; i < count; i++) pool.push(new Worker(__filename, { workerData: { ...p, index: i } }));
  const next = (w) => new Promise((resolve, reject) => {
    w.once('message', resolve);
    w.once('error', reject);
  });
  await Promise.all(pool.map(next)); // warmed up
  const cpu = [];
  const wall = [];
  for (let b = 0; b < batches; b++) {
    const done = pool.map(next);
    const cpu0 = cpuNs();
    const start = process.hrtime.bigint();
    for (const w of pool) w.postMessage('go');
    await Promise.all(done);
    wall.push(since(start) / (count * chains));
    cpu.push((cpuNs() - cpu0) / (count * chains));
  }
  for (const w of pool) w.postMessage('exit');
  await Promise.all(pool.map((w) => new Promise((resolve) => w.once('exit', resolve))));
  report({ cpuNsPerChain: median(cpu), wallNsPerChain: median(wall), cpu, wall });
}

async function worker({ manager, chains = 10000, concurrency = 100, index }) {
  installManager(manager);
  const { runChains } = require('../lib/chains');
  let first = 0;
  await runChains(chains, concurrency, first, index);
  first += chains;
  parentPort.postMessage('ready');
  parentPort.on('message', async (msg) => {
    if (msg === 'exit') {
      parentPort.close();
      return;
    }
    await runChains(chains, concurrency, first, index);
    first += chains;
    parentPort.postMessage('done');
  });
}
