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
// Everything is bounded: LOAD_SECONDS of load, at most MAX_REQUESTS
// requests, a watchdog; every process started here is stopped at the end.

const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const { fork, spawnSync } = require('node:child_process');
const bpf = require('../bench/accuracy/bpf');
const reader = require('../bench/accuracy/reader');
const profiler = require('../bench/accuracy/profiler');

const ROOT = path.resolve(__dirname, '..');
const OUT = path.join(__dirname, 'out');
const FLAMEGRAPH = path.join(ROOT, 'target', 'release', 'otel-thread-ctx-flamegraph');
const LOAD_SECONDS = 8;
const CONNECTIONS = 8;
const MAX_REQUESTS = 50000;
const READER_HZ = 99;
const STACK_HZ = 499;
const WATCHDOG_MS = 90000;
// Each connection cycles through this list: one export (the outlier) per 16 requests.
const PATHS = [
  ...Array.from({ length: 3 }, (_, i) => [`/api/products/${17 + i}`, '/api/search', `/api/reports/${i}`, '/api/checkout', `/api/products/${40 + i}`]).flat(),
  '/api/export',
];

const children = new Set();
function track(child) {
  children.add(child);
  child.on('exit', () => children.delete(child));
  return child;
}
const leftovers = new Set(); // files to remove however the demo ends
function killAll() {
  for (const c of children) c.kill('SIGKILL');
  for (const f of leftovers) fs.rmSync(f, { recursive: true, force: true });
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });
}

// ------------------------------------------------------------ service

function startService(execArgv) {
  // --perf-basic-prof also makes V8 write isolate-*-v8.log files in the
  // working directory: give the service a scratch one.
  const cwd = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'otel-thread-ctx-demo-'));
  leftovers.add(cwd);
  const child = track(fork(path.join(__dirname, 'service.js'), [], { cwd, execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
  child.on('exit', () => fs.rmSync(cwd, { recursive: true, force: true }));
  const replies = new Map();
  child.on('message', (msg) => {
    replies.get(msg.type)?.(msg);
    replies.delete(msg.type);
  });
  const next = (type) => new Promise((resolve, reject) => {
    replies.set(type, resolve);
    child.once('exit', (code) => reject(new Error(`the service exited (${code}) before '${type}'`)));
  });
  return { child, next };
}

// ------------------------------------------------------------ load

/** Drives load with autocannon when installed, else with a small keep-alive loop. */
async function drive(port, seconds) {
  let autocannon = null;
  try {
    autocannon = require('autocannon');
  } catch {
    // not installed (production install): use the built-in loop
  }
  if (autocannon) {
    const result = await autocannon({
      url: `http://127.0.0.1:${port}`,
      connections: CONNECTIONS,
      duration: seconds,
      maxOverallRequests: MAX_REQUESTS,
      requests: PATHS.map((p) => ({ method: 'GET', path: p })),
    });
    return { tool: 'autocannon', requests: result.requests.total, errors: result.errors + result.non2xx, seconds: result.duration };
  }
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const deadline = Date.now() + seconds * 1000;
  let requests = 0;
  let errors = 0;
  const get = (p) => new Promise((resolve) => {
    http
      .get({ host: '127.0.0.1', port, path: p, agent }, (res) => {
        if (res.statusCode !== 200) errors++;
        res.resume().on('end', resolve);
      })
      .on('error', () => {
        errors++;
        resolve();
      });
  });
  const started = Date.now();
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async (_, c) => {
      for (let i = c; Date.now() < deadline && requests < MAX_REQUESTS; i++) {
        requests++;
        await get(PATHS[i % PATHS.length]);
      }
    }),
  );
  agent.destroy();
  return { tool: 'built-in loop', requests, errors, seconds: (Date.now() - started) / 1000 };
}

// ------------------------------------------------------------ bpftrace stacks

