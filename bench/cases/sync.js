'use strict';
// sync: `context.with(ctxWithSpan, fn)` with a trivial fn, flat and nested
// three deep. Prints the fastest batch's ns per outer call, in process CPU
// time, as the interleave case does: interference only ever adds time, and
// time another process takes on a shared core does not count.
//
// params: { manager, iterations, batches }

const { params, report, installManager, spanContext, cpuNs } = require('../lib/common');

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

/** The fastest of `batches` timed batches of `body(n)`, in CPU ns per call, after warm-up. */
function measure(body, n) {
  let check = body(Math.max(1000, n >> 2)) + body(Math.max(1000, n >> 2));
  const perCall = [];
  for (let b = 0; b < batches; b++) {
    const start = cpuNs();
    check += body(n);
    perCall.push((cpuNs() - start) / n);
  }
  if (check <= 0) throw new Error('unexpected result');
  return { nsPerCall: Math.min(...perCall), batches: perCall };
}

const flatResult = measure(flat, iterations);
const nestedResult = measure(nested, Math.max(1, Math.round(iterations / 3)));
report({ flatNs: flatResult.nsPerCall, nestedNs: nestedResult.nsPerCall, flat: flatResult, nested: nestedResult });
