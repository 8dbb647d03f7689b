'use strict';
// `otel-thread-ctx agent` as a daemon under load, for as long as asked:
// traced services (Express with the http and Express instrumentations, in
// frame and record mode; Express handing work to a worker; a process whose
// workers come and go) under steady HTTP load, the agent exporting over
// OTLP/gRPC to a real OpenTelemetry Collector that is restarted at a
// quarter and at three quarters of the run and paused (SIGSTOP) for a
// while at half. Prints the agent's RSS and CPU over time, the targets'
// CPU, and the account of every export the agent built: sent, given up
// after retries, dropped from a full queue, or unsent at the shutdown
// deadline, against what reached the Collector's own exporter.
//
//   node bench/agent-soak.js [--minutes 60] [--services 8] [--rate 20] [--interval 10] [--hz 99] [--json FILE]
//
// --rate is requests per second per HTTP service. Needs root, a reader
// built with its BPF program and the Collector (tools/collector.js builds
// it with Go once).

const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { jsonLines } = require('../__test__/helpers');
const { collectorBinary, startCollector } = require('../tools/collector');

const READER = require('../js/native').readerPath();
const ROOT = path.resolve(__dirname, '..');
const FIXTURES = path.join(ROOT, '__test__', 'fixtures');
const TICK = 100; // USER_HZ

function parseArgs(argv) {
  const o = { minutes: 60, services: 8, rate: 20, interval: 10, hz: 99, json: null };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in o)) throw new Error(`unknown argument ${argv[i]}`);
    o[key] = key === 'json' ? argv[++i] : Number(argv[++i]);
    if (key !== 'json' && !(o[key] > 0)) throw new Error(`--${key} must be a positive number`);
  }
  return o;
}

// A process whose traced workers come and go: one starts every 500 ms,
// spins in a span for 100-300 ms and exits.
const CHURN = `
const path = require('node:path');
const { Worker, isMainThread } = require('node:worker_threads');
const fromRoot = require('node:module').createRequire(path.join(${JSON.stringify(ROOT)}, 'index.js'));
const api = fromRoot('@opentelemetry/api');
const { BasicTracerProvider } = fromRoot('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager } = fromRoot('.');
api.context.setGlobalContextManager(new ProfilingContextManager().enable());
const tracer = new BasicTracerProvider().getTracer('churn');
function spin(ms) { const end = Date.now() + ms; let x = 0; while (Date.now() < end) x += Math.sqrt(x + 1); return x; }
if (isMainThread) {
  setInterval(() => new Worker(__filename), 500);
  console.log(JSON.stringify({ pid: process.pid }));
} else {
  const span = tracer.startSpan('churn', { attributes: { 'http.route': '/churn' } });
  api.context.with(api.trace.setSpan(api.context.active(), span), () => spin(100 + Math.random() * 200));
  span.end();
}
`;

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-agent-soak-'));
const children = [];
process.on('exit', () => {
  for (const c of children) {
    c.kill('SIGKILL');
    // --perf-basic-prof's map of each service (it grows for the service's life).
    fs.rmSync(`/tmp/perf-${c.pid}.map`, { force: true });
  }
  // Retried: a service killed a moment ago may still be writing its V8 logs there.
  fs.rmSync(scratch, { recursive: true, force: true, maxRetries: 10 });
});
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => process.exit(130));

/** CPU seconds (user + system) of a live process, or NaN once it is gone. */
function cpuSeconds(pid) {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(f[11]) + Number(f[12])) / TICK;
  } catch {
    return NaN;
  }
}

