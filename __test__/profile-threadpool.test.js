'use strict';
// `otel-thread-ctx profile` follows libuv threadpool work to the span that
// queued it (fixtures/threadpool-service.js): an N-API addon's async work
// (built here with the C compiler against node's headers; it reports which
// pool thread ran each item and when), crypto.pbkdf2, zlib.gzip and
// fs.readFile of a FIFO written late, queued from many spans at once, from
// the main thread and a worker, a cancelled item, and an exit mid-item.
// Scored from the jsonl output against that truth; pprof is read back with
// `go tool pprof`. Needs root (BPF); skips with the reason otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines, exited, profileUnavailable, scratchDir } = require('./helpers');

const READER = require('../js/native').readerPath();
const SERVICE = path.join(__dirname, 'fixtures', 'threadpool-service.js');
const ADDON_SOURCE = path.join(__dirname, 'fixtures', 'pool-addon.c');
const POOL_SIZE = 6;
// Where an AsyncWrap keeps its context frame in its JS object, which the
// sample-time reading needs: Node 24 and later (Node 22's frame mode, behind
// a flag, keeps it elsewhere, and is probed).
const READS_AT_SAMPLE_TIME = Number(process.versions.node.split('.')[0]) >= 24;
const HZ = 499;
// libuv's pool thread loop, which calls each item's work function.
const WORKER_LOOP = 'worker';

/** node's headers: beside the running node, else the system's. */
function nodeHeaders() {
  const candidates = [path.resolve(process.execPath, '..', '..', 'include', 'node'), '/usr/include/node', '/usr/local/include/node'];
  return candidates.find((d) => fs.existsSync(path.join(d, 'node_api.h'))) ?? null;
}

function unavailable() {
  const profile = profileUnavailable(READER);
  if (profile !== null) return profile;
  if (nodeHeaders() === null) return "node's headers (node_api.h) are not installed";
  if (spawnSync('cc', ['--version']).status !== 0) return 'no C compiler (cc) to build the test addon';
  return null;
}

const skip = unavailable();
const tmp = scratchDir('otel-thread-ctx-threadpool-');

function buildAddon() {
  const out = path.join(tmp, 'pool-addon.node');
  const r = spawnSync('cc', ['-shared', '-fPIC', '-O2', `-I${nodeHeaders()}`, '-o', out, ADDON_SOURCE], { encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stderr);
  return out;
}

/** The threads of `pid` named `name`. */
function threadsNamed(pid, name) {
  const tids = [];
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    try {
      if (fs.readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim() === name) tids.push(Number(tid));
    } catch {
      // the thread exited
    }
  }
  return tids;
}

async function startService(addon, nodeFlags = []) {
  const child = spawn(process.execPath, [...nodeFlags, SERVICE, addon], {
    cwd: tmp,
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, UV_THREADPOOL_SIZE: String(POOL_SIZE) },
  });
  const lines = jsonLines(child.stdout, { timeoutMs: 120000 });
  const { pid, mode } = await lines.next('the service line');
  return { child, lines, pid, mode, namedPoolThreads: threadsNamed(pid, 'libuv-worker') };
}

/** The line profile writes once its samplers are attached and the target's samples flow. */
const SAMPLING_BEGAN = /^otel-thread-ctx: sampling pid \d+ at \d+ Hz/m;

function profile(pid, args) {
  const child = spawn(READER, ['profile', '--pid', String(pid), '--duration', '120', ...args], { cwd: tmp, stdio: ['ignore', 'pipe', 'pipe'] });
  const run = { child, stderr: '', done: null };
  child.stderr.on('data', (d) => (run.stderr += d));
  child.stdout.resume();
  run.done = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal, stderr: run.stderr })));
  return run;
}

/**
 * Resolves once every profile of `runs` samples (items queued before are
 * simply not sampled): attaching takes seconds, more on a loaded machine.
 */
async function attached(...runs) {
  await until(
    () => runs.every((r) => SAMPLING_BEGAN.test(r.stderr) || r.child.exitCode !== null),
    () => `the profiles to begin sampling:\n${runs.map((r) => r.stderr).join('\n')}`,
  );
  for (const r of runs) assert.match(r.stderr, SAMPLING_BEGAN, `profile ended before sampling: ${r.stderr}`);
}

