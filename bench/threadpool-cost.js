'use strict';
// What following libuv threadpool work costs its target: each fs call or
// crypto.pbkdf2 queued in a span passes two probes (the submit, and the
// worker loop's start of the item). Side by side in alternating rounds, the
// target's CPU (all threads, process.cpuUsage) for the same work
//   - unprofiled,
//   - under `profile --no-threadpool` (the samplers only),
//   - under `profile --threadpool-probes` (samplers and threadpool probes),
//   - under `profile` where the target is in frame mode (its default there:
//     no probes, a pool thread's sample reads its request);
// the difference of the probes' run and the samplers', per call, is the
// probes' cost. The
// workloads: a burst of fs.stat calls (16 in flight), a burst of 1-iteration
// crypto.pbkdf2 calls, and a service paced at --rate fs calls per second
// (default 10,000) for --seconds, whose CPU ratio profiled/unprofiled is the
// figure to keep within 1.03. Needs root and a reader built with its BPF
// program.
//
//   node bench/threadpool-cost.js [--rounds 3] [--calls 40000] [--rate 10000] [--seconds 5] [--hz 99] [--service-only 1]

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines } = require('../__test__/helpers');
const { enableBpfStats, pollBpfPrograms } = require('./lib/bpf-stats');

const ROOT = path.resolve(__dirname, '..');
const READER = require('../js/native').readerPath();

const WORKLOAD = `
const fs = require('node:fs');
const crypto = require('node:crypto');
const { context, trace } = require(${JSON.stringify(require.resolve('@opentelemetry/api', { paths: [ROOT] }))});
const { BasicTracerProvider } = require(${JSON.stringify(require.resolve('@opentelemetry/sdk-trace-base', { paths: [ROOT] }))});
const { ProfilingContextManager } = require(${JSON.stringify(ROOT)});
context.setGlobalContextManager(new ProfilingContextManager({ attributes: ['http.route'] }).enable());
const tracer = new BasicTracerProvider().getTracer('threadpool-cost');
const { KIND, CALLS, RATE, SECONDS } = process.env;
const inSpan = (route, fn) => {
  const span = tracer.startSpan(route, { attributes: { 'http.route': route } });
  return context.with(trace.setSpan(context.active(), span), () => fn(() => span.end()));
};
const call = KIND === 'pbkdf2'
  ? (cb) => crypto.pbkdf2('secret', 'salt', 1, 32, 'sha256', cb)
  : (cb) => fs.stat(__filename, cb);
// A burst: CALLS calls, 16 in flight, each in its own span.
function burst(done) {
  let started = 0, finished = 0;
  const next = () => {
    if (started === Number(CALLS)) return;
    started++;
    inSpan('/burst', (end) => call(() => { end(); if (++finished === Number(CALLS)) done(finished); else next(); }));
  };
  for (let i = 0; i < 16; i++) next();
}
// A service: RATE calls per second for SECONDS, a span per request of 10 calls.
function service(done) {
  const total = Number(RATE) * Number(SECONDS);
  const start = process.hrtime.bigint();
  let issued = 0, finished = 0;
  const tick = () => {
    const due = Math.min(total, Math.floor(Number(process.hrtime.bigint() - start) / 1e9 * Number(RATE)));
    while (issued + 10 <= due) {
      issued += 10;
      inSpan('/request', (end) => { let left = 10; for (let i = 0; i < 10; i++) call(() => { if (--left === 0) end(); if (++finished === total) done(finished); }); });
    }
    if (issued < total) setTimeout(tick, 1);
  };
  tick();
}
console.log(JSON.stringify({ ready: process.pid }));
process.stdin.once('data', () => {
  const before = process.cpuUsage();
  (KIND === 'service' ? service : burst)((calls) => {
    const used = process.cpuUsage(before);
    console.log(JSON.stringify({ cpuUs: used.user + used.system, calls }));
    process.exit(0);
  });
});
`;

function parseArgs(argv) {
  const o = { rounds: 3, calls: 40000, rate: 10000, seconds: 5, hz: 99, 'service-only': 0 };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in o)) throw new Error(`unknown argument ${argv[i]}`);
    o[key] = Number(argv[++i]);
  }
  return o;
}

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-threadpool-cost-'));
const WORKLOAD_FILE = path.join(scratch, 'workload.js');
fs.writeFileSync(WORKLOAD_FILE, WORKLOAD);
process.on('exit', () => fs.rmSync(scratch, { recursive: true, force: true }));