function rssMiB(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** The services: what each is, its pid, and for HTTP ones the port and path to load. */
async function startServices(n) {
  const churnFile = path.join(scratch, 'churn.js');
  fs.writeFileSync(churnFile, CHURN);
  const kinds = [
    { name: 'express-frame', file: path.join(FIXTURES, 'express-service.js'), path: '/sort', env: {} },
    { name: 'express-record', file: path.join(FIXTURES, 'express-service.js'), path: '/sort', env: { OTEL_THREAD_CTX_MODE: 'record' } },
    { name: 'express-worker', file: path.join(FIXTURES, 'express-worker-service.js'), path: '/offload', env: {} },
    { name: 'worker-churn', file: churnFile, path: null, env: {} },
  ];
  const services = [];
  for (let i = 0; i < n; i++) {
    const kind = kinds[i % kinds.length];
    const env = { ...process.env, ...kind.env };
    if (!kind.env.OTEL_THREAD_CTX_MODE) delete env.OTEL_THREAD_CTX_MODE;
    const child = spawn(process.execPath, ['--perf-basic-prof', kind.file], { cwd: scratch, env, stdio: ['ignore', 'pipe', 'inherit'] });
    children.push(child);
    const line = await jsonLines(child.stdout).next(`the line of ${kind.name}`, 60000);
    services.push({ kind: kind.name, pid: line.pid, port: line.port, path: kind.path, child });
  }
  return services;
}

/** Steady load: `rate` requests per second to each HTTP service; returns stop() and the counts. */
function load(services, rate) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
  const counts = { ok: 0, failed: 0 };
  const timers = services
    .filter((s) => s.path !== null)
    .map((s) =>
      setInterval(() => {
        const req = http.get({ host: '127.0.0.1', port: s.port, path: `${s.path}?n=2000`, agent }, (res) => {
          res.resume();
          res.on('end', () => (res.statusCode === 200 ? counts.ok++ : counts.failed++));
        });
        req.on('error', () => counts.failed++);
      }, 1000 / rate),
    );
  return {
    counts,
    stop: () => {
      for (const t of timers) clearInterval(t);
      agent.destroy();
    },
  };
}

