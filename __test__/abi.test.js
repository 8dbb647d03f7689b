'use strict';
// Every copy of the wire layout agrees with the ABI crate: the layout the
// addon exports (js/abi.js, which the JavaScript writer uses), the bytes in
// memory at those offsets, the reader CLI's decoding of the same record and
// process context, and the header generated for the reader's eBPF program.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { context } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const abi = require('../js/abi');
const native = require('../js/native');
const { ProfilingContextManager, threadInfo, processContextInfo } = require('..');
// The span's own attributes only (the identity attributes published by
// default are tested in local-root.test.js).
const OWN_ATTRIBUTES_ONLY = { localRootAttributes: [], spanName: false, localRootSpanId: false };

const ROOT = path.resolve(__dirname, '..');
const ROUTE = 'http.route';
const TEXT = 'x.text';

function readSelf(address, length) {
  const fd = fs.openSync('/proc/self/mem', 'r');
  try {
    const buffer = Buffer.alloc(length);
    assert.strictEqual(fs.readSync(fd, buffer, 0, length, BigInt(address)), length);
    return buffer;
  } finally {
    fs.closeSync(fd);
  }
}

/** `{u8 key_index; u8 len; u8 value[len]}` entries, strictly: no bytes left over. */
function entries(data) {
  const out = [];
  let at = 0;
  while (at < data.length) {
    assert.ok(at + 2 <= data.length, `entry header at ${at} truncated`);
    const len = data[at + 1];
    assert.ok(at + 2 + len <= data.length, `entry at ${at} truncated`);
    out.push({ keyIndex: data[at], value: data.subarray(at + 2, at + 2 + len).toString('utf8') });
    at += 2 + len;
  }
  return out;
}

test('js/abi.js is the frozen layout of the contract', () => {
  const shape = (value) =>
    typeof value === 'object' ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, shape(v)])) : typeof value;
  assert.deepStrictEqual(shape(abi), {
    record: {
      headerSize: 'number',
      size: 'number',
      attrsCapacity: 'number',
      offsets: {
        traceId: 'number', spanId: 'number', valid: 'number',
        traceFlags: 'number', attrsDataSize: 'number', attrsData: 'number',
      },
      valid: 'number',
      tlsSymbol: 'string',
    },
    attrs: { maxValueBytes: 'number', spanNameKey: 'string', localRootSpanIdKey: 'string', routeKey: 'string' },
    processContext: {
      signature: 'string', version: 'number', headerSize: 'number', maxPayloadBytes: 'number',
      maxKeys: 'number', mappingName: 'string', schemaVersionKey: 'string', keyMapKey: 'string',
      defaultSchemaVersion: 'string',
    },
    nodeSchema: {
      tlsSymbol: 'string', schemaVersion: 'string', size: 'number',
      offsets: { cpedSlot: 'number', alsHandle: 'number', alsIdentityHash: 'number', undefinedAddr: 'number' },
      defaultLayout: { jsObjectRecordOffset: 'number', taggedSize: 'number', jsMapTableOffset: 'number', orderedHashMapHeaderSize: 'number' },
      layoutKeys: { 0: 'string', 1: 'string', 2: 'string', 3: 'string' },
      tablePrefixWords: 'number', entryWords: 'number', notFound: 'number', maxChainHops: 'number',
      maxBuckets: 'number', heapObjectTag: 'number', smiShift: 'number',
    },
  });
  assert.ok(Object.isFrozen(abi) && Object.isFrozen(abi.record.offsets) && Object.isFrozen(abi.processContext));
  assert.ok(Object.isFrozen(abi.nodeSchema.offsets) && Object.isFrozen(abi.nodeSchema.layoutKeys));
  assert.strictEqual(threadInfo().recordSize, abi.record.size);
  assert.strictEqual(abi.record.headerSize + abi.record.attrsCapacity, abi.record.size);
});