/** Polls `check` until it holds (or fails after 60 s with `explain()`). */
async function until(check, explain) {
  const deadline = Date.now() + 60000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${explain()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The service's item lines until {done}. */
async function itemsUntilDone(lines) {
  const items = [];
  for (;;) {
    const line = await lines.next('an item line');
    if (line.type === 'done') return items;
    items.push(line);
  }
}

const readJsonl = (file) =>
  fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

/** Tallies samples against the span they should carry (null: none). */
function tally() {
  const t = { right: 0, wrong: 0, missing: 0, wrongExamples: [] };
  t.add = (sample, expected) => {
    const got = sample.valid ? sample.span_id : null;
    if (got === expected || (expected instanceof Set && expected.has(got))) t.right++;
    else if (got === null) t.missing++;
    else {
      t.wrong++;
      if (t.wrongExamples.length < 5) t.wrongExamples.push({ sample, expected: expected instanceof Set ? [...expected] : expected });
    }
  };
  t.total = () => t.right + t.wrong + t.missing;
  return t;
}

function assertAccurate(name, t, minimum, diagnostic) {
  const total = t.total();
  diagnostic(`${name}: ${t.right}/${total} pool samples inside items carry the queuing span, ${t.wrong} a wrong one, ${t.missing} none`);
  assert.ok(total >= minimum, `${name}: only ${total} pool samples inside items (expected at least ${minimum})`);
  assert.ok(t.right / total >= 0.99, `${name}: ${t.right}/${total} pool samples carry the queuing span (missing ${t.missing}, wrong ${t.wrong})`);
  assert.ok(t.wrong / total <= 0.005, `${name}: ${t.wrong}/${total} pool samples carry a wrong span: ${JSON.stringify(t.wrongExamples)}`);
}

// With the probes: where work is submitted and where a pool thread starts
// it (every Node.js line; the default for the record schema).
test('threadpool work carries the span that queued it (--threadpool-probes)', { skip: skip ?? false, timeout: 240000 }, (t) =>
  checkAttribution(t, { atSampleTime: false }),
);

// The default where the target publishes the Node.js schema (frame mode):
// no probes; a pool thread's sample reads the span of the request it runs.
// A sample taken while a moving GC of the request's isolate hides it takes
// the span read after the GC, or from another sample of the same item.
test('pool samples read the running request\'s span at sample time (frame mode)', { skip: skip ?? false, timeout: 240000 }, (t) =>
  checkAttribution(t, { atSampleTime: true }),
);

async function checkAttribution(t, { atSampleTime }) {
  const addon = buildAddon();
  const service = await startService(addon);
  t.after(() => service.child.kill('SIGKILL'));
  if (atSampleTime && (service.mode !== 'frame' || !READS_AT_SAMPLE_TIME)) {
    t.skip(`the service publishes in ${service.mode} mode on Node ${process.version}`);
    return;
  }
  const out = path.join(tmp, 'pool.jsonl');
  const extra = atSampleTime ? [] : ['--threadpool-probes'];
  const run = profile(service.pid, ['--hz', String(HZ), '--off-cpu', '--format', 'jsonl', ...extra, '-o', out]);
  await attached(run);
  service.child.stdin.write('go\n');
  const items = await itemsUntilDone(service.lines);
  run.child.kill('SIGINT');
  const { code, stderr } = await run.done;
  assert.strictEqual(code, 0, stderr);
  assert.match(
    stderr,
    atSampleTime
      ? /threadpool: pool threads' samples carry the span of the request they run, read at sample time \(no probes/
      : /threadpool: work queued through libuv's pool follows its span/,
  );
  for (const line of stderr.match(/^threadpool: \d+ .*$/gm) ?? []) t.diagnostic(line);
  const samples = readJsonl(out);
  const addonItems = items.filter((i) => i.type === 'item');
  assert.ok(addonItems.length >= 8 * 6 + 4 * 6 + 2, `addon items: ${addonItems.length}`);
  assert.ok(addonItems.every((i) => i.status === 'ok'), JSON.stringify(addonItems.filter((i) => i.status !== 'ok')));
  // The pool threads: those that ran addon items (the cancel case's
  // blockers hold all of them at once), and those libuv names (1.50 and
  // later).
  const poolTids = new Set([...addonItems.map((i) => i.tid), ...service.namedPoolThreads]);
  assert.ok(poolTids.size >= 2 && poolTids.size <= POOL_SIZE, `pool threads: ${[...poolTids]}`);
  t.diagnostic(`pool threads: ${poolTids.size}`);
  const poolSamples = samples.filter((s) => poolTids.has(s.tid));
  const marked = samples.filter((s) => s.threadpool);
  assert.ok(
    marked.every((s) => poolTids.has(s.tid)),
    `threadpool samples off the pool threads: ${JSON.stringify(marked.filter((s) => !poolTids.has(s.tid)).slice(0, 3))}`,
  );

  // Addon items: exact truth (pool thread, start, end) per item, queued
  // from the main thread and a worker, finishing out of order.
  const exact = tally();
  const unattributed = tally();
  // A request read at sample time keeps the context it was made in (where
  // its callback runs): the addon item made outside any span and queued
  // again in '/after-cancel' runs without a span there; the probes give it
  // the span that queued it.
  const expected = (item) => (atSampleTime && item.source === 'after-cancel' ? null : item.spanId);
  for (const item of addonItems) {
    for (const s of poolSamples) {
      if (s.tid !== item.tid || s.t_ns < item.start || s.t_ns > item.end) continue;
      if (expected(item) === null) unattributed.add(s, null);
      else exact.add(s, expected(item));
    }
  }
  assertAccurate('addon items', exact, 100, (m) => t.diagnostic(m));
  const fromWorker = addonItems.filter((i) => i.source === 'worker').map((i) => i.spanId);
  assert.ok(
    poolSamples.some((s) => fromWorker.includes(s.span_id)),
    'no pool sample carries a span of work queued from the worker thread',
  );
  // The cancelled item never ran; its request, queued again outside any
  // span, ran without one, then in a new span with that span.
  const cancelled = items.find((i) => i.type === 'cancelled');
  assert.strictEqual(cancelled.status, 'cancelled');
  assert.ok(unattributed.total() >= 3, `samples of the item queued outside a span: ${unattributed.total()}`);
  assert.strictEqual(unattributed.wrong, 0, JSON.stringify(unattributed.wrongExamples));
  assert.ok(!poolSamples.some((s) => s.span_id === cancelled.spanId), 'a pool sample carries the cancelled span');

  // pbkdf2 and gzip (on CPU) and the FIFO reads (off CPU): the span must
  // be one whose item was in flight at the sample's time. On CPU in futex
  // is the pool's own queue lock and wait between items, not the work.
  // Each FIFO item waits in open, then in reads as the writer's parts come
  // (a read that finds the next part already there does not wait).
  const writer = items.find((i) => i.type === 'fifo-writer');
  assert.strictEqual(writer.waitingInOpen, 4, 'pool threads waiting in open(2) on the FIFOs before the writer opened them');
  const working = (s) => s.kind === 'cpu' && s.syscall !== 'futex';
  // The in-flight windows are the JavaScript side's (queued to callback), so
  // they also hold libuv's own steps on a pool thread outside the work
  // function, where no span is published (the probes, and the read at
  // sample time, cover the work function): taking the next item off the
  // queue, the completion's eventfd write (uv_async_send), the wait for
  // work (uv_cond_wait), each also on CPU on its way back from the kernel
  // (where the kernel stack no longer names the system call). The user
  // stack says where a sample is: in the worker loop itself, or in one of
  // libuv's own calls from it (uv_*; the work functions are uv__*, and
  // uv__queue_work leaves the stack by a tail call). A sample without a
  // span there is not a miss; a stack cut short (no worker loop) is scored.
  const inLibuvSteps = (s) => {
    const i = s.user_stack.indexOf(WORKER_LOOP);
    return i === 0 || (i > 0 && /^uv_[a-z]/.test(s.user_stack[i - 1]));
  };
  const afterTheWork = (s) => !s.valid && inLibuvSteps(s);
  for (const [kind, minimum, pick] of [
    ['pbkdf2', 30, working],
    ['gzip', 10, working],
    ['fifo', 2 * writer.waitingInOpen, (s) => s.kind === 'off_cpu' && ['read', 'openat', 'open'].includes(s.syscall)],
  ]) {
    const flights = items.filter((i) => i.type === 'in-flight' && i.kind === kind);
    assert.ok(flights.length >= 4, `${kind}: ${flights.length} calls`);
    const from = Math.min(...flights.map((f) => f.queued));
    const to = Math.max(...flights.map((f) => f.finished));
    const score = tally();
    let afterWork = 0;
    for (const s of poolSamples) {
      if (!pick(s) || s.t_ns < from || s.t_ns > to) continue;
      if (kind !== 'fifo' && afterTheWork(s)) {
        afterWork++;
        continue;
      }
      score.add(s, new Set(flights.filter((f) => f.queued <= s.t_ns && s.t_ns <= f.finished).map((f) => f.spanId)));
    }
    t.diagnostic(`${kind}: ${afterWork} samples in libuv's steps outside the work function, without a span`);
    assert.ok(afterWork <= 0.02 * score.total(), `${kind}: ${afterWork} samples outside the work function, of ${score.total()}`);
    assertAccurate(kind, score, minimum, (m) => t.diagnostic(m));
  }

  // Between items a pool thread waits for work (futex): no span. (Inside
  // pbkdf2 a pool thread may wait on OpenSSL's locks: those phases are
  // left out.)
  const phases = items
    .filter((i) => i.type === 'in-flight')
    .map((i) => [i.queued, i.finished]);
  const inItem = (s) =>
    phases.some(([a, b]) => a <= s.t_ns && s.t_ns <= b) ||
    addonItems.some((i) => i.tid === s.tid && i.start <= s.t_ns && s.t_ns <= i.end);
  const idle = poolSamples.filter((s) => s.kind === 'off_cpu' && s.syscall === 'futex' && !inItem(s));
  assert.ok(idle.length >= 10, `pool-thread waits for work: ${idle.length}`);
  const idleWithSpan = idle.filter((s) => s.valid);
  assert.strictEqual(idleWithSpan.length, 0, JSON.stringify(idleWithSpan.slice(0, 3)));
  t.diagnostic(`between items: ${idle.length} pool-thread waits for work, ${idleWithSpan.length} with a span`);
  const summary = atSampleTime
    ? stderr.match(/threadpool: ()()(\d+) samples? of pool threads carry the span of the request they run/)
    : stderr.match(/threadpool: (\d+) work items? queued in a span, (\d+) begun on a pool thread with it; (\d+) samples?/);
  assert.ok(summary, stderr);
  assert.strictEqual(Number(summary[3]), marked.length);
}

// Items that end inside a moving GC of the isolate that queued them: every
// sample of theirs was taken with the gate closed, and the item no longer
// runs once the gate opens; its request waits for the loop thread (held
// back by the pause), and is read then.
test('pool samples of items that end inside a GC pause take the span read after it (frame mode)', { skip: skip ?? false, timeout: 240000 }, async (t) => {
  const service = await startService(buildAddon(), ['--expose-gc']);
  t.after(() => service.child.kill('SIGKILL'));
  if (service.mode !== 'frame' || !READS_AT_SAMPLE_TIME) {
    t.skip(`the service publishes in ${service.mode} mode on Node ${process.version}`);
    return;
  }
  const out = path.join(tmp, 'gc.jsonl');
  const run = profile(service.pid, ['--hz', String(HZ), '--format', 'jsonl', '-o', out]);
  await attached(run);
  service.child.stdin.write('go gc\n');
  const items = await itemsUntilDone(service.lines);
  run.child.kill('SIGINT');
  const { code, stderr } = await run.done;
  assert.strictEqual(code, 0, stderr);
  const samples = readJsonl(out);
  const inPause = items.filter((i) => i.end < i.gcEnd);
  t.diagnostic(`${inPause.length} of ${items.length} items ended inside the pause (${items.map((i) => ((i.gcEnd - i.gcStart) / 1e6).toFixed(1)).join(', ')} ms)`);
  assert.ok(inPause.length >= items.length / 2, 'too few items ended inside a GC pause to test the case');
  const score = tally();
  for (const item of inPause) {
    for (const s of samples) if (s.tid === item.tid && item.start <= s.t_ns && s.t_ns <= item.end) score.add(s, item.spanId);
  }
  assertAccurate('items that ended inside a GC pause', score, 10, (m) => t.diagnostic(m));
  const [, filled, unread] = stderr.match(/\((\d+) of the (\d+) taken while a GC kept it unreadable/) ?? [];
  t.diagnostic(`samples a GC hid: ${filled} of ${unread} given their item's span`);
  assert.ok(Number(unread) >= 10 && Number(filled) === Number(unread), stderr);
});

test('pprof and folded outputs mark pool samples; --no-threadpool turns it off', { skip: skip ?? false, timeout: 240000 }, async (t) => {
  const addon = buildAddon();
  const service = await startService(addon);
  t.after(() => service.child.kill('SIGKILL'));
  const pprof = path.join(tmp, 'pool.pb.gz');
  const folded = path.join(tmp, 'pool.folded');
  const off = path.join(tmp, 'off.jsonl');
  const runs = [
    profile(service.pid, ['--hz', String(HZ), '-o', pprof]),
    // Every trace's file, however few its samples: the first item's is read below.
    profile(service.pid, ['--hz', String(HZ), '--format', 'folded', '--group-by', 'thread', '--min-trace-samples', '1', '-o', folded]),
    profile(service.pid, ['--hz', String(HZ), '--format', 'jsonl', '--no-threadpool', '-o', off]),
  ];
  await attached(...runs);
  service.child.stdin.write('go pbkdf2\n');
  const flights = (await itemsUntilDone(service.lines)).filter((i) => i.kind === 'pbkdf2');
  const spans = new Set(flights.map((f) => f.spanId));
  for (const r of runs) r.child.kill('SIGINT');
  const [p, f, o] = await Promise.all(runs.map((r) => r.done));
  for (const r of [p, f, o]) assert.strictEqual(r.code, 0, r.stderr);

  // --no-threadpool: no sample marked, and the summary says so.
  assert.match(o.stderr, /threadpool: not attributed \(--no-threadpool\)/);
  assert.ok(!readJsonl(off).some((s) => s.threadpool), 'a sample is marked threadpool with --no-threadpool');

  // Folded: pool CPU under its span, marked [threadpool].
  const lines = fs.readFileSync(folded, 'utf8').split('\n').filter(Boolean);
  const pool = lines.filter((l) => l.split(';')[2] === '[threadpool]');
  assert.ok(pool.length > 0, lines.slice(0, 5).join('\n'));
  const spanOf = (l) => l.split(';')[1].match(/\(([0-9a-f]{16})\)$/)?.[1];
  assert.ok(pool.every((l) => spans.has(spanOf(l))), pool.filter((l) => !spans.has(spanOf(l))).join('\n'));
  // Per-trace files hold the pool thread's CPU.
  const traceFile = path.join(tmp, `pool.${flights[0].traceId}.folded`);
  const traceLines = fs.readFileSync(traceFile, 'utf8').split('\n').filter(Boolean);
  assert.ok(
    traceLines.some((l) => l.startsWith(`/pbkdf2 (${flights[0].spanId});[threadpool];`)),
    traceLines.slice(0, 5).join('\n'),
  );

  // pprof, read by go tool pprof: thread.pool labels on the pool samples, with the queuing span.
  const go = ['go', '/usr/local/go/bin/go'].find((g) => spawnSync(g, ['version']).status === 0);
  if (!go) return t.diagnostic('go is not installed: pprof not read back');
  const raw = spawnSync(go, ['tool', 'pprof', '-raw', pprof], { encoding: 'utf8', maxBuffer: 1 << 28 });
  assert.strictEqual(raw.status, 0, raw.stderr);
  const labelled = raw.stdout.split('\n').filter((l) => l.includes('thread.pool:[true]'));
  assert.ok(labelled.length > 0, raw.stdout.slice(0, 3000));
  for (const l of labelled) assert.ok(spans.has(l.match(/span_id:\[([0-9a-f]+)\]/)?.[1]), l);
});

// The agent reads pool threads at sample time too, in frame mode: its
// exports' pool samples link to the spans whose pbkdf2 calls they run.
test('agent: pool samples carry the span of the request they run (frame mode)', { skip: skip ?? false, timeout: 240000 }, async (t) => {
  const service = await startService(buildAddon());
  t.after(() => service.child.kill('SIGKILL'));
  if (service.mode !== 'frame' || !READS_AT_SAMPLE_TIME) {
    t.skip(`the service publishes in ${service.mode} mode on Node ${process.version}`);
    return;
  }
  const dir = path.join(tmp, 'agent-out');
  const agent = spawn(READER, ['agent', '--pid', String(service.pid), '--hz', String(HZ), '--interval', '1', '--output-dir', dir], {
    cwd: tmp,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  t.after(() => agent.kill('SIGKILL'));
  let log = '';
  agent.stderr.on('data', (d) => (log += d));
  // Logged once the process is one of the program's targets: its samples flow from here.
  await until(() => /threadpool: pool threads' samples read the request they run/.test(log), () => `the agent's pool note:\n${log}`);
  service.child.stdin.write('go pbkdf2\n');
  const flights = (await itemsUntilDone(service.lines)).filter((i) => i.kind === 'pbkdf2');
  const spans = new Set(flights.map((f) => f.spanId));
  // The export after the calls holds their samples.
  await new Promise((r) => setTimeout(r, 2500));
  agent.kill('SIGTERM');
  assert.strictEqual(await exited(agent, 30000), 0, log);
  const Request = require('protobufjs')
    .loadSync(path.join(__dirname, 'fixtures', 'profiles.proto'))
    .lookupType('otlp.profiles.test.ExportProfilesServiceRequest');
  let pool = 0;
  const linked = new Set();
  for (const name of fs.readdirSync(dir).filter((n) => n.endsWith('.otlp.pb'))) {
    const msg = Request.toObject(Request.decode(fs.readFileSync(path.join(dir, name))), { longs: Number, bytes: Buffer, defaults: false });
    const dict = msg.dictionary;
    const str = (i) => dict.stringTable[i ?? 0];
    for (const rp of msg.resourceProfiles ?? []) {
      for (const profile of rp.scopeProfiles[0].profiles) {
        for (const sample of profile.samples ?? []) {
          const attrs = (sample.attributeIndices ?? []).map((i) => dict.attributeTable[i]);
          if (!attrs.some((kv) => str(kv.keyStrindex) === 'thread.pool')) continue;
          pool++;
          const link = sample.linkIndex ? dict.linkTable[sample.linkIndex] : null;
          assert.ok(link, 'a pool sample without a span');
          const spanId = link.spanId.toString('hex');
          assert.ok(spans.has(spanId), `a pool sample links to ${spanId}, not a pbkdf2 span`);
          linked.add(spanId);
        }
      }
    }
  }
  t.diagnostic(`agent: ${pool} pool samples, linked to ${linked.size} of the ${spans.size} pbkdf2 spans`);
  assert.ok(pool >= 20, `only ${pool} pool samples in the agent's exports`);
  assert.ok(linked.size >= spans.size / 2, `pool samples link to ${linked.size} of ${spans.size} spans`);
});

test('a process that exits mid-item ends the profile cleanly', { skip: skip ?? false, timeout: 120000 }, async (t) => {
  const service = await startService(buildAddon());
  t.after(() => service.child.kill('SIGKILL'));
  const out = path.join(tmp, 'exit.jsonl');
  const run = profile(service.pid, ['--off-cpu', '--format', 'jsonl', '-o', out]);
  await attached(run);
  service.child.stdin.write('exit\n');
  await exited(service.child, 30000);
  const { code, stderr } = await run.done;
  assert.strictEqual(code, 0, stderr);
  assert.match(stderr, new RegExp(`pid ${service.pid} exited`));
  const pool = readJsonl(out).filter((s) => s.threadpool);
  assert.ok(pool.length > 0, 'no pool sample of the item running at exit');
  const spanIds = new Set(pool.map((s) => s.span_id));
  assert.strictEqual(spanIds.size, 1, `pool samples carry several spans: ${[...spanIds]}`);
});
