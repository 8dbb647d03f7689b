#!/usr/bin/env node
'use strict';
// Worker churn: creates and ends many workers, each publishing a span, and
// checks from this thread (through /proc/self/mem, as an outside reader
// would) that every live worker's record carries its span and every ended
// one's is invalid; then that no registry slot leaked. `--control` runs the
// same churn without the package, for the RSS comparison. Too slow for
// `npm test`; run by hand:
//
//   node --expose-gc scripts/worker-churn.js [--workers N] [--concurrency K] [--control]

const { Worker } = require('node:worker_threads');
const { once } = require('node:events');
const path = require('node:path');

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : fallback;
};
const WORKERS = option('--workers', 10000);
const CONCURRENCY = option('--concurrency', 8);
const CONTROL = args.includes('--control');
const ROOT = path.resolve(__dirname, '..');

const BODY = `
  const { parentPort, workerData } = require('node:worker_threads');
  const release = new Int32Array(workerData.release);
  if (workerData.control) {
    parentPort.postMessage({});
    Atomics.wait(release, 0, 0);
  } else {
    const { context, trace } = require('@opentelemetry/api');
    const { ProfilingContextManager, threadInfo } = require(workerData.root);
    context.setGlobalContextManager(new ProfilingContextManager().enable());
    const sc = { traceId: workerData.traceId, spanId: workerData.spanId, traceFlags: 1 };
    context.with(trace.setSpanContext(context.active(), sc), () => {
      parentPort.postMessage({ recordAddress: threadInfo().recordAddress });
      Atomics.wait(release, 0, 0);
      process.exit(0); // from inside the span
    });
  }
`;

const pkg = CONTROL ? null : require(ROOT);
const { readRecord } = CONTROL ? {} : require(path.join(ROOT, '__test__', 'helpers'));
const hex = (n, width) => n.toString(16).padStart(width, '0');
// staleValid: an ended worker's record still valid with its span.
// reusedBeforeRead: its slot already taken by a new worker publishing its own.
const counts = { started: 0, terminated: 0, exited: 0, liveMismatch: 0, staleValid: 0, reusedBeforeRead: 0, errors: 0 };

async function one(i) {
  const release = new SharedArrayBuffer(4);
  const traceId = hex(0x10000000 + i, 32);
  const spanId = hex(0x20000000 + i, 16);
  const worker = new Worker(BODY, { eval: true, workerData: { root: ROOT, control: CONTROL, release, traceId, spanId } });
  worker.on('error', () => counts.errors++);
  const [message] = await once(worker, 'message');
  counts.started++;
  if (!CONTROL) {
    const r = readRecord('self', message.recordAddress);
    if (r.valid !== 1 || r.traceId !== traceId || r.spanId !== spanId) counts.liveMismatch++;
  }
  if (i % 2) {
    await worker.terminate();
    counts.terminated++;
  } else {
    const exit = once(worker, 'exit');
    Atomics.store(new Int32Array(release), 0, 1);
    Atomics.notify(new Int32Array(release), 0);
    await exit;
    counts.exited++;
  }
  if (!CONTROL) {
    const r = readRecord('self', message.recordAddress);
    if (r.valid === 1 && r.traceId === traceId && r.spanId === spanId) counts.staleValid++;
    else if (r.valid !== 0) counts.reusedBeforeRead++;
  }
}

async function main() {
  const started = Date.now();
  let next = 0;
  let rssAfterWarmup = null;
  const lane = async () => {
    while (next < WORKERS) {
      const i = next++;
      await one(i);
      if (i === Math.min(500, WORKERS - 1)) {
        globalThis.gc?.();
        rssAfterWarmup = process.memoryUsage().rss;
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, lane));
  for (let i = 0; i < 40 && pkg?.registryStats().awaitingViewRelease > 0; i++) {
    globalThis.gc?.();
    await new Promise((r) => setTimeout(r, 25));
  }
  globalThis.gc?.();
  const rssEnd = process.memoryUsage().rss;
  const stats = pkg ? pkg.registryStats() : null;
  const leaked = stats ? stats.capacity - stats.free - stats.attached : null;
  console.log(
    JSON.stringify({
      node: process.version,
      control: CONTROL,
      workers: WORKERS,
      concurrency: CONCURRENCY,
      seconds: (Date.now() - started) / 1000,
      ...counts,
      registry: stats,
      leakedSlots: leaked,
      rssAfterWarmupMiB: +(rssAfterWarmup / 2 ** 20).toFixed(1),
      rssEndMiB: +(rssEnd / 2 ** 20).toFixed(1),
      rssGrowthMiB: +((rssEnd - rssAfterWarmup) / 2 ** 20).toFixed(1),
    }),
  );
  const ok = CONTROL || (counts.liveMismatch === 0 && counts.staleValid === 0 && counts.errors === 0 && leaked === 0 && stats.attached === 1);
  process.exitCode = ok ? 0 : 1;
}

main();
