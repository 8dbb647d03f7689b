'use strict';
// Span attributes in the record: configured keys, indexes from the process
// context's key map, UTF-8 truncation, the 640-byte bound, and the rule for
// attributes set after a span was attached.
const test = require('node:test');
const assert = require('node:assert');
const { context } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager } = require('..');
const { readFullRecord, ownRecordAddress, NO_RECORD } = require('./helpers');
const otelCtx = require('./fixtures/otel-ctx-reader');

const ROUTE = 'http.route';
const METHOD = 'http.request.method';
const LONG_KEYS = ['x.long.a', 'x.long.b', 'x.long.c', 'x.long.d'];
// The span's own attributes only: the span name, local root id and endpoint
// attributes published by default are tested in local-root.test.js.
const manager = new ProfilingContextManager({
  attributes: [ROUTE, METHOD, 'x.text', ...LONG_KEYS],
  localRootAttributes: [],
  spanName: false,
  localRootSpanId: false,
});
context.setGlobalContextManager(manager.enable());
const tracer = new BasicTracerProvider().getTracer('attributes-test');

/** The key map as an outside reader decodes it from the OTEL_CTX mapping. */
function keyMap() {
  const [mapping] = otelCtx.findMappings('self');
  assert.ok(mapping, 'no OTEL_CTX mapping');
  const reader = new otelCtx.MemoryReader('self');
  try {
    const { bytes } = reader.readConsistent(mapping.start);
    const keys = otelCtx.decodePayload(bytes).attributes['threadlocal.attribute_key_map'];
    assert.ok(Array.isArray(keys), 'threadlocal.attribute_key_map missing');
    return keys;
  } finally {
    reader.close();
  }
}

/** The calling thread's record, attributes decoded through the key map. */
function published() {
  const address = ownRecordAddress();
  const record = address === null ? { ...NO_RECORD, attrs: [] } : readFullRecord('self', address);
  const keys = keyMap();
  const attributes = {};
  for (const { keyIndex, value } of record.attrs) {
    assert.ok(keyIndex < keys.length, `key index ${keyIndex} not in the key map`);
    attributes[keys[keyIndex]] = value.toString('utf8');
  }
  return { ...record, attributes };
}

test('configured attributes are published, decoded through the key map', () => {
  tracer.startActiveSpan('GET', { attributes: { [METHOD]: 'GET', 'not.configured': 'x' } }, (span) => {
    const r = published();
    assert.strictEqual(r.valid, 1);
    assert.strictEqual(r.spanId, span.spanContext().spanId);
    assert.deepStrictEqual(r.attributes, { [METHOD]: 'GET' });
    span.end();
  });
});

test('a route set after span start is published when the span is resumed', async () => {
  await tracer.startActiveSpan('request', { attributes: { [METHOD]: 'POST' } }, async (span) => {
    assert.deepStrictEqual(published().attributes, { [METHOD]: 'POST' });
    span.setAttribute(ROUTE, '/users/:id'); // as routing does, after the span started
    await null; // resumed: the new value is published
    const r = published();
    assert.strictEqual(r.spanId, span.spanContext().spanId);
    assert.deepStrictEqual(r.attributes, { [ROUTE]: '/users/:id', [METHOD]: 'POST' });

    span.setAttribute(ROUTE, '/users/:id/posts');
    await new Promise((resolve) => setTimeout(resolve, 1)); // resumed from a timer
    assert.deepStrictEqual(published().attributes, { [ROUTE]: '/users/:id/posts', [METHOD]: 'POST' });

    // Entering a context that holds the span publishes the change too.
    span.setAttribute(METHOD, 'PUT');
    context.with(context.active(), () => assert.strictEqual(published().attributes[METHOD], 'PUT'));
    span.end();
  });
});

test("a span class whose setAttributes() does not go through setAttribute(): the configured keys it sets are published", async () => {
  // Not the SDK's class: its setAttributes() stores the values itself.
  class OwnSpan {
    constructor() {
      this.attributes = { [METHOD]: 'GET' };
      this.ended = false;
    }
    spanContext() {
      return { traceId: 'c'.repeat(32), spanId: 'd'.repeat(16), traceFlags: 1 };
    }
    setAttribute(key, value) {
      this.attributes[key] = value;
      return this;
    }
    setAttributes(attributes) {
      Object.assign(this.attributes, attributes);
      return this;
    }
    end() {
      this.ended = true;
    }
  }
  const span = new OwnSpan();
  const { trace } = require('@opentelemetry/api');
  await context.with(trace.setSpan(context.active(), span), async () => {
    assert.deepStrictEqual(published().attributes, { [METHOD]: 'GET' });
    span.setAttributes({ 'not.configured': 1 });
    await null;
    assert.deepStrictEqual(published().attributes, { [METHOD]: 'GET' }, 'keys the record does not carry change nothing');
    span.setAttributes({ [ROUTE]: '/own/:id', 'not.configured': 2 });
    await null; // resumed: the new value is published
    const r = published();
    assert.strictEqual(r.spanId, 'd'.repeat(16));
    assert.deepStrictEqual(r.attributes, { [ROUTE]: '/own/:id', [METHOD]: 'GET' });
    span.setAttributes({ [METHOD]: 'PUT' });
    await new Promise((resolve) => setTimeout(resolve, 1));
    assert.deepStrictEqual(published().attributes, { [ROUTE]: '/own/:id', [METHOD]: 'PUT' });
    span.end();
  });
});

