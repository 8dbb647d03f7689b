'use strict';
// Accuracy workload: an instrumented service whose ground truth is known.
//
// The main thread and WORKERS worker threads each run the OpenTelemetry SDK
// (NodeTracerProvider) with ProfilingContextManager and many concurrent
// request-like spans. Every span burns CPU in segments of 0.2-2 ms and logs
// each segment as `{span, start_ns, end_ns}` (CLOCK_MONOTONIC, from
// process.hrtime.bigint()), and every blocking call it makes as
// `{span, kind, block_start_ns, block_end_ns}`. Samplers outside the process
// then say which span they saw at which time; ./score.js compares.
//
// Protocol on stdio (one JSON object per line on stdout):
//   -> {event:'ready', pid, threads:[{tid, tlsAddress, recordAddress, mode,
//        frameTlsAddress, jsObjectRecordOffset}]}
//   <- 'go\n' on stdin
//   -> {event:'clock', before, after}   hrtime around the next write(2) of the
//                                        main thread (a sampler can time it)
//   -> {event:'done', truthDir}          truth files written
//   <- end of stdin                      exit (samplers have detached)
//
// Phases after 'go' (every thread): `cpuMs` of on-CPU requests, `offMs` of
// requests that block inside their span (Atomics.wait with a timeout, a
// synchronous read of a FIFO answered late by a helper process,
// execSync('sleep 0.02'), a mutex shared by the workers), `idleMs` of short
// spans awaiting timers (the loop idles with and without a span pending),
// then `tailMs` idle.
//
// Parameters: argv[2] is JSON {workers, concurrency, cpuMs, offMs, idleMs,
// tailMs, dir, execEvery, gcEvery, manager ('profiling' or the 'with-only' control), mode
// (the manager's publishing mode, or null for its default)}. Logging is allocation-light: typed arrays sized up front,
// written out once at the end.

const fs = require('node:fs');
const path = require('node:path');
const { execFileSync, execSync, spawn } = require('node:child_process');
const { isMainThread, Worker, workerData, parentPort } = require('node:worker_threads');
const { performance } = require('node:perf_hooks');
const api = require('@opentelemetry/api');
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');

const ROOT = path.resolve(__dirname, '..', '..');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { ProfilingContextManager, threadInfo, setSpanContext, clearSpanContext } = require(ROOT);

const params = isMainThread ? JSON.parse(process.argv[2] || '{}') : workerData.params;
const WORKERS = params.workers ?? 4;
const CONCURRENCY = params.concurrency ?? 8;
const CPU_MS = params.cpuMs ?? 8000;
const OFF_MS = params.offMs ?? 4000;
const IDLE_MS = params.idleMs ?? 1500;
const TAIL_MS = params.tailMs ?? 300;
const DIR = params.dir;
const EXEC_EVERY = params.execEvery ?? 12; // one blocking call in N is execSync
// One CPU segment in N forces a moving GC in its span (0: never): a
// scavenge, every 8th time a full (compacting) GC. Needs --expose-gc.
const GC_EVERY = params.gcEvery ?? 0;
const threadIndex = isMainThread ? 0 : workerData.index;

/**
 * Negative control (`manager: 'with-only'`): publishes through the direct API
 * on with() entry and exit only, never when a callback starts or the loop
 * idles. The harness must see it go wrong.
 */
class WithOnlyContextManager extends AsyncLocalStorageContextManager {
  with(ctx, fn, thisArg, ...args) {
    const outer = this.active();
    publishDirect(ctx);
    try {
      return super.with(ctx, fn, thisArg, ...args);
    } finally {
      publishDirect(outer);
    }
  }
}

function publishDirect(ctx) {
  const sc = api.trace.getSpanContext(ctx);
  if (sc === undefined || !api.isSpanContextValid(sc)) return clearSpanContext();
  const hex = (s) => BigInt(`0x${s}`);
  setSpanContext(hex(sc.traceId.slice(0, 16)), hex(sc.traceId.slice(16)), hex(sc.spanId), sc.traceFlags);
}

const provider = new NodeTracerProvider();
provider.register({
  contextManager:
    params.manager === 'with-only'
      ? new WithOnlyContextManager()
      : new ProfilingContextManager(params.mode ? { mode: params.mode } : undefined),
});
const tracer = api.trace.getTracer('accuracy-workload');

