'use strict';
// Several ProfilingContextManagers on one thread: publishing follows the
// enabled managers as a stack, and a manager the API refused to register
// does not take publishing from the registered one.
const test = require('node:test');
const assert = require('node:assert');
const { context, trace, diag } = require('@opentelemetry/api');
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const { ProfilingContextManager } = require('..');
const { readOwnRecord, spanContextFor } = require('./helpers');

function published() {
  const r = readOwnRecord();
  return r.valid === 1 ? r.spanId : null;
}

/** What each way of running code in `ctx` publishes through `manager`. */
async function publishedBy(manager, label) {
  const { spanContext, ctx } = spanContextFor(label);
  const seen = await manager.with(ctx, async () => {
    const inWith = published();
    await null;
    const inContinuation = published();
    await new Promise((resolve) => setTimeout(resolve, 1));
    return [inWith, inContinuation, published()];
  });
  return { expected: spanContext.spanId, seen };
}

function assertPublishes(result, where) {
  assert.deepStrictEqual(result.seen, Array(3).fill(result.expected), `${where}: publishes`);
}

function assertSilent(result, where) {
  assert.deepStrictEqual(result.seen, [null, null, null], `${where}: publishes nothing`);
}

test.afterEach(() => context.disable());

test('A.enable(); B.enable(); B.disable(): A publishes again', async () => {
  const a = new ProfilingContextManager();
  const b = new ProfilingContextManager();
  a.enable();
  b.enable();
  try {
    assertPublishes(await publishedBy(b, 'b on top'), 'B (most recently enabled)');
    assertSilent(await publishedBy(a, 'a below'), 'A below B');
    b.disable();
    assertPublishes(await publishedBy(a, 'a again'), 'A after B.disable()');
    context.setGlobalContextManager(a);
    const { spanContext, ctx } = spanContextFor('through the API');
    assert.strictEqual(context.with(ctx, published), spanContext.spanId, 'context.with() through the API');
  } finally {
    a.disable();
    b.disable();
  }
  assert.strictEqual(published(), null, 'nothing enabled: nothing published');
});

test('three managers: disabling one below the top changes nothing, the last one stops publishing', async () => {
  const [a, b, c] = [0, 1, 2].map(() => new ProfilingContextManager().enable());
  try {
    c.disable();
    assertPublishes(await publishedBy(b, 'b'), 'B after C.disable()');
    a.disable();
    assertPublishes(await publishedBy(b, 'b still'), 'B after A.disable()');
    a.enable();
    assertPublishes(await publishedBy(a, 'a re-enabled'), 'A re-enabled goes on top');
    assertSilent(await publishedBy(b, 'b below a'), 'B below A');
    a.disable();
    b.disable();
    assertSilent(await publishedBy(b, 'b disabled'), 'every manager disabled');
  } finally {
    for (const m of [a, b, c]) m.disable();
  }
});

test('provider.register() twice: the registered manager keeps publishing', async () => {
  const errors = [];
  diag.setLogger({ error: (m) => errors.push(m), warn() {}, info() {}, debug() {}, verbose() {} });
  const first = new ProfilingContextManager();
  const second = new ProfilingContextManager();
  try {
    new NodeTracerProvider().register({ contextManager: first });
    new NodeTracerProvider().register({ contextManager: second });
    assert.ok(errors.some((m) => m.includes('duplicate registration')), 'the API refused the second manager');
    assertPublishes(await publishedBy(first, 'registered'), 'the registered manager');
    const tracer = trace.getTracer('managers-test');
    const seen = await tracer.startActiveSpan('request', async (span) => {
      await null;
      const inside = published();
      span.end();
      return [span.spanContext().spanId, inside];
    });
    assert.strictEqual(seen[1], seen[0], 'a span started through the API is published');
    // Disabling the registered manager hands publishing to the other one.
    first.disable();
    assertPublishes(await publishedBy(second, 'second'), 'the refused manager once the registered one is disabled');
  } finally {
    first.disable();
    second.disable();
    diag.disable();
    trace.disable();
  }
});
