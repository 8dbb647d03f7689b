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
//          chain (bytes per chain, includes per-span costs);
// - with16: `with()` cycling 16 real SDK spans (bench/lib/interleave.js),
//          bytes per call;
// - await16: 16 interleaved loops of bare `await null`, each in its own SDK
//          span, bytes per continuation.
// RSS growth is taken over the measured phases together.
//
// params: { manager, withCalls, awaits, chains }

const v8 = require('node:v8');
const { params, report, installManager, spanContext } = require('../lib/common');

const { manager, withCalls = 2e6, awaits = 1e6, chains = 20000 } = params();
installManager(manager);
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { runChains } = require('../lib/chains');
const interleave = require('../lib/interleave');

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

const await16Each = Math.max(1, Math.round(awaits / interleave.LOOPS));
const await16Phase = () => interleave.awaitLoops(await16Each);

async function main() {
  const awaitsDone = LOOPS * Math.max(1, Math.round(awaits / LOOPS));
  const await16Done = interleave.LOOPS * await16Each;
  // Warm-up: every phase once.
  withLoop(withCalls);
  await awaitPhase(awaits);
  await chainPhase(chains);
  interleave.withCycle(withCalls);
  await await16Phase();

  const rss0 = process.memoryUsage().rss;
  const all = { withBytes: [], awaitBytes: [], chainBytes: [], with16Bytes: [], await16Bytes: [] };
  for (let i = 0; i < 3; i++) {
    all.withBytes.push((await allocated(() => withLoop(withCalls))) / withCalls);
    all.awaitBytes.push((await allocated(() => awaitPhase(awaits))) / awaitsDone);
    all.chainBytes.push((await allocated(() => chainPhase(chains))) / chains);
    all.with16Bytes.push((await allocated(() => interleave.withCycle(withCalls))) / withCalls);
    all.await16Bytes.push((await allocated(await16Phase)) / await16Done);
  }
  const rssGrowth = process.memoryUsage().rss - rss0;
  const smallest = {};
  for (const [key, values] of Object.entries(all)) smallest[key] = Math.min(...values);
  report({ ...smallest, rssGrowth, all });
}

main();
