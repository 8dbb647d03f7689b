'use strict';
// One accuracy run: start the workload, attach the samplers, let it run,
// score what each sampler saw against the workload's ground truth.

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const bpftrace = require('../../tools/bpftrace');
const { samplerProgram, collector } = require('../../tools/record-sampler');
const { onLines } = require('../../tools/subprocess');
const reader = require('./reader');
const profiler = require('./profiler');
const score = require('./score');

const WORKLOAD = path.join(__dirname, 'workload.js');

// Processes of runs in progress, stopped if this process exits mid-run.
const live = new Set();
function track(child) {
  live.add(child);
  child.on('exit', () => live.delete(child));
  return child;
}
process.on('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

/** Starts the workload with `node`; resolves {child, events, next(event)} once it is ready. */
function startWorkload(node, params) {
  const args = params.gcEvery > 0 ? ['--expose-gc'] : [];
  const child = track(spawn(node, [...args, WORKLOAD, JSON.stringify(params)], { stdio: ['pipe', 'pipe', 'inherit'] }));
  const events = [];
  const waiters = [];
  let exit = null;
  onLines(child.stdout, (line) => {
    events.push(JSON.parse(line));
    for (const w of waiters.splice(0)) w();
  });
  child.on('exit', (code, signal) => {
    exit = { code, signal };
    for (const w of waiters.splice(0)) w();
  });
  /** Resolves with the first event named `name`; rejects if the workload exits first. */
  const next = async (name, timeoutMs = 60000) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const ev = events.find((e) => e.event === name);
      if (ev) return ev;
      if (exit) throw new Error(`workload exited (${exit.code ?? exit.signal}) before '${name}'`);
      if (Date.now() > deadline) throw new Error(`workload: no '${name}' within ${timeoutMs} ms`);
      await new Promise((resolve) => {
        waiters.push(resolve);
        setTimeout(resolve, 250);
      });
    }
  };
  return { child, events, next };
}

/**
 * Runs the workload once under the requested samplers.
 * options: node (binary), samplers (['bpftrace', 'reader']), hz, readerHz,
 * workers, concurrency, cpuMs, offMs, idleMs, manager ('profiling', or
 * 'with-only': a negative control that publishes on with() only), mode
 * (the ProfilingContextManager's publishing mode, 'record' or 'frame';
 * default: the manager's own choice), gcEvery (force a moving GC in one
 * CPU segment in N, under --expose-gc), log (function for progress lines).
 * Returns {node, version, mode (in force), offset, offsetSource, nodejs?
 * (frame mode's block offset and wrapper record offset), clock, bpftrace?,
 * reader?, profile?}
 * where each sampler entry holds {onCpu, offCpu?} scores.
 */