function stackProgram(pid, offset) {
  const variable = offset < 0n ? `curtask->thread.fsbase - ${-offset}` : `curtask->thread.fsbase + ${offset}`;
  // Key: thread, trace id (2 words), span id, attrs_data_size, the first 40
  // bytes of attrs_data (where http.route sits), user stack.
  return `
    BEGIN { printf("B\\n"); }
    interval:s:${LOAD_SECONDS + 60} { exit(); }
    profile:hz:${STACK_HZ} /pid == ${pid}/ {
      $p = *(uint64 *)uptr(${variable});
      $valid = (uint8)0;
      $t0 = (uint64)0; $t1 = (uint64)0; $span = (uint64)0; $size = (uint64)0;
      $a0 = (uint64)0; $a1 = (uint64)0; $a2 = (uint64)0; $a3 = (uint64)0; $a4 = (uint64)0;
      if ($p != 0) { $valid = *(uint8 *)uptr($p + 24); }
      if ($valid == 1) {
        $t0 = *(uint64 *)uptr($p); $t1 = *(uint64 *)uptr($p + 8); $span = *(uint64 *)uptr($p + 16);
        $size = (uint64)*(uint16 *)uptr($p + 26);
        $a0 = *(uint64 *)uptr($p + 28); $a1 = *(uint64 *)uptr($p + 36); $a2 = *(uint64 *)uptr($p + 44);
        $a3 = *(uint64 *)uptr($p + 52); $a4 = *(uint64 *)uptr($p + 60);
      }
      @s[tid, $t0, $t1, $span, $size, $a0, $a1, $a2, $a3, $a4, ustack(perf, 48)] = count();
    }`;
}

/** Parses bpftrace's printout of @s into [{tid, traceId, spanId, attrs (Buffer), frames (leaf first), count}]. */
function parseStacks(text) {
  const entries = [];
  let cur = null;
  for (const line of text.split('\n')) {
    if (line.startsWith('@s[')) {
      // `@s[k, k, ..., ` then one frame per line and `]: count`; all on one
      // line when the stack is empty.
      const close = line.indexOf(']: ');
      const keys = close >= 0 ? line.slice(3, close) : line.slice(3);
      const nums = keys.split(',').map((s) => s.trim()).filter(Boolean).map((s) => BigInt(s));
      const [tid, t0, t1, span, size, ...attrWords] = nums;
      const attrs = Buffer.alloc(40);
      attrWords.forEach((w, i) => attrs.writeBigUInt64LE(BigInt.asUintN(64, w), i * 8));
      cur = {
        tid: Number(tid),
        traceId: span === 0n ? null : le(t0) + le(t1),
        spanId: span === 0n ? null : le(span),
        attrs: attrs.subarray(0, Math.min(Number(size), 40)),
        frames: [],
        count: 0,
      };
      if (close >= 0) {
        cur.count = Number(line.slice(close + 3));
        entries.push(cur);
        cur = null;
      }
    } else if (cur && line.startsWith('\t')) {
      cur.frames.push(frameName(line.trim()));
    } else if (cur && line.startsWith(']: ')) {
      cur.count = Number(line.slice(3));
      entries.push(cur);
      cur = null;
    }
  }
  return entries;
}

/** Hex of a u64 read little-endian from memory, in memory (W3C) byte order. */
function le(v) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt.asUintN(64, v));
  return b.toString('hex');
}

/** A readable frame name from bpftrace's `addr symbol+off (module)`. */
function frameName(raw) {
  const m = /^[0-9a-f]+ (.*) \((.*)\)$/.exec(raw);
  if (!m) return raw;
  const [, symbol, module] = m;
  if (/^0x[0-9a-f]+$/.test(symbol)) return `[${path.basename(module)}]`;
  let name = symbol.replace(/\+\d+$/, '');
  const js = /^JS:[~*^+]?(.*?) (\S+):(\d+):\d+$/.exec(name);
  if (js) name = `${js[1] || '(anonymous)'} ${path.basename(js[2])}:${js[3]}`;
  else if (name.startsWith('JS:')) name = name.slice(3).replace(/^[~*^+]/, '');
  return name.replace(/;/g, ':');
}

/** Decodes attrs_data entries {key_index, len, value} into [{index, value}]. */
function decodeAttrs(buf) {
  const out = [];
  for (let i = 0; i + 2 <= buf.length; ) {
    const index = buf[i];
    const len = buf[i + 1];
    if (i + 2 + len > buf.length) break;
    out.push({ index, value: buf.subarray(i + 2, i + 2 + len).toString('utf8') });
    i += 2 + len;
  }
  return out;
}

// ------------------------------------------------------------ eBPF profile

/**
 * Runs the reader's `profile` twice over the same interval (flame graphs,
 * and one JSON line per sample) until `stop()`; `done` resolves with their
 * summary lines and the on-CPU samples [{tid, count, traceId, spanId, route}].
 */
