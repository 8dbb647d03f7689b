'use strict';
// Where a sample belongs, published by default: the span's name, its local
// root span's id, and the local root's endpoint attributes (`http.route`)
// on every span of its tree, late routes included. Runs in the default mode
// of the Node line (frame on 24+, record on 20) and in record mode with
// OTEL_THREAD_CTX_MODE=record.
const test = require('node:test');
const assert = require('node:assert');
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager, ProcessContextSpanProcessor } = require('..');
const { readFullRecord, ownRecordAddress, NO_RECORD } = require('./helpers');
const otelCtx = require('./fixtures/otel-ctx-reader');

const ROUTE = 'http.route';
const manager = new ProfilingContextManager({ attributes: ['db.system'] });
context.setGlobalContextManager(manager.enable());
const tracer = new BasicTracerProvider({ spanProcessors: [new ProcessContextSpanProcessor()] }).getTracer('local-root-test');
// No span processor: the local root is found from the active span.
const bareTracer = new BasicTracerProvider().getTracer('local-root-test-bare');

function keyMap() {
  const [mapping] = otelCtx.findMappings('self');
  const reader = new otelCtx.MemoryReader('self');
  try {
    return otelCtx.decodePayload(reader.readConsistent(mapping.start).bytes).attributes['threadlocal.attribute_key_map'];
  } finally {
    reader.close();
  }
}

/** The calling thread's record: span id and attributes by key name. */
function published() {
  const address = ownRecordAddress();
  const record = address === null ? { ...NO_RECORD, attrs: [] } : readFullRecord('self', address);
  const keys = keyMap();
  const attributes = {};
  for (const { keyIndex, value } of record.attrs) attributes[keys[keyIndex]] = value.toString('utf8');
  return { valid: record.valid, spanId: record.spanId, attributes };
}

const idOf = (span) => span.spanContext().spanId;

test('the default keys are in the key map before any span', () => {
  const keys = keyMap();
  for (const key of ['local_root.span_id', ROUTE, 'span.name', 'db.system']) assert.ok(keys.includes(key), `${key} in ${keys}`);
});

test('every span publishes its name, its local root id and the root route', () => {
  tracer.startActiveSpan('GET /sort', { attributes: { [ROUTE]: '/sort' } }, (root) => {
    assert.deepStrictEqual(published().attributes, { 'local_root.span_id': idOf(root), [ROUTE]: '/sort', 'span.name': 'GET /sort' });
    tracer.startActiveSpan('sortBigArray', { attributes: { 'db.system': 'none' } }, (child) => {
      tracer.startActiveSpan('compare', (grandchild) => {
        const r = published();
        assert.strictEqual(r.spanId, idOf(grandchild));
        assert.deepStrictEqual(r.attributes, { 'local_root.span_id': idOf(root), [ROUTE]: '/sort', 'span.name': 'compare' });
        grandchild.end();
      });
      assert.deepStrictEqual(published().attributes, {
        'local_root.span_id': idOf(root),
        [ROUTE]: '/sort',
        'span.name': 'sortBigArray',
        'db.system': 'none',
      });
      child.end();
    });
    root.end();
  });
});

test('a route set late on the root reaches running and resumed children at once', async () => {
  await tracer.startActiveSpan('GET', async (root) => {
    await tracer.startActiveSpan('work', async (child) => {
      assert.strictEqual(published().attributes[ROUTE], undefined);
      // As a router does: on the server span, while a child runs.
      root.setAttribute(ROUTE, '/late');
      const r = published();
      assert.strictEqual(r.spanId, idOf(child));
      assert.strictEqual(r.attributes[ROUTE], '/late', 'the running child follows without a context switch');
      await new Promise((resolve) => setImmediate(resolve));
      assert.strictEqual(published().attributes[ROUTE], '/late', 'and after an await');
      child.end();
    });
    assert.strictEqual(published().attributes[ROUTE], '/late');
    root.end();
  });
});

test('a route on a span under the root (Express handler spans) becomes the endpoint of the tree', () => {
  tracer.startActiveSpan('GET', (server) => {
    tracer.startActiveSpan('request handler - /orders/:id', { attributes: { [ROUTE]: '/orders/:id' } }, (handler) => {
      tracer.startActiveSpan('load', (work) => {
        const r = published();
        assert.strictEqual(r.attributes[ROUTE], '/orders/:id');
        assert.strictEqual(r.attributes['local_root.span_id'], idOf(server));
        work.end();
      });
      handler.end();
    });
    assert.strictEqual(published().attributes[ROUTE], '/orders/:id', 'the server span carries it too');
    // The root's own value wins over its children's.
    server.setAttribute(ROUTE, '/orders');
    tracer.startActiveSpan('late handler', { attributes: { [ROUTE]: '/other' } }, (late) => {
      assert.strictEqual(published().attributes[ROUTE], '/orders');
      late.end();
    });
    server.end();
  });
});

test('a remote parent starts a new local root; without the span processor the active span is the parent', () => {
  const remote = trace.setSpanContext(ROOT_CONTEXT, {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    traceFlags: 1,
    isRemote: true,
  });
  const server = bareTracer.startSpan('server', { attributes: { [ROUTE]: '/remote' } }, remote);
  context.with(trace.setSpan(remote, server), () => {
    assert.strictEqual(published().attributes['local_root.span_id'], idOf(server));
    bareTracer.startActiveSpan('child', (child) => {
      assert.deepStrictEqual(published().attributes, { 'local_root.span_id': idOf(server), [ROUTE]: '/remote', 'span.name': 'child' });
      child.end();
    });
  });
  server.end();
});

test('with the span processor the parent is exact even when the span is entered elsewhere', () => {
  const root = tracer.startSpan('root', { attributes: { [ROUTE]: '/exact' } });
  const child = tracer.startSpan('child', {}, trace.setSpan(ROOT_CONTEXT, root));
  // Entered from no span at all: only the processor knew its parent.
  context.with(trace.setSpan(ROOT_CONTEXT, child), () => {
    assert.deepStrictEqual(published().attributes, { 'local_root.span_id': idOf(root), [ROUTE]: '/exact', 'span.name': 'child' });
  });
  child.end();
  root.end();
});

test('the identity keys can be turned off, and bad options throw', () => {
  assert.throws(() => new ProfilingContextManager({ spanName: 'yes' }), TypeError);
  assert.throws(() => new ProfilingContextManager({ localRootSpanId: 1 }), TypeError);
  assert.throws(() => new ProfilingContextManager({ localRootAttributes: 'http.route' }), TypeError);
  assert.throws(() => new ProfilingContextManager({ localRootAttributes: ['a', 'a'] }), RangeError);
  const quiet = new ProfilingContextManager({ spanName: false, localRootSpanId: false, localRootAttributes: ['http.request.method'] });
  assert.deepStrictEqual(quiet._attributeSchema.keys, ['http.request.method']);
  assert.strictEqual(new ProfilingContextManager({ spanName: false, localRootSpanId: false, localRootAttributes: [] })._attributeSchema, null);
});