test('the reader decodes, at the exported offsets, what the package wrote', (t) => {
  const reader = native.readerPath();
  if (reader === null) return t.skip('the reader CLI is not built');
  // The OTEP 4947 record's ABI: record mode, whatever the default.
  const manager = new ProfilingContextManager({ attributes: [ROUTE, TEXT], mode: 'record', ...OWN_ATTRIBUTES_ONLY });
  context.setGlobalContextManager(manager.enable());
  t.after(() => {
    manager.disable();
    context.disable();
  });
  const tracer = new BasicTracerProvider().getTracer('abi-test');
  const longest = 'v'.repeat(abi.attrs.maxValueBytes);
  const attributes = { [ROUTE]: '/users/:id', [TEXT]: longest };
  tracer.startActiveSpan('abi', { attributes }, (span) => {
    const ids = span.spanContext();
    // What otel_thread_ctx_v1 points at now: record mode points it at the
    // span's own record, sized to what it carries.
    const { tlsValue: recordAddress } = threadInfo();
    const head = readSelf(recordAddress, abi.record.headerSize);
    const at = abi.record.offsets.attrsDataSize;
    const bytes = readSelf(recordAddress, abi.record.headerSize + (os.endianness() === 'LE' ? head.readUInt16LE(at) : head.readUInt16BE(at)));
    const info = processContextInfo();
    const header = readSelf(info.mappingAddress, abi.processContext.headerSize);
    // The reader stops this thread while it is blocked here, in the span.
    const r = spawnSync(reader, ['inspect', '--pid', String(process.pid), '--json'], { encoding: 'utf8' });
    span.end();
    assert.strictEqual(r.status, 0, r.stderr);
    const report = JSON.parse(r.stdout);

    // The record, decoded with the exported offsets.
    const { offsets } = abi.record;
    const hex = (at, length) => bytes.subarray(at, at + length).toString('hex');
    assert.strictEqual(hex(offsets.traceId, 16), ids.traceId);
    assert.strictEqual(hex(offsets.spanId, 8), ids.spanId);
    assert.strictEqual(bytes[offsets.valid], abi.record.valid);
    assert.strictEqual(bytes[offsets.traceFlags], ids.traceFlags);
    const attrsSize = os.endianness() === 'LE' // host endian
      ? bytes.readUInt16LE(offsets.attrsDataSize)
      : bytes.readUInt16BE(offsets.attrsDataSize);
    const published = entries(bytes.subarray(offsets.attrsData, offsets.attrsData + attrsSize));
    assert.strictEqual(published.length, 2);
    assert.deepStrictEqual(published.map((e) => e.value).sort(), Object.values(attributes).sort());

    // The same record as the reader decodes it.
    const thread = report.threads.find((th) => th.tid === threadInfo().tid);
    assert.ok(thread?.record, `the reader found no record for this thread: ${JSON.stringify(thread)}`);
    assert.strictEqual(thread.record.address, `0x${BigInt(recordAddress).toString(16)}`);
    assert.strictEqual(thread.record.valid, bytes[offsets.valid]);
    assert.strictEqual(thread.record.trace_id, hex(offsets.traceId, 16));
    assert.strictEqual(thread.record.span_id, hex(offsets.spanId, 8));
    assert.strictEqual(thread.record.trace_flags, bytes[offsets.traceFlags]);
    assert.strictEqual(thread.record.attrs_data_size, attrsSize);
    assert.deepStrictEqual(
      thread.record.attributes.map((a) => ({ keyIndex: a.key_index, value: a.value })),
      published,
    );
    for (const a of thread.record.attributes) assert.strictEqual(a.value, attributes[a.key]);

    // The process context: header bytes, and names as the reader reports them.
    const pc = abi.processContext;
    assert.strictEqual(header.subarray(0, 8).toString('latin1'), pc.signature);
    const found = report.process_context;
    assert.strictEqual(found.status, 'ok');
    assert.strictEqual(found.version, pc.version);
    assert.ok(
      [`/memfd:${pc.mappingName}`, `[anon:${pc.mappingName}]`].includes(found.mapping),
      found.mapping,
    );
    assert.strictEqual(found.attributes[pc.schemaVersionKey], pc.defaultSchemaVersion);
    assert.deepStrictEqual(found.attributes[pc.keyMapKey], found.attribute_key_map);
  });
});