/** The target's CPU in µs for one run of `kind`, under `profiler` (null, or its extra arguments). */
async function once(opts, kind, profiler) {
  const env = { ...process.env, KIND: kind, CALLS: String(opts.calls), RATE: String(opts.rate), SECONDS: String(opts.seconds) };
  const child = spawn(process.execPath, [WORKLOAD_FILE], { env, stdio: ['pipe', 'pipe', 'inherit'] });
  const { next } = jsonLines(child.stdout);
  const { ready: pid } = await next('ready');
  let running = null;
  let summary = '';
  if (profiler) {
    running = spawn(READER, ['profile', '--pid', String(pid), '--duration', '600', '--hz', String(opts.hz), '-o', '/dev/null', ...profiler], { stdio: ['ignore', 'ignore', 'pipe'] });
    running.stderr.on('data', (d) => (summary += d));
    await new Promise((r) => setTimeout(r, 1500)); // let it attach
  }
  const exited = running && new Promise((r) => running.once('exit', r));
  const programs = running ? pollBpfPrograms(running.pid, exited) : Promise.resolve([]);
  child.stdin.write('go\n');
  const { cpuUs, calls } = await next('result', 600000);
  // The probes' programs run about once per call each; the samplers' far
  // less often.
  const ran = await programs;
  const probeNs = ran.filter((p) => p.runs >= calls / 2).reduce((t, p) => t + p.runTimeNs, 0);
  // Every program: the samplers' too, with the pool reads they do.
  const bpfNs = ran.reduce((t, p) => t + p.runTimeNs, 0);
  if (profiler && profiler.length === 0 && !/read at sample time \(no probes/.test(summary)) {
    throw new Error(`the pool was not read at sample time:\n${summary}`);
  }
  if (profiler?.includes('--threadpool-probes') && !/threadpool: work queued/.test(summary)) {
    throw new Error(`the threadpool probes were not attached:\n${summary}`);
  }
  return { cpuUs, calls, probeNs, bpfNs };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const probe = spawnSync(READER, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  if (process.getuid() !== 0 || /no kernel sampler/.test(probe.stderr)) {
    console.log(`skipped: ${process.getuid() !== 0 ? 'needs root' : probe.stderr.trim()}`);
    return;
  }
  const setups = { unprofiled: null, samplers: ['--no-threadpool'], threadpool: ['--threadpool-probes'] };
  // The workload publishes in frame mode where the running Node has it,
  // and there `profile` reads the pool at sample time by default.
  if (Number(process.versions.node.split('.')[0]) >= 24) setups.sampleTime = [];
  const statsOn = enableBpfStats();
  const probeRun = {}; // the probes' BPF run time per call, ns
  const bpfRun = {}; // every BPF program's run time per call, ns, by setup
  const results = {};
  for (let r = 0; r < opts.rounds; r++) {
    for (const kind of opts['service-only'] ? ['service'] : ['fs', 'pbkdf2', 'service']) {
      const line = [];
      for (const [name, args] of Object.entries(setups)) {
        const { cpuUs, calls, probeNs, bpfNs } = await once(opts, kind, args);
        ((results[kind] ??= {})[name] ??= []).push(cpuUs / calls);
        if (name === 'threadpool' && statsOn) ((probeRun[kind] ??= []).push(probeNs / calls));
        if (args && statsOn) ((bpfRun[kind] ??= {})[name] ??= []).push(bpfNs / calls);
        line.push(`${name} ${((cpuUs / calls) * 1000).toFixed(0)} ns/call`);
      }
      console.log(`round ${r + 1} ${kind}: ${line.join(', ')}`);
    }
  }
  const m = (kind, name) => median(results[kind][name]) * 1000; // ns per call
  console.log(`Node ${process.version}, ${opts.hz} Hz, median of ${opts.rounds} rounds (target CPU per call, all threads):`);
  const atSampleTime = (kind) =>
    setups.sampleTime ? `; read at sample time ${m(kind, 'sampleTime').toFixed(0)} ns (${(m(kind, 'sampleTime') - m(kind, 'samplers')).toFixed(0)} ns over the samplers)` : '';
  for (const kind of opts['service-only'] ? [] : ['fs', 'pbkdf2']) {
    console.log(
      `  ${kind}: unprofiled ${m(kind, 'unprofiled').toFixed(0)} ns, samplers only ${m(kind, 'samplers').toFixed(0)} ns, with threadpool probes ${m(kind, 'threadpool').toFixed(0)} ns: the probes add ${(m(kind, 'threadpool') - m(kind, 'samplers')).toFixed(0)} ns per call` +
        (probeRun[kind] ? `; their BPF programs ran ${median(probeRun[kind]).toFixed(0)} ns per call (kernel counters)` : '') +
        atSampleTime(kind),
    );
  }
  const s = (name) => m('service', name);
  console.log(
    `  service at ${opts.rate} fs calls/s for ${opts.seconds} s: CPU ratio vs unprofiled ${(s('samplers') / s('unprofiled')).toFixed(3)} samplers only, ${(s('threadpool') / s('unprofiled')).toFixed(3)} with threadpool probes` +
      (setups.sampleTime ? `, ${(s('sampleTime') / s('unprofiled')).toFixed(3)} read at sample time` : '') +
      (probeRun.service ? `; the probes' BPF programs ran ${median(probeRun.service).toFixed(0)} ns per call` : ''),
  );
  // The kernel's run-time counters, which the machine's noise does not
  // move: every BPF program's time per call, and its share of the
  // unprofiled CPU per call.
  if (bpfRun.service) {
    const parts = Object.keys(bpfRun.service).map((name) => {
      const ns = median(bpfRun.service[name]);
      return `${name} ${ns.toFixed(0)} ns (${((100 * ns) / s('unprofiled')).toFixed(2)} %)`;
    });
    console.log(`  service, every BPF program's run time per call (share of the unprofiled CPU per call): ${parts.join(', ')}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