async function runAccuracy(options = {}) {
  const {
    node = process.execPath,
    samplers = ['bpftrace'],
    hz = 997,
    readerHz = 199,
    workers = 4,
    concurrency = 8,
    cpuMs = 8000,
    offMs = 4000,
    idleMs = 1500,
    manager = 'profiling',
    mode = null,
    gcEvery = 0,
    keepRaw = false,
    log = () => {},
  } = options;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-accuracy-'));
  const params = { workers, concurrency, cpuMs, offMs, idleMs, tailMs: 300, dir, manager, mode, gcEvery };
  const workload = startWorkload(node, params);
  let bt = null;
  let rd = null;
  let pf = null;
  try {
    const ready = await workload.next('ready', 30000);
    const { pid, threads } = ready;
    const mainTid = threads[0].tid;
    // The mode in force, as every thread reports it (the default: the manager's choice).
    const modes = new Set(threads.map((t) => t.mode));
    if (modes.size !== 1) {
      const why = threads.map((t) => `${t.tid} ${t.mode}${t.frameUnavailableReason ? ` (${t.frameUnavailableReason})` : ''}`);
      throw new Error(`threads publish in different modes: ${why.join('; ')}`);
    }
    const [modeInForce] = modes;
    const result = { node, pid, threads: threads.length, mode: modeInForce };

    // Where otel_thread_ctx_v1 sits from the thread pointer: the reader's
    // `inspect --json` when it resolves it, else fs_base read by bpftrace.
    let offset = samplers.includes('bpftrace') ? reader.tlsOffset(pid, threads) : null;
    result.offsetSource = 'reader inspect --json';
    if (offset === null && samplers.includes('bpftrace')) {
      ({ offset } = await bpftrace.discoverTlsOffset(pid, threads));
      result.offsetSource = 'bpftrace fs_base vs threadInfo().tlsAddress';
    }
    result.offset = offset === null ? null : String(offset);
    if (offset !== null) log(`TLS offset of otel_thread_ctx_v1 from fs_base: ${offset} (${result.offsetSource}, same on ${threads.length} threads)`);

    // Frame mode: bpftrace walks the Node.js schema from the thread's
    // otel_thread_ctx_nodejs_v1 block, whose offset from fs_base it reads
    // itself, with the record offset the writer published.
    let nodejs = null;
    if (samplers.includes('bpftrace') && modeInForce === 'frame') {
      const { offset: blockOffset } = await bpftrace.discoverTlsOffset(pid, threads, 'frameTlsAddress');
      const recordOffsets = new Set(threads.map((t) => t.jsObjectRecordOffset));
      if (recordOffsets.size !== 1) throw new Error(`threads disagree on the wrapper's record offset: ${[...recordOffsets].join(', ')}`);
      const [recordOffset] = recordOffsets;
      nodejs = { offset: blockOffset, recordOffset };
      result.nodejs = { offset: String(blockOffset), recordOffset };
      log(`TLS offset of otel_thread_ctx_nodejs_v1 from fs_base: ${blockOffset}, wrapper record offset ${recordOffset} (bpftrace fs_base vs threadInfo().frame)`);
    }

    let col = null;
    if (samplers.includes('bpftrace')) {
      col = collector();
      const program = samplerProgram({ pid, offset, nodejs, hz, clockTid: mainTid, maxSeconds: Math.ceil((cpuMs + offMs + idleMs) / 1000) + 120 });
      bt = await bpftrace.startBpftrace(program, { onLine: col.onLine });
      track(bt.child);
      log(`bpftrace attached (profile:hz:${hz}, sched_switch${nodejs ? ', walking the Node.js schema' : ''})`);
    }
    if (samplers.includes('reader')) {
      const durationS = Math.ceil((cpuMs + offMs + idleMs + 2000) / 1000);
      rd = reader.sample(pid, { hz: readerHz, durationS });
      track(rd.child);
      log(`reader sampling at ${readerHz} Hz`);
    }

    if (samplers.includes('profile')) {
      const durationS = Math.ceil((cpuMs + offMs + idleMs) / 1000) + 120;
      pf = profiler.start(pid, { hz, durationS });
      track(pf.child);
      // Attaching (load, verify, a perf event per CPU) takes a moment.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      log(`profile attached (perf event at ${hz} Hz per CPU, sched_switch)`);
    }

    const t0 = Date.now();
    workload.child.stdin.write('go\n');
    const clock = await workload.next('clock');
    await workload.next('done', cpuMs + offMs + idleMs + 60000);
    log(`workload ran ${((Date.now() - t0) / 1000).toFixed(1)} s`);

    // Detach every sampler before the workload exits.
    if (bt) await bt.stop();
    rd?.stop();
    pf?.stop();
    const readerRun = rd ? await rd.done : null;
    const profileRun = pf ? await pf.done : null;
    const exited = new Promise((resolve) => workload.child.once('exit', resolve));
    workload.child.stdin.end();
    await exited;

    const truth = score.loadTruth(dir);
    if (bt) {
      const bsamples = col.samples;
      result.bpftrace = {
        lost: bt.lost,
        samples: bsamples.length,
        onCpu: score.scoreOnCpu(truth, bsamples),
        offCpu: score.scoreOffCpu(truth, col.offcpu),
      };
      const w = col.clock;
      result.clock = w
        ? { ok: BigInt(clock.before) <= w.t && w.t <= BigInt(clock.after), hrtimeBefore: clock.before, bpfNsecs: String(w.t), hrtimeAfter: clock.after }
        : { ok: null };
    }
    if (readerRun) {
      const { samples: rsamples, errors } = readerRun;
      result.reader = {
        samples: rsamples.length,
        errors,
        onCpu: score.scoreOnCpu(truth, rsamples),
        inBlocks: score.scoreReadsInBlocks(truth, rsamples),
      };
    }
    if (profileRun) {
      result.profile = {
        samples: profileRun.samples.length,
        onCpu: score.scoreOnCpu(truth, profileRun.samples),
        offCpu: score.scoreOffCpu(truth, profileRun.offcpu),
      };
    }
    if (keepRaw) result.raw = { truth, bpftrace: col, reader: readerRun };
    result.truth = {
      threads: truth.length,
      spans: truth.reduce((n, t) => n + t.spans, 0),
      segments: truth.reduce((n, t) => n + t.segments.length, 0),
      blocks: truth.reduce((n, t) => n + t.blocks.length, 0),
      // Frame mode: moving GCs per thread ({forced, moving, gateClosed, spanPinned}).
      gcs: truth.map((t) => t.gcs),
    };
    return result;
  } finally {
    if (bt) await bt.stop();
    rd?.stop();
    pf?.stop();
    if (workload.child.exitCode === null && workload.child.signalCode === null) workload.child.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** Printable report of one run. */
function formatRun(r) {
  const lines = [];
  if (r.clock) {
    lines.push(
      r.clock.ok === null
        ? 'clock check: the probe write was not seen'
        : `clock check: bpftrace nsecs ${r.clock.ok ? 'inside' : 'OUTSIDE'} the hrtime bracket of the same write(2) (CLOCK_MONOTONIC ${r.clock.ok ? 'confirmed' : 'MISMATCH'})`,
    );
  }
  lines.push(`mode: ${r.mode}`);
  lines.push(`truth: ${r.truth.threads} threads, ${r.truth.spans} spans, ${r.truth.segments} CPU segments, ${r.truth.blocks} blocking calls`);
  if (r.bpftrace) {
    lines.push(...score.formatOnCpu(r.bpftrace.onCpu, `bpftrace profile (${r.bpftrace.samples} samples${r.bpftrace.lost ? `, ${r.bpftrace.lost} lost` : ''})`));
    lines.push(...score.formatOffCpu(r.bpftrace.offCpu));
  }
  if (r.profile) {
    lines.push(...score.formatOnCpu(r.profile.onCpu, `profile (eBPF, ${r.profile.samples} on-CPU samples)`));
    lines.push(...score.formatOffCpu(r.profile.offCpu));
  }
  if (r.reader) {
    const label = `reader sample --raw (${r.reader.samples} reads${r.reader.errors ? `, ${r.reader.errors} failed` : ''})`;
    lines.push(...score.formatOnCpu(r.reader.onCpu, label), score.formatReadsInBlocks(r.reader.inBlocks));
  }
  return lines;
}

module.exports = { runAccuracy, formatRun };
