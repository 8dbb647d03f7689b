'use strict';
// Contexts, spans and the SDK's objects stay exactly as the application
// made them, in both modes: no own property is added (enumerable or not,
// string or symbol keyed), so equality, Object.keys/Reflect.ownKeys,
// util.inspect, structured clone and assertion diffs behave as with the
// stock manager.
const test = require('node:test');
const assert = require('node:assert');
const util = require('node:util');
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager } = require('..');
const { usesAsyncContextFrame } = require('../js/publish/frame');
const { readOwnRecord } = require('./helpers');

const MODES = usesAsyncContextFrame() ? ['record', 'frame'] : ['record'];

/** Every own key of `value` with its descriptor, functions by name (a comparable picture). */
function ownShape(value) {
  return Reflect.ownKeys(value).map((key) => {
    const d = Object.getOwnPropertyDescriptor(value, key);
    return [String(key), typeof d.value === 'function' ? `function ${d.value.name}` : typeof d.value, d.enumerable, d.writable];
  });
}

/** What the application can observe of a context or span, short of calling its methods. */
function picture(value) {
  return {
    keys: Object.keys(value),
    own: ownShape(value),
    symbols: Object.getOwnPropertySymbols(value).map(String),
    inspected: util.inspect(value, { depth: 0, showHidden: true }),
    extensible: Object.isExtensible(value),
  };
}

function withManager(t, manager) {
  context.setGlobalContextManager(manager.enable());
  t.after(() => {
    manager.disable();
    context.disable();
  });
  return manager;
}

/** A context carrying a started SDK span (with a parent, so a local root is looked up). */
function sdkContext(tracer) {
  const root = tracer.startSpan('GET /orders', { attributes: { 'http.route': '/orders' } });
  const rootContext = trace.setSpan(ROOT_CONTEXT, root);
  const child = context.with(rootContext, () => tracer.startSpan('db.query'));
  return { root, child, rootContext, childContext: trace.setSpan(rootContext, child) };
}

for (const mode of MODES) {
  test(`${mode} mode: with(), bind(), attach() and span methods add nothing to contexts or spans`, (t) => {
    const manager = withManager(t, new ProfilingContextManager({ mode, attributes: ['db.system'] }));
    const tracer = new BasicTracerProvider().getTracer('untouched');
    const { root, child, rootContext, childContext } = sdkContext(tracer);
    const objects = { ROOT_CONTEXT, rootContext, childContext, root, child };
    const before = Object.fromEntries(Object.entries(objects).map(([name, value]) => [name, picture(value)]));

    let published = null;
    manager.with(childContext, () => {
      published = readOwnRecord();
      manager.with(ROOT_CONTEXT, () => {});
      manager.with(rootContext, () => {});
    });
    manager.bind(childContext, () => {})();
    manager.attach(rootContext).dispose();
    child.setAttribute('db.system', 'postgresql');
    child.setAttributes({ 'db.name': 'orders' });
    child.updateName('db.query orders');
    root.setAttribute('http.route', '/orders/:id');
    child.end();
    manager.with(childContext, () => {});

    assert.strictEqual(published.valid, 1, 'the span was published');
    assert.strictEqual(published.spanId, child.spanContext().spanId);
    for (const [name, value] of Object.entries(objects)) {
      assert.deepStrictEqual(picture(value), before[name], `${name} looks as it did before`);
    }
  });

  test(`${mode} mode: equality, structured clone and assertion diffs of entered contexts behave as with the stock manager`, async (t) => {
    const manager = withManager(t, new ProfilingContextManager({ mode }));
    const tracer = new BasicTracerProvider().getTracer('untouched');
    const a = sdkContext(tracer).childContext;
    const b = sdkContext(tracer).childContext;
    const same = trace.setSpan(ROOT_CONTEXT, trace.getSpan(a));
    manager.with(a, () => manager.with(b, () => manager.with(same, () => {})));
    await new Promise((resolve) => manager.with(a, () => setImmediate(resolve)));

    // Every comparison answers as it does under the stock manager, and a
    // failing one ends with an AssertionError (its diff walks only the
    // application's objects).
    const outcome = (x, y) => {
      const started = process.hrtime.bigint();
      let equal = true;
      try {
        assert.deepStrictEqual(x, y);
      } catch (error) {
        assert.ok(error instanceof assert.AssertionError, String(error));
        equal = false;
      }
      return { equal, ms: Number(process.hrtime.bigint() - started) / 1e6 };
    };
    const pairs = [[a, a], [a, b], [a, same], [ROOT_CONTEXT, ROOT_CONTEXT]];
    const ours = pairs.map(([x, y]) => outcome(x, y));
    const stock = new AsyncLocalStorageContextManager().enable();
    stock.with(a, () => stock.with(b, () => {}));
    stock.disable();
    const theirs = pairs.map(([x, y]) => outcome(x, y));
    assert.deepStrictEqual(ours.map((o) => o.equal), theirs.map((o) => o.equal));
    assert.deepStrictEqual(ours.map((o) => o.equal), [true, false, false, true]);
    for (const { ms } of ours) assert.ok(ms < 5000, `a comparison took ${ms} ms`);

    // ROOT_CONTEXT is still an empty context.
    assert.deepStrictEqual(Reflect.ownKeys(ROOT_CONTEXT).filter((k) => typeof k === 'symbol'), []);
    // A plain data object used as a context clones as it was.
    const plain = { request: 7, tags: ['a'] };
    manager.with(plain, () => {});
    assert.deepStrictEqual(structuredClone(plain), { request: 7, tags: ['a'] });
    assert.deepStrictEqual(Reflect.ownKeys(plain), ['request', 'tags']);
  });

  test(`${mode} mode: frozen and sealed contexts and spans are published without being changed`, (t) => {
    const manager = withManager(t, new ProfilingContextManager({ mode }));
    const tracer = new BasicTracerProvider().getTracer('untouched');
    const { child } = sdkContext(tracer);
    const frozenContext = Object.freeze(trace.setSpan(ROOT_CONTEXT, Object.freeze(child)));
    const sealed = Object.seal(sdkContext(tracer).childContext);
    for (const ctx of [frozenContext, sealed]) {
      const span = trace.getSpan(ctx);
      const read = manager.with(ctx, () => readOwnRecord());
      assert.strictEqual(read.valid, 1);
      assert.strictEqual(read.spanId, span.spanContext().spanId);
      assert.ok(!Object.isExtensible(ctx));
    }
  });
}