function startProfile(pid) {
  const run = (format, file) => {
    const args = ['profile', '--pid', String(pid), '--hz', String(STACK_HZ), '--off-cpu', '--duration', String(LOAD_SECONDS + 60), '--format', format, '--max-traces', '3', '-o', path.join(OUT, file)];
    const child = track(require('node:child_process').spawn(reader.BINARY, args, { stdio: ['ignore', 'ignore', 'pipe'] }));
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    const done = new Promise((resolve) => child.on('close', (code) => resolve({ code, stderr })));
    return { child, done };
  };
  const samplesFile = path.join(OUT, 'samples.jsonl');
  const runs = [run('svg', 'profile.svg'), run('jsonl', 'samples.jsonl')];
  return {
    stop() {
      for (const r of runs) if (r.child.exitCode === null) r.child.kill('SIGINT');
    },
    done: Promise.all(runs.map((r) => r.done)).then((results) => {
      const samples = [];
      if (fs.existsSync(samplesFile)) {
        for (const line of fs.readFileSync(samplesFile, 'utf8').split('\n')) {
          if (!line) continue;
          const s = JSON.parse(line);
          if (s.kind !== 'cpu') continue;
          samples.push({ tid: s.tid, count: 1, traceId: s.trace_id ?? null, spanId: s.span_id ?? null, route: s.attributes?.['http.route'] ?? null });
        }
        fs.rmSync(samplesFile);
      }
      return { samples, summary: results.flatMap((r) => r.stderr.trim().split('\n').filter((l) => l && !/^thread context|samples\.jsonl/.test(l))) };
    }),
  };
}

// ------------------------------------------------------------ report

const pct = (n, d) => (d ? `${((100 * n) / d).toFixed(1)}%` : 'n/a');
const short = (id) => (id ? `${id.slice(0, 16)}…` : '-');

function printTables({ label, samples, threads, spans, routes, cpuSamplesPerThread = null }) {
  const threadName = new Map(threads.map((t) => [t.tid, t.name]));
  const js = samples.filter((s) => threadName.has(s.tid));
  const total = js.reduce((n, s) => n + s.count, 0);
  console.log(`\n${label}: ${total} samples on ${threads.length} JavaScript threads`);
  const bySpan = new Map();
  const byName = new Map();
  for (const s of js) {
    if (!s.spanId) continue;
    const key = `${s.traceId}/${s.spanId}/${s.tid}`;
    const e = bySpan.get(key) ?? { traceId: s.traceId, spanId: s.spanId, tid: s.tid, count: 0 };
    e.count += s.count;
    bySpan.set(key, e);
    const info = spans.get(s.spanId);
    const name = info?.name ?? `span ${s.spanId}`;
    byName.set(name, (byName.get(name) ?? 0) + s.count);
  }
  // The route is published on the server span; show it on every span of its trace.
  const traceRoute = new Map();
  for (const [spanId, route] of routes) {
    const info = spans.get(spanId);
    if (info) traceRoute.set(info.traceId, route);
  }
  const top = [...bySpan.values()].sort((a, b) => b.count - a.count).slice(0, 8);
  console.log('  top spans');
  console.log(`  ${'trace id'.padEnd(18)} ${'span'.padEnd(24)} ${'route (from records)'.padEnd(24)} ${'thread'.padEnd(7)} share`);
  for (const e of top) {
    const info = spans.get(e.spanId);
    const route = routes.get(e.spanId) ?? traceRoute.get(e.traceId) ?? '-';
    console.log(`  ${short(e.traceId).padEnd(18)} ${(info?.name ?? '?').padEnd(24)} ${route.padEnd(24)} ${threadName.get(e.tid).padEnd(7)} ${pct(e.count, total)}`);
  }
  console.log('  by span name');
  for (const [name, count] of [...byName].sort((a, b) => b[1] - a[1])) console.log(`    ${name.padEnd(28)} ${pct(count, total).padStart(6)}`);
  const idle = threads.map((t) => {
    const mine = js.filter((s) => s.tid === t.tid);
    const all = mine.reduce((n, s) => n + s.count, 0);
    const none = mine.filter((s) => !s.spanId).reduce((n, s) => n + s.count, 0);
    return `${t.name} ${pct(none, all)}`;
  });
  const none = js.filter((s) => !s.spanId).reduce((n, s) => n + s.count, 0);
  if (cpuSamplesPerThread === null) {
    console.log(`  idle (no span published: loop idle, or between callbacks): ${idle.join(', ')}; overall ${pct(none, total)}`);
  } else {
    // A CPU sampler sees a thread only while it runs: idle is the time it did not.
    const busy = threads.map((t) => {
      const n = js.filter((s) => s.tid === t.tid).reduce((k, s) => k + s.count, 0);
      return `${t.name} ${pct(Math.max(0, cpuSamplesPerThread - n), cpuSamplesPerThread)}`;
    });
    console.log(`  idle (off CPU): ${busy.join(', ')}`);
    console.log(`  on CPU with no span published (Node.js between callbacks, GC): ${idle.join(', ')}; overall ${pct(none, total)}`);
  }
}