/** A receiver for what the Collector exports: counts requests. */
async function startSink() {
  const received = { requests: 0, bytes: 0 };
  const server = http.createServer((req, res) => {
    let bytes = 0;
    req.on('data', (c) => (bytes += c.length));
    req.on('end', () => {
      if (req.url === '/v1development/profiles') {
        received.requests++;
        received.bytes += bytes;
      }
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { received, url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The numbers of the agent's last lines (its account of every export): the last line that says each. */
function account(log) {
  const num = (re) => Number([...log.matchAll(new RegExp(re.source, 'g'))].at(-1)?.[1] ?? NaN);
  return {
    built: num(/, (\d+) exports? \(/),
    skipped: num(/\((\d+) skipped: building was behind/),
    sent: num(/exporter: (\d+) sent/),
    failedAttempts: num(/exporter: \d+ sent, (\d+) failed attempts?/),
    givenUp: num(/(\d+) given up/),
    dropped: num(/(\d+) dropped from a full queue/),
    unsent: num(/(\d+) unsent at the shutdown deadline/) || 0,
    notBuilt: num(/(\d+) not built by the shutdown deadline/) || 0,
    samples: num(/: (\d+) samples? \(/),
  };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (READER === null) throw new Error('the reader is not built (npm install builds it)');
  const got = collectorBinary();
  if (got.reason) throw new Error(`no Collector: ${got.reason}`);
  const sink = await startSink();
  const ports = { grpcPort: await freePort(), httpPort: await freePort() };
  const collectorOptions = { ...ports, sinkUrl: sink.url, dir: scratch };
  // Each Collector started is stopped by the exit cleanup too.
  const collectorStarted = async () => {
    const c = await startCollector(got.binary, collectorOptions);
    children.push(c.child);
    return c;
  };
  let collector = await collectorStarted();

  const services = await startServices(opts.services);
  const traffic = load(services, opts.rate);
  const args = ['agent', '--hz', String(opts.hz), '--interval', String(opts.interval), '--otlp-endpoint', `grpc://127.0.0.1:${ports.grpcPort}`];
  const agent = spawn(READER, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(agent);
  let log = '';
  agent.stderr.on('data', (d) => (log += d));
  const startDeadline = Date.now() + 120000;
  while (!services.every((s) => log.includes(`profiling pid ${s.pid} `))) {
    if (Date.now() > startDeadline || agent.exitCode !== null) throw new Error(`the agent did not take every service:\n${log}`);
    await sleep(200);
  }

  const total = opts.minutes * 60 * 1000;
  const t0 = Date.now();
  const targetsCpu0 = services.map((s) => cpuSeconds(s.pid));
  const agentCpu0 = cpuSeconds(agent.pid);
  const events = [
    { at: total / 4, what: 'Collector restarted', run: async () => { await collector.stop(); await sleep(5000); collector = await collectorStarted(); } },
    { at: total / 2, what: 'Collector paused 30 s', run: async () => { collector.child.kill('SIGSTOP'); await sleep(30000); collector.child.kill('SIGCONT'); } },
    { at: (3 * total) / 4, what: 'Collector restarted', run: async () => { await collector.stop(); await sleep(5000); collector = await collectorStarted(); } },
  ];
  const rows = [];
  const every = Math.max(10000, total / 24);
  let lastCpu = agentCpu0;
  let lastAt = t0;
  let nextRow = t0 + every;
  while (Date.now() - t0 < total) {
    const due = events.find((e) => !e.done && Date.now() - t0 >= e.at);
    if (due) {
      due.done = true;
      rows.push({ t: (Date.now() - t0) / 1000, event: due.what });
      await due.run();
    }
    if (agent.exitCode !== null) throw new Error(`the agent exited (${agent.exitCode}):\n${log}`);
    if (Date.now() >= nextRow) {
      const now = Date.now();
      const cpu = cpuSeconds(agent.pid);
      rows.push({ t: (now - t0) / 1000, rssMiB: rssMiB(agent.pid), cpuShare: (cpu - lastCpu) / ((now - lastAt) / 1000) });
      lastCpu = cpu;
      lastAt = now;
      nextRow = now + every;
    }
    await sleep(1000);
  }
  const wall = (Date.now() - t0) / 1000;
  const targetsShare = services.map((s, i) => ({ kind: s.kind, share: (cpuSeconds(s.pid) - targetsCpu0[i]) / wall }));
  const agentShare = (cpuSeconds(agent.pid) - agentCpu0) / wall;
  traffic.stop();
  const stopAt = Date.now();
  agent.kill('SIGTERM');
  const code = await new Promise((resolve) => (agent.exitCode !== null ? resolve(agent.exitCode) : agent.once('exit', resolve)));
  const exitMs = Date.now() - stopAt;
  await sleep(2000); // what the Collector still forwards
  await collector.stop();
  sink.close();

  const a = account(log);
  const accounted = a.sent + a.givenUp + a.dropped + a.unsent;
  console.log(`agent soak: ${opts.minutes} min, ${opts.services} services, ${opts.rate} req/s each (HTTP ones), ${opts.hz} Hz, exports every ${opts.interval} s`);
  console.log('');
  console.log('| t (s) | agent RSS (MiB) | agent CPU (share of a core) | event |');
  console.log('|---:|---:|---:|---|');
  for (const r of rows) console.log(r.event ? `| ${r.t.toFixed(0)} | | | ${r.event} |` : `| ${r.t.toFixed(0)} | ${r.rssMiB.toFixed(1)} | ${(r.cpuShare * 100).toFixed(2)} % | |`);
  console.log('');
  const rss = rows.filter((r) => r.rssMiB !== undefined).map((r) => r.rssMiB);
  const warm = rss.slice(Math.floor(rss.length / 4));
  console.log(`agent RSS after warm-up: ${Math.min(...warm).toFixed(1)}-${Math.max(...warm).toFixed(1)} MiB; CPU over the run ${(agentShare * 100).toFixed(2)} % of a core`);
  console.log(`targets' CPU (share of a core): ${targetsShare.map((s) => `${s.kind} ${(s.share * 100).toFixed(1)} %`).join(', ')}`);
  console.log(`requests: ${traffic.counts.ok} ok, ${traffic.counts.failed} failed; samples: ${a.samples}`);
  console.log(
    `exports built ${a.built} (${a.skipped} skipped, ${a.notBuilt} not built by the deadline): ${a.sent} sent, ${a.givenUp} given up, ${a.dropped} dropped from a full queue, ${a.unsent} unsent at the deadline (${a.failedAttempts} failed attempts); ${accounted === a.built ? 'every export accounted for' : `UNACCOUNTED: ${a.built - accounted}`}`,
  );
  console.log(`the Collector forwarded ${sink.received.requests} requests; the agent exited ${code} ${exitMs} ms after SIGTERM`);
  if (opts.json) fs.writeFileSync(opts.json, JSON.stringify({ opts, rows, agentShare, targetsShare, requests: traffic.counts, account: a, forwarded: sink.received.requests, exitMs, code }, null, 2));
  if (code !== 0 || accounted !== a.built) process.exitCode = 1;
}

// Exits when done: the services' pipes would keep the process alive, and
// exiting runs the cleanup that stops them.
main().then(
  () => process.exit(),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
