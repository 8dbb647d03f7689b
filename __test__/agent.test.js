'use strict';
// `otel-thread-ctx agent` against live Node services (main thread and a
// worker each, in known spans; fixtures/profiled-service.js), one in record
// mode and one in the default mode (frame mode where the Node line has it),
// started before and after the agent. Read back with readers written
// elsewhere: protobufjs with an independent .proto for the --output-dir
// files, and a real OpenTelemetry Collector (built with the Collector
// builder, tools/collector.js) for OTLP/gRPC and OTLP/HTTP, whose own
// exporter forwards what it accepted to a receiver started here. Needs root
// (BPF) and a reader built with its BPF program; the Collector parts need
// Go. Skips with the reason otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { exited, profileUnavailable, scratchDir } = require('./helpers');
const { collectorBinary, startCollector } = require('../tools/collector');

const shared = require('./agent-helpers');

const { READER, until, describe, withoutExporterEnv, byProcess, merge, readNewFiles, complete, assertComplete } = shared;

// The agent needs what profile needs.
const skip = profileUnavailable(READER);
const tmp = scratchDir('otel-thread-ctx-agent-');

/** A service in `mode` (undefined: the default) named `name`; resolves with its ids once both threads run. */
const startService = (t, name, mode) => shared.startService(t, tmp, name, mode);

/** Starts the agent; `waitFor(re)` resolves with the first log line matching `re`. */
const startAgent = (t, args, env) => shared.startAgent(t, tmp, args, env);

/** A TCP port free right now on 127.0.0.1. */
function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** A thread's capability set `set` (CapEff, CapPrm, ...) from its status text. */
const capabilitySet = (status, set) => BigInt(`0x${new RegExp(`^${set}:\\s*([0-9a-f]+)`, 'm').exec(status)[1]}`);

/** What the agent keeps once its programs are attached: CAP_BPF, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYSLOG. */
const kept = (1n << 39n) | (1n << 19n) | (1n << 2n) | (1n << 34n);

// Frame mode where this Node line has it (24 and later by default), record mode elsewhere.
const DEFAULT_MODE_LABEL = Number(process.versions.node.split('.')[0]) >= 24 ? 'frame' : 'record';

test('agent: --output-dir, processes started before and after it, exits noticed', { skip: skip ?? false }, async (t) => {
  const before = await startService(t, 'agent-before', 'record');
  const dir = path.join(tmp, 'out');
  const agent = startAgent(t, ['--interval', '1', '--off-cpu', '--output-dir', dir, '--output-max-mib', '64']);
  await agent.waitFor(new RegExp(`profiling pid ${before.ids.pid} `), 'the service started before it');
  const after = await startService(t, `agent-after-${DEFAULT_MODE_LABEL}`, undefined);
  await agent.waitFor(new RegExp(`profiling pid ${after.ids.pid} `), 'the service started after it');
  const read = new Set();
  const seen = new Map();
  await until('both services whole in the files', () => complete(readNewFiles(dir, read, seen), before) && complete(seen, after), {
    explain: () => describe(seen),
  });
  assertComplete(seen, before);
  assertComplete(seen, after);
  assert.deepStrictEqual(seen.get(before.ids.pid).types.sort(), ['cpu', 'off_cpu']);
  // Once its programs were attached, every thread of the agent holds
  // CAP_BPF, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG at most (all four,
  // run as root), and none can regain more.
  for (const tid of fs.readdirSync(`/proc/${agent.child.pid}/task`)) {
    const status = fs.readFileSync(`/proc/${agent.child.pid}/task/${tid}/status`, 'utf8');
    for (const set of ['CapEff', 'CapPrm', 'CapBnd']) {
      const caps = capabilitySet(status, set);
      assert.strictEqual(caps & ~kept, 0n, `thread ${tid}: ${set} ${caps.toString(16)}`);
      if (set === 'CapEff') assert.strictEqual(caps, kept, `thread ${tid}: ${set} ${caps.toString(16)}`);
    }
    assert.match(status, /^NoNewPrivs:\s*1$/m, `thread ${tid}`);
  }
  // An exit is noticed, and the agent goes on.
  after.child.kill('SIGKILL');
  await agent.waitFor(new RegExp(`pid ${after.ids.pid} exited`), 'the exit of the later service');
  const { code, log } = await agent.stop();
  assert.strictEqual(code, 0, log);
  assert.match(log, /ended by signal 15/);
  assert.match(log, /profiled \d+ process(?:es)?: \d+ samples? /);
  // Every file the agent wrote passes the conformance rules.
  const files = fs.readdirSync(dir).filter((n) => n.endsWith('.otlp.pb')).map((n) => path.join(dir, n));
  assert.ok(files.length >= 2, `only ${files.length} files`);
  const check = spawnSync(READER, ['check-otlp', ...files], { encoding: 'utf8' });
  assert.strictEqual(check.status, 0, check.stdout + check.stderr);
  assert.strictEqual(check.stdout.trim().split('\n').length, files.length);
});