test('child spans publish their own attributes and the parent\'s come back', async () => {
  await tracer.startActiveSpan('parent', { attributes: { [ROUTE]: '/parent' } }, async (parent) => {
    await tracer.startActiveSpan('child', { attributes: { [ROUTE]: '/child' } }, async (child) => {
      await null;
      assert.deepStrictEqual(published().attributes, { [ROUTE]: '/child' });
      child.end();
    });
    await null;
    assert.deepStrictEqual(published().attributes, { [ROUTE]: '/parent' });
    parent.end();
  });
});

test('numbers and booleans are published as text; arrays are not', () => {
  tracer.startActiveSpan('typed', { attributes: { [ROUTE]: 42, [METHOD]: true, 'x.text': ['a', 'b'] } }, (span) => {
    assert.deepStrictEqual(published().attributes, { [ROUTE]: '42', [METHOD]: 'true' });
    span.end();
  });
});

const truncationCases = [
  ['2-byte characters', 'é'.repeat(150), 'é'.repeat(127)], // 300 bytes -> 254, not 255
  ['3-byte characters', '€'.repeat(100), '€'.repeat(85)], // 300 bytes -> 255 exactly
  ['4-byte characters', '😀'.repeat(70), '😀'.repeat(63)], // 280 bytes -> 252
  ['ASCII', 'a'.repeat(400), 'a'.repeat(255)],
  ['exactly 255 bytes', 'b'.repeat(255), 'b'.repeat(255)],
  ['ASCII, then a 2-byte character at the cut', 'c'.repeat(254) + 'é', 'c'.repeat(254)], // 256 bytes -> 254
  ['ASCII, then a 2-byte character that fits', 'd'.repeat(253) + 'é', 'd'.repeat(253) + 'é'], // 255 bytes
];
for (const [name, value, expected] of truncationCases) {
  test(`values over 255 bytes are cut on a UTF-8 boundary: ${name}`, () => {
    tracer.startActiveSpan('long', { attributes: { 'x.text': value } }, (span) => {
      const r = published();
      assert.strictEqual(r.attributes['x.text'], expected);
      assert.ok(Buffer.byteLength(r.attributes['x.text']) <= 255);
      span.end();
    });
  });
}

test('text with a character outside ASCII anywhere is published as its UTF-8 bytes', () => {
  for (const value of ['/orders/ünïcode', 'prefix-€', 'é-first', 'emoji 😀 inside']) {
    tracer.startActiveSpan('text', { attributes: { 'x.text': value } }, (span) => {
      assert.strictEqual(published().attributes['x.text'], value);
      span.end();
    });
  }
});

test('the record never exceeds 640 bytes', () => {
  const attributes = Object.fromEntries(LONG_KEYS.map((k) => [k, 'z'.repeat(300)]));
  attributes['x.text'] = 'short';
  tracer.startActiveSpan('big', { attributes }, (span) => {
    const r = published();
    assert.ok(28 + r.attrsDataSize <= 640, `record is ${28 + r.attrsDataSize} bytes`);
    // Whole entries only: every published value is complete (255 bytes) or
    // the short one; attributes that did not fit are left out entirely.
    for (const [key, value] of Object.entries(r.attributes)) {
      assert.strictEqual(value, key === 'x.text' ? 'short' : 'z'.repeat(255));
    }
    assert.strictEqual(r.attributes['x.text'], 'short', 'a short attribute still fits after the long ones');
    assert.strictEqual(Object.keys(r.attributes).length, 3); // two 257-byte entries + the short one
    span.end();
  });
});

test('invalid options throw and nothing is published', () => {
  const before = published();
  assert.throws(() => new ProfilingContextManager({ attributes: 'http.route' }), TypeError);
  assert.throws(() => new ProfilingContextManager({ attributes: [1] }), TypeError);
  assert.throws(() => new ProfilingContextManager(null), TypeError);
  assert.throws(() => new ProfilingContextManager({ attributes: [''] }), RangeError);
  assert.throws(() => new ProfilingContextManager({ attributes: ['a', 'a'] }), RangeError);
  assert.throws(() => new ProfilingContextManager({ attributes: Array.from({ length: 257 }, (_, i) => `k${i}`) }), RangeError);
  const after = published();
  assert.deepStrictEqual(after, before);
});

test('a value left out for want of room leaves no byte behind past what was encoded', () => {
  const { AttributeSchema } = require('../js/span-attributes');
  const schema = new AttributeSchema(['x.long.a', 'x.long.b', 'x.long.c']);
  // 257 + 257 bytes, then 90 characters (room for them as ASCII) whose
  // UTF-8 (140 bytes) does not fit in what is left of 612.
  const late = 'a'.repeat(40) + 'é'.repeat(50);
  const span = { attributes: { 'x.long.a': 'z'.repeat(300), 'x.long.b': 'y'.repeat(300), 'x.long.c': late } };
  const out = new Uint8Array(700);
  const size = schema.encodeInto(out, 20, 612, span, null, null);
  assert.strictEqual(size, 514);
  assert.ok(out.subarray(0, 20).every((b) => b === 0), 'bytes before the entries written');
  assert.ok(out.subarray(20 + size).every((b) => b === 0), 'bytes written past the encoded entries');
  // With room, the same value is encoded whole as UTF-8.
  const roomy = new Uint8Array(700);
  const whole = schema.encodeInto(roomy, 0, 700, span, null, null);
  assert.strictEqual(whole, 514 + 2 + Buffer.byteLength(late));
  assert.strictEqual(Buffer.from(roomy.subarray(516, whole)).toString('utf8'), late);
});
