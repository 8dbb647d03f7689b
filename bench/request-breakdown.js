#!/usr/bin/env node
'use strict';
// Where a traced server's extra CPU per request goes: the http, Express and
// Fastify servers of `npm run bench`, each one process switching between
// manager kinds (stock, bare, ours by default) in turns of short bursts of
// load, as the switching suites do, while Linux `perf` samples all its
// threads (V8's GC helpers and compiler threads included) on
// CLOCK_MONOTONIC. A sample counts for the kind whose measured burst it
// falls in; each kind's CPU per request (the process's own count, over its
// bursts) is split by what its sampled threads were doing:
//
// - garbage collection: a V8 collector's frame anywhere on the stack, on
//   the main thread or a helper;
// - the package and what it calls: as in bench/self-time.js (its own code,
//   and the store reads, runtime calls and builtins it sets off; not the
//   callbacks with() runs);
// - V8 builtins, ICs and runtime, JavaScript, the kernel, other native
//   code: by the innermost frame of everything else.
//
// Beside them, the heap bytes allocated and collections per request, from
// v8.GCProfiler windows over the same bursts (bench/lib/heap.js). The
// tables show the median over rounds (one server each) of each figure and
// of ours − stock, then the innermost functions whose time differs most
// between ours and stock (or the kind --against names: bare, to see what
// the identity attributes cost).
//
//   node bench/request-breakdown.js [--node <path>[,<path>...]]
//       [--only http,service,fastify] [--kinds stock,bare,ours]
//       [--rounds N] [--cycles N] [--burst N] [--frequency HZ] [--top N]
//       [--against KIND]
//
// Needs `perf` (linux-perf) and permission to sample another process (root,
// or kernel.perf_event_paranoid <= 1). BENCHMARKS.md has a run.

const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { startCase } = require('./lib/processes');
const { addon, perfSamples, inPackageWork, functionName } = require('./lib/perf-stacks');
const { cycleOrder } = require('./lib/turns');
const { lineControl } = require('./lib/suites');
const { median } = require('./lib/stats');

/** Each server, and the requests of one measured burst (the switching suites' bursts). */
const CASES = {
  http: { server: 'http-server', path: '/', burst: 300 },
  service: { server: 'service-server', path: '/orders/42', burst: 100 },
  fastify: { server: 'fastify-server', path: '/', burst: 300 },
};
const KINDS = ['stock', 'bare', 'ours', 'record', 'name', 'rootid', 'route', 'stamps', 'floor', 'datadog'];

