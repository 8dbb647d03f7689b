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
const { readFullRecord, ownRecordAddress, NO_RECORD, collectGarbage } = require('./helpers');
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

test('without the span processor a child joins its parent\'s tree, after the parent ended too', () => {
  let late;
  bareTracer.startActiveSpan('GET', { attributes: { [ROUTE]: '/bare' } }, (root) => {
    bareTracer.startActiveSpan('handler', (handler) => {
      bareTracer.startActiveSpan('query', (query) => {
        assert.deepStrictEqual(published().attributes, { 'local_root.span_id': idOf(root), [ROUTE]: '/bare', 'span.name': 'query' });
        query.end();
      });
      handler.end();
    });
    root.end();
    // A callback of the request that runs after the response was sent.
    late = bareTracer.startSpan('late', {}, context.active());
    context.with(trace.setSpan(context.active(), late), () => {
      assert.deepStrictEqual(published().attributes, { 'local_root.span_id': idOf(root), [ROUTE]: '/bare', 'span.name': 'late' });
    });
  });
  late.end();
});

test('an ended local root span is not kept alive by the records of its tree', async () => {
  let rootRef;
  let heldContext;
  bareTracer.startActiveSpan('GET', { attributes: { [ROUTE]: '/held' } }, (root) => {
    rootRef = new WeakRef(root);
    bareTracer.startActiveSpan('child', (child) => {
      // A context a timer or a pooled socket keeps after the request.
      heldContext = context.active();
      child.end();
    });
    root.end();
  });
  // Out of every frame that could hold the root's context.
  await new Promise((resolve) => setImmediate(resolve));
  await new Promise((resolve) => setImmediate(resolve));
  collectGarbage();
  assert.strictEqual(rootRef.deref(), undefined, 'the root span was collected');
  assert.ok(trace.getSpan(heldContext), 'while a context of its tree lives on');
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

test('a span whose parent is in another thread joins that thread\'s local root; the entry goes when the root ends or its thread exits', async () => {
  const { Worker } = require('node:worker_threads');
  const binding = require('../js/binding');
  const worker = new Worker(
    `
    const { parentPort } = require('node:worker_threads');
    const req = require('node:module').createRequire(${JSON.stringify(require.resolve('..'))});
    const { context, trace, ROOT_CONTEXT } = req('@opentelemetry/api');
    const { BasicTracerProvider } = req('@opentelemetry/sdk-trace-base');
    const { ProfilingContextManager } = req('.');
    const { readFullRecord, ownRecordAddress } = req('./__test__/helpers');
    const otelCtx = req('./__test__/fixtures/otel-ctx-reader');
    context.setGlobalContextManager(new ProfilingContextManager().enable());
    const tracer = new BasicTracerProvider().getTracer('worker');
    function published() {
      const [mapping] = otelCtx.findMappings('self');
      const reader = new otelCtx.MemoryReader('self');
      const keys = otelCtx.decodePayload(reader.readConsistent(mapping.start).bytes).attributes['threadlocal.attribute_key_map'];
      reader.close();
      const attributes = {};
      for (const { keyIndex, value } of readFullRecord('self', ownRecordAddress()).attrs) attributes[keys[keyIndex]] = value.toString('utf8');
      return attributes;
    }
    let own = null;
    parentPort.on('message', (parent) => {
      const remote = trace.setSpanContext(ROOT_CONTEXT, { ...parent, traceFlags: 1, isRemote: true });
      const span = tracer.startSpan('job', {}, remote);
      const attributes = context.with(trace.setSpan(remote, span), published);
      span.end();
      // A root of the worker's own, left running: shared while the worker lives.
      own ??= tracer.startSpan('worker root');
      context.with(trace.setSpan(ROOT_CONTEXT, own), () => {});
      parentPort.postMessage({ attributes, ownTraceId: own.spanContext().traceId });
    });
    parentPort.postMessage('ready');`,
    { eval: true },
  );
  const messages = [];
  const next = () => new Promise((resolve) => (messages.length ? resolve(messages.shift()) : worker.once('message', resolve)));
  assert.strictEqual(await next(), 'ready');
  // Threads are counted at most once a second: the worker is seen after that.
  await new Promise((resolve) => setTimeout(resolve, 1100));

  const root = tracer.startSpan('GET /jobs/:id', { attributes: { [ROUTE]: '/jobs/:id' } });
  const { traceId, spanId } = root.spanContext();
  context.with(trace.setSpan(ROOT_CONTEXT, root), () => {});
  assert.deepStrictEqual(binding.traceRootFind(traceId), { rootSpanId: spanId, values: [ROUTE, '/jobs/:id'] });
  worker.postMessage({ traceId, spanId });
  const reply = await next();
  assert.deepStrictEqual(reply.attributes, { 'local_root.span_id': spanId, [ROUTE]: '/jobs/:id', 'span.name': 'job' });
  root.end();
  assert.strictEqual(binding.traceRootFind(traceId), null, 'an ended root leaves the table');

  // A trace no other thread published: the worker's span is its own local root.
  const stranger = { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7' };
  worker.postMessage(stranger);
  const alone = await next();
  assert.notStrictEqual(alone.attributes['local_root.span_id'], stranger.spanId);
  assert.strictEqual(alone.attributes[ROUTE], undefined);
  assert.match(alone.attributes['local_root.span_id'], /^[0-9a-f]{16}$/);

  assert.notStrictEqual(binding.traceRootFind(alone.ownTraceId), null, 'the worker shares its own root');
  await worker.terminate();
  assert.strictEqual(binding.traceRootFind(alone.ownTraceId), null, 'a thread\'s roots leave with it');
});

test('the trace-root table refuses ids that are not hex, and stays bounded', () => {
  const binding = require('../js/binding');
  assert.throws(() => binding.traceRootPublish('not hex', '00f067aa0ba902b7', []), RangeError);
  assert.throws(() => binding.traceRootPublish('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7', ['odd']), RangeError);
  assert.strictEqual(binding.traceRootFind('4bf92f3577b34da6a3ce929d0e0e4736'), null, 'nothing was published');
  const before = binding.traceRootStats();
  for (let i = 0; i < 4100; i++) binding.traceRootPublish(i.toString(16).padStart(32, '0'), '00f067aa0ba902b7', []);
  const after = binding.traceRootStats();
  assert.strictEqual(after.entries, 4096);
  // Full at 4096: the oldest gave way, those left from earlier tests first.
  assert.strictEqual(after.evicted, before.evicted + before.entries + 4100 - 4096, JSON.stringify({ before, after }));
  for (let i = 0; i < 4100; i++) binding.traceRootWithdraw(i.toString(16).padStart(32, '0'), '00f067aa0ba902b7');
});
