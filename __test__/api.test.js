'use strict';
// The direct napi API: what it writes, and what it refuses.
const test = require('node:test');
const assert = require('node:assert');
const { setSpanContext, clearSpanContext, threadInfo } = require('..');
const { readOwnRecord } = require('./helpers');

test('setSpanContext writes the W3C bytes, flags and valid = 1', () => {
  setSpanContext(0x0af7651916cd43ddn, 0x8448eb211c80319cn, 0xb7ad6b7169203331n, 1);
  assert.deepStrictEqual(readOwnRecord(), {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    valid: 1,
    traceFlags: 1,
    attrsDataSize: 0,
  });
  setSpanContext(1n, 2n, 3n);
  const r = readOwnRecord();
  assert.strictEqual(r.traceId, '00000000000000010000000000000002');
  assert.strictEqual(r.spanId, '0000000000000003');
  assert.strictEqual(r.traceFlags, 0, 'traceFlags defaults to 0');
  assert.strictEqual(r.valid, 1);
});

test('clearSpanContext sets valid = 0', () => {
  setSpanContext(1n, 2n, 3n, 1);
  clearSpanContext();
  assert.strictEqual(readOwnRecord().valid, 0);
});

test('threadInfo describes the calling thread and its TLS pointer', () => {
  const info = threadInfo();
  assert.strictEqual(typeof info.tid, 'number');
  assert.ok(info.tid > 0);
  assert.strictEqual(typeof info.recordAddress, 'bigint');
  assert.strictEqual(info.recordAddress % 64n, 0n, 'records are 64-byte aligned');
  assert.strictEqual(info.tlsValue, info.recordAddress, 'otel_thread_ctx_v1 points at the record');
  assert.strictEqual(info.recordSize, 640);
  assert.strictEqual(info.tid, Number(require('node:fs').readlinkSync('/proc/thread-self').split('/').pop()));
});

const U64_MAX = 2n ** 64n - 1n;
const badInputs = [
  ['number trace id high', [1, 2n, 3n], TypeError],
  ['string trace id low', [1n, '2', 3n], TypeError],
  ['missing span id', [1n, 2n], TypeError],
  ['null span id', [1n, 2n, null], TypeError],
  ['object span id', [1n, 2n, {}], TypeError],
  ['negative trace id high', [-1n, 2n, 3n], RangeError],
  ['trace id low >= 2^64', [1n, U64_MAX + 1n, 3n], RangeError],
  ['span id >= 2^64', [1n, 2n, 2n ** 70n], RangeError],
  ['negative span id', [1n, 2n, -3n], RangeError],
  ['all-zero trace id', [0n, 0n, 3n], RangeError],
  ['all-zero span id', [1n, 2n, 0n], RangeError],
  ['traceFlags 256', [1n, 2n, 3n, 256], RangeError],
  ['traceFlags -1', [1n, 2n, 3n, -1], RangeError],
  ['traceFlags 1.5', [1n, 2n, 3n, 1.5], RangeError],
  ['traceFlags NaN', [1n, 2n, 3n, NaN], RangeError],
  ['traceFlags string', [1n, 2n, 3n, '1'], TypeError],
  ['traceFlags bigint', [1n, 2n, 3n, 1n], TypeError],
];

for (const published of [true, false]) {
  for (const [name, args, ErrorClass] of badInputs) {
    test(`setSpanContext rejects ${name} with ${ErrorClass.name} and leaves a ${published ? 'valid' : 'cleared'} record unchanged`, () => {
      setSpanContext(0x1111111111111111n, U64_MAX, 0x2222222222222222n, 1);
      if (!published) clearSpanContext();
      const before = readOwnRecord();
      assert.throws(() => setSpanContext(...args), (err) => {
        assert.ok(err instanceof ErrorClass, `${err.constructor.name}: ${err.message}`);
        assert.match(err.message, /traceId|spanId|traceFlags|trace id|span id/);
        return true;
      });
      assert.deepStrictEqual(readOwnRecord(), before);
    });
  }
}

test('the largest ids are accepted', () => {
  setSpanContext(U64_MAX, U64_MAX, U64_MAX, 255);
  const r = readOwnRecord();
  assert.strictEqual(r.traceId, 'f'.repeat(32));
  assert.strictEqual(r.spanId, 'f'.repeat(16));
  assert.strictEqual(r.traceFlags, 255);
  clearSpanContext();
});
