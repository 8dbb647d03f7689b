'use strict';
// Frame mode (the Node.js schema nodejs_v1_dev): chosen where
// AsyncLocalStorage runs on AsyncContextFrame and the walk verifies, record
// mode otherwise; no hook of any kind runs; the walk from the thread's
// otel_thread_ctx_nodejs_v1 block ends at the active span's record across
// await; records are freed once nothing reaches them.
const test = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const { context, ROOT_CONTEXT } = require('@opentelemetry/api');
const { ProfilingContextManager, threadInfo, setSpanContext, clearSpanContext } = require('..');
const binding = require('../js/binding');
const { usesAsyncContextFrame } = require('../js/publish/frame');
const { ROOT, readOwnRecord, readRecord, readFromOutside, spanContextFor, spawnNode, exited, gcFunction, collectUntilSettled } = require('./helpers');

const FRAME = usesAsyncContextFrame();
/** The default this process runs with: OTEL_THREAD_CTX_MODE=record (a suite run in record mode) wins. */
const DEFAULT_MODE = process.env.OTEL_THREAD_CTX_MODE === 'record' || !FRAME ? 'record' : 'frame';
const frameOnly = { skip: !FRAME && 'AsyncLocalStorage does not run on AsyncContextFrame on this Node' };

/** Runs `source` in a child of this Node (cwd: the package) and returns its JSON output. */
function runChild(source, { env = {}, args = [] } = {}) {
  const r = spawnSync(process.execPath, [...args, '-e', source], { cwd: ROOT, env: { ...process.env, ...env }, encoding: 'utf8', timeout: 60000 });
  assert.strictEqual(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

test('the default mode is frame where AsyncLocalStorage runs on AsyncContextFrame, record elsewhere, with the reason', () => {
  const manager = new ProfilingContextManager();
  assert.strictEqual(manager.mode, DEFAULT_MODE);
  context.setGlobalContextManager(manager.enable());
  try {
    const info = threadInfo();
    assert.strictEqual(info.mode, manager.mode);
    if (DEFAULT_MODE === 'frame') {
      assert.strictEqual(info.frameUnavailableReason, null);
      assert.notStrictEqual(info.frame, null);
      assert.ok(info.frame.cpedSlot > 0n && info.frame.alsHandle > 0n);
    } else {
      assert.match(info.frameUnavailableReason, FRAME ? /record mode was chosen/ : /AsyncContextFrame/);
    }
  } finally {
    manager.disable();
    context.disable();
  }
  assert.strictEqual(threadInfo().mode, null);
  assert.strictEqual(threadInfo().frame ?? null, null, 'disable() closes the gate and clears the block');
});

test('the mode option and OTEL_THREAD_CTX_MODE choose; bad options throw', () => {
  assert.strictEqual(new ProfilingContextManager({ mode: 'record' }).mode, 'record');
  assert.strictEqual(new ProfilingContextManager({ mode: 'frame' }).mode, FRAME ? 'frame' : 'record');
  assert.throws(() => new ProfilingContextManager({ mode: 'fast' }), RangeError);
  assert.throws(() => new ProfilingContextManager({ mode: 1 }), TypeError);
  const source = `
    const { diag } = require('@opentelemetry/api');
    const warnings = [];
    diag.setLogger({ warn: (m) => warnings.push(m), error() {}, info() {}, debug() {}, verbose() {} });
    const { ProfilingContextManager } = require('.');
    console.log(JSON.stringify({ mode: new ProfilingContextManager().mode, option: new ProfilingContextManager({ mode: 'frame' }).mode, warnings }));`;
  const record = runChild(source, { env: { OTEL_THREAD_CTX_MODE: 'record' } });
  assert.deepStrictEqual([record.mode, record.option], ['record', FRAME ? 'frame' : 'record'], 'the option wins over the variable');
  const bad = runChild(source, { env: { OTEL_THREAD_CTX_MODE: 'turbo' } });
  assert.strictEqual(bad.mode, FRAME ? 'frame' : 'record');
  assert.ok(bad.warnings.some((w) => /OTEL_THREAD_CTX_MODE=turbo/.test(w)), JSON.stringify(bad.warnings));
});

test('a misspelt option or OTEL_THREAD_CTX_MODE is said once: on stderr without a diag logger, through diag with one', () => {
  const source = (withLogger) => `
    const { diag, context } = require('@opentelemetry/api');
    const warnings = [];
    if (${withLogger}) diag.setLogger({ warn: (m) => warnings.push(m), error() {}, info() {}, debug() {}, verbose() {} });
    const { ProfilingContextManager, ProcessContextSpanProcessor } = require('.');
    const managers = [0, 1].map(() => new ProfilingContextManager({ atributes: ['db.system'], spanName: false }));
    new ProcessContextSpanProcessor({ schemaVersion: 'x', resourse: {} });
    context.setGlobalContextManager(managers[0].enable());
    console.log(JSON.stringify({ warnings }));`;
  const run = (withLogger, env) => {
    const r = spawnSync(process.execPath, ['-e', source(withLogger)], { cwd: ROOT, env: { ...process.env, ...env }, encoding: 'utf8', timeout: 60000 });
    assert.strictEqual(r.status, 0, r.stderr);
    return { stderr: r.stderr, out: JSON.parse(r.stdout.trim().split('\n').pop()) };
  };
  const silent = run(false, { OTEL_THREAD_CTX_MODE: 'recrd' });
  const lines = silent.stderr.split('\n').filter((l) => l.includes('otel-thread-ctx:'));
  assert.strictEqual(lines.filter((l) => /unknown option "atributes" is ignored \(did you mean "attributes"\?\)/.test(l)).length, 1, silent.stderr);
  assert.strictEqual(lines.filter((l) => /ProcessContextSpanProcessor: unknown option "resourse"/.test(l)).length, 1, silent.stderr);
  assert.strictEqual(lines.filter((l) => /OTEL_THREAD_CTX_MODE=recrd is not "record" or "frame"/.test(l)).length, 1, silent.stderr);
  assert.deepStrictEqual(silent.out.warnings, []);
  const logged = run(true, { OTEL_THREAD_CTX_MODE: 'recrd' });
  assert.ok(!logged.stderr.includes('otel-thread-ctx:'), `nothing on stderr when diag has a logger: ${logged.stderr}`);
  assert.ok(logged.out.warnings.some((w) => /unknown option "atributes"/.test(w)), JSON.stringify(logged.out.warnings));
  assert.ok(logged.out.warnings.some((w) => /OTEL_THREAD_CTX_MODE=recrd/.test(w)), JSON.stringify(logged.out.warnings));
  const quiet = run(false, { OTEL_THREAD_CTX_MODE: 'record', NODE_OPTIONS: '--no-warnings' });
  assert.ok(!quiet.stderr.includes('otel-thread-ctx:'), `--no-warnings silences them: ${quiet.stderr}`);
});

test('frame mode enables no async hook and no promise hook, and keeps the span across await', frameOnly, () => {
  const out = runChild(`
    const asyncHooks = require('node:async_hooks');
    const v8 = require('node:v8');
    const enabled = [];
    const createHook = asyncHooks.createHook;
    asyncHooks.createHook = (callbacks) => {
      const hook = createHook(callbacks);
      const enable = hook.enable.bind(hook);
      hook.enable = () => (enabled.push('async_hooks'), enable());
      return hook;
    };
    for (const name of ['onInit', 'onBefore', 'onAfter', 'onSettled', 'createHook']) {
      const original = v8.promiseHooks[name];
      v8.promiseHooks[name] = (...a) => (enabled.push('promiseHooks.' + name), original(...a));
    }
    const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
    const { ProfilingContextManager, threadInfo } = require('.');
    const binding = require('./js/binding');
    context.setGlobalContextManager(new ProfilingContextManager().enable()); // frame: from OTEL_THREAD_CTX_MODE
    const hex = (h) => Buffer.from(h).toString('hex');
    const walked = () => { const w = binding.frameWalk(); return w.header && w.header[24] === 1 ? hex(w.header.subarray(16, 24)) : null; };
    const spans = ['1111111111111111', '2222222222222222'];
    (async () => {
      const seen = await Promise.all(spans.map((spanId) =>
        context.with(trace.setSpanContext(ROOT_CONTEXT, { traceId: 'ab'.repeat(16), spanId, traceFlags: 1 }), async () => {
          const before = walked();
          await null;
          await new Promise((r) => setTimeout(r, 5));
          const afterTimer = walked();
          await new Promise((r) => setImmediate(r));
          return { spanId, before, afterTimer, afterImmediate: walked() };
        })));
      console.log(JSON.stringify({ mode: threadInfo().mode, enabled, seen, outside: walked() }));
    })();`, { env: { OTEL_THREAD_CTX_MODE: 'frame' } });
  assert.strictEqual(out.mode, 'frame');
  assert.deepStrictEqual(out.enabled, [], 'no hook was enabled');
  for (const s of out.seen) assert.deepStrictEqual(s, { spanId: s.spanId, before: s.spanId, afterTimer: s.spanId, afterImmediate: s.spanId });
  assert.strictEqual(out.outside, null);
});

test('the walk finds exactly the active span: nested, attach/dispose, bind, ended, and no span at the root', frameOnly, async () => {
  const manager = new ProfilingContextManager({ mode: 'frame' });
  assert.strictEqual(manager.mode, 'frame');
  context.setGlobalContextManager(manager.enable());
  try {
    const a = spanContextFor('frame-a');
    const b = spanContextFor('frame-b');
    const ids = () => {
      const r = readOwnRecord();
      return r.valid === 1 ? r.spanId : null;
    };
    assert.strictEqual(ids(), null, 'root');
    context.with(a.ctx, () => {
      assert.strictEqual(ids(), a.spanContext.spanId);
      context.with(b.ctx, () => assert.strictEqual(ids(), b.spanContext.spanId));
      assert.strictEqual(ids(), a.spanContext.spanId);
      context.with(ROOT_CONTEXT, () => assert.strictEqual(ids(), null));
      const token = manager.attach(b.ctx);
      assert.strictEqual(ids(), b.spanContext.spanId);
      assert.strictEqual(context.active(), b.ctx);
      token.dispose();
      assert.strictEqual(ids(), a.spanContext.spanId);
      assert.strictEqual(context.active(), a.ctx);
    });
    const bound = context.bind(b.ctx, () => ids());
    assert.strictEqual(bound(), b.spanContext.spanId);
    await context.with(a.ctx, async () => {
      await null;
      assert.strictEqual(ids(), a.spanContext.spanId, 'after await');
    });
  } finally {
    manager.disable();
    context.disable();
  }
});

test('span records are freed once nothing reaches them, and none is made per switch', frameOnly, async () => {
  const manager = new ProfilingContextManager({ mode: 'frame' });
  context.setGlobalContextManager(manager.enable());
  try {
    await collectUntilSettled();
    const before = binding.spanRecordSlabs();
    const held = spanContextFor('held');
    for (let i = 0; i < 2000; i++) context.with(held.ctx, () => {});
    assert.ok(binding.spanRecordSlabs() - before <= 1, 'switching into one span makes at most its one record');
    for (let i = 0; i < 5000; i++) {
      const { ctx } = spanContextFor(`churn${i}`);
      context.with(ctx, () => {});
    }
    await collectUntilSettled();
    assert.ok(binding.spanRecordSlabs() - before < 100, `records left: ${binding.spanRecordSlabs() - before}`);
  } finally {
    manager.disable();
    context.disable();
  }
});

test("choosing frame mode leaves the caller's AsyncContextFrame as it was (no probe keys copied into every later frame)", frameOnly, () => {
  const seen = runChild(`
    const frames = require('internal/async_context_frame');
    const keys = () => (frames.current() === undefined ? 0 : frames.current().size);
    const { context } = require('@opentelemetry/api');
    const { ProfilingContextManager } = require('.');
    const before = keys();
    const manager = new ProfilingContextManager({ mode: 'frame' });
    const constructed = keys();
    context.setGlobalContextManager(manager.enable());
    console.log(JSON.stringify({ mode: manager.mode, before, constructed, enabled: keys() }));`, { args: ['--expose-internals'] });
  assert.deepStrictEqual(seen, { mode: 'frame', before: 0, constructed: 0, enabled: 0 });
});

test('moving GCs close the gate for their pause and the walk finds the moved span after; callbacks go with the publication', frameOnly, () => {
  const gc = gcFunction();
  const manager = new ProfilingContextManager({ mode: 'frame' });
  context.setGlobalContextManager(manager.enable());
  const { ctx, spanContext } = spanContextFor('moving');
  try {
    const before = threadInfo().frame;
    context.with(ctx, () => {
      // Young objects (the context, its wrapper, the frame) move in a scavenge.
      let garbage = null;
      for (let i = 0; i < 10000; i++) garbage = { i, garbage };
      gc({ type: 'minor' });
      const afterScavenge = threadInfo().frame;
      assert.ok(afterScavenge.movingGcs > before.movingGcs, 'a scavenge was not seen as a moving GC');
      assert.strictEqual(readOwnRecord().spanId, spanContext.spanId, 'the walk lost the span after a scavenge');
      gc();
      const afterFull = threadInfo().frame;
      assert.ok(afterFull.movingGcs > afterScavenge.movingGcs, 'a full GC was not seen as a moving GC');
      assert.strictEqual(readOwnRecord().spanId, spanContext.spanId, 'the walk lost the span after a full GC');
      assert.strictEqual(afterFull.movingGcs - before.movingGcs, afterFull.movingGcsGateClosed - before.movingGcsGateClosed, 'a moving GC ended with the gate open');
      assert.strictEqual(afterFull.cpedSlot, before.cpedSlot, 'the gate reopens to the same slot');
      // Inside the span, every pause pointed the OTEP 4947 variable (read
      // first by readers) at the span's record, and pointed it back after.
      assert.strictEqual(afterFull.movingGcsSpanPinned - before.movingGcsSpanPinned, afterFull.movingGcs - before.movingGcs, 'a moving GC inside the span left readers without it');
      assert.strictEqual(threadInfo().tlsValue, threadInfo().recordAddress, 'the 4947 variable was not pointed back at the thread record');
    });
    // Outside any span there is nothing to carry through a pause.
    const outside = threadInfo().frame;
    gc({ type: 'minor' });
    const afterOutside = threadInfo().frame;
    assert.ok(afterOutside.movingGcs > outside.movingGcs);
    assert.strictEqual(afterOutside.movingGcsSpanPinned, outside.movingGcsSpanPinned, 'a pause outside any span pinned one');
    // A span the direct API put in the thread's own record stays there.
    context.with(ctx, () => {
      setSpanContext(0xcdn, 0xefn, 0x6666n, 1);
      const direct = threadInfo().frame;
      gc({ type: 'minor' });
      assert.strictEqual(threadInfo().frame.movingGcsSpanPinned, direct.movingGcsSpanPinned, 'a pause replaced the direct API span');
      assert.strictEqual(threadInfo().tlsValue, threadInfo().recordAddress, 'the 4947 variable left the thread record');
      clearSpanContext();
    });
    // A second frame-mode manager takes over the thread: the callbacks stay
    // registered once, and keep closing the gate.
    const second = new ProfilingContextManager({ mode: 'frame' });
    context.disable();
    context.setGlobalContextManager(second.enable());
    const takeover = threadInfo().frame;
    gc();
    const afterTakeover = threadInfo().frame;
    assert.ok(afterTakeover.movingGcs > takeover.movingGcs);
    assert.strictEqual(afterTakeover.movingGcs - takeover.movingGcs, afterTakeover.movingGcsGateClosed - takeover.movingGcsGateClosed);
    second.disable();
  } finally {
    manager.disable();
    context.disable();
  }
  // Unpublished: the callbacks are gone, GCs are no longer counted.
  const counts = binding.frameGcPauses();
  gc({ type: 'minor' });
  gc();
  assert.deepStrictEqual(binding.frameGcPauses(), counts, 'GC callbacks still run after disable()');
});

test('the direct API in frame mode: readers see its span first, clearSpanContext, idle, enable() and disable() leave none', frameOnly, async () => {
  // The child stops (a blocking read of stdin) at each step while the
  // reader CLI reads it from outside: the record first, then the walk.
  const { child, lines, next } = await spawnNode(`
    const fs = require('node:fs');
    const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
    const { ProfilingContextManager, setSpanContext, clearSpanContext, threadInfo } = require('.');
    const step = (name) => {
      const info = threadInfo();
      fs.writeSync(1, JSON.stringify({ step: name, tid: info.tid, mode: info.mode, recordAddress: String(info.recordAddress) }) + '\\n');
      fs.readSync(0, Buffer.alloc(1), 0, 1, null);
    };
    setSpanContext(0x1n, 0x2n, 0x3n, 1); // before any manager publishes
    const manager = new ProfilingContextManager({ mode: 'frame' });
    context.setGlobalContextManager(manager.enable());
    step('enabled');
    const sc = { traceId: 'ab'.repeat(16), spanId: '1111111111111111', traceFlags: 1 };
    context.with(trace.setSpanContext(ROOT_CONTEXT, sc), () => {
      step('frame');
      setSpanContext(0xcdn, 0xefn, 0x2222n, 1);
      step('direct');
      clearSpanContext();
      step('cleared');
      setSpanContext(0xcdn, 0xefn, 0x4444n, 1);
    });
    step('after with');
    // Back to the loop, which idles: the record is cleared there. A signal
    // (handled on the loop) brings the child back.
    fs.writeSync(1, JSON.stringify({ step: 'idling' }) + '\\n');
    const keepAlive = setInterval(() => {}, 1 << 30);
    process.once('SIGUSR2', () => {
      setSpanContext(0xcdn, 0xefn, 0x5555n, 1);
      manager.disable();
      step('disabled');
      clearInterval(keepAlive);
    });
  `);
  try {
    const go = () => child.stdin.write('\n');
    const read = (tid) => readFromOutside(child.pid, { tid, mode: 'frame' });
    const [enabled] = lines;
    assert.strictEqual(enabled.mode, 'frame');
    const tid = enabled.tid;
    assert.strictEqual(read(tid).valid, 0, 'enable() in frame mode leaves no direct-API span behind');
    go();
    assert.strictEqual((await next('frame')).step, 'frame');
    assert.strictEqual(read(tid).spanId, '1111111111111111', 'the walk finds the frame span');
    go();
    assert.strictEqual((await next('direct')).step, 'direct');
    const direct = read(tid);
    assert.strictEqual(direct.spanId, '0000000000002222', 'the direct-API span is read before the frame');
    assert.strictEqual(direct.traceId, `${'cd'.padStart(16, '0')}${'ef'.padStart(16, '0')}`);
    go();
    assert.strictEqual((await next('cleared')).step, 'cleared');
    assert.strictEqual(read(tid).spanId, '1111111111111111', 'clearSpanContext() hands back to the frame');
    go();
    assert.strictEqual((await next('after with')).step, 'after with');
    assert.strictEqual(read(tid).spanId, '0000000000004444', 'frame mode never writes the record: the direct span stays until cleared or idle');
    go();
    assert.strictEqual((await next('idling')).step, 'idling');
    await new Promise((r) => setImmediate(r));
    // The loop clears the record right before it blocks; the child gets
    // there on its own, so read until it has (bounded, no timing asserted).
    let idle = read(tid);
    for (let i = 0; i < 100 && idle.valid !== 0; i++) {
      await new Promise((r) => setTimeout(r, 20));
      idle = read(tid);
    }
    assert.strictEqual(idle.valid, 0, 'a direct-API span outlived the callbacks: the idle loop did not clear it');
    child.kill('SIGUSR2');
    const disabled = await next('disabled');
    assert.strictEqual(disabled.mode, null);
    assert.strictEqual(readRecord(child.pid, disabled.recordAddress).valid, 0, 'disable() leaves the record invalid');
    go();
    assert.strictEqual(await exited(child), 0);
  } finally {
    child.kill('SIGKILL');
  }
});

test('a thread blocked in Atomics.wait inside a span publishes it; an idle thread publishes none (read from another thread)', frameOnly, async () => {
  const { Worker } = require('node:worker_threads');
  const flag = new Int32Array(new SharedArrayBuffer(8));
  // The worker parks inside a span, then idles; this thread walks its block.
  const worker = new Worker(`
    const { parentPort, workerData } = require('node:worker_threads');
    const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
    const { ProfilingContextManager, threadInfo } = require(workerData.root);
    context.setGlobalContextManager(new ProfilingContextManager({ mode: 'frame' }).enable());
    const sc = { traceId: 'cd'.repeat(16), spanId: '3333333333333333', traceFlags: 1 };
    context.with(trace.setSpanContext(ROOT_CONTEXT, sc), () => {
      const info = threadInfo();
      parentPort.postMessage({ mode: info.mode, tls: info.frame.tlsAddress });
      Atomics.wait(workerData.flag, 0, 0);
    });
    parentPort.postMessage({ idle: true });
    setInterval(() => {}, 1 << 30);
  `, { eval: true, workerData: { root: ROOT, flag } });
  try {
    const [{ mode, tls }] = await require('node:events').once(worker, 'message');
    assert.strictEqual(mode, 'frame');
    await new Promise((r) => setTimeout(r, 50));
    const parked = binding.frameWalkAt(tls);
    assert.ok(parked.header, parked.reason);
    assert.strictEqual(Buffer.from(parked.header.subarray(16, 24)).toString('hex'), '3333333333333333');
    assert.strictEqual(parked.header[24], 1);
    Atomics.store(flag, 0, 1);
    Atomics.notify(flag, 0);
    await require('node:events').once(worker, 'message');
    await new Promise((r) => setTimeout(r, 100));
    const idle = binding.frameWalkAt(tls);
    assert.strictEqual(idle.record ?? null, null, 'an idle thread publishes no span');
    assert.match(idle.reason, /no AsyncContextFrame is current/);
  } finally {
    await worker.terminate();
  }
});
