'use strict';
// sync: `context.with(ctxWithSpan, fn)` with a trivial fn, flat and nested
// three deep. Prints the median over batches of ns per outer call.
//
// params: { manager, iterations, batches }

const { params, report, installManager, spanContext, since, median } = require('../lib/common');

const { manager, iterations = 2e6, batches = 5 } = params();
installManager(manager);
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');

const ctxA = trace.setSpanContext(ROOT_CONTEXT, spanContext(1));
const ctxB = trace.setSpanContext(ROOT_CONTEXT, spanContext(2));
const ctxC = trace.setSpanContext(ROOT_CONTEXT, spanContext(3));

function leaf() {
  return 1;
}
function level2() {
  return context.with(ctxC, leaf);
}
function level1() {
  return context.with(ctxB, level2);
}

function flat(n) {
  let sum = 0;
  for (let i = 0; i < n; i++) sum += context.with(ctxA, leaf);
  return sum;
}

function nested(n) {
  let sum = 0;
  for (let i = 0; i < n; i++) sum += context.with(ctxA, level1);
  return sum;
}

/** Median ns per call of `body(n)` over `batches` timed batches, after warm-up. */
function measure(body, n) {
  let check = body(Math.max(1000, n >> 2)) + body(Math.max(1000, n >> 2));
  const perCall = [];
  for (let b = 0; b < batches; b++) {
    const start = process.hrtime.bigint();
    check += body(n);
    perCall.push(since(start) / n);
  }
  if (check <= 0) throw new Error('unexpected result');
  return { nsPerCall: median(perCall), batches: perCall };
}

const flatResult = measure(flat, iterations);
const nestedResult = measure(nested, Math.max(1, Math.round(iterations / 3)));
report({ flatNs: flatResult.nsPerCall, nestedNs: nestedResult.nsPerCall, flat: flatResult, nested: nestedResult });
