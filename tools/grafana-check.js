#!/usr/bin/env node
'use strict';
// End-to-end check of span profiles in Grafana, against the real servers:
//
//   tools/grafana-service.js (Express, ProfilingContextManager,
//   ProfileIdSpanProcessor) -> `otel-thread-ctx agent --span-profiles <mode>`
//   -> OpenTelemetry Collector (OTLP/gRPC in, otlphttp out, profiles
//   feature gate) -> Grafana Pyroscope (OTLP/HTTP ingest)
//
// then asks Pyroscope's query API for the flame graph of single spans (by
// span id, as Grafana's "Profiles for this span" does) and of single traces
// (by trace id), and checks that a /sort request's graph holds the route's
// busy function `sortNumbers` and not /hash's `hashStrings`, and the other
// way round. Each mode pairs the processor's choice with the agent's:
// `root` (spans: 'local-roots', the request's server span is queried) and
// `span` (spans: 'all', the innermost span is queried).
//
//   PYROSCOPE_BIN=/path/to/pyroscope sudo -E node tools/grafana-check.js [root|span ...]
//
// Needs root (the agent loads BPF programs), a built reader, Go (the
// Collector is built once and cached, see tools/collector.js) and a
// Pyroscope server binary given by PYROSCOPE_BIN; skips with the reason
// when one is missing. COLLECTOR_VERSION picks the Collector (default
// 0.148.0). Exit status 1 when a check fails.

const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { onLines } = require('./subprocess');
const { collectorBinary, startCollector } = require('./collector');

const COLLECTOR_VERSION = process.env.COLLECTOR_VERSION || '0.148.0';
const SERVICE = path.join(__dirname, 'grafana-service.js');
/** Requests sent to each busy route. */
const REQUESTS = 3;
const MODES = {
  root: { spans: 'local-roots', queried: 'the server span (local root)' },
  span: { spans: 'all', queried: 'the innermost span' },
};
const BUSY = { '/sort': 'sortNumbers', '/hash': 'hashStrings' };

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Why the check cannot run here, or null. */
function unavailable(reader) {
  const bin = process.env.PYROSCOPE_BIN;
  if (!bin) return 'PYROSCOPE_BIN is not set: give the path of a Grafana Pyroscope server binary (>= 1.20)';
  if (!fs.existsSync(bin)) return `PYROSCOPE_BIN=${bin} does not exist`;
  if (reader === null) return 'the reader is not built (npm install builds it)';
  if (process.getuid() !== 0) return 'the agent loads BPF programs: run as root';
  return null;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** One HTTP request; resolves with {status, body}. */
function request(url, { method = 'GET', body, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, timeout: 30000 }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('timeout', () => req.destroy(new Error(`${url}: no answer`)));
    req.on('error', reject);
    req.end(body);
  });
}

/** A Connect (JSON) call of Pyroscope's query API. */
async function query(base, method, body) {
  const res = await request(`${base}/querier.v1.QuerierService/${method}`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json' },
  });
  if (res.status !== 200) throw new Error(`${method}: HTTP ${res.status}: ${res.body.slice(0, 500)}`);
  return JSON.parse(res.body);
}

/** A child process whose output lines are kept; `stop()` ends it. */
function start(command, args, options = {}) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options });
  const lines = [];
  onLines(child.stdout, (l) => lines.push(l));
  onLines(child.stderr, (l) => lines.push(l));
  const exited = new Promise((resolve) => child.on('close', resolve));
  const stop = async (signal = 'SIGTERM') => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 15000);
    await exited;
    clearTimeout(timer);
  };
  return { child, lines, stop, log: () => lines.join('\n') };
}

