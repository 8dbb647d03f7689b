'use strict';
// What `otel-thread-ctx agent` costs, side by side in one run:
// - on its targets: the CPU time a fixed amount of traced work takes in N
//   busy Node processes (main thread + one worker each, spans entered with
//   the ProfilingContextManager) without and with the agent profiling them,
//   in alternating rounds: the ratio (the bound is 1.03);
// - its own CPU while it profiles them, as a share of one core;
// - its RSS over a soak: an hour of 10 s exports compressed into `--soak`
//   seconds of 1 s exports, with the N processes busy throughout: RSS after
//   warm-up (the first quarter) against the end.
// Exports go to files in a scratch directory (bounded with --output-max-mib).
// Needs root and a reader built with its BPF program.
//
//   node bench/agent-cost.js [--processes 8] [--rounds 2] [--units 300] [--hz 99] [--soak 360]

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines } = require('../__test__/helpers');
const { tracedWorkload } = require('./lib/traced-workload');

const READER = require('../js/native').readerPath();

// UNITS units of traced work on each thread, or forever when UNITS is 0.
const WORKLOAD = tracedWorkload({ tracer: 'agent-cost', resource: { 'service.name': 'agent-cost' } });

function parseArgs(argv) {
  const o = { processes: 8, rounds: 2, units: 300, hz: 99, soak: 360 };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in o)) throw new Error(`unknown argument ${argv[i]}`);
    o[key] = Number(argv[++i]);
  }
  return o;
}

const TICK = 100; // USER_HZ
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-agent-cost-'));
const WORKLOAD_FILE = path.join(scratch, 'workload.js');
fs.writeFileSync(WORKLOAD_FILE, WORKLOAD);
const children = [];
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(scratch, { recursive: true, force: true });
});

/** CPU seconds (user + system) of a live process. */
function cpuSeconds(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / TICK;
}

function rssMiB(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}

async function startWorkloads(n, units) {
  const started = [];
  for (let i = 0; i < n; i++) {
    const child = spawn(process.execPath, ['--perf-basic-prof', WORKLOAD_FILE], { env: { ...process.env, UNITS: String(units) }, stdio: ['pipe', 'pipe', 'inherit'] });
    children.push(child);
    const { next } = jsonLines(child.stdout);
    const { ready } = await next('ready');
    started.push({ child, pid: ready, next });
  }
  return started;
}

/** Starts the agent on `pids`; resolves once it profiles every one. */
async function startAgent(pids, hz, interval, dir) {
  const args = ['agent', '--hz', String(hz), '--interval', String(interval), '--output-dir', dir, '--output-max-mib', '64'];
  for (const pid of pids) args.push('--pid', String(pid));
  const agent = spawn(READER, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(agent);
  let log = '';
  agent.stderr.on('data', (d) => (log += d));
  const deadline = Date.now() + 60000;
  while (!pids.every((pid) => log.includes(`profiling pid ${pid} `))) {
    if (Date.now() > deadline || agent.exitCode !== null) throw new Error(`the agent did not start:\n${log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { agent, log: () => log };
}

async function stopAgent(agent) {
  agent.kill('SIGTERM');
  await new Promise((r) => (agent.exitCode !== null ? r() : agent.once('exit', r)));
}

/** One round: the targets' CPU for the fixed work, and the agent's own CPU share while it ran. */
async function round(opts, profiled) {
  const workloads = await startWorkloads(opts.processes, opts.units);
  let agent = null;
  const dir = path.join(scratch, `out-${Date.now()}`);
  if (profiled) agent = (await startAgent(workloads.map((w) => w.pid), opts.hz, 10, dir)).agent;
  const agentCpu0 = agent ? cpuSeconds(agent.pid) : 0;
  const t0 = process.hrtime.bigint();
  for (const w of workloads) w.child.stdin.write('go\n');
  const results = await Promise.all(workloads.map((w) => w.next('result', 1800000)));
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  let agentShare = null;
  if (agent) {
    agentShare = (cpuSeconds(agent.pid) - agentCpu0) / wall;
    await stopAgent(agent);
  }
  return { targetCpu: results.reduce((a, r) => a + r.cpuTicks / TICK, 0), wall, agentShare };
}

async function soak(opts) {
  const workloads = await startWorkloads(opts.processes, 0);
  for (const w of workloads) w.child.stdin.write('go\n');
  const { agent, log } = await startAgent(workloads.map((w) => w.pid), opts.hz, 1, path.join(scratch, 'soak'));
  const cpu0 = cpuSeconds(agent.pid);
  const t0 = Date.now();
  const samples = [];
  while (Date.now() - t0 < opts.soak * 1000) {
    await new Promise((r) => setTimeout(r, 5000));
    samples.push({ t: (Date.now() - t0) / 1000, rss: rssMiB(agent.pid) });
  }
  const share = (cpuSeconds(agent.pid) - cpu0) / ((Date.now() - t0) / 1000);
  await stopAgent(agent);
  for (const w of workloads) w.child.kill('SIGKILL');
  const exports = (log().match(/wrote /g) ?? []).length;
  const skipped = Number(log().match(/\((\d+) skipped: building was behind\)/)?.[1] ?? NaN);
  const warm = samples.filter((s) => s.t >= opts.soak / 4);
  const max = (xs) => Math.max(...xs);
  return {
    exports,
    skipped,
    share,
    afterWarmUp: warm[0]?.rss,
    end: samples.at(-1)?.rss,
    peakAfterWarmUp: max(warm.map((s) => s.rss)),
    trace: samples.map((s) => `${s.t.toFixed(0)}s:${s.rss.toFixed(1)}`).join(' '),
  };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const probe = READER && spawnSync(READER, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  if (!READER || process.getuid() !== 0 || /no kernel sampler/.test(probe.stderr)) {
    console.log(`skipped: ${!READER ? 'the reader is not built' : process.getuid() !== 0 ? 'needs root' : probe.stderr.trim()}`);
    return;
  }
  console.log(`Node ${process.version}, ${os.cpus().length} CPUs, load average ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);
  const base = [];
  const prof = [];
  const shares = [];
  for (let r = 0; r < opts.rounds; r++) {
    const b = await round(opts, false);
    const p = await round(opts, true);
    base.push(b.targetCpu);
    prof.push(p.targetCpu);
    shares.push(p.agentShare);
    console.log(`round ${r + 1}: ${opts.processes} targets' CPU ${b.targetCpu.toFixed(2)} s unprofiled, ${p.targetCpu.toFixed(2)} s with the agent at ${opts.hz} Hz (ratio ${(p.targetCpu / b.targetCpu).toFixed(3)}); the agent: ${(p.agentShare * 100).toFixed(1)} % of one core over ${p.wall.toFixed(1)} s`);
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log(`targets: median CPU ${median(base).toFixed(2)} s unprofiled, ${median(prof).toFixed(2)} s profiled: ratio ${(median(prof) / median(base)).toFixed(3)} (bound 1.03); the agent's own CPU: median ${(median(shares) * 100).toFixed(1)} % of one core`);
  if (opts.soak > 0) {
    const s = await soak(opts);
    console.log(`soak: ${opts.soak} s at 1 s exports (${s.exports} exports, ${s.skipped} intervals skipped while building was behind, ${opts.processes} busy targets): agent RSS ${s.afterWarmUp?.toFixed(1)} MiB after warm-up, ${s.end?.toFixed(1)} MiB at the end (peak after warm-up ${s.peakAfterWarmUp.toFixed(1)} MiB); agent CPU ${(s.share * 100).toFixed(1)} % of one core`);
    console.log(`soak RSS trace (MiB): ${s.trace}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
