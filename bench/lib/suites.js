'use strict';
// The benchmarks: what each runs per round and variant, and the rows it
// contributes to the summary table. Every round runs each variant in its own
// process, except in the suites with `runRound`, where one process takes
// turns with the variants: the switching servers, and the sync and
// interleave micro-benchmarks (bench/lib/turns.js); and the interleaved
// suites, whose `runRound` runs one server process per variant, all at
// once, loaded in turns (interleavedLoad). `value(round)` turns
// one round ({ stock, floor, ours, none, direct } results) into one number,
// and the table shows their median and spread.
//
// Targets: `n20` applies to Node < 24, `n24` to Node >= 24 (where
// AsyncLocalStorage follows V8's continuation-preserved data).

const { spawnSync } = require('node:child_process');
const { randomInt } = require('node:crypto');
const path = require('node:path');
const { ROOT, runCase, startCase, processCpuNs, settledCpuNs, canPin } = require('./processes');
const { onLines } = require('./common');
const { pairedMedian, median } = require('./stats');
const { cycleOrder } = require('./turns');

const count = (n, { quick, scale }) => Math.max(2, Math.round(n * (quick ? 0.25 : 1) * scale));

/** Two variants' turns in the same cycles compared (bench/lib/turns.js): the median ratio. */
const turnsRatio = (phase, a, b) => (r) => pairedMedian(r[a][`${phase}Turns`], r[b][`${phase}Turns`]);
/** The same, the median difference. */
const turnsDifference = (phase, a, b) => (r) =>
  pairedMedian(r[a][`${phase}Turns`], r[b][`${phase}Turns`], { difference: true });

/** The variants of the suites that take turns in one process (bench/lib/turns.js). */
const SYNC_VARIANTS = ['stock', 'ours', 'record'];
const INTERLEAVE_VARIANTS = ['stock', 'floor', 'store', 'write', 'ours', 'record'];

const sync = {
  name: 'sync',
  variants: SYNC_VARIANTS,
  rounds: { full: 5, quick: 1 },
  // One process per round, the variants taking turns.
  runRound: (node, opts) =>
    runCase(node, 'sync', { variants: SYNC_VARIANTS, iterations: count(250000, opts), cycles: opts.quick ? 2 : 40 }, { core: 0 }),
  rows: [
    {
      label: 'sync context.with() added time per call',
      unit: 'ns+',
      value: turnsDifference('flat', 'ours', 'stock'),
      target: { n20: 15, n24: 15 },
    },
    {
      label: 'sync context.with() added time per call, record mode (record − stock)',
      unit: 'ns+',
      value: turnsDifference('flat', 'record', 'stock'),
      target: null,
    },
    {
      label: 'sync context.with() nested 3 deep, added time per with()',
      unit: 'ns+',
      value: (r) => turnsDifference('nested', 'ours', 'stock')(r) / 3,
      target: { n20: 15, n24: 15 },
    },
  ],
  details: [
    { label: 'sync with(): ns per call', field: 'flatNs', unit: 'ns' },
    { label: 'sync nested 3 deep: ns per outer call', field: 'nestedNs', unit: 'ns' },
  ],
};

const async = {
  name: 'async',
  variants: ['stock', 'ours'],
  rounds: { full: 7, quick: 2 },
  run: (node, manager, opts) =>
    runCase(node, 'async', { manager, chains: count(20000, opts), concurrency: 100, batches: opts.quick ? 2 : 5 }),
  rows: [
    {
      label: 'async chains, 100 concurrent (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.nsPerChain / r.stock.nsPerChain,
      target: { n20: 1.1, n24: 1.25 },
    },
  ],
  details: [
    { label: 'async: event-loop busy ns per chain', field: 'nsPerChain', unit: 'ns' },
    { label: 'async: process CPU ns per chain', field: 'cpuNsPerChain', unit: 'ns' },
    { label: 'async: wall-clock ns per chain', field: 'wallNsPerChain', unit: 'ns' },
  ],
};