/** Starts Pyroscope (one process, every component) in `dir` with its HTTP API on `port`; resolves once it is ready. */
async function startPyroscope(bin, dir, port) {
  const [grpc, raft, memberlist] = [await freePort(), await freePort(), await freePort()];
  const args = [
    // The new storage alone: with the default dual mode, queries go to the
    // old read path until the metastore reports the tenant's first data.
    '-architecture.storage=v2',
    '-write-path=segment-writer',
    `-server.http-listen-port=${port}`,
    `-server.grpc-listen-port=${grpc}`,
    `-metastore.address=127.0.0.1:${grpc}`,
    `-query-backend.address=127.0.0.1:${grpc}`,
    `-metastore.raft.bind-address=127.0.0.1:${raft}`,
    `-metastore.raft.advertise-address=127.0.0.1:${raft}`,
    `-memberlist.bind-port=${memberlist}`,
    '-self-profiling.disable-push=true',
  ];
  const p = start(bin, args, { cwd: dir });
  const deadline = Date.now() + 120000;
  for (;;) {
    if (p.child.exitCode !== null) throw new Error(`Pyroscope exited (${p.child.exitCode}):\n${p.log().slice(-3000)}`);
    const ready = await request(`http://127.0.0.1:${port}/ready`).catch(() => null);
    if (ready?.status === 200) return p;
    if (Date.now() > deadline) throw new Error(`Pyroscope is not ready after 120 s:\n${p.log().slice(-3000)}`);
    await sleep(500);
  }
}

/** Starts the service; resolves with {child, info, spans (every ended span so far)}. */
function startService(dir, mode, serviceName) {
  const env = { ...process.env, SERVICE_NAME: serviceName, PROFILE_ID_SPANS: MODES[mode].spans };
  const child = spawn(process.execPath, ['--perf-basic-prof', '--interpreted-frames-native-stack', SERVICE], { cwd: dir, env, stdio: ['ignore', 'pipe', 'inherit'] });
  const spans = [];
  return new Promise((resolve, reject) => {
    let info = null;
    onLines(child.stdout, (line) => {
      const msg = JSON.parse(line);
      if (msg.span) spans.push(msg.span);
      else if (info === null) {
        info = msg;
        resolve({ child, info, spans });
      }
    });
    child.once('exit', (code, signal) => {
      if (info === null) reject(new Error(`the service exited (${code ?? signal}) before listening`));
    });
  });
}

/** The function names of a flame graph response (empty when it has no samples). */
function names(response) {
  const fg = response.flamegraph;
  if (!fg || !Number(fg.total)) return [];
  return fg.names ?? [];
}

const holds = (list, fn) => list.some((n) => new RegExp(`\\b${fn}\\b`).test(n));