test('agent: OTLP/gRPC and OTLP/HTTP to a real Collector, which goes away and comes back', { skip: skip ?? false, timeout: 900000 }, async (t) => {
  const got = collectorBinary();
  if (got.reason) return t.skip(got.reason);
  // What the Collector exports: decoded as it arrives, with its arrival time.
  const received = [];
  const sink = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/v1development/profiles') received.push({ at: Date.now(), seen: byProcess(Buffer.concat(chunks)) });
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  await new Promise((resolve) => sink.listen(0, '127.0.0.1', resolve));
  t.after(() => sink.close());
  const ports = { grpcPort: await freePort(), httpPort: await freePort() };
  const options = { ...ports, sinkUrl: `http://127.0.0.1:${sink.address().port}`, dir: tmp };
  let collector = await startCollector(got.binary, options);
  t.after(() => collector.stop());
  const seenSince = (since) => received.filter((r) => r.at >= since).reduce((all, r) => merge(all, r.seen), new Map());

  const record = await startService(t, 'agent-grpc-record', 'record');
  const other = await startService(t, `agent-grpc-${DEFAULT_MODE_LABEL}`, undefined);
  const agent = startAgent(t, ['--interval', '1', '--otlp-endpoint', `grpc://127.0.0.1:${ports.grpcPort}`, '--pid', String(record.ids.pid), '--pid', String(other.ids.pid)]);
  await until('both services whole through the Collector over gRPC', () => complete(seenSince(0), record) && complete(seenSince(0), other), {
    explain: () => describe(seenSince(0)),
  });
  assertComplete(seenSince(0), record);
  assertComplete(seenSince(0), other);

  await t.test('the Collector goes away and comes back: the agent keeps sampling and resumes', async () => {
    await collector.stop();
    await agent.waitFor(/exporter: .*failed attempts?/, 'a failed export');
    assert.strictEqual(agent.child.exitCode, null, 'the agent is still running');
    const restarted = Date.now();
    collector = await startCollector(got.binary, options);
    await until('exports again after the restart', () => complete(seenSince(restarted), record), { explain: () => describe(seenSince(restarted)) });
    assert.strictEqual(agent.child.exitCode, null);
    const { code, log } = await agent.stop();
    assert.strictEqual(code, 0, log);
    assert.match(log, /exporter: [1-9]\d* sent, [1-9]\d* failed attempts?/);
  });

  await t.test('OTLP/HTTP', async () => {
    const since = Date.now();
    const overHttp = startAgent(t, ['--interval', '1', '--otlp-endpoint', `http://127.0.0.1:${ports.httpPort}`, '--pid', String(other.ids.pid)]);
    await until('the service whole through the Collector over HTTP', () => complete(seenSince(since), other), { explain: () => describe(seenSince(since)) });
    assertComplete(seenSince(since), other);
    const { code, log } = await overHttp.stop();
    assert.strictEqual(code, 0, log);
    assert.match(log, /exporter: [1-9]\d* sent/);
  });
});

test('agent: --service-name profiles only the processes that publish that service.name', { skip: skip ?? false }, async (t) => {
  const wanted = await startService(t, 'agent-wanted', 'record');
  const other = await startService(t, 'agent-other', 'record');
  const dir = path.join(tmp, 'by-service');
  const agent = startAgent(t, ['--interval', '1', '--service-name', 'agent-wanted', '--service-name', 'agent-absent', '--output-dir', dir]);
  await agent.waitFor(new RegExp(`profiling pid ${wanted.ids.pid} `), 'the wanted service');
  const read = new Set();
  const seen = new Map();
  await until('the wanted service whole in the files', () => {
    for (const name of fs.readdirSync(dir).filter((n) => n.endsWith('.otlp.pb')).sort()) {
      if (read.has(name)) continue;
      read.add(name);
      merge(seen, byProcess(fs.readFileSync(path.join(dir, name))));
    }
    return complete(seen, wanted);
  }, { explain: () => describe(seen) });
  assertComplete(seen, wanted);
  // Both services were there for several scans: the other one was looked at and left out.
  const { code, log } = await agent.stop();
  assert.strictEqual(code, 0, log);
  assert.doesNotMatch(log, new RegExp(`profiling pid ${other.ids.pid} `));
  assert.deepStrictEqual([...seen.keys()], [wanted.ids.pid], describe(seen));
});