const interleave = {
  name: 'interleave',
  variants: INTERLEAVE_VARIANTS,
  rounds: { full: 5, quick: 1 },
  // One process per round, the variants taking turns.
  runRound: (node, opts) =>
    runCase(
      node,
      'interleave',
      {
        variants: INTERLEAVE_VARIANTS,
        withCalls: count(250000, opts),
        awaits: count(4000, opts),
        cycles: opts.quick ? 2 : 40,
      },
      { core: 0 },
    ),
  rows: [
    {
      label: 'with() cycling 16 SDK spans, added time per call (ours − stock)',
      unit: 'ns+',
      value: turnsDifference('with', 'ours', 'stock'),
      target: { n20: 15, n24: 15 },
    },
    {
      label: 'with() cycling 16 SDK spans, record mode added time (record − stock)',
      unit: 'ns+',
      value: turnsDifference('with', 'record', 'stock'),
      target: null,
    },
    {
      label: 'with() cycling 16 SDK spans, the floor\'s added time (floor − stock)',
      unit: 'ns+',
      value: turnsDifference('with', 'floor', 'stock'),
      target: null,
    },
    {
      label: 'with() cycling 16 SDK spans, the write reference\'s added time (write − stock)',
      unit: 'ns+',
      value: turnsDifference('with', 'write', 'stock'),
      target: null,
    },
    {
      label: 'bare await, 16 interleaved SDK spans (ours/floor)',
      unit: 'ratio',
      value: turnsRatio('await', 'ours', 'floor'),
      target: { n20: 1.1, n24: 1.1 },
    },
    {
      label: 'bare await, 16 interleaved SDK spans (ours/stock)',
      unit: 'ratio',
      value: turnsRatio('await', 'ours', 'stock'),
      target: { n24: 1.02 },
    },
    {
      label: 'bare await, 16 interleaved SDK spans, record mode (record/stock)',
      unit: 'ratio',
      value: turnsRatio('await', 'record', 'stock'),
      target: null,
    },
    {
      label: 'bare await, 16 interleaved SDK spans (floor/stock)',
      unit: 'ratio',
      value: turnsRatio('await', 'floor', 'stock'),
      target: null,
    },
    {
      label: 'bare await, 16 interleaved SDK spans (store/floor)',
      unit: 'ratio',
      value: turnsRatio('await', 'store', 'floor'),
      target: null,
    },
    {
      label: 'bare await, 16 interleaved SDK spans (write/floor)',
      unit: 'ratio',
      value: turnsRatio('await', 'write', 'floor'),
      target: null,
    },
    {
      label: 'await, setImmediate hop every 8th (ours/floor)',
      unit: 'ratio',
      value: turnsRatio('hop', 'ours', 'floor'),
      target: { n20: 1.1, n24: 1.1 },
    },
    {
      label: 'await, setImmediate hop every 8th (floor/stock)',
      unit: 'ratio',
      value: turnsRatio('hop', 'floor', 'stock'),
      target: null,
    },
    {
      label: 'await, setImmediate hop every 8th (store/floor)',
      unit: 'ratio',
      value: turnsRatio('hop', 'store', 'floor'),
      target: null,
    },
    {
      label: 'await, setImmediate hop every 8th (write/floor)',
      unit: 'ratio',
      value: turnsRatio('hop', 'write', 'floor'),
      target: null,
    },
  ],
  details: [
    { label: 'with() cycling 16 SDK spans: ns per call', field: 'withNs', unit: 'ns' },
    { label: 'bare await, 16 loops: ns per continuation', field: 'awaitNs', unit: 'ns' },
    { label: 'await + setImmediate every 8th: ns per continuation', field: 'hopNs', unit: 'ns' },
  ],
};

const workers = {
  name: 'workers',
  variants: ['stock', 'ours'],
  rounds: { full: 5, quick: 2 },
  run: (node, manager, opts) =>
    runCase(node, 'workers', {
      manager,
      workers: 4,
      chains: count(10000, opts),
      concurrency: 100,
      batches: opts.quick ? 2 : 4,
    }),
  rows: [
    {
      label: 'async chains in 4 workers at once (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerChain / r.stock.cpuNsPerChain,
      target: { n20: 1.1, n24: 1.25 },
    },
  ],
  details: [
    { label: 'workers: process CPU ns per chain', field: 'cpuNsPerChain', unit: 'ns' },
    { label: 'workers: wall-clock ns per chain (4 threads)', field: 'wallNsPerChain', unit: 'ns' },
  ],
};

/** Server CPU per request under one fixed-count load; the server on core 0, the load on core 1. */
async function loadServer(server, url, manager, opts, { warmUp = 10000, measured = 30000 } = {}) {
  const load = { url, connections: 10 };
  // The load generator runs on the Node that runs this script, whatever Node the server runs.
  await runCase(process.execPath, 'http-load', { ...load, amount: count(warmUp, opts) }, { core: 1 });
  const cpu0 = processCpuNs(server.first.pid);
  const result = await runCase(process.execPath, 'http-load', { ...load, amount: count(measured, opts) }, { core: 1 });
  const cpu = processCpuNs(server.first.pid) - cpu0;
  const end = await server.stop();
  if (result.errors > 0) throw new Error(`${manager}: ${result.errors} failed requests`);
  return { ...result, cpuNsPerRequest: cpu / result.requests, spans: end && end.spans, pinned: canPin };
}

async function httpRun(node, manager, opts) {
  const server = await startCase(node, 'http-server', { manager }, { core: 0 });
  try {
    return await loadServer(server, `http://127.0.0.1:${server.first.port}/`, manager, opts);
  } finally {
    server.child.kill('SIGKILL');
  }
}

/** The Express service on core 0; its upstream and the load on core 1. */
async function serviceRun(node, manager, opts) {
  const upstream = await startCase(process.execPath, 'upstream', {}, { core: 1 });
  try {
    const server = await startCase(node, 'service-server', { manager, upstream: `http://127.0.0.1:${upstream.first.port}` }, { core: 0 });
    try {
      // A request costs several times the http case's, so fewer of them measure as well.
      return await loadServer(server, `http://127.0.0.1:${server.first.port}/orders/42`, manager, opts, {
        warmUp: 5000,
        measured: 15000,
      });
    } finally {
      server.child.kill('SIGKILL');
    }
  } finally {
    await upstream.stop();
  }
}

