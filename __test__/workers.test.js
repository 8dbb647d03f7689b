'use strict';
// Worker lifecycles: every worker gets its own record, exited workers leave
// nothing valid behind, and slots are recycled without leaks.
const test = require('node:test');
const assert = require('node:assert');
const { Worker } = require('node:worker_threads');
const { once } = require('node:events');
const { registryStats, threadInfo } = require('..');
const { readRecord, readThreadRecord, readRunningThreadRecord } = require('./helpers');

/**
 * After a thread exits, record mode leaves its record invalid (records are
 * never unmapped); in frame mode the thread's TLS block is gone with the
 * thread (its gate was closed at teardown), so there is nothing to read.
 */
function assertNothingLeft(info, message) {
  if (info.mode !== 'frame') assert.strictEqual(readRecord('self', info.recordAddress).valid, 0, message);
}

const WORKER = `
  const { parentPort, workerData } = require('node:worker_threads');
  const { context, trace } = require('@opentelemetry/api');
  const { ProfilingContextManager, threadInfo } = require(workerData.root);
  context.setGlobalContextManager(new ProfilingContextManager().enable());
  const sc = { traceId: workerData.traceId, spanId: workerData.spanId, traceFlags: 1 };
  context.with(trace.setSpanContext(context.active(), sc), () => {
    const info = threadInfo();
    parentPort.postMessage({ tid: info.tid, slot: info.slot, recordAddress: info.recordAddress, tlsAddress: info.tlsAddress, mode: info.mode, frame: info.frame });
    // Parked inside the span until the test has read the record, then
    // exits from inside it: only teardown can invalidate the record.
    Atomics.wait(workerData.release, 0, 0, 30000);
    process.exit(0);
  });
`;

function hex(n, width) {
  return n.toString(16).padStart(width, '0');
}

/** Starts a worker parked inside its span; `release()` lets it exit. */
async function runWorker(i) {
  const traceId = hex(0xfeed0000 + i, 32);
  const spanId = hex(0xbeef0000 + i, 16);
  const release = new Int32Array(new SharedArrayBuffer(4));
  const worker = new Worker(WORKER, { eval: true, workerData: { root: require.resolve('..'), traceId, spanId, release } });
  const [info] = await once(worker, 'message');
  const letGo = () => {
    Atomics.store(release, 0, 1);
    Atomics.notify(release, 0);
  };
  return { worker, info, traceId, spanId, release: letGo };
}