function fail(message) {
  console.error(`request-breakdown: ${message}`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { nodes: [], only: Object.keys(CASES), kinds: ['stock', 'bare', 'ours'], rounds: 3, cycles: 40, burst: null, frequency: 1999, top: 12, against: 'stock' };
  for (let i = 0; i < argv.length; i++) {
    const value = () => {
      if (i + 1 >= argv.length) fail(`${argv[i]} needs a value`);
      return argv[++i];
    };
    const positive = (name) => {
      const n = Number.parseInt(value(), 10);
      if (!(n > 0)) fail(`${name} must be a positive integer`);
      return n;
    };
    switch (argv[i]) {
      case '--node':
        opts.nodes.push(...value().split(',').filter(Boolean));
        break;
      case '--only':
        opts.only = value().split(',').filter(Boolean);
        for (const name of opts.only) if (!CASES[name]) fail(`unknown case ${name} (${Object.keys(CASES).join(', ')})`);
        break;
      case '--kinds':
        opts.kinds = value().split(',').filter(Boolean);
        for (const kind of opts.kinds) if (!KINDS.includes(kind)) fail(`unknown kind ${kind} (${KINDS.join(', ')})`);
        if (!opts.kinds.includes('stock')) fail('--kinds must include stock, the reference');
        break;
      case '--rounds':
        opts.rounds = positive('--rounds');
        break;
      case '--cycles':
        opts.cycles = positive('--cycles');
        break;
      case '--burst':
        opts.burst = positive('--burst');
        break;
      case '--frequency':
        opts.frequency = positive('--frequency');
        break;
      case '--top':
        opts.top = positive('--top');
        break;
      case '--against':
        opts.against = value();
        break;
      default:
        fail(`unknown option ${argv[i]}`);
    }
  }
  if (opts.nodes.length === 0) opts.nodes.push(process.execPath);
  if (!opts.kinds.includes(opts.against) || opts.against === 'ours') fail('--against must name another kind that runs (--kinds)');
  return opts;
}

/** A frame of one of V8's collectors (young or old generation, concurrent or not, sweeping). */
const GC_FRAME =
  /v8::internal::(Heap::(CollectGarbage|CollectAllGarbage|PerformGarbageCollection|GarbageCollection|MarkCompact|StartIncrementalMarking|FinalizeIncrementalMarking)|Scaveng|MarkCompact|MinorMark|ConcurrentMarking|IncrementalMarking|Sweeper|ArrayBufferSweeper|Evacuat|MarkingVisitor|MainMarkingVisitor|MarkingWorklist|PointersUpdating|GlobalHandles::(PostGarbageCollectionProcessing|InvokeFirstPassWeakCallbacks|InvokeSecondPassPhantomCallbacks)|MemoryReducer|GCTracer|CppHeap)/;

const BUCKETS = ['gc', 'package', 'v8', 'js', 'kernel', 'native'];
const BUCKET_TITLES = {
  gc: 'garbage collection (all threads)',
  package: 'the package and what it calls',
  v8: 'V8 builtins, ICs and runtime',
  js: 'other JavaScript (Node, SDK, instrumentations, server)',
  kernel: 'the kernel (sockets, scheduling)',
  native: 'other native code (Node, libuv, libc, compilers)',
};

/** The bucket of a sample's stack, innermost frame first (`<address> <symbol> (<object>)`). */
function bucketOf(frames) {
  if (frames.some((frame) => GC_FRAME.test(frame))) return 'gc';
  if (inPackageWork(frames)) return 'package';
  const leaf = frames[0];
  if (/\(\[kernel\.kallsyms\]\)$/.test(leaf)) return 'kernel';
  if (/\sJS:/.test(leaf) || /\sLazyCompile:|\sFunction:/.test(leaf)) return 'js';
  if (/\s(Builtins?[_:]|BytecodeHandler:|Stub:|Handler:|RegExp:)/.test(leaf) || /v8::internal::|v8::(Object|Value|Isolate|Function)/.test(leaf)) {
    return 'v8';
  }
  return 'native';
}

/** The index of the window [start, end] (sorted, disjoint) holding `t`, or -1. */
function windowOf(windows, t) {
  let lo = 0;
  let hi = windows.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (t < windows[mid].start) hi = mid - 1;
    else if (t > windows[mid].end) lo = mid + 1;
    else return mid;
  }
  return -1;
}

/**
 * One server switching between `kinds` (bench/lib/common.js,
 * answerSwitches), its turns taken in rotating order under burst load, while
 * perf samples all its threads: each kind's per-request figures, its
 * samples being those stamped inside its own measured bursts.
 */
