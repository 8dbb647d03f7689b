'use strict';
// The reader CLI (crates/cli/, binary otel-thread-ctx) against real Node
// processes, run with the Node binary running this suite: a main thread and
// two workers parked inside their own spans, the same threads once their
// spans ended and their loops idle, a process without the addon, a pid that
// does not exist, a sampler killed mid-run, and samplers whose target has
// workers that come and go, exits, is killed mid-run, or executes another
// program (process.execve, where Node has it).
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const { spawn, spawnSync, execFileSync } = require('node:child_process');
const { jsonLines, scratchDir } = require('./helpers');

const ROOT = path.resolve(__dirname, '..');
const native = require('../js/native');
let READER = native.readerPath();

// The child: each JS thread publishes a distinct span and blocks inside it
// (workers in Atomics.wait, main in a read of stdin). A line on stdin
// releases them: every span ends and every event loop idles. SIGUSR2 makes
// the main loop answer, to show it runs.
const CHILD = `
const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads');
const fs = require('node:fs');
const { context, trace } = require(${JSON.stringify(require.resolve('@opentelemetry/api', { paths: [ROOT] }))});
const { ProfilingContextManager, threadInfo } = require(${JSON.stringify(ROOT)});
context.setGlobalContextManager(new ProfilingContextManager().enable());
const hex = (n, w) => n.toString(16).padStart(w, '0');
function span(i) {
  const sc = { traceId: hex(0x4bf92f35 + i, 16) + hex(0x77b34da6 * (i + 1), 16), spanId: hex(0x00f067aa0ba902b7n + BigInt(i), 16), traceFlags: i % 2 ? 0 : 1 };
  return { sc, ctx: trace.setSpanContext(context.active(), sc) };
}
const me = (sc) => ({ tid: threadInfo().tid, traceId: sc.traceId, spanId: sc.spanId, traceFlags: sc.traceFlags });
if (isMainThread) {
  const flag = new Int32Array(new SharedArrayBuffer(4));
  const parked = [], released = [];
  for (const i of [1, 2]) {
    const w = new Worker(__filename, { workerData: { i, flag } });
    w.on('message', (m) => {
      if (m.parked) parked.push(m.parked);
      if (m.released) released.push(m.released);
      if (m.parked && parked.length === 2) parkMain();
      if (m.released && released.length === 2) console.log(JSON.stringify({ phase: 'idle' }));
    });
  }
  function parkMain() {
    const { sc, ctx } = span(0);
    context.with(ctx, () => {
      console.log(JSON.stringify({ phase: 'parked', threads: [me(sc), ...parked] }));
      fs.readSync(0, Buffer.alloc(1));
    });
    Atomics.store(flag, 0, 1);
    Atomics.notify(flag, 0);
  }
  setInterval(() => {}, 1 << 30);
  process.on('SIGUSR2', () => console.log(JSON.stringify({ phase: 'pong' })));
} else {
  const { i, flag } = workerData;
  const { sc, ctx } = span(i);
  context.with(ctx, () => {
    parentPort.postMessage({ parked: me(sc) });
    Atomics.wait(flag, 0, 0);
  });
  parentPort.postMessage({ released: threadInfo().tid });
  parentPort.on('message', () => {});
}
`;

/**
 * Writes `source` to a scratch file `name` and runs it with the Node running
 * the tests; the child is killed and the file removed when the test ends.
 */
function spawnScriptFile(t, name, source, stdin = 'pipe') {
  const file = path.join(scratchDir('otel-inspect-'), name);
  fs.writeFileSync(file, source);
  const child = spawn(process.execPath, [file], { stdio: [stdin, 'pipe', 'inherit'] });
  t.after(() => {
    child.kill('SIGKILL');
    fs.rmSync(path.dirname(file), { recursive: true, force: true });
  });
  return child;
}

/** Starts the child; `next()` resolves with its next JSON line. */
function startChild(t) {
  const child = spawnScriptFile(t, 'child.js', CHILD);
  const { next } = jsonLines(child.stdout, { timeoutMs: 20000 });
  return { child, next };
}

function inspect(pid) {
  const r = spawnSync(READER, ['inspect', '--pid', String(pid), '--json'], { encoding: 'utf8' });
  return { status: r.status, report: r.stdout ? JSON.parse(r.stdout) : null, stderr: r.stderr };
}

/** State and TracerPid of every thread of `pid`. */
function threadStates(pid) {
  return fs.readdirSync(`/proc/${pid}/task`).map((tid) => {
    const status = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
    const field = (name) => status.match(new RegExp(`^${name}:\\s*(.*)$`, 'm'))[1];
    return { tid, state: field('State'), tracerPid: field('TracerPid') };
  });
}

