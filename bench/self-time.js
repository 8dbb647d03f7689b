#!/usr/bin/env node
'use strict';
// Where a traced server's CPU goes, measured with Linux `perf` (call
// graphs) on the http and Express service servers of `npm run bench` under
// load, with ProfilingContextManager, as two shares of its on-CPU samples:
//
// - self time: the innermost frame is the package's own code (js/,
//   index.js, the addon);
// - the package and what it calls: the nearest package frame up the stack
//   is reached through native frames and Node's own JavaScript only, before
//   any AsyncLocalStorage run(), so the store reads, runtime calls and
//   collections that our hooks and with() set off count, and the callbacks
//   that with() runs do not.
//
// Unlike the servers' CPU ratios, this does not compare two processes, so
// the host's speed changes cancel out (they stretch every frame alike).
// Both are lower bounds of what ours costs above the floor: our code that
// V8 inlined into a caller outside the package counts as that caller, and
// what we allocate and leave to a later collection, or the cache lines we
// take from the code around us, count where they are paid.
//
//   node bench/self-time.js [--node <path>[,<path>...]] [--only http,service]
//                           [--requests N] [--frequency HZ]
//
// Needs `perf` (linux-perf) and permission to sample another process (root,
// or kernel.perf_event_paranoid <= 1). BENCHMARKS.md has a run.

const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { runCase, startCase } = require('./lib/processes');
const { addon, perfSamples, isOurs, inPackageWork, functionName } = require('./lib/perf-stacks');

const CASES = {
  http: { server: 'http-server', path: '/', requests: 30000 },
  service: { server: 'service-server', path: '/orders/42', requests: 8000 },
};

function parseArgs(argv) {
  const opts = { nodes: [], only: Object.keys(CASES), requests: null, frequency: 2999 };
  for (let i = 0; i < argv.length; i++) {
    const value = () => {
      if (i + 1 >= argv.length) fail(`${argv[i]} needs a value`);
      return argv[++i];
    };
    switch (argv[i]) {
      case '--node':
        opts.nodes.push(...value().split(',').filter(Boolean));
        break;
      case '--only':
        opts.only = value().split(',').filter(Boolean);
        for (const name of opts.only) if (!CASES[name]) fail(`unknown case ${name}`);
        break;
      case '--requests':
        opts.requests = Number.parseInt(value(), 10);
        if (!(opts.requests > 0)) fail('--requests must be > 0');
        break;
      case '--frequency':
        opts.frequency = Number.parseInt(value(), 10);
        if (!(opts.frequency > 0)) fail('--frequency must be > 0');
        break;
      default:
        fail(`unknown option ${argv[i]}`);
    }
  }
  if (opts.nodes.length === 0) opts.nodes.push(process.execPath);
  return opts;
}

function fail(message) {
  console.error(`self-time: ${message}`);
  process.exit(2);
}

async function profileCase(node, name, opts) {
  const spec = CASES[name];
  const requests = opts.requests ?? spec.requests;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-self-time-'));
  const data = path.join(dir, 'perf.data');
  const upstream = name === 'service' ? await startCase(process.execPath, 'upstream', {}, { core: 1 }) : null;
  let server = null;
  let perf = null;
  try {
    const params = { manager: 'ours' };
    if (upstream) params.upstream = `http://127.0.0.1:${upstream.first.port}`;
    server = await startCase(node, spec.server, params, { core: 0, nodeArgs: ['--perf-basic-prof'] });
    const url = `http://127.0.0.1:${server.first.port}${spec.path}`;
    await runCase(process.execPath, 'http-load', { url, amount: Math.ceil(requests / 3), connections: 10 }, { core: 1 });
    perf = spawn('perf', ['record', '-q', '-g', '-F', String(opts.frequency), '-p', String(server.first.pid), '-o', data], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let perfErr = '';
    perf.stderr.on('data', (d) => (perfErr += d));
    const perfDone = new Promise((resolve) => perf.on('close', resolve));
    // perf attaches asynchronously; a short pause keeps the start of the load in the profile.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const load = await runCase(process.execPath, 'http-load', { url, amount: requests, connections: 10 }, { core: 1 });
    perf.kill('SIGINT');
    const code = await perfDone;
    if (!fs.existsSync(data)) throw new Error(`perf record failed (${code}): ${perfErr.trim()}`);
    if (load.errors > 0) throw new Error(`${load.errors} failed requests`);
    const stacks = perfSamples(data).map((sample) => sample.frames);
    const byFunction = new Map();
    let inclusive = 0;
    for (const frames of stacks) {
      if (inPackageWork(frames)) inclusive++;
      if (!isOurs(frames[0])) continue;
      const fn = functionName(frames[0]);
      byFunction.set(fn, (byFunction.get(fn) ?? 0) + 1);
    }
    const total = stacks.length;
    const ours = [...byFunction.values()].reduce((a, b) => a + b, 0);
    const top = [...byFunction.entries()].sort((a, b) => b[1] - a[1]).slice(0, 6);
    return { total, ours, inclusive, top, rps: load.rps };
  } finally {
    // A failed load would leave perf attached to the server; SIGINT ends it.
    if (perf && perf.exitCode === null) perf.kill('SIGINT');
    if (server) {
      server.child.kill('SIGKILL');
      // --perf-basic-prof leaves /tmp/perf-<pid>.map behind.
      fs.rmSync(`/tmp/perf-${server.first.pid}.map`, { force: true });
    }
    if (upstream) await upstream.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (spawnSync('perf', ['--version'], { stdio: 'ignore' }).status !== 0) fail('needs `perf` (linux-perf) on PATH');
  if (!addon) fail('the addon is missing; build it first with `npm install`');
  const lines = [
    '| case | Node | samples | self time in the package | the package and what it calls | its largest functions (self) |',
    '| --- | --- | ---: | ---: | ---: | --- |',
  ];
  for (const node of opts.nodes) {
    const version = spawnSync(node, ['-p', 'process.versions.node'], { encoding: 'utf8' }).stdout.trim();
    for (const name of opts.only) {
      process.stderr.write(`self-time: ${name} on node ${version} ...\n`);
      const r = await profileCase(node, name, opts);
      const share = (n) => `${((100 * n) / r.total).toFixed(2)} %`;
      const top = r.top.map(([fn, n]) => `${fn} ${share(n)}`).join(', ');
      lines.push(`| ${name} | ${version} | ${r.total} | ${share(r.ours)} | ${share(r.inclusive)} | ${top} |`);
    }
  }
  console.log(lines.join('\n'));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
