'use strict';
// `otel-thread-ctx profile` against a live Node service (main thread and a
// worker, each in known spans; see fixtures/profiled-service.js), read back
// with readers written elsewhere: `go tool pprof` for pprof, protobufjs with
// an independent .proto for OTLP (from a file and from an OTLP/HTTP receiver
// started here). Needs root (BPF) and a reader built with its BPF program;
// skips with the reason otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const protobuf = require('protobufjs');
const { jsonLines, exited, profileUnavailable, scratchDir, goTool, rawSamples } = require('./helpers');

const READER = require('../js/native').readerPath();
const SERVICE = path.join(__dirname, 'fixtures', 'profiled-service.js');


const skip = profileUnavailable(READER);
const tmp = scratchDir('otel-thread-ctx-profile-');
let service = null;
let ids = null;

/** The line profile writes once its samplers are attached and the target's samples flow. */
const SAMPLING_BEGAN = /^otel-thread-ctx: sampling pid \d+ at \d+ Hz for up to \d+ s; SIGINT \(Ctrl-C\) ends it early$/m;

/** A capability set (CapEff, CapPrm, ...) from a status text. */
const capabilitySet = (status, set) => BigInt(`0x${new RegExp(`^${set}:\\s*([0-9a-f]+)`, 'm').exec(status)[1]}`);

/**
 * Runs profile; `onSampling(child)` is called once it says sampling began,
 * and SIGINT sent `signalAfterMs` later.
 */