function assertRunningUntraced(pid) {
  for (const th of threadStates(pid)) {
    assert.ok(!/^[tT]/.test(th.state), `thread ${th.tid} left in state ${th.state}`);
    assert.strictEqual(th.tracerPid, '0', `thread ${th.tid} left traced`);
  }
}

test.before(() => {
  if (READER === null) {
    execFileSync(process.execPath, [path.join(ROOT, 'scripts', 'build.js')], { cwd: ROOT, stdio: 'inherit' });
    READER = native.readerPath();
  }
});

test('inspect reads the span of each parked thread, then no span once the loops idle', async (t) => {
  const { child, next } = startChild(t);
  const parked = await next('parked');
  assert.strictEqual(parked.phase, 'parked');
  assert.strictEqual(parked.threads.length, 3);

  const { status, report, stderr } = inspect(child.pid);
  assert.strictEqual(status, 0, `${stderr}\n${JSON.stringify(report, null, 2)}`);
  assert.strictEqual(report.conformant, true);
  assert.strictEqual(report.symbol.module, fs.realpathSync(native.addonPath()));
  assert.strictEqual(report.symbol.access_model, 'tlsdesc');
  assert.match(report.symbol.resolution.path, /^tlsdesc-(static|dtv)$/);
  for (const th of parked.threads) {
    const entry = report.threads.find((x) => x.tid === th.tid);
    assert.ok(entry, `thread ${th.tid} is in the report`);
    assert.strictEqual(entry.status, 'valid', JSON.stringify(entry));
    assert.deepStrictEqual(
      { trace_id: entry.record.trace_id, span_id: entry.record.span_id, trace_flags: entry.record.trace_flags },
      { trace_id: th.traceId, span_id: th.spanId, trace_flags: th.traceFlags },
      `thread ${th.tid}`,
    );
    assert.strictEqual(entry.name.length > 0, true);
    assert.strictEqual(entry.tls.path, report.symbol.resolution.path);
  }
  // Only the three JS threads publish; Node's own threads have no record.
  assert.strictEqual(report.threads.filter((x) => x.status === 'valid').length, 3);
  assertRunningUntraced(child.pid);

  child.stdin.write('go\n');
  assert.strictEqual((await next('idle')).phase, 'idle');
  await new Promise((r) => setTimeout(r, 200)); // let every loop settle into epoll_wait
  const idle = inspect(child.pid);
  assert.strictEqual(idle.status, 0, idle.stderr);
  for (const th of parked.threads) {
    const entry = idle.report.threads.find((x) => x.tid === th.tid);
    // Record mode: the record is invalid (or gone). Frame mode: the walk
    // finds no span, the current frame being undefined between callbacks.
    assert.ok(['idle', 'no-record', 'no-span'].includes(entry.status), JSON.stringify(entry));
    if (entry.schema === 'nodejs_v1_dev') assert.strictEqual(entry.no_span_reason, 'no-frame', JSON.stringify(entry));
    if (entry.record) assert.notStrictEqual(entry.record.valid, 1);
  }
  assert.deepStrictEqual(idle.report.threads.filter((x) => x.status === 'valid'), []);
  assertRunningUntraced(child.pid);
});