// ---------------------------------------------------------------- truth log

const MAX_SEGMENTS = 1 << 18;
const MAX_BLOCKS = 1 << 16;
const spanIds = [];
const segSpan = new Int32Array(MAX_SEGMENTS);
const segStart = new BigInt64Array(MAX_SEGMENTS);
const segEnd = new BigInt64Array(MAX_SEGMENTS);
let segments = 0;
const BLOCK_KINDS = ['atomics', 'fifo', 'exec', 'lock'];
const blkSpan = new Int32Array(MAX_BLOCKS);
const blkKind = new Uint8Array(MAX_BLOCKS);
const blkStart = new BigInt64Array(MAX_BLOCKS);
const blkEnd = new BigInt64Array(MAX_BLOCKS);
let blocks = 0;

/** Runs `fn(span, index)` inside a new active span; `index` names it in the truth log. */
function inSpan(name, fn) {
  return tracer.startActiveSpan(name, (span) => {
    const index = spanIds.length;
    spanIds.push(span.spanContext().spanId);
    return fn(span, index);
  });
}

let sink = 1;
/** Burns CPU for `ms` milliseconds on behalf of span `index` and logs the segment. */
function burn(index, ms) {
  const start = process.hrtime.bigint();
  const until = performance.now() + ms;
  let x = sink;
  while (performance.now() < until) {
    for (let i = 0; i < 256; i++) x = (x * 1103515245 + 12345) % 2147483647;
  }
  sink = x;
  if (GC_EVERY > 0 && segments % GC_EVERY === 0) moveObjects();
  const end = process.hrtime.bigint();
  if (segments < MAX_SEGMENTS) {
    segSpan[segments] = index;
    segStart[segments] = start;
    segEnd[segments] = end;
    segments++;
  }
}

let forcedGcs = 0;
/** A moving GC inside the current segment, over young garbage and this thread's live contexts. */
function moveObjects() {
  let garbage = null;
  for (let i = 0; i < 2000; i++) garbage = { i, next: garbage, text: `g${i}` };
  sink += garbage.i;
  globalThis.gc(forcedGcs++ % 8 === 7 ? undefined : { type: 'minor' });
}

/** Runs the blocking call `fn` on behalf of span `index` and logs it as a block of `kind`. */
function block(index, kind, fn) {
  const start = process.hrtime.bigint();
  fn();
  const end = process.hrtime.bigint();
  if (blocks < MAX_BLOCKS) {
    blkSpan[blocks] = index;
    blkKind[blocks] = BLOCK_KINDS.indexOf(kind);
    blkStart[blocks] = start;
    blkEnd[blocks] = end;
    blocks++;
  }
}

function writeTruth() {
  const { tid } = threadInfo();
  const segs = new Array(segments);
  for (let i = 0; i < segments; i++) segs[i] = [segSpan[i], String(segStart[i]), String(segEnd[i])];
  const blks = new Array(blocks);
  for (let i = 0; i < blocks; i++) {
    blks[i] = [blkSpan[i], BLOCK_KINDS[blkKind[i]], String(blkStart[i]), String(blkEnd[i])];
  }
  const file = path.join(DIR, `truth-${tid}.json`);
  // Frame mode: the moving GCs this thread went through, how many of them
  // closed its gate, and how many carried the span through the OTEP 4947
  // variable meanwhile (threadInfo().frame).
  const frame = threadInfo().frame;
  const gcs =
    frame === null
      ? null
      : { forced: forcedGcs, moving: frame.movingGcs, gateClosed: frame.movingGcsGateClosed, spanPinned: frame.movingGcsSpanPinned };
  fs.writeFileSync(file, JSON.stringify({ tid, thread: threadIndex, spanIds, segments: segs, blocks: blks, gcs }));
}

// ---------------------------------------------------------------- helpers

const rnd = (lo, hi) => lo + Math.random() * (hi - lo);
const segMs = () => rnd(0.2, 2);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const immediate = () => new Promise((resolve) => setImmediate(resolve));

// ---------------------------------------------------------------- on-CPU requests

