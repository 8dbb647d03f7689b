'use strict';
// Worker lifecycles: every worker gets its own record, exited workers leave
// nothing valid behind, and slots are recycled without leaks.
const test = require('node:test');
const assert = require('node:assert');
const { Worker } = require('node:worker_threads');
const { once } = require('node:events');
const { registryStats, threadInfo } = require('..');
const { readRecord } = require('./helpers');

const WORKER = `
  const { parentPort, workerData } = require('node:worker_threads');
  const { context, trace } = require('@opentelemetry/api');
  const { ProfilingContextManager, threadInfo } = require(workerData.root);
  context.setGlobalContextManager(new ProfilingContextManager().enable());
  const sc = { traceId: workerData.traceId, spanId: workerData.spanId, traceFlags: 1 };
  context.with(trace.setSpanContext(context.active(), sc), () => {
    const info = threadInfo();
    // Exit while the span is still published: teardown must invalidate it.
    parentPort.postMessage({ tid: info.tid, slot: info.slot, recordAddress: info.recordAddress });
    const wait = new Int32Array(new SharedArrayBuffer(4));
    Atomics.wait(wait, 0, 0, workerData.holdMs);
  });
`;

function hex(n, width) {
  return n.toString(16).padStart(width, '0');
}

async function runWorker(i, holdMs = 0) {
  const traceId = hex(0xfeed0000 + i, 32);
  const spanId = hex(0xbeef0000 + i, 16);
  const worker = new Worker(WORKER, { eval: true, workerData: { root: require.resolve('..'), traceId, spanId, holdMs } });
  const [info] = await once(worker, 'message');
  return { worker, info, traceId, spanId };
}

test('200 workers started and exited one after another leak no slot', async () => {
  const mainSlot = threadInfo().slot;
  const seenSlots = new Set();
  for (let i = 0; i < 200; i++) {
    const { worker, info, traceId, spanId } = await runWorker(i, 20);
    assert.notStrictEqual(info.slot, mainSlot);
    seenSlots.add(info.slot);
    const live = readRecord('self', info.recordAddress);
    assert.deepStrictEqual([live.valid, live.traceId, live.spanId], [1, traceId, spanId], `worker ${i} while alive`);
    await once(worker, 'exit');
    const after = readRecord('self', info.recordAddress);
    assert.strictEqual(after.valid, 0, `worker ${i}'s record still valid after exit`);
  }
  // V8 finalizes exited workers' record views at teardown; give stragglers a GC.
  for (let i = 0; i < 20 && registryStats().awaitingViewRelease > 0; i++) {
    globalThis.gc?.();
    await new Promise((r) => setTimeout(r, 25));
  }
  const stats = registryStats();
  assert.strictEqual(stats.attached, 1, 'only the main thread is registered');
  assert.strictEqual(stats.awaitingViewRelease, 0, 'every exited worker released its view');
  assert.strictEqual(stats.free, stats.capacity - 1, 'every other slot is free');
  assert.ok(seenSlots.size < 200, `slots were recycled (${seenSlots.size} distinct)`);
});

test('many workers at once each publish their own span', async () => {
  const running = await Promise.all(Array.from({ length: 16 }, (_, i) => runWorker(1000 + i, 5000)));
  try {
    assert.strictEqual(new Set(running.map((r) => r.info.slot)).size, 16, 'distinct slots');
    assert.strictEqual(new Set(running.map((r) => r.info.tid)).size, 16, 'distinct threads');
    for (const { info, traceId, spanId } of running) {
      const r = readRecord('self', info.recordAddress);
      assert.deepStrictEqual([r.valid, r.traceId, r.spanId], [1, traceId, spanId]);
    }
    assert.strictEqual(registryStats().attached, 17);
  } finally {
    await Promise.all(running.map(({ worker }) => worker.terminate()));
  }
  for (const { info } of running) assert.strictEqual(readRecord('self', info.recordAddress).valid, 0);
});
