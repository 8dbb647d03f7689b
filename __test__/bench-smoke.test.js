'use strict';
// Smoke test of the benchmark harness: it runs and prints a table with
// numbers. Tiny iteration counts; no timing is asserted.
const { test } = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { scratchDir } = require('./helpers');

const ROOT = path.resolve(__dirname, '..');

/**
 * Runs `node bench/run.js --quick <args> --node <this node>` and returns
 * its stdout and its JSON results; fails the test when it fails.
 */
function runBench(args, timeout) {
  const dir = scratchDir('otel-bench-');
  const json = path.join(dir, 'results.json');
  try {
    const r = spawnSync(process.execPath, ['bench/run.js', '--quick', ...args, '--node', process.execPath, '--json', json], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout,
    });
    assert.strictEqual(r.status, 0, r.stderr);
    return { stdout: r.stdout, results: JSON.parse(fs.readFileSync(json, 'utf8')).results };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

test('bench/run.js --quick prints a table of numbers and writes JSON', () => {
  const { stdout, results } = runBench(['--only', 'direct,sync', '--scale', '0.01'], 60000);
  const lines = stdout.split('\n');
  const header = lines.find((l) => l.startsWith('| benchmark |'));
  assert.ok(header && header.includes(`Node ${process.versions.node}`), stdout);
  for (const label of ['setSpanContext() per call', 'sync context.with() added time per call']) {
    const row = lines.find((l) => l.startsWith(`| ${label} |`));
    assert.ok(row, `no row for ${label}:\n${stdout}`);
    assert.match(row, /[+-]?\d+\.\d+ ns/);
  }
  const [sync] = results.sync[process.versions.node].rounds;
  assert.equal(sync.stock.manager, 'AsyncLocalStorageContextManager');
  assert.equal(sync.ours.manager, 'ProfilingContextManager');
  const rows = results.direct[process.versions.node].rows;
  assert.ok(rows.every((row) => Number.isFinite(row.median) && row.median > 0));
});

test('bench/run.js --quick runs the interleave, service and memory cases with stock, the floor, the references and ours', () => {
  const { stdout, results } = runBench(['--rounds', '1', '--only', 'interleave,service,memory', '--scale', '0.01'], 120000);
  const lines = stdout.split('\n');
  const rowFor = (label) => {
    const row = lines.find((l) => l.startsWith(`| ${label} |`));
    assert.ok(row, `no row for ${label}:\n${stdout}`);
    return row;
  };
  assert.match(rowFor('with() cycling 16 SDK spans, added time per call (ours − stock)'), /[+-]?\d+\.\d+ ns/);
  assert.match(rowFor('bare await, 16 interleaved SDK spans (ours/floor)'), /\| \d+\.\d\d/);
  assert.match(rowFor('Express service server CPU per request (ours/stock)'), /\| \d+\.\d\d/);
  assert.match(rowFor('bytes per bare await, 16 interleaved SDK spans (ours − floor)'), /[+-]?\d+(\.\d)? B/);
  // One process, the variants taking turns, each its own manager.
  const [round] = results.interleave[process.versions.node].rounds;
  const managers = {
    stock: 'AsyncLocalStorageContextManager',
    floor: 'FloorContextManager',
    store: 'FloorContextManager',
    write: 'RecordWriteContextManager',
    ours: 'ProfilingContextManager',
  };
  for (const [variant, manager] of Object.entries(managers)) {
    assert.equal(round[variant].manager, manager, variant);
    for (const field of ['withNs', 'awaitNs', 'hopNs']) assert.ok(round[variant][field] > 0, `${variant} ${field}`);
    for (const field of ['withTurns', 'awaitTurns', 'hopTurns']) {
      assert.ok(round[variant][field].length >= 2 && round[variant][field].every((ns) => ns > 0), `${variant} ${field}`);
    }
  }
  const [service] = results.service[process.versions.node].rounds;
  for (const variant of ['none', 'stock', 'floor', 'ours']) {
    assert.ok(service[variant].requests > 0 && service[variant].cpuNsPerRequest > 0, variant);
    // Traced variants export the server, Express and client spans of each request.
    if (variant !== 'none') assert.ok(service[variant].spans >= service[variant].requests * 3, `${variant} spans`);
  }
});

test('bench/run.js --quick runs the switching suites: one server taking turns with stock, the floor, ours, identity off, record mode and (Node 24+) Datadog\'s writer', () => {
  const { stdout, results } = runBench(['--rounds', '1', '--only', 'http-switching,service-switching,fastify-switching', '--scale', '0.2'], 180000);
  for (const title of ['http', 'Express service', 'Fastify']) {
    assert.match(stdout, new RegExp(`\\| ${title} server CPU per request, one process switching managers \\(ours/stock\\) \\| \\d+\\.\\d\\d`));
    assert.match(stdout, new RegExp(`\\| ${title} server CPU per request, one process switching managers, identity attributes off \\(bare/stock\\) \\| \\d+\\.\\d\\d`));
  }
  const classes = {
    stock: 'AsyncLocalStorageContextManager',
    floor: 'FloorContextManager',
    ours: 'ProfilingContextManager',
    bare: 'ProfilingContextManager',
    record: 'ProfilingContextManager',
  };
  // Datadog's writer publishes only where AsyncLocalStorage runs on AsyncContextFrame.
  if (Number(process.versions.node.split('.')[0]) >= 24) classes.datadog = 'DatadogContextManager';
  for (const suite of ['http-switching', 'service-switching', 'fastify-switching']) {
    const [round] = results[suite][process.versions.node].rounds;
    for (const [variant, manager] of Object.entries(classes)) {
      assert.strictEqual(round[variant].manager, manager, `${suite} ${variant}`);
      assert.ok(round[variant].requests > 0 && round[variant].cpuNsPerRequest > 0, `${suite} ${variant}`);
      assert.ok(Number.isFinite(round[variant].bytesPerRequest), `${suite} ${variant}: heap bytes per request`);
    }
  }
});

test('bench/run.js --quick runs the interleaved suites: one server process per manager kind, a second stock one, loaded in turns', () => {
  const { stdout, results } = runBench(['--rounds', '1', '--only', 'http-interleaved,service-interleaved,fastify-interleaved', '--scale', '0.2'], 180000);
  for (const title of ['http', 'Express service', 'Fastify']) {
    const cpu = `${title} server CPU per request, separate servers interleaved`;
    assert.match(stdout, new RegExp(`\\| ${cpu} \\(ours/stock\\) \\| \\d+\\.\\d\\d`));
    assert.match(stdout, new RegExp(`\\| ${cpu}, the null test \\(stock2/stock\\) \\| \\d+\\.\\d\\d`));
  }
  const kinds = ['stock', 'stock2', 'ours', 'bare', 'record'];
  // Datadog's writer publishes only where AsyncLocalStorage runs on AsyncContextFrame.
  if (Number(process.versions.node.split('.')[0]) >= 24) kinds.push('datadog');
  for (const suite of ['http-interleaved', 'service-interleaved', 'fastify-interleaved']) {
    const [round] = results[suite][process.versions.node].rounds;
    assert.deepStrictEqual(Object.keys(round).sort(), [...kinds].sort(), suite);
    for (const kind of kinds) {
      const r = round[kind];
      assert.ok(r.bursts.length >= 2 && r.bursts.every((ns) => ns > 0), `${suite} ${kind}: bursts`);
      assert.strictEqual(r.ratios.length, r.bursts.length, `${suite} ${kind}: ratios`);
      assert.ok(Number.isFinite(r.ratio) && r.ratio > 0, `${suite} ${kind}: ratio`);
      // Same request count for every server; every request traced.
      assert.strictEqual(r.served, round.stock.served, `${suite} ${kind}: served`);
      assert.ok(r.spans >= r.served, `${suite} ${kind}: spans`);
    }
    assert.strictEqual(round.stock.ratio, 1);
  }
});

test('bench/run.js --kinds runs the interleaved suites with the managers chosen, stock always among them (here with --export otlp)', () => {
  const { stdout, results } = runBench(['--rounds', '1', '--only', 'http-interleaved', '--scale', '0.2', '--kinds', 'name,rootid,route,stamps', '--export', 'otlp'], 180000);
  const [round] = results['http-interleaved'][process.versions.node].rounds;
  assert.deepStrictEqual(Object.keys(round).sort(), ['name', 'rootid', 'route', 'stamps', 'stock']);
  for (const kind of ['name', 'rootid', 'route', 'stamps']) {
    assert.ok(Number.isFinite(round[kind].ratio) && round[kind].ratio > 0, `${kind}: ratio`);
    assert.ok(round[kind].spans >= round[kind].served, `${kind}: every request traced`);
  }
  assert.match(stdout, /\| http server CPU per request, separate servers interleaved \(ours\/stock\) \| n\/a/);
  const refused = spawnSync(process.execPath, ['bench/run.js', '--kinds', 'nosuch'], { cwd: ROOT, encoding: 'utf8' });
  assert.strictEqual(refused.status, 2);
  assert.match(refused.stderr, /--kinds: unknown kind nosuch/);
});

test('bench/cold-spans.js prints, warm and cold, every variant\'s time per unit and its extra per span over stock', () => {
  const r = spawnSync(process.execPath, ['bench/cold-spans.js', '--rounds', '1', '--units', '20', '--warm-ups', '50'], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 120000,
  });
  assert.strictEqual(r.status, 0, r.stderr);
  const frame = /ours in frame mode/.test(r.stdout);
  for (const condition of ['warm', 'cold']) {
    for (const kind of ['stock', 'bare', 'ours', ...(frame ? ['record'] : [])]) {
      const line = r.stdout.split('\n').find((l) => l.startsWith(`${condition} ${kind} `));
      assert.ok(line, `no ${condition} ${kind} line:\n${r.stdout}`);
      assert.match(line, /\d+\.\d\d µs per unit \[\d+\.\d\d, \d+\.\d\d\] {2}\d+\.\d\dx stock/);
      if (kind !== 'stock') assert.match(line, /-?\d+ ns per span over stock$/);
    }
  }
});

