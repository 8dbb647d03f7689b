'use strict';
// The cost of `otel-thread-ctx profile` (or `sample`) on its target: the CPU
// time a fixed amount of traced work takes (main thread + one worker, spans
// entered with the ProfilingContextManager, awaits between units) with and
// without the reader attached, in alternating rounds. `profile` needs root
// and a reader built with its BPF program; `sample` (ptrace) also reports
// how long it held the target's threads and its own CPU per thread read.
//
// The CPU ratio is noisy on a shared machine; alongside it, the run time the
// kernel counts for the profiler's BPF programs (kernel.bpf_stats_enabled,
// read from the programs' fdinfo) is reported as a share of the target's CPU:
// an upper bound on what the programs take from the target, since the
// sched_switch program also runs, and is counted, for every other task.
//
//   node bench/profile-overhead.js [--rounds 3] [--units 400] [--hz 99] [--off-cpu] [--sampler profile|sample]

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines } = require('../__test__/helpers');
const { tracedWorkload } = require('./lib/traced-workload');
const { enableBpfStats, pollBpfPrograms } = require('./lib/bpf-stats');

const READER = require('../js/native').readerPath();

const WORKLOAD = tracedWorkload({ tracer: 'overhead' });

function parseArgs(argv) {
  const o = { rounds: 3, units: 400, hz: 99, offCpu: false, sampler: 'profile' };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--rounds') o.rounds = Number(argv[++i]);
    else if (argv[i] === '--units') o.units = Number(argv[++i]);
    else if (argv[i] === '--hz') o.hz = Number(argv[++i]);
    else if (argv[i] === '--off-cpu') o.offCpu = true;
    else if (argv[i] === '--sampler') o.sampler = argv[++i];
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return o;
}

// Workers need a file to run: the workload is written to a scratch one.
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-profile-overhead-'));
const WORKLOAD_FILE = path.join(scratch, 'workload.js');
fs.writeFileSync(WORKLOAD_FILE, WORKLOAD);
process.on('exit', () => fs.rmSync(scratch, { recursive: true, force: true }));