/**
 * Sends lines to a started case that answers each with one JSON line (a
 * switching server, bench/lib/common.js answerSwitches; the burst load
 * generator): `ask(line)` resolves with the reply.
 */
function lineControl(started) {
  const waiting = [];
  onLines(started.child.stdout, (line) => {
    if (line.startsWith('{') && waiting.length > 0) waiting.shift().resolve(JSON.parse(line));
  });
  started.child.on('close', (code, signal) => {
    for (const w of waiting.splice(0)) w.reject(new Error(`the process exited with ${code ?? signal}`));
  });
  return (line) =>
    new Promise((resolve, reject) => {
      waiting.push({ resolve, reject });
      started.child.stdin.write(`${line}\n`);
    });
}

/**
 * The managers one switching server takes turns with. The server leaves
 * out the ones that cannot run on its Node (the Datadog peer before Node
 * 24: bench/lib/datadog.js) and names those it has; their rows show n/a.
 */
const SWITCHED = ['stock', 'floor', 'ours', 'bare', 'record', 'datadog'];

/** The `q` quantile of `values` (sorted in place), or NaN for none. */
function quantile(values, q) {
  if (values.length === 0) return NaN;
  values.sort((a, b) => a - b);
  return values[Math.min(values.length - 1, Math.floor(q * values.length))];
}

/**
 * One process, its managers taking turns: server CPU per request of each,
 * summed over `cycles` turns of `burst` requests. A turn starts with a
 * switch while no request is in flight and a tenth of a burst unmeasured;
 * the server measures its own CPU time around the burst, and the heap
 * allocated and GCs in it (bench/lib/heap.js). The process's
 * speed phases then fall on every manager alike, which separate processes
 * do not share (BENCHMARKS.md, "Machine and noise in brief"). Latency
 * percentiles are over every measured request of a manager's bursts.
 */
async function switchingLoad(server, url, opts, { burst, cycles }) {
  const switched = server.first.managers;
  if (!Array.isArray(switched) || !switched.every((kind) => SWITCHED.includes(kind))) {
    throw new Error(`the server switches between ${JSON.stringify(switched)}, not some of ${SWITCHED.join(', ')}`);
  }
  const ask = lineControl(server);
  const generator = await startCase(process.execPath, 'http-bursts', { url, connections: 10 }, { core: 1 });
  try {
    const send = lineControl(generator);
    const load = async (amount) => {
      const result = await send(String(amount));
      if (result.errors > 0) throw new Error(`${result.errors} failed requests`);
      return result;
    };
    const requests = count(burst, opts);
    const totals = Object.fromEntries(
      switched.map((kind) => [
        kind,
        { cpuNs: 0, requests: 0, bursts: [], burstBytes: [], scavenges: 0, gcs: 0, latencyUs: [], manager: null },
      ]),
    );
    // Every manager's paths warm (and compiled) before anything is measured.
    for (let w = 0; w < 2; w++) {
      for (const kind of switched) {
        await ask(`use ${kind}`);
        await load(requests);
      }
    }
    const turns = opts.quick ? 1 : cycles;
    for (let c = 0; c < turns; c++) {
      for (const kind of cycleOrder(switched, c)) {
        const t = totals[kind];
        t.manager = (await ask(`use ${kind}`)).manager;
        await load(Math.max(2, Math.round(requests / 10)));
        const before = await ask('mark');
        const result = await load(requests);
        const after = await ask('mark');
        t.cpuNs += after.cpuNs - before.cpuNs;
        t.requests += result.requests;
        t.bursts.push((after.cpuNs - before.cpuNs) / result.requests);
        t.burstBytes.push(after.heap.bytes / result.requests);
        t.scavenges += after.heap.scavenges;
        t.gcs += after.heap.gcs;
        for (const us of result.latencyUs) t.latencyUs.push(us);
      }
    }
    await server.stop();
    return Object.fromEntries(
      switched.map((kind) => {
        const { cpuNs, requests: served, bursts, burstBytes, scavenges, gcs, latencyUs, manager } = totals[kind];
        return [
          kind,
          {
            cpuNsPerRequest: cpuNs / served,
            // The median burst: a burst with one-off allocations of the JIT counts once.
            bytesPerRequest: median(burstBytes),
            scavengesPer10k: (scavenges * 1e4) / served,
            gcsPer10k: (gcs * 1e4) / served,
            p50Ms: quantile(latencyUs, 0.5) / 1000,
            p99Ms: quantile(latencyUs, 0.99) / 1000,
            requests: served,
            bursts,
            burstBytes,
            manager,
          },
        ];
      }),
    );
  } finally {
    await generator.stop();
  }
}