test('agent: SIGTERM ends it promptly whatever the receiver does, counting what it did not send', { skip: skip ?? false }, async (t) => {
  const service = await startService(t, 'agent-shutdown', 'record');
  // A TCP server that accepts connections and reads, but never answers.
  const sockets = new Set();
  let received = 0;
  const silent = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('data', (chunk) => (received += chunk.length));
    socket.on('error', () => {});
  });
  await new Promise((resolve) => silent.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    for (const s of sockets) s.destroy();
    silent.close();
  });
  const silentPort = silent.address().port;
  const cases = [
    { what: 'nothing listens (OTLP/gRPC)', endpoint: `grpc://127.0.0.1:${await freePort()}`, ready: (agent) => agent.waitFor(/exporter: .*failed attempts?/, 'a failed export') },
    { what: 'the receiver never answers (OTLP/HTTP)', endpoint: `http://127.0.0.1:${silentPort}`, silent: true },
    { what: 'the receiver never answers (OTLP/gRPC)', endpoint: `grpc://127.0.0.1:${silentPort}`, silent: true },
  ];
  for (const c of cases) {
    await t.test(c.what, async () => {
      const before = received;
      const agent = startAgent(t, ['--interval', '1', '--otlp-endpoint', c.endpoint, '--pid', String(service.ids.pid)]);
      await agent.waitFor(new RegExp(`profiling pid ${service.ids.pid} `), 'the service profiled');
      if (c.silent) await until('an export sent to the silent receiver', () => received > before, { timeoutMs: 60000 });
      else await c.ready(agent);
      const start = process.hrtime.bigint();
      agent.child.kill('SIGTERM');
      const code = await exited(agent.child, 30000);
      const ms = Number(process.hrtime.bigint() - start) / 1e6;
      t.diagnostic(`${c.what}: exited ${ms.toFixed(0)} ms after SIGTERM`);
      const log = agent.lines.join('\n');
      assert.strictEqual(code, 0, log);
      // The agent bounds its shutdown at 2 s; a generous bound here, for a busy machine.
      assert.ok(ms < 5000, `exited ${ms.toFixed(0)} ms after SIGTERM:\n${log}`);
      const summary = /exporter: (\d+) sent, \d+ failed attempts?, \d+ given up, \d+ dropped from a full queue, (\d+) unsent at the shutdown deadline/.exec(log);
      assert.ok(summary, log);
      assert.strictEqual(Number(summary[1]), 0, log);
      assert.ok(Number(summary[2]) >= 1, `nothing counted as unsent:\n${log}`);
      assert.match(log, /ended by signal 15/);
    });
  }
});

