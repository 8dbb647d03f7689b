'use strict';
// Workloads shaped like many requests interleaving, each with its own real
// SDK span (BasicTracerProvider), shared by the interleave and memory cases.
//
// - withCycle(n): `context.with(ctxs[i & 15], leaf)` cycling 16 contexts, so
//   every entry switches to another span than the last one.
// - awaitLoops(each, hopEvery): 16 async loops, each running in its own
//   span's context, awaiting `null` `each` times; with `hopEvery` > 0 every
//   hopEvery-th await is a setImmediate hop instead. The loops' continuations
//   take turns, so every continuation switches span.

const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');

const LOOPS = 16;

const tracer = new BasicTracerProvider().getTracer('bench');
const contexts = Array.from({ length: LOOPS }, (_, i) => trace.setSpan(ROOT_CONTEXT, tracer.startSpan(`request ${i}`)));

function leaf() {
  return 1;
}

function withCycle(n) {
  let sum = 0;
  for (let i = 0; i < n; i++) sum += context.with(contexts[i & (LOOPS - 1)], leaf);
  return sum;
}

function immediateHop(resolve) {
  setImmediate(resolve);
}

async function bareAwaits(each) {
  for (let k = 0; k < each; k++) await null;
}

async function hoppingAwaits(each, hopEvery) {
  for (let k = 1; k <= each; k++) {
    if (k % hopEvery === 0) await new Promise(immediateHop);
    else await null;
  }
}

/** Resolves when all 16 loops awaited `each` times; `each * 16` continuations. */
function awaitLoops(each, hopEvery = 0) {
  const body = hopEvery > 0 ? hoppingAwaits : bareAwaits;
  return Promise.all(contexts.map((ctx) => context.with(ctx, body, undefined, each, hopEvery)));
}

module.exports = { LOOPS, withCycle, awaitLoops };