function profile(args, { signalAfterMs = null, onSampling = null } = {}) {
  return new Promise((resolve) => {
    const child = spawn(READER, ['profile', '--pid', String(ids.pid), ...args], { cwd: tmp, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    let signalled = false;
    child.stderr.on('data', (d) => {
      stderr += d;
      // Counted from the moment sampling began: attaching takes seconds on a loaded machine.
      if (!signalled && SAMPLING_BEGAN.test(stderr)) {
        signalled = true;
        onSampling?.(child);
        if (signalAfterMs !== null) setTimeout(() => child.kill('SIGINT'), signalAfterMs);
      }
    });
    child.stdout.resume();
    child.on('exit', (code, signal) => resolve({ code, signal, stderr }));
  });
}

const sum = (list, f) => list.reduce((a, s) => a + f(s), 0);

test('profile', { skip: skip ?? false }, async (t) => {
  service = spawn(process.execPath, ['--perf-basic-prof', SERVICE], { cwd: tmp, stdio: ['ignore', 'pipe', 'inherit'] });
  ids = JSON.parse(JSON.stringify(await jsonLines(service.stdout).next('the service line')));
  t.after(async () => {
    service.kill('SIGKILL');
    await exited(service);
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.rmSync(`/tmp/perf-${ids.pid}.map`, { force: true });
  });
  const { main, worker } = ids;

  await t.test('pprof: on- and off-CPU samples carry the span, route and thread they ran in', async (t) => {
    const out = path.join(tmp, 'run.pb.gz');
    const r = await profile(['--duration', '3', '--off-cpu=all', '-o', out]);
    assert.strictEqual(r.code, 0, r.stderr);
    assert.match(r.stderr, /JavaScript frames named from \/tmp\/perf-\d+\.map/);
    const go = goTool();
    if (!go) return t.skip('no Go toolchain: go tool pprof cannot read the profile');
    const raw = spawnSync(go, ['tool', 'pprof', '-raw', out], { encoding: 'utf8' });
    assert.strictEqual(raw.status, 0, raw.stderr);
    const { samples, locations } = rawSamples(raw.stdout);
    // CPU is the first sample type and the one a viewer opens on.
    assert.match(raw.stdout, /Samples:\n\s*cpu\/nanoseconds\[dflt\]\s+samples\/count\s+off_cpu\/nanoseconds\n/);
    const onCpu = samples.filter((s) => s.values.samples > 0);
    const offCpu = samples.filter((s) => s.values.off_cpu > 0);
    // Every on-CPU sample of a span ran on the thread that owns the span,
    // with its route; there are samples of both threads' CPU spans.
    const bySpan = (spanId) => onCpu.filter((s) => s.labels.span_id === spanId);
    for (const [span, tid] of [[main.cpu, main.tid], [worker.span, worker.tid]]) {
      const own = bySpan(span.spanId);
      assert.ok(sum(own, (s) => s.values.samples) >= 5, `few samples of ${span.name}: ${JSON.stringify(own)}`);
      for (const s of own) {
        assert.strictEqual(s.labels['thread.id'], String(tid));
        assert.strictEqual(s.labels.trace_id, span.traceId);
        assert.strictEqual(s.labels['http.route'], span.route);
        assert.strictEqual(s.labels.trace_endpoint, span.route);
        assert.strictEqual(s.labels.span_name, span.name);
        // Each of these spans is the first of its trace in the process.
        assert.strictEqual(s.labels.local_root_span_id, span.spanId);
        assert.strictEqual(s.labels.state, 'running');
      }
    }
    assert.ok(onCpu.every((s) => s.values.cpu === s.values.samples * onCpu[0].values.cpu / onCpu[0].values.samples));
    // Off CPU: the Atomics.wait in span "wait" is blocked time on that span,
    // on the main thread; waits without a span are idle, never a span.
    const blocked = offCpu.filter((s) => s.labels.span_id === main.wait.spanId);
    assert.ok(sum(blocked, (s) => s.values.off_cpu) > 0.3e9, `blocked in wait: ${JSON.stringify(blocked)}`);
    for (const s of blocked) {
      assert.strictEqual(s.labels.state, 'blocked');
      assert.strictEqual(s.labels['thread.id'], String(main.tid));
      assert.strictEqual(s.labels['http.route'], '/main/wait');
    }
    const idle = offCpu.filter((s) => s.labels.state === 'idle');
    assert.ok(idle.length > 0);
    assert.ok(idle.every((s) => s.labels.span_id === undefined && s.labels.trace_id === undefined));
    // JS frames named from the perf map, native ones from ELF symbols.
    assert.ok(locations.some((l) => /spinCpu .*profiled-service\.js/.test(l)), 'no spinCpu frame');
    assert.ok(locations.some((l) => /uv_run/.test(l)), 'no uv_run frame');
    const tags = spawnSync(go, ['tool', 'pprof', '-tags', out], { encoding: 'utf8' });
    assert.match(tags.stdout, /http\.route/);
    assert.match(tags.stdout, new RegExp(main.wait.spanId));
  });

  await t.test('pprof with --off-cpu: the idle waits of helper threads and event loops are left out', async (t) => {
    const out = path.join(tmp, 'spans.pb.gz');
    const r = await profile(['--duration', '2', '--off-cpu', '-o', out]);
    assert.strictEqual(r.code, 0, r.stderr);
    assert.match(r.stderr, /left out [\d.]+ s of idle waits/);
    const go = goTool();
    if (!go) return t.skip('no Go toolchain: go tool pprof cannot read the profile');
    const raw = spawnSync(go, ['tool', 'pprof', '-raw', out], { encoding: 'utf8' });
    assert.strictEqual(raw.status, 0, raw.stderr);
    const offCpu = rawSamples(raw.stdout).samples.filter((s) => s.values.off_cpu > 0);
    assert.ok(offCpu.some((s) => s.labels.span_id === main.wait.spanId), 'the wait in a span is kept');
    for (const s of offCpu) {
      assert.ok([String(main.tid), String(worker.tid)].includes(s.labels['thread.id']), `a thread without spans: ${JSON.stringify(s)}`);
    }
  });

  await t.test('otlp: the file and the receiver get the Resource, links and thread attributes', async () => {
    const root = protobuf.loadSync(path.join(__dirname, 'fixtures', 'profiles.proto'));
    const Request = root.lookupType('otlp.profiles.test.ExportProfilesServiceRequest');
    const received = [];
    const receiver = http.createServer((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        received.push({ url: req.url, type: req.headers['content-type'], body: Buffer.concat(chunks) });
        res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
      });
    });
    await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    const out = path.join(tmp, 'run.otlp.pb');
    const r = await profile(['--duration', '2', '--format', 'otlp', '-o', out, '--otlp-endpoint', `http://127.0.0.1:${receiver.address().port}`]);
    receiver.close();
    assert.strictEqual(r.code, 0, r.stderr);
    assert.strictEqual(received.length, 1);
    assert.strictEqual(received[0].url, '/v1development/profiles');
    assert.strictEqual(received[0].type, 'application/x-protobuf');
    // ProfilesData and the request share their fields: the file decodes the same.
    for (const bytes of [received[0].body, fs.readFileSync(out)]) {
      const msg = Request.toObject(Request.decode(bytes), { longs: Number, bytes: Buffer });
      const dict = msg.dictionary;
      const str = (i) => dict.stringTable[i ?? 0];
      assert.strictEqual(str(0), '');
      const rp = msg.resourceProfiles[0];
      const resource = Object.fromEntries(rp.resource.attributes.map((kv) => [kv.key, kv.value.stringValue ?? kv.value.intValue]));
      assert.strictEqual(resource['service.name'], 'profiled-service');
      const [cpu] = rp.scopeProfiles[0].profiles;
      assert.strictEqual(str(cpu.sampleType.typeStrindex), 'cpu');
      const attrs = (s) => Object.fromEntries((s.attributeIndices ?? []).map((i) => {
        const kv = dict.attributeTable[i];
        return [str(kv.keyStrindex), kv.value.stringValue ?? kv.value.intValue];
      }));
      const linked = cpu.samples.filter((s) => s.linkIndex);
      assert.ok(linked.length > 0);
      for (const s of linked) {
        const link = dict.linkTable[s.linkIndex];
        const spanId = link.spanId.toString('hex');
        const span = [main.cpu, main.wait, worker.span].find((x) => x.spanId === spanId);
        assert.ok(span, `link to an unknown span ${spanId}`);
        assert.strictEqual(link.traceId.toString('hex'), span.traceId);
        assert.strictEqual(attrs(s)['http.route'], span.route);
        assert.strictEqual(attrs(s)['span.name'], span.name);
        assert.strictEqual(attrs(s)['local_root.span_id'], span.spanId);
        assert.strictEqual(attrs(s)['thread.id'], span === worker.span ? worker.tid : main.tid);
        assert.strictEqual(s.values.length, s.timestampsUnixNano.length);
      }
      assert.ok(linked.some((s) => dict.linkTable[s.linkIndex].spanId.toString('hex') === worker.span.spanId));
      // The zero Link: no field set (not 16 and 8 zero bytes).
      assert.ok(!dict.linkTable[0].traceId?.length && !dict.linkTable[0].spanId?.length, 'link_table[0] is not empty');
    }
    // The profiling SIG's conformance rules, as `check-otlp` applies them.
    const check = spawnSync(READER, ['check-otlp', out], { encoding: 'utf8' });
    assert.strictEqual(check.status, 0, check.stdout + check.stderr);
    assert.match(check.stdout, /: conformant$/m);
  });

  await t.test('svg on SIGINT: whole-run and per-trace flame graphs are written; sampling holds five capabilities', async () => {
    const out = path.join(tmp, 'run.svg');
    let status = null;
    const r = await profile(['--duration', '60', '--format', 'svg', '--group-by', 'thread', '-o', out], {
      signalAfterMs: 2000,
      onSampling: (child) => {
        status = fs.readFileSync(`/proc/${child.pid}/status`, 'utf8');
      },
    });
    assert.strictEqual(r.code, 0, r.stderr);
    // Once attached (run as root): CAP_BPF, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH,
    // CAP_SYSLOG and CAP_DAC_OVERRIDE (to write its outputs), nothing more, for good.
    const kept = (1n << 39n) | (1n << 19n) | (1n << 2n) | (1n << 34n) | (1n << 1n);
    assert.strictEqual(capabilitySet(status, 'CapEff'), kept, status);
    assert.strictEqual(capabilitySet(status, 'CapPrm'), kept, status);
    assert.strictEqual(capabilitySet(status, 'CapBnd') & ~kept, 0n, status);
    assert.match(status, /^NoNewPrivs:\s*1$/m);
    assert.match(r.stderr, /ended by signal 2/);
    const whole = fs.readFileSync(out, 'utf8');
    assert.match(whole, /<svg/);
    assert.match(whole, /pid \d+: CPU by thread and span/);
    assert.match(whole, new RegExp(`<title>cpu \\(${main.cpu.spanId}\\) `));
    const perTrace = fs.readFileSync(path.join(tmp, `run.${worker.span.traceId}.svg`), 'utf8');
    assert.match(perTrace, new RegExp(`worker /worker/cpu \\(trace ${worker.span.traceId}\\)`));
    assert.match(perTrace, new RegExp(`<title>worker \\(${worker.span.spanId}\\) `));
  });

  await t.test('folded: a target that exits ends the profile normally', async () => {
    const out = path.join(tmp, 'run.folded');
    const running = profile(['--duration', '60', '--format', 'folded', '--group-by', 'thread', '-o', out]);
    // Time to attach and take samples on a loaded machine (profile reports
    // only at its end), then the target dies mid-run.
    await new Promise((resolve) => setTimeout(resolve, 4000));
    service.kill('SIGKILL');
    const r = await running;
    assert.strictEqual(r.code, 0, r.stderr);
    assert.match(r.stderr, new RegExp(`pid ${ids.pid} exited after`));
    const lines = fs.readFileSync(out, 'utf8').trim().split('\n');
    assert.ok(lines.some((l) => l.includes(`;worker (${worker.span.spanId});`)), lines.slice(0, 5).join('\n'));
    assert.ok(lines.every((l) => /^[^;]+ \(\d+\);/.test(l) && / \d+$/.test(l)));
  });
});