/** Runs the check in one mode; returns {passed, failed, lines}. */
async function runMode(mode, { reader, collector, pyroscopeBin, tmp }) {
  const lines = [];
  const say = (s) => {
    lines.push(s);
    console.log(s);
  };
  let passed = 0;
  let failed = 0;
  const check = (ok, what) => {
    if (ok) passed++;
    else failed++;
    say(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  };
  const dir = fs.mkdtempSync(path.join(tmp, `${mode}-`));
  const [pyroPort, colGrpc, colHttp] = [await freePort(), await freePort(), await freePort()];
  const base = `http://127.0.0.1:${pyroPort}`;
  const cleanup = [];
  try {
    const pyroscope = await startPyroscope(pyroscopeBin, dir, pyroPort);
    cleanup.push(() => pyroscope.stop());
    const col = await startCollector(collector, { grpcPort: colGrpc, httpPort: colHttp, sinkUrl: base, dir });
    cleanup.push(() => col.stop());
    const serviceName = `grafana-check-${mode}`;
    const service = await startService(dir, mode, serviceName);
    cleanup.push(async () => {
      service.child.kill('SIGKILL');
      fs.rmSync(`/tmp/perf-${service.child.pid}.map`, { force: true });
    });
    const agent = start(reader, [
      'agent',
      '--interval',
      '2',
      '--hz',
      '199',
      '--span-profiles',
      mode,
      '--otlp-endpoint',
      `grpc://127.0.0.1:${colGrpc}`,
      '--pid',
      String(service.info.pid),
    ]);
    cleanup.push(() => agent.stop());
    say(`mode ${mode}: service ${serviceName} (pid ${service.info.pid}, ${service.info.mode} mode), ProfileIdSpanProcessor spans: '${MODES[mode].spans}', agent --span-profiles ${mode}; querying ${MODES[mode].queried}`);
    await sleep(3000);

    // One request per route first, not checked: the record's attribute
    // keys are named in the process context as they are first used, and
    // the agent reads the new names on its next scan.
    for (const route of Object.keys(BUSY)) await request(`http://127.0.0.1:${service.info.port}${route}`);
    await sleep(4000);
    const warmup = new Set(service.spans.map((s) => s.traceId));

    // The requests, one at a time so each span's samples are its own.
    const start0 = Date.now();
    for (let i = 0; i < REQUESTS; i++) {
      for (const route of Object.keys(BUSY)) {
        const res = await request(`http://127.0.0.1:${service.info.port}${route}`);
        if (res.status !== 200) throw new Error(`GET ${route}: HTTP ${res.status}`);
      }
    }
    // Two more exports, so every request's samples have been sent.
    await sleep(6000);
    const end0 = Date.now();

    // Each request's trace, its queried span and the span carrying
    // pyroscope.profile.id (what Grafana would send).
    const traces = new Map();
    for (const s of service.spans) {
      if (warmup.has(s.traceId)) continue;
      if (!traces.has(s.traceId)) traces.set(s.traceId, []);
      traces.get(s.traceId).push(s);
    }
    const requests = [];
    for (const [traceId, spans] of traces) {
      const root = spans.find((s) => s.parentSpanId === null || s.parentSpanId === undefined);
      const inner = spans.find((s) => s.name === 'sortBigArray' || s.name === 'hashStrings');
      if (!root || !inner) continue;
      const route = inner.name === 'sortBigArray' ? '/sort' : '/hash';
      const queried = mode === 'root' ? root : inner;
      requests.push({ traceId, route, root, inner, queried, withProfileId: spans.filter((s) => s.profileId) });
    }
    check(requests.length === REQUESTS * 2, `${requests.length} traced requests (${REQUESTS} GET /sort, ${REQUESTS} GET /hash)`);

    // Ingestion is asynchronous: wait until the service's profiles are listed.
    let typeIds = [];
    for (const deadline = Date.now() + 90000; Date.now() < deadline; await sleep(2000)) {
      const types = await query(base, 'ProfileTypes', { start: start0 - 60000, end: end0 + 60000 });
      typeIds = (types.profileTypes ?? []).map((t) => t.ID);
      if (typeIds.length > 0) break;
    }
    say(`Pyroscope profile types: ${typeIds.join(', ')}`);
    const cpuType = typeIds.find((id) => /^cpu:cpu:nanoseconds:cpu:nanoseconds$/.test(id));
    check(cpuType !== undefined, `a CPU profile type (${cpuType ?? 'none'})`);
    const labels = await query(base, 'LabelValues', { name: 'service_name', start: start0 - 60000, end: end0 + 60000 });
    check((labels.names ?? []).includes(serviceName), `service_name=${serviceName} is a Pyroscope service (${(labels.names ?? []).join(', ')})`);
    if (cpuType === undefined) {
      say(`agent:\n${agent.log().slice(-1500)}\nCollector:\n${col.log().slice(-1500)}\nPyroscope:\n${pyroscope.log().slice(-3000)}`);
      return { passed, failed, lines };
    }

    const selector = `{service_name="${serviceName}"}`;
    const window = { start: start0 - 5000, end: end0 + 5000 };
    const bySpan = (spanId) => query(base, 'SelectMergeSpanProfile', { profileTypeID: cpuType, labelSelector: selector, spanSelector: [spanId], ...window });
    const byTrace = (traceId) => query(base, 'SelectMergeStacktraces', { profileTypeID: cpuType, labelSelector: selector, traceIdSelector: [traceId], ...window });

    // Wait until the first request's span has a graph.
    const deadline = Date.now() + 60000;
    while (names(await bySpan(requests[0].queried.spanId)).length === 0 && Date.now() < deadline) await sleep(2000);

    for (const r of requests) {
      const mine = BUSY[r.route];
      const other = Object.values(BUSY).find((f) => f !== mine);
      const tag = `GET ${r.route} trace ${r.traceId}`;
      const carriers = r.withProfileId.map((s) => s.spanId);
      check(
        r.queried.profileId === r.queried.spanId && carriers.includes(r.queried.spanId) && (mode === 'span' || carriers.length === 1),
        `${tag}: pyroscope.profile.id=${r.queried.profileId} on ${mode === 'root' ? 'its server span' : 'its innermost span'} "${r.queried.name}" only${mode === 'span' ? ' (and every other span)' : ''}`,
      );
      const spanGraph = names(await bySpan(r.queried.spanId));
      check(holds(spanGraph, mine) && !holds(spanGraph, other), `${tag}: span ${r.queried.spanId}'s flame graph has ${mine}, not ${other} (${spanGraph.length} names${holds(spanGraph, other) ? `, ${other} among them` : ''})`);
      const traceGraph = names(await byTrace(r.traceId));
      check(holds(traceGraph, mine) && !holds(traceGraph, other), `${tag}: trace ${r.traceId}'s flame graph has ${mine}, not ${other} (${traceGraph.length} names${holds(traceGraph, other) ? `, ${other} among them` : ''})`);
      if (mode === 'span') {
        // Innermost labelling: the server span's own samples are not its child's.
        const rootGraph = names(await bySpan(r.root.spanId));
        check(!holds(rootGraph, mine), `${tag}: server span ${r.root.spanId}'s own flame graph does not have ${mine} (it ran in the child span)`);
      }
    }
    const agentLog = agent.log();
    const refused = /abandoned [1-9]|rejected/.test(agentLog);
    check(!refused, 'no export refused by the Collector or Pyroscope');
    const colRefused = /Exporting failed|dropping data|permanent error/i.test(col.log());
    check(!colRefused, `the Collector forwarded every export to Pyroscope${colRefused ? `:\n${col.log().slice(-2000)}` : ''}`);
  } catch (e) {
    check(false, `${mode}: ${e.stack || e}`);
  } finally {
    for (const f of cleanup.reverse()) await f().catch(() => {});
  }
  return { passed, failed, lines };
}

async function main() {
  const reader = require('../js/native').readerPath();
  const why = unavailable(reader);
  if (why) {
    console.log(`grafana-check: skipped: ${why}`);
    return 0;
  }
  const got = collectorBinary(COLLECTOR_VERSION);
  if (got.reason) {
    console.log(`grafana-check: skipped: ${got.reason}`);
    return 0;
  }
  const modes = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(MODES);
  for (const m of modes) if (!MODES[m]) throw new RangeError(`unknown mode ${m} (root or span)`);
  const pyroscopeBin = process.env.PYROSCOPE_BIN;
  const version = spawnSync(pyroscopeBin, ['-version'], { encoding: 'utf8' });
  const pyroVersion = `${version.stdout}${version.stderr}`.split('\n').find((l) => /version/i.test(l))?.trim() ?? 'unknown version';
  console.log(`grafana-check: Pyroscope ${pyroVersion}; OpenTelemetry Collector ${COLLECTOR_VERSION} (--feature-gates=+service.profilesSupport); Node ${process.version}; ${os.release()}`);
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-grafana-'));
  let passed = 0;
  let failed = 0;
  try {
    for (const mode of modes) {
      const r = await runMode(mode, { reader, collector: got.binary, pyroscopeBin, tmp });
      passed += r.passed;
      failed += r.failed;
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  console.log(`grafana-check: ${passed}/${passed + failed} checks passed`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