test('sample killed with SIGTERM mid-run leaves the target running and untraced', async (t) => {
  const { child, next } = startChild(t);
  await next('parked');
  for (const delay of [0, 250]) {
    // Raw reads on stdout show when sampling has begun; the summary goes to stderr.
    const sampler = spawn(READER, ['sample', '--pid', String(child.pid), '--hz', '2000', '--duration', '30', '--raw', '--json'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let err = '';
    sampler.stderr.on('data', (d) => (err += d));
    const closed = new Promise((r) => sampler.on('close', (c) => r(c)));
    await new Promise((r) => sampler.stdout.once('data', r));
    sampler.stdout.resume();
    await new Promise((r) => setTimeout(r, delay));
    sampler.kill('SIGTERM');
    const code = await closed;
    assert.strictEqual(code, 128 + 15, err);
    const summary = JSON.parse(err.slice(0, err.indexOf('\n}\n') + 2));
    assert.strictEqual(summary.interrupted_by_signal, 15);
    assert.ok(summary.reads > 0, 'it sampled before being stopped');
    assertRunningUntraced(child.pid);
  }
  // The target still works: it answers and can be released.
  child.stdin.write('go\n');
  assert.strictEqual((await next('idle')).phase, 'idle');
  child.kill('SIGUSR2');
  assert.strictEqual((await next('pong')).phase, 'pong');
});

// A child whose workers come and go: it keeps three workers alive, each
// publishing one span while it spins for a moment and then exiting, and
// exits by itself after about a second.
const CHURN = `
const { Worker, isMainThread } = require('node:worker_threads');
const { context, trace } = require(${JSON.stringify(require.resolve('@opentelemetry/api', { paths: [ROOT] }))});
const { ProfilingContextManager } = require(${JSON.stringify(ROOT)});
context.setGlobalContextManager(new ProfilingContextManager().enable());
const sc = { traceId: '5bf92f3577b34da6a3ce929d0e0e4736', spanId: '10f067aa0ba902b7', traceFlags: 1 };
if (isMainThread) {
  const end = Date.now() + 1000;
  const start = () => {
    if (Date.now() < end) new Worker(__filename).on('exit', start);
  };
  for (let i = 0; i < 3; i++) start();
  console.log(JSON.stringify({ phase: 'churning', traceId: sc.traceId, spanId: sc.spanId }));
  setTimeout(() => process.exit(0), 1000);
} else {
  context.with(trace.setSpanContext(context.active(), sc), () => {
    const until = Date.now() + 30;
    while (Date.now() < until);
  });
}
`;

/** Runs the reader with `args`; resolves with its exit code and output. */
function run(args) {
  const p = spawn(READER, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d) => (stdout += d));
  p.stderr.on('data', (d) => (stderr += d));
  return new Promise((resolve) => p.on('close', (status) => resolve({ status, stdout, stderr })));
}

test('sample of a process whose workers come and go, then which exits: exit 0 with the samples read, late stops skipped and counted', async (t) => {
  const child = spawnScriptFile(t, 'churn.js', CHURN, 'ignore');
  const ready = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('child never started churning')), 20000);
    let pending = '';
    child.stdout.on('data', (d) => {
      pending += d;
      const i = pending.indexOf('\n');
      if (i < 0) return;
      clearTimeout(timer);
      resolve(JSON.parse(pending.slice(0, i)));
    });
  });
  assert.strictEqual(ready.phase, 'churning');
  const started = Date.now();
  const r = await run(['sample', '--pid', String(child.pid), '--hz', '500', '--duration', '3', '--raw', '--json']);
  assert.strictEqual(r.status, 0, r.stderr);
  assert.ok(Date.now() - started < 2500, `the run ends with the process (${Date.now() - started} ms)`);
  const lines = r.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  // stderr: the JSON summary, then the line saying when the process exited.
  const exitLine = r.stderr.trimEnd().split('\n').pop();
  const summary = JSON.parse(r.stderr.trimEnd().slice(0, -exitLine.length));
  assert.strictEqual(summary.target_exited, true);
  // A thread that stops late (a loaded machine) is a skipped read: no raw
  // line, no sample, no error, counted in late_stops.
  const sum = (key) => summary.threads.reduce((n, th) => n + th[key], 0);
  assert.strictEqual(lines.length, summary.reads, 'one raw line per read');
  assert.strictEqual(sum('samples'), summary.reads);
  assert.strictEqual(sum('late_stops'), summary.late_stops);
  assert.strictEqual(sum('errors'), 0, JSON.stringify(summary.threads));
  if (summary.late_stops > 0) console.log(`sample: ${summary.late_stops} late stops skipped`);
  assert.ok(lines.length > 0, 'samples were printed');
  const tids = new Set(lines.map((l) => l.tid));
  assert.ok(tids.has(child.pid), 'the main thread was read');
  let inSpan = 0;
  for (const l of lines) {
    assert.strictEqual(l.error, undefined, JSON.stringify(l));
    if (l.valid) {
      inSpan++;
      assert.deepStrictEqual([l.trace_id, l.span_id], [ready.traceId, ready.spanId]);
    }
  }
  assert.ok(inSpan > 0, 'some worker was read inside its span');
  assert.match(exitLine, new RegExp(`pid ${child.pid} exited after`));
});

