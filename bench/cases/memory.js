'use strict';
// memory: bytes allocated on the V8 heap per context transition in steady
// state, and RSS growth.
//
// Method: a v8.GCProfiler session spans the measured work. Every byte
// allocated in the window is either still in the heap at the end or was
// freed by one of the GCs the profiler recorded, so
//   allocated = used_heap_size(end) - used_heap_size(start)
//             + sum over GCs of (usedHeapSize before GC - after GC).
// This is exact to the byte (checked against a loop allocating a known-size
// object) and needs no flags. Each phase runs once unmeasured first, so
// caches (per-span entries, inline caches, hidden classes) are warm, then is
// measured three times; the smallest figure is kept, which drops one-off
// allocations of the JIT (optimized code, feedback) that are not per
// transition.
//
// Phases:
// - with:  `context.with(ctx, fn)` alternating two span contexts
//          (bytes per with() call: one enter and one exit transition);
// - await: 100 concurrent loops, each in its own span context, awaiting an
//          async function (bytes per await continuation);
// - chain: the request-like chains of the async benchmark, fresh span per
//          chain (bytes per chain, includes per-span costs).
// RSS growth is taken over the three measured phases together.
//
// params: { manager, withCalls, awaits, chains }

const v8 = require('node:v8');
const { params, report, installManager, spanContext } = require('../lib/common');

const { manager, withCalls = 2e6, awaits = 1e6, chains = 20000 } = params();
installManager(manager);
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { runChains } = require('../lib/chains');

/** Bytes allocated on the V8 heap while `work()` (sync or async) runs. */
async function allocated(work) {
  const profiler = new v8.GCProfiler();
  profiler.start();
  const start = v8.getHeapStatistics().used_heap_size;
  await work();
  const end = v8.getHeapStatistics().used_heap_size;
  const { statistics } = profiler.stop();
  let freed = 0;
  for (const gc of statistics) {
    freed += gc.beforeGC.heapStatistics.usedHeapSize - gc.afterGC.heapStatistics.usedHeapSize;
  }
  return end - start + freed;
}

const ctxA = trace.setSpanContext(ROOT_CONTEXT, spanContext(1));
const ctxB = trace.setSpanContext(ROOT_CONTEXT, spanContext(2));
function leaf() {
  return 1;
}
function withLoop(n) {
  let sum = 0;
  for (let i = 0; i < n; i += 2) {
    sum += context.with(ctxA, leaf);
    sum += context.with(ctxB, leaf);
  }
  return sum;
}

const LOOPS = 100;
const loopContexts = Array.from({ length: LOOPS }, (_, i) => trace.setSpanContext(ROOT_CONTEXT, spanContext(10 + i)));
async function step(k) {
  return k + 1;
}
async function awaitLoop(count) {
  let acc = 0;
  for (let k = 0; k < count; k++) acc += await step(k);
  return acc;
}
function awaitPhase(total) {
  const each = Math.max(1, Math.round(total / LOOPS));
  return Promise.all(loopContexts.map((ctx) => context.with(ctx, awaitLoop, undefined, each)));
}

let chainSerial = 0;
function chainPhase(total) {
  const first = chainSerial;
  chainSerial += total;
  return runChains(total, 100, first);
}

async function main() {
  const awaitsDone = LOOPS * Math.max(1, Math.round(awaits / LOOPS));
  // Warm-up: every phase once.
  withLoop(withCalls);
  await awaitPhase(awaits);
  await chainPhase(chains);

  const rss0 = process.memoryUsage().rss;
  const withBytes = [];
  const awaitBytes = [];
  const chainBytes = [];
  for (let i = 0; i < 3; i++) {
    withBytes.push((await allocated(() => withLoop(withCalls))) / withCalls);
    awaitBytes.push((await allocated(() => awaitPhase(awaits))) / awaitsDone);
    chainBytes.push((await allocated(() => chainPhase(chains))) / chains);
  }
  const rssGrowth = process.memoryUsage().rss - rss0;
  report({
    withBytes: Math.min(...withBytes),
    awaitBytes: Math.min(...awaitBytes),
    chainBytes: Math.min(...chainBytes),
    rssGrowth,
    all: { withBytes, awaitBytes, chainBytes },
  });
}

main();
