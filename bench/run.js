#!/usr/bin/env node
'use strict';
// Benchmarks ProfilingContextManager against the stock
// AsyncLocalStorageContextManager, on Node 20 and Node 24, and prints one
// table of ratios with their targets. See BENCHMARKS.md for the method.
//
//   node bench/run.js [--quick] [--only sync,interleave,async,http,service,fastify,http-switching,http-interleaved,...]
//                     [--node <path>[,<path>...]] [--rounds N] [--scale F]
//                     [--json <file>]
//
// Every round runs each variant (stock, ours; for http also no tracing) in
// its own process, alternating which goes first, so a hook installed by one
// manager never slows the other; the switching suites instead run one
// server that switches managers between short bursts of load, and the
// interleaved suites run one server per manager, all at once on one core,
// loaded in turns of short bursts. The table
// shows the median over rounds of each round's ratio (or difference), with
// the spread [min, max].

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { SUITES, chooseInterleavedKinds } = require('./lib/suites');
const { summarize, median } = require('./lib/stats');
const { ROOT, canPin } = require('./lib/processes');

const USAGE = `usage: node bench/run.js [options]
  --quick            few rounds and short runs (a smoke run, not for numbers)
  --only a,b         run only these benchmarks: ${SUITES.map((s) => s.name).join(', ')}
  --node p[,p]       Node binaries to measure (repeatable); default: this Node,
                     plus Node 24 from $OTEL_BENCH_NODE24 or bench/.node24
                     (installed there with npm when missing)
  --rounds N         rounds per benchmark (default: per benchmark, 5-7)
  --scale F          multiply every iteration count by F (default 1)
  --json FILE        where to write the results (default bench/results/latest.json)
  --export otlp      traced servers serialize every batch of spans to OTLP
                     protobuf, as an exporter does before sending (default:
                     spans are counted and dropped)
  --kinds a,b        the managers the interleaved suites run (default
                     stock,stock2,ours,bare,record,datadog); also name, rootid,
                     route (one identity attribute each) and stamps (stock plus
                     a private field per context and span)`;