/** A round's `field` of variant `a` over variant `b`'s, NaN (n/a) when either did not run. */
const ratioOf = (field, a, b) => (r) => (r[a] && r[b] ? r[a][field] / r[b][field] : NaN);
/** The same, the difference. */
const differenceOf = (field, a, b) => (r) => (r[a] && r[b] ? r[a][field] - r[b][field] : NaN);

/**
 * A switching suite: `title` names its rows, `detail` its detail rows, and
 * `runRound(node, opts)` runs one switching server (switchingLoad).
 */
function switchingSuite(name, title, detail, runRound) {
  const cpu = `${title} server CPU per request, one process switching managers`;
  return {
    name,
    variants: SWITCHED,
    rounds: { full: 3, quick: 1 },
    runRound,
    rows: [
      { label: `${cpu} (ours/stock)`, unit: 'ratio', value: ratioOf('cpuNsPerRequest', 'ours', 'stock'), target: { n20: 1.02, n24: 1.02 } },
      // Span name, local root id and route off ('bare'), and record mode where the default is frame.
      { label: `${cpu}, identity attributes off (bare/stock)`, unit: 'ratio', value: ratioOf('cpuNsPerRequest', 'bare', 'stock'), target: { n20: 1.01, n24: 1.01 } },
      { label: `${cpu}, record mode (record/stock)`, unit: 'ratio', value: ratioOf('cpuNsPerRequest', 'record', 'stock'), target: null },
      { label: `${cpu} (ours/floor)`, unit: 'ratio', value: ratioOf('cpuNsPerRequest', 'ours', 'floor'), target: null },
      // The Datadog peer (Node 24 and later): its writer driven as a tracer drives it.
      { label: `${cpu} (datadog/stock)`, unit: 'ratio', value: ratioOf('cpuNsPerRequest', 'datadog', 'stock'), target: null },
      {
        label: `${title} server bytes per request, switching managers (ours − stock)`,
        unit: 'B+',
        value: differenceOf('bytesPerRequest', 'ours', 'stock'),
        target: null,
      },
      {
        label: `${title} server bytes per request, switching managers (datadog − stock)`,
        unit: 'B+',
        value: differenceOf('bytesPerRequest', 'datadog', 'stock'),
        target: null,
      },
      { label: `${title} p99 latency, switching managers (ours/stock)`, unit: 'ratio', value: ratioOf('p99Ms', 'ours', 'stock'), target: null },
      { label: `${title} p99 latency, switching managers (datadog/stock)`, unit: 'ratio', value: ratioOf('p99Ms', 'datadog', 'stock'), target: null },
    ],
    details: [
      { label: `${detail} server CPU per request, switching managers`, field: 'cpuNsPerRequest', unit: 'us' },
      { label: `${detail} server heap bytes per request, switching managers`, field: 'bytesPerRequest', unit: 'B' },
      { label: `${detail} server scavenges per 10,000 requests, switching managers`, field: 'scavengesPer10k', unit: 'num' },
      { label: `${detail} p99 latency, switching managers`, field: 'p99Ms', unit: 'ms' },
    ],
  };
}

const httpSwitching = switchingSuite('http-switching', 'http', 'http', async (node, opts) => {
  const server = await startCase(node, 'http-server', { manager: SWITCHED }, { core: 0 });
  try {
    return await switchingLoad(server, `http://127.0.0.1:${server.first.port}/`, opts, { burst: 300, cycles: 80 });
  } finally {
    server.child.kill('SIGKILL');
  }
});

const serviceSwitching = switchingSuite('service-switching', 'Express service', 'service', async (node, opts) => {
  const upstream = await startCase(process.execPath, 'upstream', {}, { core: 1 });
  try {
    const params = { manager: SWITCHED, upstream: `http://127.0.0.1:${upstream.first.port}` };
    const server = await startCase(node, 'service-server', params, { core: 0 });
    try {
      return await switchingLoad(server, `http://127.0.0.1:${server.first.port}/orders/42`, opts, { burst: 100, cycles: 80 });
    } finally {
      server.child.kill('SIGKILL');
    }
  } finally {
    await upstream.stop();
  }
});

const fastifySwitching = switchingSuite('fastify-switching', 'Fastify', 'fastify', async (node, opts) => {
  const server = await startCase(node, 'fastify-server', { manager: SWITCHED }, { core: 0 });
  try {
    return await switchingLoad(server, `http://127.0.0.1:${server.first.port}/`, opts, { burst: 300, cycles: 80 });
  } finally {
    server.child.kill('SIGKILL');
  }
});

/**
 * The interleaved suites' servers, one process per kind, all running at
 * once. 'stock2' is a second stock server: stock2/stock is the harness's
 * null test (its spread is the harness's own). The Datadog peer runs only
 * where its writer can publish (Node 24 and later); its rows show n/a
 * elsewhere.
 */
const INTERLEAVED = ['stock', 'stock2', 'ours', 'bare', 'record', 'datadog'];
/** The kinds `--kinds` chose for the interleaved suites (stock always among them), or null: INTERLEAVED. */
let chosenKinds = null;