/** One request: CPU segments interleaved with every kind of continuation. */
function cpuRequest() {
  return inSpan('request', async (span, idx) => {
    burn(idx, segMs());
    await null; // await continuation
    burn(idx, segMs());
    await sleep(Math.random() < 0.5 ? 0 : 1); // timer
    burn(idx, segMs());
    // Nested child span across await, immediate and an fs callback.
    await inSpan('child', async (child, cidx) => {
      burn(cidx, segMs());
      await immediate();
      burn(cidx, segMs());
      await new Promise((resolve) => fs.stat(__filename, () => { burn(cidx, segMs()); resolve(); }));
      await fs.promises.readFile(__filename);
      burn(cidx, segMs());
      child.end();
    });
    burn(idx, segMs());
    // Synchronous nested span: with() entry and exit.
    inSpan('inner', (inner, iidx) => { burn(iidx, segMs()); inner.end(); });
    burn(idx, segMs());
    await new Promise((resolve) => setTimeout(() => { burn(idx, segMs()); resolve(); }, 1));
    await new Promise((resolve) => process.nextTick(() => { burn(idx, segMs()); resolve(); }));
    await new Promise((resolve) => queueMicrotask(() => { burn(idx, segMs()); resolve(); }));
    await new Promise((resolve) => setImmediate(() => { burn(idx, segMs()); resolve(); }));
    await Promise.resolve().then(() => burn(idx, segMs()));
    span.end();
  });
}

async function cpuLoop(deadline) {
  while (performance.now() < deadline) {
    await cpuRequest();
    // Outside any span; sometimes long enough for the loop to go idle.
    await sleep(Math.random() < 0.3 ? rnd(1, 3) : 0);
  }
}

// ---------------------------------------------------------------- off-CPU requests

let fifo = null; // {req, resp} file descriptors to the helper, per thread
const fifoByte = Buffer.alloc(1);
const waitCell = new Int32Array(new SharedArrayBuffer(4)); // never notified
let mutex = null; // Int32Array over the workers' shared lock word

function atomicsWait() {
  Atomics.wait(waitCell, 0, 0, rnd(2, 6));
}

function fifoRead() {
  fs.writeSync(fifo.req, fifoByte);
  fs.readSync(fifo.resp, fifoByte, 0, 1, null);
}

function execSleep() {
  execSync('sleep 0.02');
}

/** Futex-style mutex over a SharedArrayBuffer: 0 free, 1 held, 2 held with waiters. */
function lock(idx) {
  if (Atomics.compareExchange(mutex, 0, 0, 1) === 0) return;
  block(idx, 'lock', () => {
    let c = Atomics.exchange(mutex, 0, 2);
    while (c !== 0) {
      Atomics.wait(mutex, 0, 2);
      c = Atomics.exchange(mutex, 0, 2);
    }
  });
}

function unlock() {
  if (Atomics.exchange(mutex, 0, 0) === 2) Atomics.notify(mutex, 0, 1);
}

let blockingCalls = 0;
function offRequest() {
  return inSpan('blocking', async (span, idx) => {
    burn(idx, rnd(0.2, 0.5));
    // Block after a continuation, as a handler does after awaiting something.
    await (Math.random() < 0.5 ? null : immediate());
    const n = blockingCalls++;
    if (n % EXEC_EVERY === EXEC_EVERY - 1) block(idx, 'exec', execSleep);
    else if (mutex !== null && n % 3 === 0) {
      lock(idx);
      burn(idx, rnd(0.5, 1.5));
      unlock();
    } else if (n % 2 === 0) block(idx, 'atomics', atomicsWait);
    else block(idx, 'fifo', fifoRead);
    burn(idx, rnd(0.2, 0.5));
    span.end();
  });
}

async function offLoop(deadline) {
  while (performance.now() < deadline) {
    await offRequest();
    await sleep(rnd(1, 4)); // the loop idles between requests
  }
}

// ---------------------------------------------------------------- idle-heavy requests

/** Short spans that wait on timers: the loop goes idle with and without a span pending. */
async function idleLoop(deadline) {
  while (performance.now() < deadline) {
    await inSpan('waiting', async (span, idx) => {
      burn(idx, rnd(0.2, 0.5));
      await sleep(rnd(1, 3)); // idle while this span awaits
      burn(idx, rnd(0.2, 0.5));
      span.end();
    });
    await sleep(rnd(1, 3)); // idle outside any span
  }
}