/** The newest header crates/profiler/build.rs generated in the build tree, or null. */
function generatedBpfHeader() {
  const target = process.env.CARGO_TARGET_DIR ?? path.join(ROOT, 'target');
  const candidates = [];
  const visit = (dir, depth) => {
    let names;
    try {
      names = fs.readdirSync(dir);
    } catch {
      return;
    }
    for (const name of names) {
      const full = path.join(dir, name);
      if (name.startsWith('otel-thread-ctx-profiler-') && path.basename(dir) === 'build') {
        const file = path.join(full, 'out', 'otel_thread_ctx_abi.h');
        if (fs.existsSync(file)) candidates.push({ file, mtime: fs.statSync(file).mtimeMs });
      } else if (depth > 0 && !name.startsWith('.')) {
        visit(full, depth - 1);
      }
    }
  };
  // target/{debug,release}/build or target/<triple>/{debug,release}/build
  visit(target, 3);
  candidates.sort((a, b) => b.mtime - a.mtime);
  return candidates[0]?.file ?? null;
}

test("the eBPF program's generated header has the exported layout", (t) => {
  const source = fs.readFileSync(path.join(ROOT, 'crates/profiler/bpf/profile.bpf.c'), 'utf8');
  assert.match(source, /#include "otel_thread_ctx_abi\.h"/);
  const file = generatedBpfHeader();
  if (file === null) return t.skip('no reader build tree with the generated header');
  const defines = Object.fromEntries(
    [...fs.readFileSync(file, 'utf8').matchAll(/^#define (ABI_\w+) (\d+)$/gm)].map(([, k, v]) => [k, Number(v)]),
  );
  const { record } = abi;
  const recordDefines = Object.fromEntries(Object.entries(defines).filter(([k]) => !k.startsWith('ABI_NODE_')));
  const nodeDefines = Object.fromEntries(Object.entries(defines).filter(([k]) => k.startsWith('ABI_NODE_')));
  // The Node.js schema nodejs_v1_dev as its design publishes it: the 32-byte
  // block {cped_slot, als_handle, als_identity_hash, undefined_addr} and
  // the x86-64 defaults of the V8 walk.
  assert.deepStrictEqual(
    {
      size: nodeDefines.ABI_NODE_SIZE,
      block: [nodeDefines.ABI_NODE_OFFSET_CPED_SLOT, nodeDefines.ABI_NODE_OFFSET_ALS_HANDLE, nodeDefines.ABI_NODE_OFFSET_ALS_IDENTITY_HASH, nodeDefines.ABI_NODE_OFFSET_UNDEFINED_ADDR],
      layout: [nodeDefines.ABI_NODE_DEFAULT_JS_OBJECT_RECORD_OFFSET, nodeDefines.ABI_NODE_DEFAULT_TAGGED_SIZE, nodeDefines.ABI_NODE_DEFAULT_JS_MAP_TABLE_OFFSET, nodeDefines.ABI_NODE_DEFAULT_ORDERED_HASH_MAP_HEADER_SIZE],
      entry: [nodeDefines.ABI_NODE_TABLE_PREFIX_WORDS, nodeDefines.ABI_NODE_ENTRY_WORDS],
    },
    { size: 32, block: [0, 8, 16, 24], layout: [0x20, 8, 0x18, 0x10], entry: [3, 3] },
  );
  assert.deepStrictEqual(recordDefines, {
    ABI_RECORD_SIZE: record.size,
    ABI_RECORD_HEADER_SIZE: record.headerSize,
    ABI_ATTRS_CAPACITY: record.attrsCapacity,
    ABI_OFFSET_TRACE_ID: record.offsets.traceId,
    ABI_OFFSET_SPAN_ID: record.offsets.spanId,
    ABI_OFFSET_VALID: record.offsets.valid,
    ABI_OFFSET_TRACE_FLAGS: record.offsets.traceFlags,
    ABI_OFFSET_ATTRS_DATA_SIZE: record.offsets.attrsDataSize,
    ABI_OFFSET_ATTRS_DATA: record.offsets.attrsData,
    ABI_VALID: record.valid,
  });
});