function writeFlameGraphs(stacks, threads, spans, routes) {
  const threadName = new Map(threads.map((t) => [t.tid, t.name]));
  const mine = stacks.filter((s) => threadName.has(s.tid));
  fs.rmSync(OUT, { recursive: true, force: true });
  fs.mkdirSync(OUT, { recursive: true });
  const folded = (entries, prefix) => {
    const lines = new Map();
    for (const e of entries) {
      const line = [...prefix(e), ...[...e.frames].reverse()].join(';');
      lines.set(line, (lines.get(line) ?? 0) + e.count);
    }
    return [...lines].map(([l, n]) => `${l} ${n}`).join('\n') + '\n';
  };
  const spanLabel = (e) => (e.spanId ? spans.get(e.spanId)?.name ?? `span ${e.spanId}` : 'no span');
  const traceRoute = new Map();
  for (const [spanId, route] of routes) {
    const info = spans.get(spanId);
    if (info) traceRoute.set(info.traceId, route);
  }
  const files = [];
  const render = (name, text, title) => {
    const foldedPath = path.join(OUT, `${name}.folded`);
    const svgPath = path.join(OUT, `${name}.svg`);
    fs.writeFileSync(foldedPath, text);
    const r = spawnSync(FLAMEGRAPH, [foldedPath, svgPath, title], { encoding: 'utf8' });
    files.push({ foldedPath, svgPath: r.status === 0 ? svgPath : null, error: r.status === 0 ? null : (r.stderr || String(r.error)).trim() });
  };
  const byTrace = new Map();
  for (const e of mine) {
    if (!e.traceId) continue;
    const t = byTrace.get(e.traceId) ?? { traceId: e.traceId, count: 0, entries: [] };
    t.count += e.count;
    t.entries.push(e);
    byTrace.set(e.traceId, t);
  }
  const topTraces = [...byTrace.values()].sort((a, b) => b.count - a.count).slice(0, 3);
  for (const t of topTraces) {
    const route = traceRoute.get(t.traceId) ?? '';
    render(`trace-${t.traceId}`, folded(t.entries, (e) => [threadName.get(e.tid), spanLabel(e)]), `trace ${t.traceId} ${route} (${t.count} samples)`);
  }
  render('all-by-span', folded(mine, (e) => [spanLabel(e), threadName.get(e.tid)]), 'demo-shop CPU by span (all samples)');
  return { files, topTraces, traceRoute };
}

// ------------------------------------------------------------ main

