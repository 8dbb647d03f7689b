'use strict';
// ProfileIdSpanProcessor: `pyroscope.profile.id` (the span's own id) on the
// spans Grafana should link to their profiles: local roots by default,
// every span with `spans: 'all'`; never on spans of unsampled traces, and
// nothing thrown into the SDK.
const test = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { BasicTracerProvider, SimpleSpanProcessor, InMemorySpanExporter, SamplingDecision } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager, ProfileIdSpanProcessor } = require('..');
const { ROOT } = require('./helpers');

const ATTRIBUTE = 'pyroscope.profile.id';
context.setGlobalContextManager(new ProfilingContextManager().enable());

function setup(options, sampler) {
  const exporter = new InMemorySpanExporter();
  const processor = new ProfileIdSpanProcessor(options);
  const provider = new BasicTracerProvider({ sampler, spanProcessors: [processor, new SimpleSpanProcessor(exporter)] });
  return { processor, tracer: provider.getTracer('profile-id-test'), exported: () => exporter.getFinishedSpans() };
}

/** Runs a request's worth of spans: a server span under a remote parent, a child, a grandchild; and a root of its own. */
function request(tracer) {
  const remote = trace.setSpanContext(ROOT_CONTEXT, { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: 1, isRemote: true });
  tracer.startActiveSpan('GET /orders/:id', {}, remote, (server) => {
    tracer.startActiveSpan('db', (child) => {
      tracer.startActiveSpan('parse', (grandchild) => grandchild.end());
      child.end();
    });
    server.end();
  });
  tracer.startActiveSpan('job', (root) => root.end());
}

const marked = (spans) => Object.fromEntries(spans.map((s) => [s.name, s.attributes[ATTRIBUTE]]));

test('by default the local roots carry their own span id: no parent, or a remote one', () => {
  const { processor, tracer, exported } = setup();
  assert.strictEqual(processor.spans, 'local-roots');
  request(tracer);
  const spans = exported();
  const id = (name) => spans.find((s) => s.name === name).spanContext().spanId;
  assert.deepStrictEqual(marked(spans), { parse: undefined, db: undefined, 'GET /orders/:id': id('GET /orders/:id'), job: id('job') });
  assert.match(id('job'), /^[0-9a-f]{16}$/);
});

test("spans: 'all' marks every span with its own id", () => {
  const { processor, tracer, exported } = setup({ spans: 'all' });
  assert.strictEqual(processor.spans, 'all');
  request(tracer);
  assert.strictEqual(exported().length, 4);
  for (const span of exported()) assert.strictEqual(span.attributes[ATTRIBUTE], span.spanContext().spanId, span.name);
});

test('spans of unsampled traces are left alone', () => {
  // Recorded but not sampled: the SDK makes real spans (processors see
  // them) that are never exported.
  const recordOnly = { shouldSample: () => ({ decision: SamplingDecision.RECORD }), toString: () => 'RecordOnly' };
  const seen = [];
  const processor = new ProfileIdSpanProcessor({ spans: 'all' });
  const provider = new BasicTracerProvider({ sampler: recordOnly, spanProcessors: [processor, { onStart: (s) => seen.push(s), onEnd() {}, forceFlush: async () => {}, shutdown: async () => {} }] });
  request(provider.getTracer('unsampled'));
  assert.strictEqual(seen.length, 4);
  for (const span of seen) assert.strictEqual(span.attributes[ATTRIBUTE], undefined, span.name);
});

test('bad options throw; nothing a span throws reaches the SDK', () => {
  assert.throws(() => new ProfileIdSpanProcessor(null), TypeError);
  assert.throws(() => new ProfileIdSpanProcessor({ spans: true }), TypeError);
  assert.throws(() => new ProfileIdSpanProcessor({ spans: 'roots' }), RangeError);
  const processor = new ProfileIdSpanProcessor();
  const hostile = {
    spanContext() {
      throw new Error('boom');
    },
  };
  assert.doesNotThrow(() => processor.onStart(hostile, ROOT_CONTEXT));
  assert.doesNotThrow(() => processor.onStart({ spanContext: () => ({ spanId: 'x', traceFlags: 1 }), setAttribute() { throw new Error('no'); } }, undefined));
  const r = spawnSync(process.execPath, ['-e', "new (require('.').ProfileIdSpanProcessor)({ span: 'all' })"], { cwd: ROOT, encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stderr);
  assert.match(r.stderr, /ProfileIdSpanProcessor: unknown option "span" is ignored \(did you mean "spans"\?\)/);
});