test('profile without privileges or target says why', { skip: READER === null ? 'the reader is not built' : false }, () => {
  const r = spawnSync(READER, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  assert.strictEqual(r.status, 2);
  assert.match(r.stderr, /no kernel sampler|run as root, or grant CAP_BPF and CAP_PERFMON \(missing: CAP_[A-Z_, ]+\)|no such process/);
});

/**
 * Why running the reader as another user with file capabilities cannot be
 * tried here, or null: it takes root, setpriv and setcap.
 */
function capabilityTrialUnavailable() {
  if (READER === null) return 'the reader is not built';
  if (process.getuid() !== 0) return 'not root: cannot run the reader as another user';
  // A build without the BPF program says so before it looks at capabilities.
  const sampler = profileUnavailable(READER);
  if (sampler !== null) return sampler;
  for (const tool of ['setpriv', 'setcap']) {
    const r = spawnSync(tool, ['--version'], { encoding: 'utf8' });
    if (r.error) return `${tool} is not installed`;
  }
  return null;
}

test('without the capabilities they need, profile and agent say which are missing', { skip: capabilityTrialUnavailable() ?? false }, () => {
  // A copy of the reader other users may run, given capabilities by file.
  const dir = scratchDir('otel-thread-ctx-caps-');
  // Writable by the user it runs as: what is refused must be the capabilities, not the output.
  fs.chmodSync(dir, 0o777);
  const binary = path.join(dir, 'otel-thread-ctx');
  fs.copyFileSync(READER, binary);
  fs.chmodSync(binary, 0o755);
  const asNobody = (args) =>
    spawnSync('setpriv', ['--reuid=nobody', '--regid=nogroup', '--clear-groups', binary, ...args], { encoding: 'utf8', cwd: dir });
  const target = spawn('sleep', ['60'], { stdio: 'ignore' });
  try {
    // No capability at all: both commands name the two sampling needs, and neither names the other.
    const profile = asNobody(['profile', '--pid', String(target.pid), '--duration', '1', '-o', path.join(dir, 'p.folded')]);
    assert.strictEqual(profile.status, 2, profile.stderr);
    assert.match(profile.stderr, /run as root, or grant CAP_BPF and CAP_PERFMON \(missing: CAP_BPF, CAP_PERFMON\)/);
    assert.match(profile.stderr, /CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH/);
    const agent = asNobody(['agent', '--output-dir', path.join(dir, 'agent')]);
    assert.strictEqual(agent.status, 2, agent.stderr);
    assert.match(agent.stderr, /\(missing: CAP_BPF, CAP_PERFMON\)/);
    assert.doesNotMatch(agent.stderr, /\bprofile\b/, 'the agent\'s error names another command');

    // Sampling capabilities only: reading a process of another user (root's
    // sleep) names the two it also takes.
    const setcap = spawnSync('setcap', ['cap_bpf,cap_perfmon+ep', binary], { encoding: 'utf8' });
    assert.strictEqual(setcap.status, 0, setcap.stderr);
    const partial = asNobody(['profile', '--pid', String(target.pid), '--duration', '1', '-o', path.join(dir, 'p.folded')]);
    assert.notStrictEqual(partial.status, 0, partial.stderr);
    assert.match(partial.stderr, new RegExp(`permission denied reading the memory of ${target.pid} .*grant CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH`));
  } finally {
    target.kill();
  }
});

test('profile checks every output path before it samples', { skip: READER === null ? 'the reader is not built' : false }, async (t) => {
  const target = spawn('sleep', ['60'], { stdio: 'ignore' });
  t.after(async () => {
    target.kill('SIGKILL');
    await exited(target);
  });
  const dir = scratchDir('otel-thread-ctx-outputs-');
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  // The whole-run file's directory is missing; the per-trace files' names
  // (the whole-run name with a trace id added) are too long.
  const cases = [
    { args: ['-o', '/nonexistent/dir/x.pb.gz'], path: '/nonexistent/dir/x.pb.gz', why: /No such file or directory/ },
    { args: ['--format', 'svg', '-o', path.join(dir, `${'a'.repeat(240)}.svg`)], path: `${'a'.repeat(240)}.${'0'.repeat(32)}.svg`, why: /File name too long/ },
  ];
  for (const c of cases) {
    const started = Date.now();
    const r = spawnSync(READER, ['profile', '--pid', String(target.pid), '--duration', '30', ...c.args], { encoding: 'utf8', timeout: 25000 });
    const took = Date.now() - started;
    assert.strictEqual(r.status, 2, r.stderr);
    assert.ok(took < 10000, `failed after ${took} ms, not before sampling`);
    assert.ok(r.stderr.includes(c.path), r.stderr);
    assert.match(r.stderr, c.why);
    assert.match(r.stderr, /nothing was sampled/);
  }
  assert.deepStrictEqual(fs.readdirSync(dir), []);
});

test('profile of a process that publishes no thread context says so before it samples', { skip: skip ?? false }, async (t) => {
  const target = spawn('sleep', ['60'], { stdio: 'ignore' });
  t.after(async () => {
    target.kill('SIGKILL');
    await exited(target);
  });
  // Until it has executed sleep, the child is a copy of this process.
  while (fs.readFileSync(`/proc/${target.pid}/comm`, 'utf8') !== 'sleep\n') await new Promise((resolve) => setTimeout(resolve, 5));
  const r = spawnSync(READER, ['profile', '--pid', String(target.pid), '--duration', '1', '--format', 'top'], { encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stderr);
  const lines = r.stderr.split('\n');
  assert.match(lines[0], new RegExp(`^otel-thread-ctx: pid ${target.pid} publishes no thread context: .*otel_thread_ctx_v1.*otel_thread_ctx_nodejs_v1.*no sample will carry a trace or span$`));
});