test('agent: with no --otlp-endpoint, the endpoint and protocol come from OTEL_EXPORTER_OTLP_*', { skip: skip ?? false }, async (t) => {
  const service = await startService(t, 'agent-env-endpoint', 'record');
  const paths = [];
  const seen = new Map();
  const receiver = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      paths.push(req.url);
      if (req.url === '/base/v1development/profiles') merge(seen, byProcess(Buffer.concat(chunks)));
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  t.after(() => receiver.close());
  // The generic endpoint is a base URL: the profiles path is appended to it.
  const env = withoutExporterEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${receiver.address().port}/base/`, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf' });
  const agent = startAgent(t, ['--interval', '1', '--metrics-interval', '1', '--pid', String(service.ids.pid)], env);
  await until('the service whole at the endpoint of the environment', () => complete(seen, service), { explain: () => `${describe(seen)}\npaths: ${paths}` });
  assertComplete(seen, service);
  assert.deepStrictEqual([...new Set(paths)], ['/base/v1development/profiles']);
  // The agent's own metrics, every second: a line that counts what was just seen sent.
  const metrics = await agent.waitFor(/metrics: processes=1 processes_seen=1 samples=[1-9]\d* .*exports=[1-9]\d* .*sent=[1-9]\d* failed_attempts=0 given_up=0 dropped=0 waiting=\d+ cpu_s=[\d.]+$/, 'a metrics line counting sent exports');
  assert.match(metrics, /samples_unattributed=\d+ kernel_lost_samples=\d+ kernel_lost_waits=\d+ exports=\d+ exports_skipped=\d+ /);
  const { code, log } = await agent.stop();
  assert.strictEqual(code, 0, log);
  assert.match(log, /exporter: [1-9]\d* sent/);
});

/** Why the agent cannot be run here as another user with file capabilities, or null. */
function capabilityTrialUnavailable() {
  if (skip) return skip;
  for (const tool of ['setpriv', 'setcap']) {
    if (spawnSync(tool, ['--version'], { encoding: 'utf8' }).error) return `${tool} is not installed`;
  }
  return null;
}

test('agent: as an unprivileged user with the documented file capabilities, it profiles another user\'s service, then holds four', { skip: capabilityTrialUnavailable() ?? false }, async (t) => {
  // A copy of the reader other users may run, given the five capabilities by file.
  const dir = scratchDir('otel-thread-ctx-agent-caps-');
  fs.chmodSync(dir, 0o777);
  const binary = path.join(dir, 'otel-thread-ctx');
  fs.copyFileSync(READER, binary);
  fs.chmodSync(binary, 0o755);
  const setcap = spawnSync('setcap', ['cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_syslog+ep', binary], { encoding: 'utf8' });
  assert.strictEqual(setcap.status, 0, setcap.stderr);
  // The service runs as root: another user's process.
  const service = await startService(t, 'agent-unprivileged', undefined);
  const out = path.join(dir, 'out');
  const child = spawn('setpriv', ['--reuid=nobody', '--regid=nogroup', '--clear-groups', binary, 'agent', '--interval', '1', '--output-dir', out, '--pid', String(service.ids.pid)], {
    cwd: dir,
    env: withoutExporterEnv(),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  t.after(() => child.kill('SIGKILL'));
  let log = '';
  child.stderr.on('data', (d) => (log += d));
  const read = new Set();
  const seen = new Map();
  await until('the service whole in the files of the unprivileged agent', () => fs.existsSync(out) && complete(readNewFiles(out, read, seen), service), {
    explain: () => `${describe(seen)}\n${log}`,
  });
  assertComplete(seen, service);
  for (const tid of fs.readdirSync(`/proc/${child.pid}/task`)) {
    const status = fs.readFileSync(`/proc/${child.pid}/task/${tid}/status`, 'utf8');
    assert.match(status, /^Uid:\s+65534\b/m);
    assert.strictEqual(capabilitySet(status, 'CapEff'), kept, `thread ${tid}`);
    assert.strictEqual(capabilitySet(status, 'CapPrm'), kept, `thread ${tid}`);
  }
  child.kill('SIGTERM');
  assert.strictEqual(await exited(child, 30000), 0, log);
  assert.doesNotMatch(log, /could not give up/);
});

test('agent: bad flags are usage errors', { skip: READER === null ? 'the reader is not built' : false }, () => {
  for (const [args, re] of [
    [['--interval', '0'], /--interval/],
    [['--otlp-endpoint', 'https://collector:4318'], /TLS is not supported/],
    [['--otlp-endpoint', 'collector:4317'], /expected grpc:\/\/host:port or http:\/\/host:port/],
    [['--pid', '0', '--output-dir', tmp], /invalid pid 0/],
    [['--service-name', '', '--output-dir', tmp], /--service-name.*not empty/],
    [['--metrics-interval', '0.5', '--output-dir', tmp], /--metrics-interval.*0 \(no metrics lines\)/],
    [[], /needs somewhere to export/],
  ]) {
    const r = spawnSync(READER, ['agent', ...args], { encoding: 'utf8', env: withoutExporterEnv() });
    assert.strictEqual(r.status, 2, `${args}: ${r.stderr}`);
    assert.match(r.stderr, re);
  }
  // The exporter variables, when no --otlp-endpoint is given: checked as the flags are.
  for (const [vars, re] of [
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector:4318' }, /OTEL_EXPORTER_OTLP_ENDPOINT="https:\/\/collector:4318": TLS is not supported/],
    [{ OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT: 'collector:4317' }, /OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT="collector:4317": expected a URL/],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' }, /OTEL_EXPORTER_OTLP_PROTOCOL=http\/json: OTLP\/HTTP with JSON bodies is not supported/],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL: 'grcp' }, /OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL="grcp": unknown protocol/],
  ]) {
    const r = spawnSync(READER, ['agent'], { encoding: 'utf8', env: withoutExporterEnv(vars) });
    assert.strictEqual(r.status, 2, `${JSON.stringify(vars)}: ${r.stderr}`);
    assert.match(r.stderr, re);
  }
});
