'use strict';
// Variants taking turns in one process, for the micro-benchmarks
// (bench/cases/sync.js, bench/cases/interleave.js). This host runs a
// process at one of two speeds that change within a second, and separate
// processes do not share them (BENCHMARKS.md, "Machine and noise in brief"); turns
// of a few tens of milliseconds in one process put every variant in the
// same phases, and each cycle's ratio compares neighbouring turns.
//
// What one process shares, and how it is kept from favouring a variant:
// - Each variant gets its own copy of the JavaScript it runs (the
//   OpenTelemetry API, the context managers, the workload), loaded with a
//   module cache of its own, so their call sites, inline caches and
//   optimized code see that variant's manager alone, as in a process that
//   has only one.
// - The managers share one AsyncLocalStorage (common.js, shareStorage).
// - Node's own code (async_hooks' callers of the hooks, the promise hooks,
//   AsyncLocalStorage) and the addon are shared. Only the current
//   variant's manager is enabled, so only its hooks are on, but the call
//   sites in Node that run hooks have seen every variant's.

const { createManager, shareStorage, cpuNs } = require('./common');
const { median } = require('./stats');

/**
 * The variant `kind`: its context manager (created, not enabled) and
 * `load()`'s result (its workload), with a module cache of their own
 * except for native addons (a process loads an addon once). Returns
 * { kind, api, manager, workload }.
 */
function isolatedVariant(kind, load) {
  for (const key of Object.keys(require.cache)) {
    if (!key.endsWith('.node')) delete require.cache[key];
  }
  const api = require('@opentelemetry/api');
  const manager = shareStorage(createManager(kind));
  return { kind, api, manager, workload: load() };
}

/**
 * The order of cycle `cycle`'s turns: each cycle starts one item further
 * on, so every item takes every place equally often, follows each of the
 * others, and never takes two turns in a row (as reversing the order every
 * other cycle would give the first and the last at each reversal).
 */
function cycleOrder(items, cycle) {
  return items.map((_, i) => items[(cycle + i) % items.length]);
}

let current = null;

/** Makes `variant`'s manager the enabled, global one (the current one disabled first). */
function use(variant) {
  if (current === variant) return;
  if (current !== null) current.api.context.disable();
  current = null;
  const { context } = variant.api;
  context.setGlobalContextManager(variant.manager.enable());
  // The API refuses a second registration with a diag message only.
  if (context._getContextManager() !== variant.manager) throw new Error(`${variant.kind}: its manager did not become the global one`);
  current = variant;
}

/**
 * Runs `turn(variant, size)` (sync or async; it does `size` operations) for
 * every variant in turns: `warmUps` passes unmeasured, then `cycles`
 * cycles in cycleOrder(). A turn switches, runs
 * a tenth of `size` unmeasured, then `size` timed in process CPU time.
 * Resolves with { [kind]: [ns per operation of each cycle's turn] }.
 */
async function takeTurns(variants, turn, { size, cycles, warmUps = 2 }) {
  for (let w = 0; w < warmUps; w++) {
    for (const variant of variants) {
      use(variant);
      await turn(variant, size);
    }
  }
  const turns = new Map(variants.map((v) => [v, []]));
  const settle = Math.max(1, Math.round(size / 10));
  for (let c = 0; c < cycles; c++) {
    for (const variant of cycleOrder(variants, c)) {
      use(variant);
      await turn(variant, settle);
      const start = cpuNs();
      await turn(variant, size);
      turns.get(variant).push((cpuNs() - start) / size);
    }
  }
  return Object.fromEntries(variants.map((v) => [v.kind, turns.get(v)]));
}

/**
 * A case's result from `phases` ({ [phase]: takeTurns() result }): for each
 * variant, its manager's class (what the turns ran), and per phase the
 * median turn (`<phase>Ns`) and every cycle's turn (`<phase>Turns`).
 */
function turnsResult(variants, phases) {
  const result = {};
  for (const { kind, manager } of variants) {
    result[kind] = { manager: manager.constructor.name };
    for (const [phase, turns] of Object.entries(phases)) {
      result[kind][`${phase}Ns`] = median(turns[kind]);
      result[kind][`${phase}Turns`] = turns[kind];
    }
  }
  return result;
}

module.exports = { isolatedVariant, use, takeTurns, turnsResult, cycleOrder };