test('sample of a process killed mid-run: exit 0 with the samples read until then', async (t) => {
  const { child, next } = startChild(t);
  const parked = await next('parked');
  const started = Date.now();
  const sampling = run(['sample', '--pid', String(child.pid), '--hz', '500', '--duration', '3', '--json']);
  await new Promise((r) => setTimeout(r, 300));
  child.kill('SIGKILL');
  const r = await sampling;
  assert.strictEqual(r.status, 0, r.stderr);
  assert.ok(Date.now() - started < 2500, `the run ends with the process (${Date.now() - started} ms)`);
  const summary = JSON.parse(r.stdout);
  assert.strictEqual(summary.target_exited, true);
  assert.strictEqual(summary.interrupted_by_signal, null);
  assert.ok(summary.rounds > 0, 'it sampled before the process died');
  for (const th of parked.threads) {
    const entry = summary.threads.find((x) => x.tid === th.tid);
    assert.ok(entry && entry.samples > 0, `thread ${th.tid} was sampled`);
    assert.strictEqual(entry.spans[0].span_id, th.spanId);
  }
  for (const th of summary.threads) assert.strictEqual(th.errors, 0, JSON.stringify(th));
  assert.match(r.stderr, new RegExp(`pid ${child.pid} exited after`));
});

// The main thread publishes a span, then executes /bin/sleep from inside it
// once a line arrives on stdin.
const EXECS = `
const fs = require('node:fs');
const { context, trace } = require(${JSON.stringify(require.resolve('@opentelemetry/api', { paths: [ROOT] }))});
const { ProfilingContextManager } = require(${JSON.stringify(ROOT)});
context.setGlobalContextManager(new ProfilingContextManager().enable());
const sc = { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: 1 };
context.with(trace.setSpanContext(context.active(), sc), () => {
  console.log(JSON.stringify({ phase: 'parked', traceId: sc.traceId, spanId: sc.spanId }));
  fs.readSync(0, Buffer.alloc(1));
  process.execve('/bin/sleep', ['sleep', '30']);
});
`;

test('sample of a process that executes a program without thread context: no read of it, and a message', { skip: typeof process.execve !== 'function' && 'this Node has no process.execve' }, async (t) => {
  const child = spawnScriptFile(t, 'execs.js', EXECS);
  const parked = await jsonLines(child.stdout, { timeoutMs: 20000 }).next('parked');
  const sampler = spawn(READER, ['sample', '--pid', String(child.pid), '--hz', '200', '--duration', '2', '--raw', '--json'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  sampler.stderr.on('data', (d) => (stderr += d));
  const lines = [];
  let execed = false;
  readline.createInterface({ input: sampler.stdout }).on('line', (l) => {
    lines.push(JSON.parse(l));
    // Once the span was read, make the process execute.
    if (!execed && lines.some((x) => x.valid)) {
      execed = true;
      child.stdin.write('\n');
    }
  });
  const status = await new Promise((r) => sampler.on('close', (c) => r(c)));
  assert.strictEqual(status, 0, stderr);
  assert.ok(execed, 'the span was read before the exec');
  for (const l of lines) {
    assert.strictEqual(l.error, undefined, JSON.stringify(l));
    if (l.valid) assert.deepStrictEqual([l.trace_id, l.span_id], [parked.traceId, parked.spanId]);
  }
  const summary = JSON.parse(stderr.slice(0, stderr.indexOf('\n}\n') + 2));
  assert.strictEqual(summary.execs.length, 1, stderr);
  const [exec] = summary.execs;
  assert.match(exec.executable, /sleep$/);
  assert.strictEqual(exec.resolution_path, null);
  assert.match(exec.error, /no module defines otel_thread_ctx_v1/);
  assert.match(stderr, new RegExp(`pid ${child.pid} executed \\S*sleep after .*no thread read since`));
  assert.strictEqual(fs.readlinkSync(`/proc/${child.pid}/exe`), exec.executable);
  assertRunningUntraced(child.pid);
});

test('a Node process without the addon: exit 1 with the reason', async (t) => {
  const plain = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 1e5)'], { stdio: 'ignore' });
  t.after(() => plain.kill('SIGKILL'));
  await new Promise((r) => setTimeout(r, 300));
  const r = spawnSync(READER, ['inspect', '--pid', String(plain.pid)], { encoding: 'utf8' });
  assert.strictEqual(r.status, 1, r.stdout + r.stderr);
  assert.match(r.stdout, /no module defines otel_thread_ctx_v1/);
  const json = inspect(plain.pid);
  assert.strictEqual(json.status, 1);
  assert.strictEqual(json.report.conformant, false);
  assert.strictEqual(json.report.symbol, null);
});

test('a nonexistent pid: exit 2', () => {
  const pidMax = Number(fs.readFileSync('/proc/sys/kernel/pid_max', 'utf8'));
  const r = spawnSync(READER, ['inspect', '--pid', String(pidMax)], { encoding: 'utf8' });
  assert.strictEqual(r.status, 2);
  assert.match(r.stderr, /no such process/);
});