// ---------------------------------------------------------------- phases

async function runPhases() {
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, () => cpuLoop(t0 + CPU_MS)));
  const t1 = performance.now();
  await Promise.all(Array.from({ length: 2 }, () => offLoop(t1 + OFF_MS)));
  await idleLoop(performance.now() + IDLE_MS);
  await sleep(TAIL_MS);
  writeTruth();
}

function openFifo(index) {
  const req = fs.openSync(path.join(DIR, `req-${index}`), 'w');
  const resp = fs.openSync(path.join(DIR, `resp-${index}`), 'r');
  return { req, resp };
}

function describeThread() {
  const info = threadInfo();
  return {
    tid: info.tid,
    tlsAddress: String(info.tlsAddress),
    recordAddress: String(info.recordAddress),
    mode: info.mode,
    // Why frame mode is not in force on the thread (null when it is).
    frameUnavailableReason: info.frameUnavailableReason,
    // Frame mode: where the thread's otel_thread_ctx_nodejs_v1 block is, and
    // where wrappers keep their record's address.
    frameTlsAddress: info.frame === null ? null : String(info.frame.tlsAddress),
    jsObjectRecordOffset: info.frame === null ? null : info.frame.jsObjectRecordOffset,
  };
}

if (isMainThread) {
  for (let i = 0; i <= WORKERS; i++) {
    execFileSync('mkfifo', [path.join(DIR, `req-${i}`), path.join(DIR, `resp-${i}`)]);
  }
  const helper = spawn(process.execPath, [path.join(__dirname, 'fifo-helper.js'), DIR, String(WORKERS + 1)], {
    stdio: ['pipe', 'ignore', 'inherit'], // it exits when this pipe closes
  });
  fifo = openFifo(0);
  // Keep every loop making syscalls until 'go', so a sampler can see each thread.
  const tick = setInterval(() => {}, 20);
  const lockWord = new Int32Array(new SharedArrayBuffer(4));
  const threads = [describeThread()];
  const workers = [];
  let pending = WORKERS;
  let done = 0;
  for (let i = 1; i <= WORKERS; i++) {
    const worker = new Worker(__filename, { workerData: { index: i, params, lockWord } });
    workers.push(worker);
    worker.on('error', (err) => {
      console.error(err);
      process.exit(1);
    });
    worker.on('message', (msg) => {
      if (msg.ready) {
        threads.push(msg.ready);
        if (--pending === 0) ready();
      } else if (msg.done && ++done === WORKERS + 1) finish();
    });
  }
  function ready() {
    process.stdout.write(`${JSON.stringify({ event: 'ready', pid: process.pid, threads })}\n`);
    let input = '';
    let started = false;
    // The harness went away before 'go': nothing will ever start the run.
    process.stdin.once('end', () => started || process.exit(1));
    process.stdin.on('data', (chunk) => {
      input += chunk;
      if (started || !input.includes('go\n')) return;
      started = true;
      clearInterval(tick);
      for (const w of workers) w.postMessage('go');
      const before = process.hrtime.bigint();
      fs.writeSync(1, '{"event":"clock-probe"}\n');
      const after = process.hrtime.bigint();
      fs.writeSync(1, `${JSON.stringify({ event: 'clock', before: String(before), after: String(after) })}\n`);
      runPhases().then(() => {
        if (++done === WORKERS + 1) finish();
      });
    });
  }
  function finish() {
    helper.kill('SIGKILL');
    process.stdout.write(`${JSON.stringify({ event: 'done', truthDir: DIR })}\n`);
    // Exit when stdin closes: samplers detach from a live process first.
    process.stdin.on('end', () => process.exit(0)).resume();
    setTimeout(() => process.exit(0), 30000).unref();
  }
} else {
  fifo = openFifo(threadIndex);
  mutex = workerData.lockWord;
  const tick = setInterval(() => {}, 20);
  parentPort.postMessage({ ready: describeThread() });
  parentPort.once('message', () => {
    clearInterval(tick);
    runPhases().then(() => parentPort.postMessage({ done: true }));
  });
}