async function measureRound(node, name, kinds, upstream, opts) {
  const spec = CASES[name];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-breakdown-'));
  const data = path.join(dir, 'perf.data');
  const params = { manager: kinds };
  if (upstream) params.upstream = `http://127.0.0.1:${upstream.first.port}`;
  let server = null;
  let generator = null;
  let perf = null;
  try {
    server = await startCase(node, spec.server, params, { core: 0, nodeArgs: ['--perf-basic-prof'] });
    const ran = server.first.managers;
    const ask = lineControl(server);
    const url = `http://127.0.0.1:${server.first.port}${spec.path}`;
    generator = await startCase(process.execPath, 'http-bursts', { url, connections: 10 }, { core: 1 });
    const send = lineControl(generator);
    const load = async (amount) => {
      const result = await send(String(amount));
      if (result.errors > 0) throw new Error(`${result.errors} failed requests`);
      return result;
    };
    const burst = opts.burst ?? spec.burst;
    // Every kind's paths warm (and compiled) before anything is measured.
    for (let w = 0; w < 2; w++) {
      for (const kind of ran) {
        await ask(`use ${kind}`);
        await load(burst);
      }
    }
    perf = spawn('perf', ['record', '-q', '-g', '-k', 'CLOCK_MONOTONIC', '-F', String(opts.frequency), '-p', String(server.first.pid), '-o', data], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let perfErr = '';
    perf.stderr.on('data', (d) => (perfErr += d));
    const perfDone = new Promise((resolve) => perf.on('close', resolve));
    // perf attaches asynchronously.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const totals = Object.fromEntries(ran.map((kind) => [kind, { cpuNs: 0, requests: 0, bytes: 0, scavenges: 0, gcs: 0 }]));
    const windows = [];
    for (let c = 0; c < opts.cycles; c++) {
      for (const kind of cycleOrder(ran, c)) {
        await ask(`use ${kind}`);
        await load(Math.max(2, Math.round(burst / 10)));
        const before = await ask('mark');
        const result = await load(burst);
        const after = await ask('mark');
        const t = totals[kind];
        t.cpuNs += after.cpuNs - before.cpuNs;
        t.requests += result.requests;
        t.bytes += after.heap.bytes;
        t.scavenges += after.heap.scavenges;
        t.gcs += after.heap.gcs;
        windows.push({ kind, start: Number(before.monotonicNs) / 1e9, end: Number(after.monotonicNs) / 1e9 });
      }
    }
    perf.kill('SIGINT');
    const code = await perfDone;
    if (!fs.existsSync(data)) throw new Error(`perf record failed (${code}): ${perfErr.trim()}`);
    const counts = Object.fromEntries(ran.map((kind) => [kind, { buckets: Object.fromEntries(BUCKETS.map((b) => [b, 0])), functions: new Map(), samples: 0 }]));
    for (const { seconds, frames } of perfSamples(data)) {
      const at = windowOf(windows, seconds);
      if (at < 0) continue;
      const k = counts[windows[at].kind];
      const bucket = bucketOf(frames);
      k.buckets[bucket]++;
      k.samples++;
      const fn = `${functionName(frames[0])} [${bucket}]`;
      k.functions.set(fn, (k.functions.get(fn) ?? 0) + 1);
    }
    const figures = {};
    for (const kind of ran) {
      const t = totals[kind];
      const k = counts[kind];
      const cpuUs = t.cpuNs / 1e3 / t.requests;
      // Shares of the kind's samples, as µs of its measured CPU per request.
      const share = (n) => (k.samples === 0 ? NaN : (cpuUs * n) / k.samples);
      const f = { cpuUs, bytes: t.bytes / t.requests };
      for (const b of BUCKETS) f[b] = share(k.buckets[b]);
      f.functions = new Map([...k.functions].map(([fn, n]) => [fn, share(n)]));
      f.scavenges = (1e4 * t.scavenges) / t.requests;
      f.otherGcs = (1e4 * (t.gcs - t.scavenges)) / t.requests;
      figures[kind] = f;
    }
    return figures;
  } finally {
    if (perf && perf.exitCode === null) perf.kill('SIGINT');
    if (generator) await generator.stop().catch(() => {});
    if (server) {
      server.child.kill('SIGKILL');
      // --perf-basic-prof leaves /tmp/perf-<pid>.map behind.
      fs.rmSync(`/tmp/perf-${server.first.pid}.map`, { force: true });
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

const ROWS = [
  ['cpuUs', 'CPU per request, µs'],
  ...BUCKETS.map((b) => [b, `  ${BUCKET_TITLES[b]}, µs`]),
  ['bytes', 'heap bytes allocated per request'],
  ['scavenges', 'young-generation collections per 10,000 requests'],
  ['otherGcs', 'other collections per 10,000 requests'],
];

function formatFigure(key, value) {
  if (!Number.isFinite(value)) return 'n/a';
  if (key === 'bytes') return Math.round(value).toLocaleString('en-US');
  return value.toFixed(1);
}

function signed(key, value) {
  const text = formatFigure(key, Math.abs(value));
  return value < 0 ? `−${text}` : `+${text}`;
}

/**
 * The `top` innermost functions whose µs per request differ most between
 * ours and the kind `against` (median over the rounds both ran of the
 * paired difference), with their bucket: what the extra time is spent in,
 * by function.
 */
function largestDifferences(byKind, top, against) {
  // Rounds where both ran (the Datadog peer cannot before Node 24).
  const pairs = byKind[against].map((r, i) => [r, byKind.ours[i]]).filter(([r, o]) => r !== null && o !== null);
  if (pairs.length === 0) return [`(${against} did not run here: no functions to compare)`];
  const names = new Set();
  for (const [r, o] of pairs) for (const fn of [...r.functions.keys(), ...o.functions.keys()]) names.add(fn);
  const rows = [...names].map((fn) => {
    const at = (f) => f.functions.get(fn) ?? 0;
    return { fn, reference: median(pairs.map(([r]) => at(r))), ours: median(pairs.map(([, o]) => at(o))), diff: median(pairs.map(([r, o]) => at(o) - at(r))) };
  });
  rows.sort((a, b) => Math.abs(b.diff) - Math.abs(a.diff));
  const lines = [`| innermost function [bucket] | ${against}, µs | ours, µs | ours − ${against} |`, '| --- | ---: | ---: | ---: |'];
  for (const r of rows.slice(0, top)) lines.push(`| ${r.fn.replace(/\|/g, '\\|')} | ${r.reference.toFixed(2)} | ${r.ours.toFixed(2)} | ${signed('', r.diff)} |`);
  return lines;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (spawnSync('perf', ['--version'], { stdio: 'ignore' }).status !== 0) fail('needs `perf` (linux-perf) on PATH');
  if (!addon) fail('the addon is missing; build it first with `npm install`');
  const out = [];
  for (const node of opts.nodes) {
    const version = spawnSync(node, ['-p', 'process.versions.node'], { encoding: 'utf8' }).stdout.trim();
    for (const name of opts.only) {
      const upstream = name === 'service' ? await startCase(process.execPath, 'upstream', {}, { core: 1 }) : null;
      const byKind = Object.fromEntries(opts.kinds.map((kind) => [kind, []]));
      try {
        for (let round = 0; round < opts.rounds; round++) {
          process.stderr.write(`request-breakdown: ${name} on node ${version}, round ${round + 1} of ${opts.rounds} ...\n`);
          const figures = await measureRound(node, name, opts.kinds, upstream, opts);
          // A kind the server could not run here (the Datadog peer before Node 24) shows n/a.
          for (const kind of opts.kinds) byKind[kind].push(figures[kind] ?? null);
        }
      } finally {
        if (upstream) await upstream.stop();
      }
      const ran = (kind) => byKind[kind].filter((f) => f !== null);
      const medianOf = (kind, key) => (ran(kind).length === 0 ? NaN : median(ran(kind).map((f) => f[key])));
      const diff = (key) => median(byKind.stock.map((s, i) => byKind.ours?.[i]?.[key] - s[key]));
      const hasOurs = opts.kinds.includes('ours');
      out.push(`### ${name}, Node ${version} (median of ${opts.rounds} rounds)`, '');
      out.push(`| | ${opts.kinds.join(' | ')}${hasOurs ? ' | ours − stock |' : ''}`);
      out.push(`| --- |${' ---: |'.repeat(opts.kinds.length + (hasOurs ? 1 : 0))}`);
      for (const [key, title] of ROWS) {
        const cells = opts.kinds.map((kind) => formatFigure(key, medianOf(kind, key)));
        if (hasOurs) cells.push(signed(key, diff(key)));
        out.push(`| ${title} | ${cells.join(' | ')} |`);
      }
      out.push('');
      if (hasOurs) out.push(...largestDifferences(byKind, opts.top, opts.against), '');
      process.stderr.write(`${out.slice(-ROWS.length - 4).join('\n')}\n`);
    }
  }
  console.log(out.join('\n'));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
