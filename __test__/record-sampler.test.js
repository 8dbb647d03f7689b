'use strict';
// The bpftrace programs of the accuracy harness and the demo read the record
// at the ABI's offsets and nowhere else, and their output parses back into
// the record's fields. No bpftrace needed: the programs are only generated.
const test = require('node:test');
const assert = require('node:assert');
const abi = require('../js/abi');
const { samplerProgram, stackProgram, collector, parseStacks } = require('../tools/record-sampler');
const { decodeAttrs } = require('../tools/record');

const { offsets } = abi.record;
const TLS_OFFSET = -64n;

/** Every offset the program reads from the record at `$p`. */
function recordOffsets(program) {
  const reads = [...program.matchAll(/uptr\(\$p\b([^)]*)\)/g)].map((m) => m[1]);
  return new Set(
    reads.map((rest) => {
      const m = /^ \+ (\d+)$/.exec(rest);
      assert.ok(m, `a record read not of the form $p + <offset>: uptr($p${rest})`);
      return Number(m[1]);
    }),
  );
}

const sorted = (set) => [...set].sort((a, b) => a - b);

test('the sampler program reads valid, span id and trace id at the ABI offsets, nothing else', () => {
  for (const offCpu of [false, true]) {
    const program = samplerProgram({ pid: 1234, offset: TLS_OFFSET, offCpu });
    assert.deepStrictEqual(sorted(recordOffsets(program)), sorted(new Set([offsets.traceId, offsets.traceId + 8, offsets.spanId, offsets.valid])));
    assert.match(program, /curtask->thread\.fsbase - 64\)/);
  }
});

test('the stack program reads the header and the start of attrs_data at the ABI offsets, nothing else', () => {
  const program = stackProgram({ pid: 1234, offset: TLS_OFFSET, hz: 99, maxSeconds: 10 });
  const attrs = [0, 1, 2, 3, 4].map((i) => offsets.attrsData + 8 * i);
  assert.deepStrictEqual(
    sorted(recordOffsets(program)),
    sorted(new Set([offsets.traceId, offsets.traceId + 8, offsets.spanId, offsets.valid, offsets.attrsDataSize, ...attrs])),
  );
  assert.match(program, new RegExp(`\\$valid == ${abi.record.valid}\\)`));
});

// A record as the writer lays it out: trace id, span id, valid, flags, attrs.
const TRACE_ID = '0af7651916cd43dd8448eb211c80319c';
const SPAN_ID = 'b7ad6b7169203331';
const ROUTE = '/api/products/:id/reviews';
const CONTENT_TYPE = 'application/json; charset=utf-8';
function recordBytes() {
  const buf = Buffer.alloc(abi.record.size);
  Buffer.from(TRACE_ID, 'hex').copy(buf, offsets.traceId);
  Buffer.from(SPAN_ID, 'hex').copy(buf, offsets.spanId);
  buf[offsets.valid] = abi.record.valid;
  buf[offsets.traceFlags] = 1;
  const route = Buffer.from(ROUTE);
  const entries = Buffer.concat([Buffer.from([3, route.length]), route, Buffer.from([4, CONTENT_TYPE.length]), Buffer.from(CONTENT_TYPE)]);
  buf.writeUInt16LE(entries.length, offsets.attrsDataSize);
  entries.copy(buf, offsets.attrsData);
  return buf;
}
// What bpftrace prints for a u64 it reads from the record (%llx, or decimal in map keys).
const hexWord = (buf, offset) => buf.readBigUInt64LE(offset).toString(16);
const decWord = (buf, offset) => buf.readBigUInt64LE(offset).toString(10);

test('sampler lines parse back into the record fields', () => {
  const buf = recordBytes();
  const col = collector();
  const ids = `${hexWord(buf, offsets.spanId)} ${hexWord(buf, offsets.traceId)} ${hexWord(buf, offsets.traceId + 8)}`;
  col.onLine(`S 101 5000 1 ${ids} 1`);
  col.onLine('S 102 5001 0 0 0 0 0');
  col.onLine(`O 101 6000 1 ${ids} 1 232 1`);
  col.onLine('I 101 9000');
  col.onLine('W 101 7000');
  assert.deepStrictEqual(col.samples, [
    { tid: 101, t: 5000n, valid: 1, spanId: SPAN_ID, traceId: TRACE_ID, pointer: true },
    { tid: 102, t: 5001n, valid: 0, spanId: '0000000000000000', traceId: '0'.repeat(32), pointer: false },
  ]);
  assert.deepStrictEqual(col.offcpu, [{ tid: 101, out: 6000n, in: 9000n, valid: 1, spanId: SPAN_ID, state: 1, syscall: 232, pointer: true, epoll: true }]);
  assert.deepStrictEqual(col.clock, { tid: 101, t: 7000n });
});

test('stack map entries parse back into the record fields, frames and the route in attrs_data', () => {
  const buf = recordBytes();
  const words = [0, 1, 2, 3, 4].map((i) => decWord(buf, offsets.attrsData + 8 * i));
  const keys = `101, ${decWord(buf, offsets.traceId)}, ${decWord(buf, offsets.traceId + 8)}, ${decWord(buf, offsets.spanId)}, ${buf.readUInt16LE(offsets.attrsDataSize)}, ${words.join(', ')}`;
  const text = [
    `@s[${keys}, `,
    '\t7f00aa JS:*handle /app/service.js:40:3+12 (/tmp/perf-1.map)',
    '\t7f00bb 0x7f00bb ([unknown])',
    ']: 17',
    '@s[102, 0, 0, 0, 0, 0, 0, 0, 0, 0, ]: 4',
  ].join('\n');
  const [busy, idle] = parseStacks(text);
  assert.strictEqual(busy.tid, 101);
  assert.strictEqual(busy.traceId, TRACE_ID);
  assert.strictEqual(busy.spanId, SPAN_ID);
  assert.strictEqual(busy.count, 17);
  assert.deepStrictEqual(busy.frames, ['handle service.js:40', '[[unknown]]']);
  // The stack program keeps 40 bytes of attrs_data: the route entry whole, the next one cut off.
  assert.deepStrictEqual(
    decodeAttrs(busy.attrs, { prefix: true }).map((a) => [a.keyIndex, a.value.toString()]),
    [[3, ROUTE]],
  );
  assert.throws(() => decodeAttrs(busy.attrs), /overruns/);
  assert.deepStrictEqual({ ...idle, attrs: idle.attrs.length }, { tid: 102, traceId: null, spanId: null, attrs: 0, frames: [], count: 4 });
});