function parseArgs(argv) {
  const opts = { quick: false, only: null, nodes: [], rounds: null, scale: 1, json: null, kinds: null, export: 'drop' };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${arg} needs a value`);
      return argv[++i];
    };
    switch (arg) {
      case '--quick':
        opts.quick = true;
        break;
      case '--only':
        opts.only = value().split(',').filter(Boolean);
        break;
      case '--node':
        opts.nodes.push(...value().split(',').filter(Boolean));
        break;
      case '--rounds':
        opts.rounds = Number.parseInt(value(), 10);
        break;
      case '--scale':
        opts.scale = Number(value());
        break;
      case '--json':
        opts.json = value();
        break;
      case '--export':
        opts.export = value();
        if (opts.export !== 'otlp' && opts.export !== 'drop') fail('--export must be otlp or drop');
        break;
      case '--kinds':
        opts.kinds = value().split(',').filter(Boolean);
        break;
      case '-h':
      case '--help':
        console.log(USAGE);
        process.exit(0);
        break;
      default:
        fail(`unknown option ${arg}`);
    }
  }
  if (opts.only) {
    for (const name of opts.only) if (!SUITES.some((s) => s.name === name)) fail(`unknown benchmark ${name}`);
  }
  // The servers are child processes: they read it from their environment.
  if (opts.export === 'otlp') process.env.OTEL_BENCH_EXPORT = 'otlp';
  else delete process.env.OTEL_BENCH_EXPORT;
  if (opts.kinds !== null) {
    try {
      chooseInterleavedKinds(opts.kinds);
    } catch (error) {
      fail(`--kinds: ${error.message}`);
    }
  }
  if (opts.rounds !== null && !(opts.rounds >= 1)) fail('--rounds must be >= 1');
  if (!(opts.scale > 0)) fail('--scale must be > 0');
  return opts;
}

function fail(message) {
  console.error(`bench: ${message}\n${USAGE}`);
  process.exit(2);
}

const log = (message) => process.stderr.write(`${message}\n`);

/** Node 24: $OTEL_BENCH_NODE24, or bench/.node24 (installed with npm when missing). */
function node24() {
  if (process.env.OTEL_BENCH_NODE24) return process.env.OTEL_BENCH_NODE24;
  const dir = path.join(__dirname, '.node24');
  const pkg = `node-${process.platform}-${process.arch}`;
  const bin = path.join(dir, 'node_modules', pkg, 'bin', 'node');
  if (!fs.existsSync(bin)) {
    log(`bench: installing Node 24 (${pkg}@24) into ${path.relative(ROOT, dir)}/ ...`);
    fs.mkdirSync(dir, { recursive: true });
    const manifest = path.join(dir, 'package.json');
    if (!fs.existsSync(manifest)) fs.writeFileSync(manifest, '{ "private": true }\n');
    const npm = spawnSync('npm', ['install', '--no-save', '--no-package-lock', '--no-audit', '--no-fund', `${pkg}@24`], {
      cwd: dir,
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    if (npm.status !== 0 || !fs.existsSync(bin)) {
      log('bench: could not install Node 24; set OTEL_BENCH_NODE24 or pass --node');
      return null;
    }
  }
  return bin;
}

function nodeVersion(node) {
  const r = spawnSync(node, ['-p', 'process.versions.node'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`cannot run ${node}: ${r.stderr || r.error}`);
  return r.stdout.trim();
}

function defaultNodes() {
  const nodes = [process.execPath];
  if (Number(process.versions.node.split('.')[0]) < 24) {
    const n24 = node24();
    if (n24) nodes.push(n24);
  }
  return nodes;
}

// ---------------------------------------------------------------- formatting

const signed = (v, text) => (v >= 0 ? `+${text}` : text);
const FORMAT = {
  'ns+': (v) => `${signed(v, v.toFixed(1))} ns`,
  ns: (v) => `${v.toFixed(1)} ns`,
  ratio: (v) => v.toFixed(2),
  'B+': (v) => `${signed(v, Math.abs(v) < 10 ? v.toFixed(1) : v.toFixed(0))} B`,
  B: (v) => `${v < 10 ? v.toFixed(1) : v.toFixed(0)} B`,
  'MB+': (v) => `${signed(v, (v / 2 ** 20).toFixed(1))} MiB`,
  MB: (v) => `${(v / 2 ** 20).toFixed(1)} MiB`,
  int: (v) => `${Math.round(v)}`,
  num: (v) => v.toFixed(1),
  ms: (v) => `${v.toFixed(2)} ms`,
  us: (v) => `${(v / 1000).toFixed(1)} µs`,
};

function targetText(unit, target) {
  if (target === null || target === undefined) return '—';
  if (unit === 'ns+') return `≤ +${target} ns`;
  if (unit === 'ns') return `≤ ${target} ns`;
  if (unit === 'B+') return `${target} B`;
  if (unit === 'ratio') return `≤ ${target.toFixed(2)}`;
  return `≤ ${target}`;
}

/** Bytes are whole: a median below half a byte is zero. */
function meets(unit, value, target) {
  return unit === 'B+' ? value < target + 0.5 : value <= target;
}

const targetKey = (version) => (Number(version.split('.')[0]) >= 24 ? 'n24' : 'n20');

function cell(unit, s) {
  if (s === null) return 'n/a';
  const f = FORMAT[unit];
  const bare = (v) => f(v).replace(/ \D+$/, '');
  return s.n > 1 ? `${f(s.median)} [${bare(s.min)}, ${bare(s.max)}]` : f(s.median);
}

function markdownTable(header, rows) {
  const lines = [`| ${header.join(' | ')} |`, `|${header.map((_, i) => (i === 0 ? ' --- ' : ' ---: ')).join('|')}|`];
  for (const row of rows) lines.push(`| ${row.join(' | ')} |`);
  return lines.join('\n');
}

// ---------------------------------------------------------------- running

async function runSuite(suite, node, version, opts) {
  const rounds = opts.rounds ?? (opts.quick ? suite.rounds.quick : suite.rounds.full);
  const perRound = [];
  for (let r = 0; r < rounds; r++) {
    // Alternate (rotate) which variant goes first.
    const k = r % suite.variants.length;
    const order = r % 2 === 0 ? [...suite.variants.slice(k), ...suite.variants.slice(0, k)] : [...suite.variants].reverse();
    const round = {};
    // A suite with runRound() measures all its variants in one process.
    if (suite.runRound) Object.assign(round, await suite.runRound(node, opts));
    else for (const variant of order) round[variant] = await suite.run(node, variant, opts);
    perRound.push(round);
    const shown = suite.rows
      .filter((row) => row.target !== null)
      .map((row) => `${row.label}: ${FORMAT[row.unit](row.value(round))}`)
      .join('; ');
    log(`  node ${version} ${suite.name} round ${r + 1}/${rounds}: ${shown}`);
  }
  const rows = suite.rows.map((row) => {
    const s = summarize(perRound.map(row.value));
    const target = row.target ? row.target[targetKey(version)] : null;
    return {
      label: row.label,
      unit: row.unit,
      ...s,
      target,
      pass: target === null || s === null ? null : meets(row.unit, s.median, target),
    };
  });
  const details = [];
  for (const d of suite.details) {
    for (const variant of suite.variants) {
      // A variant that cannot run on this Node (the Datadog peer before 24) has no result: n/a.
      const values = perRound.map((round) => round[variant]?.[d.field]);
      details.push({ label: d.label, variant, unit: d.unit, median: median(values.filter(Number.isFinite)) });
    }
  }
  return { rounds: perRound, rows, details };
}

/** The commit measured, with `+dirty` when the package's own code has local changes. */
function revision() {
  const head = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8' });
  if (head.status !== 0) return null;
  const dirty = spawnSync('git', ['status', '--porcelain', '--', 'js', 'src', 'index.js'], { cwd: ROOT, encoding: 'utf8' });
  return `${head.stdout.trim()}${dirty.stdout.trim() ? '+dirty' : ''}`;
}

function machine() {
  const cpuinfo = fs.existsSync('/proc/cpuinfo') ? fs.readFileSync('/proc/cpuinfo', 'utf8') : '';
  const model = /^model name\s*:\s*(.+)$/m.exec(cpuinfo);
  return {
    cpuModel: model ? model[1].trim() : os.cpus()[0]?.model,
    cores: os.cpus().length,
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    kernel: os.release(),
    pinned: canPin,
  };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (require('../js/native').addonPath() === null) {
    console.error('bench: the addon is missing; build it first with `npm install`');
    process.exit(2);
  }
  const suites = SUITES.filter((s) => !opts.only || opts.only.includes(s.name));
  const nodes = (opts.nodes.length > 0 ? opts.nodes : defaultNodes()).map((p) => ({ path: p, version: nodeVersion(p) }));
  const started = new Date();
  const info = { ...machine(), loadavgStart: os.loadavg() };
  const commit = revision();
  log(`bench: ${suites.map((s) => s.name).join(', ')} on ${nodes.map((n) => `node ${n.version}`).join(', ')}` +
    `${opts.quick ? ' (quick)' : ''}; ${info.cores} cores, ${info.cpuModel}` +
    `${canPin ? '' : '; taskset unavailable, http runs unpinned'}`);

  const results = {};
  let failures = 0;
  for (const suite of suites) {
    results[suite.name] = {};
    for (const node of nodes) {
      try {
        results[suite.name][node.version] = await runSuite(suite, node.path, node.version, opts);
      } catch (err) {
        failures++;
        log(`bench: ${suite.name} on node ${node.version} failed: ${err.message}`);
        results[suite.name][node.version] = { error: err.message };
      }
    }
  }

  const header = ['benchmark'];
  for (const n of nodes) header.push(`Node ${n.version}`, 'target');
  const summaryRows = [];
  for (const suite of suites) {
    suite.rows.forEach((row, i) => {
      const line = [row.label];
      for (const n of nodes) {
        const res = results[suite.name][n.version];
        if (res.error) {
          line.push('error', '—');
          continue;
        }
        const r = res.rows[i];
        const mark = r.pass === null ? '' : r.pass ? ' ✓' : ' ✗';
        line.push(`${cell(row.unit, r.n ? r : null)}${mark}`, targetText(row.unit, r.target));
      }
      summaryRows.push(line);
    });
  }
  const detailHeader = ['measurement (median over rounds)', 'variant', ...nodes.map((n) => `Node ${n.version}`)];
  const detailRows = [];
  for (const suite of suites) {
    suite.details.forEach((d, i) => {
      suite.variants.forEach((variant, j) => {
        const line = [d.label, variant];
        for (const n of nodes) {
          const res = results[suite.name][n.version];
          const v = res.error ? null : res.details[i * suite.variants.length + j].median;
          line.push(Number.isFinite(v) ? FORMAT[d.unit](v) : 'n/a');
        }
        detailRows.push(line);
      });
    });
  }
  const table = markdownTable(header, summaryRows);
  const details = detailRows.length > 0 ? markdownTable(detailHeader, detailRows) : '';
  const seconds = (Date.now() - started.getTime()) / 1000;
  info.loadavgEnd = os.loadavg();

  console.log(`\n${table}\n`);
  if (details) console.log(`${details}\n`);
  console.log(
    `median [min, max] over rounds; ✓/✗ = median meets/misses the target. ` +
      `${info.cores} cores (${info.cpuModel}), load average ${info.loadavgStart.map((x) => x.toFixed(2)).join(' ')} at start. ` +
      `${commit ? `Commit ${commit}. ` : ''}${seconds.toFixed(0)} s.`,
  );

  const jsonPath = opts.json ?? path.join(__dirname, 'results', 'latest.json');
  fs.mkdirSync(path.dirname(jsonPath), { recursive: true });
  fs.writeFileSync(
    jsonPath,
    `${JSON.stringify(
      {
        started: started.toISOString(),
        seconds,
        command: ['node', 'bench/run.js', ...process.argv.slice(2)].join(' '),
        quick: opts.quick,
        commit,
        machine: info,
        nodes,
        results,
        table,
        details,
      },
      null,
      2,
    )}\n`,
  );
  log(`bench: results written to ${path.relative(process.cwd(), jsonPath) || jsonPath}`);
  if (failures > 0) process.exit(1);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
