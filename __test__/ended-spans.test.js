'use strict';
// Once a span has ended, work that still runs in a context holding it
// publishes no span. Every check reads the record through /proc/self/mem,
// as an outside reader would.
const test = require('node:test');
const assert = require('node:assert');
const { context, trace } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager, ProcessContextSpanProcessor } = require('..');
const { readOwnRecord, collectUntilSettled } = require('./helpers');

const manager = new ProfilingContextManager();
context.setGlobalContextManager(manager.enable());

function published() {
  const r = readOwnRecord();
  return r.valid === 1 ? r.spanId : null;
}

const later = (fn) => new Promise((resolve) => setTimeout(() => resolve(fn()), 1));

test('without the span processor: callbacks after end() publish no span', async () => {
  const tracer = new BasicTracerProvider().getTracer('ended');
  const seen = await tracer.startActiveSpan('request', async (span) => {
    const id = span.spanContext().spanId;
    const inside = published();
    const timer = new Promise((resolve) => setTimeout(() => resolve(published()), 5));
    await null;
    span.end();
    await null;
    const continuation = published();
    const nested = context.with(context.active(), published);
    return { id, inside, continuation, nested, timer: await timer, afterTimer: await later(published) };
  });
  assert.deepStrictEqual(seen, { id: seen.id, inside: seen.id, continuation: null, nested: null, timer: null, afterTimer: null });
});

test('with ProcessContextSpanProcessor: the record stops carrying the span at end()', async () => {
  const tracer = new BasicTracerProvider({ spanProcessors: [new ProcessContextSpanProcessor()] }).getTracer('ended');
  const seen = tracer.startActiveSpan('parent', (parent) => {
    const child = tracer.startActiveSpan('child', (span) => {
      const inside = published();
      span.end();
      return { id: span.spanContext().spanId, inside, afterEnd: published() };
    });
    const backInParent = published();
    parent.end();
    return { parent: parent.spanContext().spanId, child, backInParent, afterParentEnd: published() };
  });
  assert.deepStrictEqual(seen, {
    parent: seen.parent,
    child: { id: seen.child.id, inside: seen.child.id, afterEnd: null },
    backInParent: seen.parent,
    afterParentEnd: null,
  });
  assert.notStrictEqual(seen.parent, seen.child.id);
});

test('a span ended in another callback is not published where its context resumes', async () => {
  const tracer = new BasicTracerProvider().getTracer('ended');
  const span = tracer.startSpan('background');
  const ctx = trace.setSpan(context.active(), span);
  assert.strictEqual(context.with(ctx, published), span.spanContext().spanId, 'published while live');
  const resumed = context.with(ctx, () => later(published));
  span.end();
  assert.strictEqual(await resumed, null, 'timer scheduled while live, fired after end');
  assert.strictEqual(context.with(ctx, published), null, 'with() after end');
});

test('an outer span ended inside a nested with() is not published when it returns', () => {
  const tracer = new BasicTracerProvider().getTracer('ended');
  const outer = tracer.startSpan('outer');
  const inner = tracer.startSpan('inner');
  const seen = context.with(trace.setSpan(context.active(), outer), () => {
    const before = published();
    const during = context.with(trace.setSpan(context.active(), inner), () => {
      outer.end();
      return published();
    });
    return { before, during, after: published() };
  });
  assert.deepStrictEqual(seen, { before: outer.spanContext().spanId, during: inner.spanContext().spanId, after: null });
  inner.end();
});

test('ended spans waiting to be exported keep none of our records alive', async () => {
  const binding = require('../js/binding');
  const tracer = new BasicTracerProvider().getTracer('queued');
  await collectUntilSettled();
  const before = binding.spanRecordSlabs();
  // What a batch span processor holds until its next export: ended spans,
  // and none of the contexts they ran in.
  const queued = [];
  for (let i = 0; i < 5000; i++) {
    tracer.startActiveSpan(`queued span ${i}`, { attributes: { 'http.route': `/queued/${i % 7}` } }, (span) => {
      tracer.startActiveSpan('child', (child) => child.end());
      span.end();
      queued.push(span);
    });
  }
  // Their records alone would fill dozens of slabs.
  await collectUntilSettled();
  const left = binding.spanRecordSlabs() - before;
  assert.ok(left <= 2, `slabs still alive: ${left}`);
  assert.strictEqual(queued.length, 5000);
  assert.ok(queued.every((span) => span.ended), 'the spans themselves are kept');
});