/**
 * Makes the interleaved suites run `kinds` (bench/lib/common.js,
 * createManager; 'stock2' is the null test) instead of INTERLEAVED: each
 * round prints every kind's ratio to stock on stderr, and rows of kinds
 * left out print n/a. Throws on an unknown kind.
 */
function chooseInterleavedKinds(kinds) {
  const known = ['stock2', ...INTERLEAVED, 'name', 'rootid', 'route', 'stamps', 'floor', 'store', 'write'];
  for (const kind of kinds) if (!known.includes(kind)) throw new Error(`unknown kind ${kind} (one of ${[...new Set(known)].join(', ')})`);
  chosenKinds = ['stock', ...new Set(kinds.filter((kind) => kind !== 'stock'))];
}
/** The manager kind a server of `kind` runs (bench/lib/common.js, createManager). */
const managerOf = (kind) => (kind === 'stock2' ? 'stock' : kind);

const datadogChecked = new Map();
/** Whether the Datadog peer can run on `node` (asked once per Node, in a process of its own). */
function datadogRuns(node) {
  if (!datadogChecked.has(node)) {
    const common = path.join(__dirname, 'common.js');
    const check = `process.exit(require(${JSON.stringify(common)}).unavailable('datadog') === null ? 0 : 3)`;
    const r = spawnSync(node, ['-e', check], { cwd: ROOT, stdio: 'ignore' });
    datadogChecked.set(node, r.status === 0);
  }
  return datadogChecked.get(node);
}

/** The kinds the interleaved suites run on `node`. */
const interleavedKinds = (node) => (chosenKinds ?? INTERLEAVED).filter((kind) => kind !== 'datadog' || datadogRuns(node));

/** `items` in a random order whose first item is not `notFirst` (when it has another). */
function shuffled(items, notFirst) {
  for (;;) {
    const order = [...items];
    for (let i = order.length - 1; i > 0; i--) {
      const j = randomInt(i + 1);
      [order[i], order[j]] = [order[j], order[i]];
    }
    if (order.length < 2 || order[0] !== notFirst) return order;
  }
}

/**
 * Starts one server of case `name` per kind, all pinned to core 1, with
 * `params(manager)`: resolves with { [kind]: started } (bench/lib/processes.js,
 * startCase), or kills the ones that started and throws.
 */
async function startServers(node, name, kinds, params) {
  const settled = await Promise.allSettled(kinds.map((kind) => startCase(node, name, params(managerOf(kind)), { core: 1 })));
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed) {
    for (const s of settled) if (s.status === 'fulfilled') s.value.child.kill('SIGKILL');
    throw failed.reason;
  }
  const servers = {};
  kinds.forEach((kind, i) => {
    const started = settled[i].value;
    const has = started.first.managers;
    if (!Array.isArray(has) || has.length !== 1 || has[0] !== managerOf(kind)) {
      for (const s of settled) s.value.child.kill('SIGKILL');
      throw new Error(`the ${kind} server runs ${JSON.stringify(has)}, not ${managerOf(kind)}`);
    }
    servers[kind] = started;
  });
  return servers;
}

/** Stops every server (stdin end; killed when it does not exit in time): { [kind]: its last JSON line }. */
async function stopServers(servers) {
  const kinds = Object.keys(servers);
  const ends = await Promise.all(kinds.map((kind) => servers[kind].stop(5000)));
  return Object.fromEntries(kinds.map((kind, i) => [kind, ends[i]]));
}

