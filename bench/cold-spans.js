'use strict';
// What a request's spans cost, run back to back ("warm") and right after
// the CPU's caches were filled by other code ("cold"), as in a server.
//
// Each variant runs bench/cases/request-spans.js in its own process, pinned
// to one core where possible, in alternating rounds: stock
// (AsyncLocalStorageContextManager), bare (ours with the span name, local
// root id and route off), ours (the defaults), and record (ours in record
// mode) where frame mode is the default. A round's figure is its median
// unit: the host runs a process at one of two speeds that change within a
// second, and a median of thousands of short units is steadier than their
// mean. Prints per condition and variant the median round, its spread, and
// the extra ns per span over stock.
//
//   node bench/cold-spans.js [--rounds 7] [--units 3000] [--warm-ups 20000]

const { spawnSync } = require('node:child_process');
const path = require('node:path');
const { command, lastJson } = require('./lib/processes');
const { summarize } = require('./lib/stats');

const CASE = path.join(__dirname, 'cases', 'request-spans.js');
const SPANS_PER_UNIT = 5;

function parseArgs(argv) {
  const o = { rounds: 7, units: 3000, warmUps: 20000 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--rounds') o.rounds = Number(argv[++i]);
    else if (argv[i] === '--units') o.units = Number(argv[++i]);
    else if (argv[i] === '--warm-ups') o.warmUps = Number(argv[++i]);
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  for (const [flag, value] of [['--rounds', o.rounds], ['--units', o.units], ['--warm-ups', o.warmUps + 1]]) {
    if (!(Number.isInteger(value) && value > 0)) throw new RangeError(`${flag} must be a ${flag === '--warm-ups' ? 'non-negative' : 'positive'} integer`);
  }
  return o;
}

function runOnce(kind, units, cold, warmUps) {
  const [cmd, args] = command(process.execPath, [CASE, JSON.stringify({ manager: kind, units, cold, warmUps })], 1);
  const run = spawnSync(cmd, args, { encoding: 'utf8' });
  const result = run.status === 0 ? lastJson(run.stdout) : null;
  if (result === null) throw new Error(`${kind}${cold ? ' (cold)' : ''}: ${run.stderr}`);
  return result;
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const frameByDefault = runOnce('ours', 1, false, 0).mode === 'frame';
  const kinds = ['stock', 'bare', 'ours', ...(frameByDefault ? ['record'] : [])];
  console.log(
    `Node ${process.version}, ours in ${frameByDefault ? 'frame' : 'record'} mode by default; ` +
      `${opts.rounds} rounds of ${opts.units} units (${SPANS_PER_UNIT} spans each)`,
  );
  for (const cold of [false, true]) {
    const perUnit = Object.fromEntries(kinds.map((k) => [k, []]));
    for (let r = 0; r < opts.rounds; r++) {
      for (const kind of r % 2 === 0 ? kinds : [...kinds].reverse()) perUnit[kind].push(runOnce(kind, opts.units, cold, opts.warmUps).nsPerUnit);
    }
    const stock = summarize(perUnit.stock).median;
    for (const kind of kinds) {
      const s = summarize(perUnit[kind]);
      const us = (ns) => (ns / 1000).toFixed(2);
      console.log(
        `${cold ? 'cold' : 'warm'} ${kind.padEnd(6)} ${us(s.median).padStart(7)} µs per unit [${us(s.min)}, ${us(s.max)}]  ${(s.median / stock).toFixed(2)}x stock` +
          (kind === 'stock' ? '' : `  ${((s.median - stock) / SPANS_PER_UNIT).toFixed(0).padStart(6)} ns per span over stock`),
      );
    }
  }
}

main();