async function main() {
  const watchdog = setTimeout(() => {
    console.error('demo: watchdog expired, stopping');
    killAll();
    process.exit(1);
  }, WATCHDOG_MS);
  watchdog.unref();

  const readerReason = reader.unavailableReason();
  const profileReason = profiler.unavailableReason();
  const bpfReason = profileReason === null ? null : bpf.unavailableReason();
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
  if (stacks) leftovers.add(perfMap);

  try {
    let bt = null;
    let stackText = '';
    let pf = null;
    if (useProfile) {
      fs.rmSync(OUT, { recursive: true, force: true });
      fs.mkdirSync(OUT, { recursive: true });
      pf = startProfile(pid);
      // Loading and attaching takes a moment: the load waits for it.
      await new Promise((resolve) => setTimeout(resolve, 1500));
    } else if (stacks) {
      let offset = readerReason === null ? reader.tlsOffset(pid, threads.filter((t) => t.tlsAddress)) : null;
      if (offset === null) {
        // fs_base is read at a system call of each thread: give them work.
        const warm = drive(port, 1.5);
        ({ offset } = await bpf.discoverTlsOffset(pid, threads.filter((t) => t.tlsAddress)));
        await warm;
      }
      // One target process: caching its symbols is safe, and naming every
      // frame without the cache takes minutes.
      bt = await bpf.startBpftrace(stackProgram(pid, offset), {
        onLine: (l) => (stackText += `${l}\n`),
        env: { BPFTRACE_CACHE_USER_SYMBOLS: '1' },
      });
      track(bt.child);
    }
    const sampleStart = Date.now();
    let rd = null;
    if (readerReason === null) {
      rd = reader.sample(pid, { hz: READER_HZ, durationS: LOAD_SECONDS + 2 });
      track(rd.child);
    }

    console.log(`load: ${CONNECTIONS} connections for ${LOAD_SECONDS} s (at most ${MAX_REQUESTS} requests) cycling over ${[...new Set(PATHS.map((p) => p.replace(/\d+$/, ':id')))].join(' ')}`);
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
    if (bt) await bt.stop(30000);
    if (bt) console.log(`stacks: bpftrace printed and named ${stackText.split('\n').length} lines in ${((Date.now() - printing) / 1000).toFixed(1)} s`);
    service.child.send({ type: 'report' });
    const { spans: spanList } = await service.next('report');
    const spans = new Map(spanList.map((s) => [s.spanId, s]));

    const stackEntries = bt ? parseStacks(stackText) : [];
    const routes = new Map();
    for (const e of stackEntries) {
      for (const a of decodeAttrs(e.attrs)) if (a.index === listening.routeKeyIndex && e.spanId) routes.set(e.spanId, a.value);
    }
    for (const s of profileRun?.samples ?? []) if (s.spanId && s.route) routes.set(s.spanId, s.route);
    if (readerRun) {
      const samples = readerRun.samples.map((s) => ({ tid: s.tid, count: 1, traceId: s.valid === 1 ? s.traceId : null, spanId: s.valid === 1 ? s.spanId : null }));
      printTables({ label: 'reader (ptrace reads every thread each round: share of wall-clock time)', samples, threads, spans, routes });
    }
    if (profileRun) {
      printTables({
        label: 'otel-thread-ctx profile (eBPF on-CPU samples: share of CPU time)',
        samples: profileRun.samples,
        threads,
        spans,
        routes,
        cpuSamplesPerThread: Math.round((STACK_HZ * sampledMs) / 1000),
      });
      console.log('\nprofile: flame graphs (whole run on and off CPU by thread and span, and the top traces):');
      for (const line of profileRun.summary) console.log(`  ${line}`);
      for (const f of fs.readdirSync(OUT).sort()) console.log(`  ${path.relative(process.cwd(), path.join(OUT, f))}`);
    }
    if (bt) {
      printTables({
        label: 'bpftrace (on-CPU samples: share of CPU time)',
        samples: stackEntries,
        threads,
        spans,
        routes,
        cpuSamplesPerThread: Math.round((STACK_HZ * sampledMs) / 1000),
      });
      if (fs.existsSync(FLAMEGRAPH)) {
        const { files, topTraces, traceRoute } = writeFlameGraphs(stackEntries, threads, spans, routes);
        console.log('\nflame graphs (folded stacks beside each SVG):');
        for (const t of topTraces) console.log(`  trace ${t.traceId} ${traceRoute.get(t.traceId) ?? ''}: ${t.count} samples`);
        for (const f of files) console.log(`  ${path.relative(process.cwd(), f.svgPath ?? f.foldedPath)}${f.error ? ` (not rendered: ${f.error})` : ''}`);
      } else {
        console.log(`\nflame graphs: ${FLAMEGRAPH} is not built (\`npm run build:demo\` builds it)`);
      }
    }
  } finally {
    if (service.child.connected) service.child.send({ type: 'exit' });
    await new Promise((resolve) => {
      if (service.child.exitCode !== null) return resolve();
      service.child.once('exit', resolve);
      setTimeout(() => service.child.kill('SIGKILL'), 3000).unref();
    });
    fs.rmSync(perfMap, { force: true });
  }
}

main().catch((err) => {
  console.error(`demo: ${err.message}`);
  killAll();
  process.exit(1);
});