/** The `q` quantile (0..1, nearest rank) of `values`, or NaN for none. */
function rank(values, q) {
  const s = [...values].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

/**
 * Separate server processes, one per kind (`servers`, { [kind]: started }),
 * all pinned to core 1 and all up at once, loaded in turns: every cycle
 * sends one burst of `burst` requests to each server in a fresh random
 * order (the load generator on core 0, one keep-alive agent per server), so
 * the host's two speed states, which switch within about a second, fall on
 * every server alike, and nothing (JIT code, inline caches, heap) is shared
 * between the kinds. A burst's CPU is the server's on-CPU time over all its
 * threads (bench/lib/processes.js, threadsCpuNs), read from outside once
 * the server has gone idle before the burst and again after it answered
 * it. The first `warmUpCycles` cycles are not counted.
 *
 * Per kind: the median over cycles of its CPU per request, and its ratio
 * to the stock server's burst of the same cycle, the median with the
 * quartiles and extremes over cycles; also the ratio of the medians, and
 * the ratio of the kind's total CPU over all measured bursts to stock's.
 */
async function interleavedLoad(servers, urls, opts, { burst, cycles, warmUpCycles }) {
  const kinds = Object.keys(servers);
  const generator = await startCase(
    process.execPath,
    'http-bursts',
    { urls: kinds.map((kind) => urls[kind]), connections: 10, persistent: true },
    { core: 0 },
  );
  try {
    const send = lineControl(generator);
    const requests = count(burst, opts);
    const warm = opts.quick ? 4 : warmUpCycles;
    const measured = opts.quick ? 10 : cycles;
    const bursts = Object.fromEntries(kinds.map((kind) => [kind, []]));
    const latencyUs = Object.fromEntries(kinds.map((kind) => [kind, []]));
    const settleSteps = [];
    let last = null;
    const started = Date.now();
    for (let c = 0; c < warm + measured; c++) {
      const order = shuffled(kinds, last);
      last = order[order.length - 1];
      for (const kind of order) {
        const { pid } = servers[kind].first;
        const before = await settledCpuNs(pid);
        const result = await send(`${requests} ${kinds.indexOf(kind)}`);
        const after = await settledCpuNs(pid);
        if (result.errors > 0) throw new Error(`${kind}: ${result.errors} failed requests`);
        if (before.ns === null || after.ns === null) throw new Error(`the ${kind} server (pid ${pid}) exited`);
        if (c < warm) continue;
        bursts[kind].push((after.ns - before.ns) / result.requests);
        for (const us of result.latencyUs) latencyUs[kind].push(us);
        settleSteps.push(after.steps);
      }
    }
    const cycleMs = (Date.now() - started) / (warm + measured);
    const stockMedian = median(bursts.stock);
    const sum = (values) => values.reduce((a, b) => a + b, 0);
    const out = {};
    for (const kind of kinds) {
      const ratios = bursts[kind].map((ns, i) => ns / bursts.stock[i]);
      out[kind] = {
        cpuNsPerRequest: median(bursts[kind]),
        ratio: median(ratios),
        ratioP25: rank(ratios, 0.25),
        ratioP75: rank(ratios, 0.75),
        ratioMin: Math.min(...ratios),
        ratioMax: Math.max(...ratios),
        medianRatio: median(bursts[kind]) / stockMedian,
        // All measured bursts' CPU over the stock server's: counts in full
        // the collections that fall in a minority of bursts (a median
        // burst may have none), each cycle weighing the same for both.
        sumRatio: sum(bursts[kind]) / sum(bursts.stock),
        p99Ms: rank(latencyUs[kind], 0.99) / 1000,
        requests: bursts[kind].length * requests,
        bursts: bursts[kind],
        ratios,
      };
    }
    const shown = kinds
      .filter((kind) => kind !== 'stock')
      .map((kind) => `${kind}/stock ${out[kind].ratio.toFixed(3)} [${out[kind].ratioP25.toFixed(3)}, ${out[kind].ratioP75.toFixed(3)}]`)
      .join('; ');
    process.stderr.write(
      `    ${measured} cycles (+${warm} warm-up) of ${requests} requests per server, ${cycleMs.toFixed(0)} ms per cycle, ` +
        `settled after a median ${median(settleSteps)} ms; per cycle, median [p25, p75]: ${shown}\n`,
    );
    return out;
  } finally {
    await generator.stop();
  }
}

/** A round's `field` of `kind`, NaN (n/a) when that server did not run. */
const fieldOf = (field, kind) => (r) => (r[kind] ? r[kind][field] : NaN);

/**
 * An interleaved suite: `title` names its rows, `detail` its detail rows,
 * and `runRound(node, opts)` starts the servers and runs interleavedLoad.
 * Its ratios are each round's median over cycles of the per-cycle ratio.
 */
function interleavedSuite(name, title, detail, runRound) {
  const cpu = `${title} server CPU per request, separate servers interleaved`;
  return {
    name,
    variants: INTERLEAVED,
    rounds: { full: 3, quick: 1 },
    runRound,
    rows: [
      { label: `${cpu} (ours/stock)`, unit: 'ratio', value: fieldOf('ratio', 'ours'), target: { n20: 1.02, n24: 1.02 } },
      { label: `${cpu}, identity attributes off (bare/stock)`, unit: 'ratio', value: fieldOf('ratio', 'bare'), target: { n20: 1.01, n24: 1.01 } },
      { label: `${cpu}, record mode (record/stock)`, unit: 'ratio', value: fieldOf('ratio', 'record'), target: null },
      { label: `${cpu} (datadog/stock)`, unit: 'ratio', value: fieldOf('ratio', 'datadog'), target: null },
      // Two stock servers: what the harness itself makes of no difference.
      { label: `${cpu}, the null test (stock2/stock)`, unit: 'ratio', value: fieldOf('ratio', 'stock2'), target: null },
    ],
    details: [
      { label: `${detail} interleaved: server CPU per request (median burst)`, field: 'cpuNsPerRequest', unit: 'us' },
      { label: `${detail} interleaved: per-cycle ratio to stock, p25`, field: 'ratioP25', unit: 'ratio' },
      { label: `${detail} interleaved: per-cycle ratio to stock, p75`, field: 'ratioP75', unit: 'ratio' },
      { label: `${detail} interleaved: ratio of the median bursts to stock's`, field: 'medianRatio', unit: 'ratio' },
      { label: `${detail} interleaved: ratio of total CPU over all measured bursts to stock's`, field: 'sumRatio', unit: 'ratio' },
      { label: `${detail} interleaved: p99 latency`, field: 'p99Ms', unit: 'ms' },
    ],
  };
}

/**
 * Runs `load(servers)` with one `name` server per kind on `node`, then
 * stops them and adds to each kind's result the spans its server exported
 * and the requests it served (warm-up included). The servers are killed
 * however it ends.
 */
async function withServers(node, name, params, load) {
  const servers = await startServers(node, name, interleavedKinds(node), params);
  try {
    const result = await load(servers);
    const ends = await stopServers(servers);
    for (const [kind, end] of Object.entries(ends)) Object.assign(result[kind], { spans: end?.spans, served: end?.served });
    return result;
  } finally {
    for (const s of Object.values(servers)) s.child.kill('SIGKILL');
  }
}

const urlsOf = (servers, route) =>
  Object.fromEntries(Object.entries(servers).map(([kind, s]) => [kind, `http://127.0.0.1:${s.first.port}${route}`]));

const httpInterleaved = interleavedSuite('http-interleaved', 'http', 'http', (node, opts) =>
  withServers(node, 'http-server', (manager) => ({ manager }), (servers) =>
    interleavedLoad(servers, urlsOf(servers, '/'), opts, { burst: 200, cycles: 120, warmUpCycles: 30 }),
  ),
);

const serviceInterleaved = interleavedSuite('service-interleaved', 'Express service', 'service', async (node, opts) => {
  // One upstream for all the services, on the load generator's core.
  const upstream = await startCase(process.execPath, 'upstream', {}, { core: 0 });
  try {
    const params = (manager) => ({ manager, upstream: `http://127.0.0.1:${upstream.first.port}` });
    return await withServers(node, 'service-server', params, (servers) =>
      interleavedLoad(servers, urlsOf(servers, '/orders/42'), opts, { burst: 100, cycles: 120, warmUpCycles: 30 }),
    );
  } finally {
    await upstream.stop();
  }
});

const fastifyInterleaved = interleavedSuite('fastify-interleaved', 'Fastify', 'fastify', (node, opts) =>
  withServers(node, 'fastify-server', (manager) => ({ manager }), (servers) =>
    interleavedLoad(servers, urlsOf(servers, '/'), opts, { burst: 200, cycles: 120, warmUpCycles: 30 }),
  ),
);

const http = {
  name: 'http',
  variants: ['none', 'stock', 'floor', 'ours'],
  rounds: { full: 5, quick: 1 },
  run: httpRun,
  rows: [
    {
      label: 'http requests/s (stock/ours)',
      unit: 'ratio',
      value: (r) => r.stock.rps / r.ours.rps,
      target: { n20: 1.03, n24: 1.03 },
    },
    {
      label: 'http p99 latency (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.p99Ms / r.stock.p99Ms,
      target: { n20: 1.03, n24: 1.03 },
    },
    {
      label: 'http server CPU per request (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerRequest / r.stock.cpuNsPerRequest,
      target: { n20: 1.03, n24: 1.03 },
    },
    {
      label: 'http server CPU per request (ours/floor)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerRequest / r.floor.cpuNsPerRequest,
      target: null,
    },
    {
      label: 'http server CPU per request, stock tracing/no tracing',
      unit: 'ratio',
      value: (r) => r.stock.cpuNsPerRequest / r.none.cpuNsPerRequest,
      target: null,
    },
  ],
  details: [
    { label: 'http requests/s', field: 'rps', unit: 'int' },
    { label: 'http p50 latency', field: 'p50Ms', unit: 'ms' },
    { label: 'http p99 latency', field: 'p99Ms', unit: 'ms' },
    { label: 'http server CPU per request', field: 'cpuNsPerRequest', unit: 'us' },
  ],
};

const service = {
  name: 'service',
  variants: ['none', 'stock', 'floor', 'ours'],
  rounds: { full: 5, quick: 1 },
  run: serviceRun,
  rows: [
    {
      label: 'Express service server CPU per request (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerRequest / r.stock.cpuNsPerRequest,
      target: { n20: 1.05, n24: 1.05 },
    },
    {
      label: 'Express service server CPU per request (ours/floor)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerRequest / r.floor.cpuNsPerRequest,
      target: null,
    },
    {
      label: 'Express service requests/s (stock/ours)',
      unit: 'ratio',
      value: (r) => r.stock.rps / r.ours.rps,
      target: null,
    },
    {
      label: 'Express service server CPU per request, stock tracing/no tracing',
      unit: 'ratio',
      value: (r) => r.stock.cpuNsPerRequest / r.none.cpuNsPerRequest,
      target: null,
    },
  ],
  details: [
    { label: 'service requests/s', field: 'rps', unit: 'int' },
    { label: 'service p99 latency', field: 'p99Ms', unit: 'ms' },
    { label: 'service server CPU per request', field: 'cpuNsPerRequest', unit: 'us' },
  ],
};

const fastify = {
  name: 'fastify',
  variants: ['none', 'stock', 'floor', 'ours'],
  rounds: { full: 5, quick: 1 },
  run: async (node, manager, opts) => {
    const server = await startCase(node, 'fastify-server', { manager }, { core: 0 });
    try {
      return await loadServer(server, `http://127.0.0.1:${server.first.port}/`, manager, opts);
    } finally {
      server.child.kill('SIGKILL');
    }
  },
  rows: [
    {
      label: 'Fastify server CPU per request (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerRequest / r.stock.cpuNsPerRequest,
      target: { n20: 1.05, n24: 1.05 },
    },
    {
      label: 'Fastify server CPU per request (ours/floor)',
      unit: 'ratio',
      value: (r) => r.ours.cpuNsPerRequest / r.floor.cpuNsPerRequest,
      target: null,
    },
    {
      label: 'Fastify requests/s (stock/ours)',
      unit: 'ratio',
      value: (r) => r.stock.rps / r.ours.rps,
      target: null,
    },
    {
      label: 'Fastify p99 latency (ours/stock)',
      unit: 'ratio',
      value: (r) => r.ours.p99Ms / r.stock.p99Ms,
      target: null,
    },
    {
      label: 'Fastify server CPU per request, stock tracing/no tracing',
      unit: 'ratio',
      value: (r) => r.stock.cpuNsPerRequest / r.none.cpuNsPerRequest,
      target: null,
    },
  ],
  details: [
    { label: 'fastify requests/s', field: 'rps', unit: 'int' },
    { label: 'fastify p99 latency', field: 'p99Ms', unit: 'ms' },
    { label: 'fastify server CPU per request', field: 'cpuNsPerRequest', unit: 'us' },
  ],
};

const memory = {
  name: 'memory',
  variants: ['stock', 'floor', 'ours'],
  rounds: { full: 3, quick: 1 },
  run: (node, manager, opts) =>
    runCase(node, 'memory', {
      manager,
      withCalls: count(2e6, opts),
      awaits: count(1e6, opts),
      chains: count(20000, opts),
    }),
  rows: [
    {
      label: 'bytes per with() call (ours − stock)',
      unit: 'B+',
      value: (r) => r.ours.withBytes - r.stock.withBytes,
      target: { n20: 0, n24: 0 },
    },
    {
      label: 'bytes per with() cycling 16 SDK spans (ours − stock)',
      unit: 'B+',
      value: (r) => r.ours.with16Bytes - r.stock.with16Bytes,
      target: { n20: 0, n24: 0 },
    },
    {
      label: 'bytes per await continuation (ours − floor)',
      unit: 'B+',
      value: (r) => r.ours.awaitBytes - r.floor.awaitBytes,
      target: { n20: 0, n24: 0 },
    },
    {
      label: 'bytes per bare await, 16 interleaved SDK spans (ours − floor)',
      unit: 'B+',
      value: (r) => r.ours.await16Bytes - r.floor.await16Bytes,
      target: { n20: 0, n24: 0 },
    },
    {
      label: 'bytes per bare await, 16 interleaved SDK spans (floor − stock)',
      unit: 'B+',
      value: (r) => r.floor.await16Bytes - r.stock.await16Bytes,
      target: null,
    },
    {
      label: 'bytes per chain incl. its new span (ours − floor)',
      unit: 'B+',
      value: (r) => r.ours.chainBytes - r.floor.chainBytes,
      target: null,
    },
    {
      label: 'RSS growth over the measured phases (ours − stock)',
      unit: 'MB+',
      value: (r) => r.ours.rssGrowth - r.stock.rssGrowth,
      target: null,
    },
  ],
  details: [
    { label: 'memory: bytes per with() call', field: 'withBytes', unit: 'B' },
    { label: 'memory: bytes per with() cycling 16 SDK spans', field: 'with16Bytes', unit: 'B' },
    { label: 'memory: bytes per await continuation', field: 'awaitBytes', unit: 'B' },
    { label: 'memory: bytes per bare await, 16 SDK spans', field: 'await16Bytes', unit: 'B' },
    { label: 'memory: bytes per chain', field: 'chainBytes', unit: 'B' },
    { label: 'memory: RSS growth', field: 'rssGrowth', unit: 'MB' },
  ],
};

const direct = {
  name: 'direct',
  variants: ['direct'],
  rounds: { full: 5, quick: 2 },
  run: (node, variant, opts) => runCase(node, 'direct', { iterations: count(5e6, opts), batches: opts.quick ? 3 : 5 }),
  rows: [
    { label: 'setSpanContext() per call', unit: 'ns', value: (r) => r.direct.setSpanContextNs, target: { n20: 50, n24: 50 } },
    { label: 'clearSpanContext() per call', unit: 'ns', value: (r) => r.direct.clearSpanContextNs, target: null },
    { label: 'record mode switch (pointer store) per transition', unit: 'ns', value: (r) => r.direct.publishNs, target: null },
  ],
  details: [],
};

const SUITES = [
  sync,
  interleave,
  async,
  http,
  service,
  fastify,
  httpSwitching,
  serviceSwitching,
  fastifySwitching,
  httpInterleaved,
  serviceInterleaved,
  fastifyInterleaved,
  memory,
  direct,
  workers,
];

module.exports = { SUITES, chooseInterleavedKinds, lineControl };