test('bench/cold-spans.js refuses a bad argument', () => {
  const r = spawnSync(process.execPath, ['bench/cold-spans.js', '--rounds', '0'], { cwd: ROOT, encoding: 'utf8' });
  assert.notStrictEqual(r.status, 0);
  assert.match(r.stderr, /RangeError: --rounds must be a positive integer/);
});

const perfReason = (() => {
  if (spawnSync('perf', ['--version'], { stdio: 'ignore' }).status !== 0) return 'needs perf (linux-perf)';
  if (typeof process.getuid === 'function' && process.getuid() !== 0) {
    const paranoid = Number.parseInt(fs.readFileSync('/proc/sys/kernel/perf_event_paranoid', 'utf8'), 10);
    if (!(paranoid <= 1)) return 'needs root or kernel.perf_event_paranoid <= 1';
  }
  return null;
})();

test('bench/request-breakdown.js splits each manager\'s CPU per request into parts that add up to it', { skip: perfReason ?? false }, () => {
  const r = spawnSync(
    process.execPath,
    ['bench/request-breakdown.js', '--only', 'http', '--kinds', 'stock,bare,ours', '--against', 'bare', '--rounds', '1', '--cycles', '10', '--burst', '150', '--top', '5'],
    { cwd: ROOT, encoding: 'utf8', timeout: 120000 },
  );
  assert.strictEqual(r.status, 0, r.stderr);
  const lines = r.stdout.split('\n');
  const cells = (title) => {
    const row = lines.find((l) => l.startsWith(`| ${title}`));
    assert.ok(row, `no row ${title}:\n${r.stdout}`);
    return row.split('|').slice(2, -1).map((c) => Number.parseFloat(c.trim().replace(/,/g, '').replace('−', '-')));
  };
  const cpu = cells('CPU per request, µs');
  const parts = ['garbage collection', 'the package and what it calls', 'V8 builtins', 'other JavaScript', 'the kernel', 'other native code'].map(
    (title) => cells(`  ${title}`),
  );
  // Columns: stock, bare, ours (one round: the medians are that round's figures).
  for (const column of [0, 1, 2]) {
    assert.ok(cpu[column] > 0, `CPU per request ${cpu[column]}`);
    const sum = parts.reduce((total, part) => total + part[column], 0);
    assert.ok(Math.abs(sum - cpu[column]) <= 0.05 * parts.length + 0.01 * cpu[column], `parts ${sum} against CPU ${cpu[column]}`);
  }
  assert.ok(parts[1][2] > 0, 'ours spends some of its time in the package');
  assert.ok(cells('heap bytes allocated per request')[0] > 1000, 'a traced request allocates');
  // The functions are compared with the kind --against names.
  assert.ok(lines.some((l) => l.startsWith('| innermost function [bucket] | bare, µs | ours, µs | ours − bare |')), r.stdout);
});

test('bench/request-breakdown.js refuses to compare with a kind it does not run', () => {
  const r = spawnSync(process.execPath, ['bench/request-breakdown.js', '--kinds', 'stock,ours', '--against', 'bare'], { cwd: ROOT, encoding: 'utf8' });
  assert.strictEqual(r.status, 2, r.stderr);
  assert.match(r.stderr, /--against must name another kind that runs/);
});