test('200 workers started and exited one after another leak no slot', async () => {
  const mainSlot = threadInfo().slot;
  const seenSlots = new Set();
  for (let i = 0; i < 200; i++) {
    const { worker, info, traceId, spanId, release } = await runWorker(i);
    assert.notStrictEqual(info.slot, mainSlot);
    seenSlots.add(info.slot);
    const live = readThreadRecord(info);
    assert.deepStrictEqual([live.valid, live.traceId, live.spanId], [1, traceId, spanId], `worker ${i} while alive`);
    const exit = once(worker, 'exit');
    release();
    await exit;
    assertNothingLeft(info, `worker ${i}'s record still valid after exit`);
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
  const running = await Promise.all(Array.from({ length: 16 }, (_, i) => runWorker(1000 + i)));
  try {
    assert.strictEqual(new Set(running.map((r) => r.info.slot)).size, 16, 'distinct slots');
    assert.strictEqual(new Set(running.map((r) => r.info.tid)).size, 16, 'distinct threads');
    for (const { info, traceId, spanId } of running) {
      const r = readThreadRecord(info);
      assert.deepStrictEqual([r.valid, r.traceId, r.spanId], [1, traceId, spanId]);
    }
    assert.strictEqual(registryStats().attached, 17);
  } finally {
    // terminate() while parked: teardown must invalidate a published span.
    await Promise.all(running.map(({ worker }) => worker.terminate()));
  }
  for (const { info } of running) assertNothingLeft(info, 'a terminated worker left a valid record');
});

/** Runs GCs until exited workers' views are released (V8 finalizes them lazily). */
async function settle() {
  for (let i = 0; i < 40 && (registryStats().awaitingViewRelease > 0 || registryStats().attached > 1); i++) {
    globalThis.gc?.();
    await new Promise((r) => setTimeout(r, 25));
  }
}

const TERMINATED = `
  const { parentPort, workerData } = require('node:worker_threads');
  const { context, trace } = require('@opentelemetry/api');
  const { ProfilingContextManager, threadInfo } = require(workerData.root);
  context.setGlobalContextManager(new ProfilingContextManager().enable());
  const sc = { traceId: workerData.traceId, spanId: workerData.spanId, traceFlags: 1 };
  context.with(trace.setSpanContext(context.active(), sc), () => {
    const info = threadInfo();
    parentPort.postMessage({ recordAddress: info.recordAddress, tlsAddress: info.tlsAddress, mode: info.mode, frame: info.frame });
    if (workerData.mode === 'wait') Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
    else for (;;) Math.sqrt(Math.random());
  });
`;

test('terminate() at any moment: busy in a span, in Atomics.wait in a span, while requiring the package', async () => {
  const { Worker: W } = require('node:worker_threads');
  const addresses = [];
  for (let i = 0; i < 24; i++) {
    const mode = ['busy', 'wait', 'require'][i % 3];
    const worker = new W(mode === 'require' ? `require(${JSON.stringify(require.resolve('..'))})` : TERMINATED, {
      eval: true,
      workerData: { root: require.resolve('..'), traceId: hex(0xdead0000 + i, 32), spanId: hex(0xf00d0000 + i, 16), mode },
    });
    if (mode === 'require') {
      // Anywhere from before the script starts to after the addon loaded.
      await new Promise((r) => setTimeout(r, (i * 3) % 20));
    } else {
      const [info] = await once(worker, 'message');
      addresses.push(info);
      const r = mode === 'busy' ? readRunningThreadRecord(info) : readThreadRecord(info);
      assert.strictEqual(r.valid, 1, `${mode} worker ${i} publishes its span`);
    }
    await worker.terminate();
  }
  for (const info of addresses) assertNothingLeft(info, 'no stale valid record');
  await settle();
  const stats = registryStats();
  assert.deepStrictEqual([stats.attached, stats.awaitingViewRelease, stats.free], [1, 0, stats.capacity - 1], 'no leaked slot');
  // A worker on a recycled slot starts with an invalid record.
  const fresh = new W(`
    const { parentPort } = require('node:worker_threads');
    const { threadInfo } = require(${JSON.stringify(require.resolve('..'))});
    parentPort.postMessage({ recordAddress: threadInfo().recordAddress });
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
  `, { eval: true });
  const [{ recordAddress }] = await once(fresh, 'message');
  assert.strictEqual(readRecord('self', recordAddress).valid, 0, 'a recycled slot holds no span');
  await fresh.terminate();
});

const EXIT_WITH_WORKERS = `
  const { Worker } = require('node:worker_threads');
  const withPackage = process.argv[1] === 'with';
  if (withPackage) require('.');
  const body = withPackage ? ${JSON.stringify(TERMINATED)} : 'const w = require("node:worker_threads"); w.parentPort.postMessage({}); if (w.workerData.mode === "wait") Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); else for (;;) Math.sqrt(Math.random());';
  let ready = 0;
  for (let i = 0; i < 64; i++) {
    const mode = i % 8 ? 'wait' : 'busy';
    const worker = new Worker(body, { eval: true, workerData: {
      root: require.resolve('.'), traceId: (i + 1).toString(16).padStart(32, '0'), spanId: (i + 1).toString(16).padStart(16, '0'), mode,
    } });
    worker.once('message', () => { if (++ready === 64) process.exit(7); });
  }
`;

test('process.exit() with 64 workers alive inside spans: the exit code is the one without the package', async () => {
  const { spawnSync } = require('node:child_process');
  const root = require('node:path').resolve(__dirname, '..');
  const run = (mode) => spawnSync(process.execPath, ['-e', EXIT_WITH_WORKERS, mode], { cwd: root, timeout: 60000 });
  const control = run('without');
  const withPackage = run('with');
  assert.deepStrictEqual([control.status, control.signal], [7, null], `control: ${control.stderr}`);
  assert.deepStrictEqual([withPackage.status, withPackage.signal], [control.status, control.signal], `${withPackage.stderr}`);
  assert.strictEqual(withPackage.stderr.toString(), '', 'nothing printed');
});
