'use strict';
// The sync case's workload (bench/cases/sync.js), a module so that each
// variant taking turns loads its own copy (bench/lib/turns.js):
// - flat(n): `context.with(ctxA, leaf)`, one span context;
// - nested(n): the same, nested three deep with three span contexts.
// Spans made with `trace.setSpanContext`, so ours publishes a valid record
// on entry and restores the outer one on exit.

const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { spanContext } = require('./common');

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

module.exports = { flat, nested };
