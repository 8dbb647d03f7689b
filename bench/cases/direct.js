'use strict';
// direct: the package's own hot paths without any context manager.
// - setSpanContext(traceIdHigh, traceIdLow, spanId, traceFlags), alternating
//   two span contexts (a napi call per transition);
// - clearSpanContext();
// - record mode's switch: pointing the thread's otel_thread_ctx_v1 at a
//   span's record (one store into the typed-array view over it, no FFI),
//   alternating two spans' records.
// Prints the median over batches of ns per call.
//
// params: { iterations, batches }

const path = require('node:path');
const { ROOT, params, report, since, median } = require('../lib/common');

const { iterations = 5e6, batches = 5 } = params();
const otel = require(ROOT);
const view = require(path.join(ROOT, 'js', 'record-view.js'));

const A = [0x0af7651916cd43ddn, 0x8448eb211c80319cn, 0xb7ad6b7169203331n, 1];
const B = [0x4bf92f3577b34da6n, 0xa3ce929d0e0e4736n, 0x00f067aa0ba902b7n, 1];

function setLoop(n) {
  const set = otel.setSpanContext;
  for (let i = 0; i < n; i += 2) {
    set(A[0], A[1], A[2], A[3]);
    set(B[0], B[1], B[2], B[3]);
  }
}

function clearLoop(n) {
  const clear = otel.clearSpanContext;
  for (let i = 0; i < n; i++) clear();
}

const spanRecords = require(path.join(ROOT, 'js', 'span-records.js'));
const span = (traceId, spanId) => ({ spanContext: () => ({ traceId, spanId, traceFlags: 1 }) });
const recordA = spanRecords.recordOf(span('0af7651916cd43dd8448eb211c80319c', 'b7ad6b7169203331'));
const recordB = spanRecords.recordOf(span('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7'));
function publishLoop(n) {
  const pointAt = view.pointAt;
  const a = recordA.address;
  const b = recordB.address;
  for (let i = 0; i < n; i += 2) {
    pointAt(a);
    pointAt(b);
  }
}

/** Median ns per call of `body(n)` over `batches` timed batches, after warm-up. */
function measure(body, n) {
  body(Math.max(1000, n >> 2));
  body(Math.max(1000, n >> 2));
  const perCall = [];
  for (let b = 0; b < batches; b++) {
    const start = process.hrtime.bigint();
    body(n);
    perCall.push(since(start) / n);
  }
  return median(perCall);
}

const napiIterations = Math.max(2, Math.round(iterations / 5));
report({
  setSpanContextNs: measure(setLoop, napiIterations),
  clearSpanContextNs: measure(clearLoop, napiIterations),
  publishNs: measure(publishLoop, iterations),
});
otel.clearSpanContext();
