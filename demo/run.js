'use strict';
// `npm run demo`: starts the example service (demo/service.js), drives load
// against it for a few seconds, samples it from outside the process and
// prints which spans the threads were running: the top spans, CPU by route,
// and how much of the time no span was published (idle).
//
// Sampler: the project's reader (`otel-thread-ctx sample --raw`, ptrace)
// when it is built, else bpftrace. When running as root it also profiles
// on- and off-CPU stacks in the kernel with the reader's eBPF `profile`
// command (JS frames named through node --perf-basic-prof's
// /tmp/perf-<pid>.map) and writes its flame graphs, whole run and per top
// trace, into demo/out/, and tables of CPU share by span from its samples
// (`--format jsonl`). Without `profile` (a reader built
// without clang) bpftrace collects the stacks instead and the
// otel-thread-ctx-flamegraph binary renders them.
//
// Everything is bounded: LOAD_SECONDS of load, at most a fixed number of
// requests (lib/load.js), a watchdog; every process started here is
// stopped at the end (lib/processes.js).

const fs = require('node:fs');
const path = require('node:path');
const bpftrace = require('../tools/bpftrace');
const reader = require('../bench/accuracy/reader');
const profiler = require('../bench/accuracy/profiler');
const { killAll, leaveBehind, startService, stopService, track } = require('./lib/processes');
const { describeLoad, drive } = require('./lib/load');
const { findTlsOffset, startStacks } = require('./lib/stacks');
const { startProfile } = require('./lib/profile');
const { recordRoutes } = require('./lib/routes');
const { printTables } = require('./lib/tables');
const { writeFlameGraphs } = require('./lib/flamegraphs');

const ROOT = path.resolve(__dirname, '..');
const OUT = path.join(__dirname, 'out');
const FLAMEGRAPH = path.join(ROOT, 'target', 'release', 'otel-thread-ctx-flamegraph');
const LOAD_SECONDS = 8;
const READER_HZ = 99;
const STACK_HZ = 499;
const WATCHDOG_MS = 90000;

