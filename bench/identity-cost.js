'use strict';
// What the identity attributes published by default (span name, local root
// span id, the local root's http.route) cost: process CPU per request-like
// chain (a new span, so a new local root, made active for 20 awaits; 100
// chains in flight) with the stock manager, ours with those attributes off,
// and ours with its defaults, each in its own process, in alternating
// rounds, on this Node. Prints the medians and the ratios to stock.
//
//   node bench/identity-cost.js [--rounds 5] [--chains 10000]

const path = require('node:path');
const { spawnSync } = require('node:child_process');

const ROOT = path.resolve(__dirname, '..');

const VARIANT = `
const { context, trace } = require(${JSON.stringify(require.resolve('@opentelemetry/api', { paths: [ROOT] }))});
const variant = process.env.VARIANT;
const manager =
  variant === 'stock'
    ? new (require(${JSON.stringify(require.resolve('@opentelemetry/context-async-hooks', { paths: [ROOT] }))}).AsyncLocalStorageContextManager)()
    : new (require(${JSON.stringify(ROOT)}).ProfilingContextManager)(
        variant === 'no-identity' ? { spanName: false, localRootSpanId: false, localRootAttributes: [] } : {},
      );
context.setGlobalContextManager(manager.enable());
let n = 0;
function spanContext() {
  n++;
  const hex = n.toString(16).padStart(16, '0');
  return { traceId: hex + hex, spanId: hex, traceFlags: 1 };
}
async function body() {
  for (let k = 0; k < 20; k++) await null;
}
const chain = () => context.with(trace.setSpanContext(context.active(), spanContext()), body);
async function main() {
  const total = Number(process.env.CHAINS);
  for (let b = 0; b < total / 100; b++) await Promise.all(Array.from({ length: 100 }, chain)); // warm-up
  const c0 = process.cpuUsage();
  for (let b = 0; b < total / 100; b++) await Promise.all(Array.from({ length: 100 }, chain));
  const c = process.cpuUsage(c0);
  console.log(JSON.stringify({ nsPerChain: ((c.user + c.system) * 1000) / total }));
}
main();
`;

function parseArgs(argv) {
  const o = { rounds: 5, chains: 10000 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--rounds') o.rounds = Number(argv[++i]);
    else if (argv[i] === '--chains') o.chains = Number(argv[++i]);
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return o;
}

const VARIANTS = ['stock', 'no-identity', 'defaults'];

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const results = Object.fromEntries(VARIANTS.map((v) => [v, []]));
  for (let r = 0; r < opts.rounds; r++) {
    // Alternate which variant goes first.
    const order = r % 2 === 0 ? VARIANTS : [...VARIANTS].reverse();
    for (const variant of order) {
      const run = spawnSync(process.execPath, ['-e', VARIANT], {
        cwd: ROOT,
        env: { ...process.env, VARIANT: variant, CHAINS: String(opts.chains) },
        encoding: 'utf8',
      });
      if (run.status !== 0) throw new Error(`${variant}: ${run.stderr}`);
      results[variant].push(JSON.parse(run.stdout.trim().split('\n').pop()).nsPerChain);
    }
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const stock = median(results.stock);
  for (const variant of VARIANTS) {
    const m = median(results[variant]);
    console.log(`Node ${process.version} ${variant.padEnd(12)} ${m.toFixed(0).padStart(7)} ns CPU per chain  ${(m / stock).toFixed(2)}x stock`);
  }
}

main();