async function once(opts, profiled) {
  const child = spawn(process.execPath, [WORKLOAD_FILE], { env: { ...process.env, UNITS: String(opts.units) }, stdio: ['pipe', 'pipe', 'inherit'] });
  const { next } = jsonLines(child.stdout);
  const { ready: pid } = await next('ready');
  let profiler = null;
  let summary = '';
  let stdout = '';
  if (profiled) {
    const args =
      opts.sampler === 'sample'
        ? ['sample', '--pid', String(pid), '--duration', '600', '--hz', String(opts.hz), '--json']
        : ['profile', '--pid', String(pid), '--duration', '600', '--hz', String(opts.hz), '-o', '/dev/null'];
    if (opts.offCpu && opts.sampler === 'profile') args.push('--off-cpu');
    // `sample` under GNU time, which prints the reader's own user and system
    // CPU seconds last on stderr (`profile` reports its own per sample, and
    // holds the BPF programs whose counters are read below).
    profiler =
      opts.sampler === 'sample'
        ? spawn('/usr/bin/time', ['-f', 'reader-cpu %U %S', READER, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
        : spawn(READER, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    profiler.stdout.on('data', (d) => (stdout += d));
    profiler.stderr.on('data', (d) => (summary += d));
    // The work starts once the reader samples: `profile` says so after the
    // kernel verified and attached its programs, which takes seconds;
    // `sample` attaches as it starts.
    if (opts.sampler === 'sample') await new Promise((r) => setTimeout(r, 1000));
    else {
      await new Promise((resolve, reject) => {
        const check = () => {
          if (summary.includes(': sampling pid ')) resolve();
          else if (profiler.exitCode !== null) reject(new Error(`profile exited before sampling:\n${summary}`));
          else setTimeout(check, 50);
        };
        check();
      });
    }
  }
  // The programs' counters, read until the profiler exits.
  const exited = profiler && new Promise((r) => profiler.once('exit', r));
  const programs = profiler && pollBpfPrograms(profiler.pid, exited);
  child.stdin.write('go\n');
  const { cpuTicks } = await next('result', 600000);
  let bpf = null;
  if (profiler) {
    const ps = await programs;
    if (ps.length) bpf = { runTimeNs: ps.reduce((t, p) => t + p.runTimeNs, 0), runs: ps.reduce((t, p) => t + p.runs, 0) };
  }
  const own = summary.match(/([\d.]+) µs per sample \((\d+) samples?\)/);
  const truncated = summary.match(/truncated user stacks: ([^\n]*)/);
  const readerCpu = summary.match(/reader-cpu ([\d.]+) ([\d.]+)/);
  const result = { cpu: cpuTicks / 100, bpf, perSampleUs: own ? Number(own[1]) : null, samples: own ? Number(own[2]) : null, truncated: truncated?.[1] ?? null };
  if (profiled && opts.sampler === 'sample') {
    const s = JSON.parse(stdout);
    result.samples = s.reads;
    result.perSampleUs = readerCpu ? Number(((Number(readerCpu[1]) + Number(readerCpu[2])) * 1e6 / s.reads).toFixed(1)) : null;
    result.truncated = `held median ${(s.stop_time.held_median_ns / 1e3).toFixed(1)} µs, p90 ${(s.stop_time.held_p90_ns / 1e3).toFixed(1)} µs, max ${(s.stop_time.held_max_ns / 1e3).toFixed(1)} µs; ${s.achieved_hz.toFixed(1)} Hz achieved, ${s.late_stops} late stops`;
  }
  return result;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const probe = spawnSync(READER, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  if (opts.sampler === 'profile' && (process.getuid() !== 0 || /no kernel sampler/.test(probe.stderr))) {
    console.log(`skipped: ${process.getuid() !== 0 ? 'needs root' : probe.stderr.trim()}`);
    return;
  }
  const statsOn = enableBpfStats(); // without counters the share is not reported
  const base = [];
  const prof = [];
  const perSample = [];
  const bpfShare = [];
  for (let r = 0; r < opts.rounds; r++) {
    base.push((await once(opts, false)).cpu);
    const p = await once(opts, true);
    prof.push(p.cpu);
    perSample.push(p.perSampleUs);
    const what = opts.sampler === 'sample' ? 'thread read' : 'sample';
    const extra = opts.sampler === 'sample' ? 'stops' : 'truncated user stacks';
    let bpfText = '';
    if (statsOn && p.bpf) {
      bpfShare.push(p.bpf.runTimeNs / 1e9 / p.cpu);
      bpfText = `; BPF programs ${(p.bpf.runTimeNs / 1e6).toFixed(1)} ms in ${p.bpf.runs} runs (${(p.bpf.runTimeNs / Math.max(p.bpf.runs, 1) / 1000).toFixed(2)} µs each) = ${(100 * bpfShare.at(-1)).toFixed(2)} % of the target's CPU`;
    }
    console.log(`round ${r + 1}: target CPU ${base.at(-1).toFixed(2)} s without, ${prof.at(-1).toFixed(2)} s with ${opts.sampler} at ${opts.hz} Hz${opts.offCpu ? ' --off-cpu' : ''}; the reader: ${p.perSampleUs} µs of CPU per ${what} (${p.samples}); ${extra}: ${p.truncated}${bpfText}`);
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const bpfSummary = bpfShare.length ? `; BPF programs' run time: median ${(100 * median(bpfShare)).toFixed(2)} % of the target's CPU (an upper bound of their share)` : '';
  console.log(`Node ${process.version}: median target CPU ${median(base).toFixed(2)} s without, ${median(prof).toFixed(2)} s with ${opts.sampler}: ratio ${(median(prof) / median(base)).toFixed(3)}; the reader's own CPU: median ${median(perSample)} µs per ${opts.sampler === 'sample' ? 'thread read' : 'sample'}${bpfSummary}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