async function main() {
  const watchdog = setTimeout(() => {
    console.error('demo: watchdog expired, stopping');
    killAll();
    process.exit(1);
  }, WATCHDOG_MS);
  watchdog.unref();

  const readerReason = reader.unavailableReason();
  const profileReason = profiler.unavailableReason();
  const bpfReason = profileReason === null ? null : bpftrace.unavailableReason();
  const useProfile = profileReason === null;
  const stacks = useProfile || bpfReason === null;
  if (readerReason && bpfReason) {
    throw new Error(`no sampler: the reader is not built (${readerReason}; run npm install) and bpftrace cannot run (${bpfReason})`);
  }
  console.log(`sampler: ${readerReason === null ? `the reader (otel-thread-ctx sample --raw, ${READER_HZ} Hz)` : `bpftrace (${STACK_HZ} Hz) - the reader is not available: ${readerReason}`}`);
  console.log(
    useProfile
      ? `stacks: otel-thread-ctx profile (eBPF, ${STACK_HZ} Hz, --off-cpu)`
      : stacks
        ? `stacks: bpftrace profile:hz:${STACK_HZ} with ustack (profile is not available: ${profileReason})`
        : `stacks: off (profile: ${profileReason}; bpftrace: ${bpfReason})`,
  );

  const execArgv = stacks ? ['--perf-basic-prof', '--interpreted-frames-native-stack'] : [];
  const service = startService(execArgv);
  const listening = await service.next('listening');
  const { pid, port, threads } = listening;
  console.log(`service: demo-shop on http://127.0.0.1:${port} (pid ${pid}; threads ${threads.map((t) => `${t.name} ${t.tid}`).join(', ')})`);
  const perfMap = `/tmp/perf-${pid}.map`;
  if (stacks) leaveBehind(perfMap);

  try {
    let bt = null;
    let pf = null;
    if (useProfile) {
      fs.rmSync(OUT, { recursive: true, force: true });
      fs.mkdirSync(OUT, { recursive: true });
      pf = startProfile(pid, { hz: STACK_HZ, durationS: LOAD_SECONDS + 60, outDir: OUT });
      // Loading and attaching takes a moment: the load waits for it.
      await new Promise((resolve) => setTimeout(resolve, 1500));
    } else if (stacks) {
      const offset = await findTlsOffset(pid, threads, { useReader: readerReason === null, warm: () => drive(port, 1.5) });
      bt = await startStacks(pid, offset, { hz: STACK_HZ, maxSeconds: LOAD_SECONDS + 60 });
    }
    const sampleStart = Date.now();
    let rd = null;
    if (readerReason === null) {
      rd = reader.sample(pid, { hz: READER_HZ, durationS: LOAD_SECONDS + 2 });
      track(rd.child);
    }

    console.log(`load: ${describeLoad(LOAD_SECONDS)}`);
    const load = await drive(port, LOAD_SECONDS);
    console.log(`load: ${load.tool}: ${load.requests} requests in ${load.seconds.toFixed(1)} s, ${load.errors} errors`);

    // Detach the samplers while the service lives: bpftrace names JIT
    // frames from the perf map of the live process when it prints.
    rd?.stop();
    pf?.stop();
    const readerRun = rd ? await rd.done : null;
    const profileRun = pf ? await pf.done : null;
    const printing = Date.now();
    const sampledMs = printing - sampleStart;
    const stackRun = bt ? await bt.stop() : null;
    if (stackRun) console.log(`stacks: bpftrace printed and named ${stackRun.lines} lines in ${((Date.now() - printing) / 1000).toFixed(1)} s`);
    service.child.send({ type: 'report' });
    const { spans: spanList } = await service.next('report');
    const spans = new Map(spanList.map((s) => [s.spanId, s]));

    const stackEntries = stackRun?.entries ?? [];
    const routes = recordRoutes({ stackEntries, profileSamples: profileRun?.samples ?? [], routeKeyIndex: listening.routeKeyIndex });
    const cpuSamplesPerThread = Math.round((STACK_HZ * sampledMs) / 1000);
    if (readerRun) {
      // The reader's own tables: samples in a span by endpoint and span name.
      const summary = readerRun.summary.split('\n');
      const from = summary.findIndex((l) => l.startsWith('ENDPOINT'));
      console.log('\notel-thread-ctx sample (ptrace reads every thread each round: share of the samples in a span)');
      for (const line of from < 0 ? summary : summary.slice(from)) console.log(`  ${line}`);
    }
    if (profileRun?.top) {
      console.log('\notel-thread-ctx profile --format top (eBPF: CPU, and off-CPU time in spans)');
      for (const line of profileRun.top.trimEnd().split('\n')) console.log(`  ${line}`);
    }
    if (profileRun) {
      console.log('\nprofile: flame graphs (whole run by endpoint, and the top traces):');
      for (const line of profileRun.summary) console.log(`  ${line}`);
      for (const f of fs.readdirSync(OUT).sort()) console.log(`  ${path.relative(process.cwd(), path.join(OUT, f))}`);
    }
    if (stackRun) {
      printTables({ label: 'bpftrace (on-CPU samples: share of CPU time)', samples: stackEntries, threads, spans, routes, cpuSamplesPerThread });
      if (fs.existsSync(FLAMEGRAPH)) {
        const { files, topTraces, traceRoute } = writeFlameGraphs(stackEntries, { threads, spans, routes, outDir: OUT, flamegraph: FLAMEGRAPH });
        console.log('\nflame graphs (folded stacks beside each SVG):');
        for (const t of topTraces) console.log(`  trace ${t.traceId} ${traceRoute.get(t.traceId) ?? ''}: ${t.count} samples`);
        for (const f of files) console.log(`  ${path.relative(process.cwd(), f.svgPath ?? f.foldedPath)}${f.error ? ` (not rendered: ${f.error})` : ''}`);
      } else {
        console.log(`\nflame graphs: ${FLAMEGRAPH} is not built (\`npm run build:demo\` builds it)`);
      }
    }
  } finally {
    await stopService(service);
    fs.rmSync(perfMap, { force: true });
  }
}

main().catch((err) => {
  console.error(`demo: ${err.message}`);
  killAll();
  process.exit(1);
});
