'use strict';
// The calling thread's own OTEP 4947 record (the direct API writes it) and
// its `otel_thread_ctx_v1` pointer (record mode points it at span records:
// ./publish/record.js), written from JavaScript through typed-array views
// over native memory: no napi call, no allocation, no syscall per write.
// Also the decoding every writer shares: a span context's hex ids into the
// record's words, its flags, the record's tail word. Layout: abi/ (through
// ./abi); protocol: src/record.rs.

const { diag } = require('@opentelemetry/api');
const abi = require('./abi');
const binding = require('./binding');

const { offsets } = abi.record;
// The word stores below assume the OTEP 4947 header: trace_id and span_id
// in words 0..5, then valid, trace_flags and attrs_data_size in one word.
if (
  offsets.traceId !== 0 || offsets.spanId !== 16 || offsets.valid !== 24 ||
  offsets.traceFlags !== offsets.valid + 1 || offsets.attrsDataSize !== offsets.valid + 2 ||
  offsets.attrsData !== offsets.valid + 4 || abi.record.valid !== 1
) {
  throw new Error('otel-thread-ctx: the addon\'s record layout is not the one this writer stores');
}
const OFFSET_VALID = offsets.valid;
const OFFSET_ATTRS_DATA = offsets.attrsData;
const TAIL_INDEX_U32 = OFFSET_VALID / 4; // valid, trace_flags, attrs_data_size
const RECORD_SIZE = abi.record.size;

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const pointerScratch = new Float64Array(1);
const pointerHalves = new Uint32Array(pointerScratch.buffer);

/**
 * The 8 bytes of pointer `address` (a number: user-space addresses are
 * below 2^47, so exact) as the double with the same bits, which a
 * Float64Array stores in one aligned 8-byte store. Such doubles are
 * subnormal, never NaN, so JavaScript keeps their bits exactly.
 */
function pointerBits(address) {
  const low = address % 0x100000000;
  const high = (address - low) / 0x100000000;
  pointerHalves[LITTLE_ENDIAN ? 0 : 1] = low;
  pointerHalves[LITTLE_ENDIAN ? 1 : 0] = high;
  return pointerScratch[0];
}

/**
 * Why the record and its pointer cannot be viewed directly, or null. Where
 * the runtime forbids external ArrayBuffers (V8 sandbox builds), the
 * writers build the record in a buffer of their own and copy it through a
 * napi call: slower, same protocol.
 */
let noViewReason = null;
let buffer;
/** The thread's `otel_thread_ctx_v1` as one double (pointerBits), or null. */
let pointer = null;
/** pointerBits() of the thread's own record. */
let ownRecordBits = 0;
try {
  buffer = binding.recordBuffer();
  pointer = new Float64Array(binding.recordPointerBuffer());
  ownRecordBits = pointerBits(binding.bufferAddress(buffer));
} catch (error) {
  noViewReason = error;
  pointer = null;
  buffer = new ArrayBuffer(RECORD_SIZE);
}
const bytes = new Uint8Array(buffer);
const words = new Uint32Array(buffer, 0, TAIL_INDEX_U32 + 1);
const ids = new DataView(buffer, 0, OFFSET_VALID);

/**
 * Bytes 24..27 as one host-endian word: valid = 1, trace_flags, and
 * attrs_data_size (itself host-endian). Storing it last in one instruction
 * makes the record valid together with its flags and size.
 */
function tailWord(traceFlags, attrsSize) {
  return LITTLE_ENDIAN
    ? (1 | (traceFlags << 8) | (attrsSize << 16)) >>> 0
    : ((1 << 24) | (traceFlags << 16) | attrsSize) >>> 0;
}

/**
 * A span's trace flags as published, or -1 when they are invalid. One rule
 * for the manager and the direct API: `undefined` means 0, anything but an
 * integer in 0..255 makes the span context invalid (the direct API throws
 * a RangeError, the manager publishes no span).
 */
function validFlags(traceFlags) {
  if (traceFlags === undefined) return 0;
  return typeof traceFlags === 'number' && (traceFlags & 0xff) === traceFlags ? traceFlags : -1;
}

/**
 * Each hex digit's value (either case, as the API accepts) by its
 * character code, -1 for every other character below 128. 128 bytes: two
 * cache lines that stay cached between a server's spans, where a table by
 * pairs of digits (32 KiB) had most lookups of a new span id miss.
 */
const HEX_DIGIT = new Int8Array(128).fill(-1);
for (const digit of '0123456789abcdefABCDEF') HEX_DIGIT[digit.charCodeAt(0)] = parseInt(digit, 16);

/** The byte the hex digits `hex[i]`, `hex[i + 1]` encode, or a negative number. */
function byteAt(hex, i) {
  const high = hex.charCodeAt(i);
  const low = hex.charCodeAt(i + 1);
  // A digit's -1 makes the whole byte negative.
  return (high | low) < 128 ? (HEX_DIGIT[high] << 4) | HEX_DIGIT[low] : -1;
}

/** Set negative by wordAt() on characters that are not hex digits. */
let badDigits = 0;

/**
 * The 4 bytes that the 8 hex digits of `hex` from `at` encode, as the
 * host-endian word storing them in order. An int32 (the Uint32Array store
 * keeps its bits), so the words stay small integers.
 */
function wordAt(hex, at) {
  const b0 = byteAt(hex, at);
  const b1 = byteAt(hex, at + 2);
  const b2 = byteAt(hex, at + 4);
  const b3 = byteAt(hex, at + 6);
  badDigits |= b0 | b1 | b2 | b3;
  return LITTLE_ENDIAN ? b0 | (b1 << 8) | (b2 << 16) | (b3 << 24) : (b0 << 24) | (b1 << 16) | (b2 << 8) | b3;
}

/**
 * The trace id decoded last and its words. A trace's spans share their
 * trace id, the SDK even the same string, and a service starts a request's
 * spans close together, so most spans decode only their span id.
 */
let lastTraceId = '';
let lastW0 = 0;
let lastW1 = 0;
let lastW2 = 0;
let lastW3 = 0;

/**
 * The words of the ids decodeIds() decoded last: trace id in 0..3, span id
 * in 4..5, host-endian as the record stores them.
 */
const decodedIds = new Int32Array(6);

/**
 * Decodes a span context's ids (32 + 16 hex digits) into `decodedIds`
 * without building an entry: what frame mode's per-span records need.
 * False for ids that are malformed or all zero (W3C invalid).
 */
function decodeIds(traceId, spanId) {
  if (typeof traceId !== 'string' || traceId.length !== 32 || typeof spanId !== 'string' || spanId.length !== 16) {
    return false;
  }
  badDigits = 0;
  if (traceId !== lastTraceId) {
    const w0 = wordAt(traceId, 0);
    const w1 = wordAt(traceId, 8);
    const w2 = wordAt(traceId, 16);
    const w3 = wordAt(traceId, 24);
    if (badDigits < 0 || (w0 | w1 | w2 | w3) === 0) return false;
    lastTraceId = traceId;
    lastW0 = w0;
    lastW1 = w1;
    lastW2 = w2;
    lastW3 = w3;
  }
  const w4 = wordAt(spanId, 0);
  const w5 = wordAt(spanId, 8);
  if (badDigits < 0 || (w4 | w5) === 0) return false;
  decodedIds[0] = lastW0;
  decodedIds[1] = lastW1;
  decodedIds[2] = lastW2;
  decodedIds[3] = lastW3;
  decodedIds[4] = w4;
  decodedIds[5] = w5;
  return true;
}

/**
 * Publishes ids given as unsigned 64-bit bigints (already validated) in the
 * thread's own record, as the direct API does (big-endian stores put the
 * W3C bytes in hex order), and points the thread's pointer back at it.
 */
function publishIds(traceIdHigh, traceIdLow, spanId, traceFlags) {
  bytes[OFFSET_VALID] = 0; // ORDER: valid = 0 before the fields
  ids.setBigUint64(0, traceIdHigh);
  ids.setBigUint64(8, traceIdLow);
  ids.setBigUint64(16, spanId);
  words[TAIL_INDEX_U32] = tailWord(traceFlags, 0); // ORDER: last store to the record
  pointer[0] = ownRecordBits;
}

/** Marks the thread's own record invalid (the ids stay; readers ignore them) and points at it. */
function clear() {
  bytes[OFFSET_VALID] = 0;
  pointer[0] = ownRecordBits;
}

/**
 * Makes the thread's pointer point at a record, given as pointerBits():
 * one aligned 8-byte store, seen whole or not at all by a sampler that
 * interrupts the thread. The record must be complete (valid or not).
 */
function pointAt(recordBits) {
  pointer[0] = recordBits;
}

// The writers where the record cannot be viewed: records are built in
// plain buffers and copied into the thread's own record by the native side
// with the protocol (the pointer stays on it).

let warned = false;
function warnOnce() {
  warned = true;
  try {
    diag.warn(
      `otel-thread-ctx: the thread's record cannot be viewed from JavaScript (${noViewReason?.message}); ` +
        'it is written through napi calls instead, which costs more per context switch',
    );
  } catch {
    // A throwing diag logger: nothing else to report to.
  }
}

/** Copies `length` bytes of a record image from `imageBytes` at `offset` into the thread's record. */
function copyThroughNapi(imageBytes, offset, length) {
  if (!warned) warnOnce();
  binding.writeRecord(imageBytes.subarray(offset, offset + length));
}

function publishIdsThroughNapi(traceIdHigh, traceIdLow, spanId, traceFlags) {
  if (!warned) warnOnce();
  ids.setBigUint64(0, traceIdHigh);
  ids.setBigUint64(8, traceIdLow);
  ids.setBigUint64(16, spanId);
  words[TAIL_INDEX_U32] = tailWord(traceFlags, 0);
  binding.writeRecord(bytes.subarray(0, OFFSET_ATTRS_DATA));
}

function clearThroughNapi() {
  if (!warned) warnOnce();
  binding.clearRecord();
}

const shared = { validFlags, tailWord, decodeIds, decodedIds, pointerBits };
module.exports =
  noViewReason === null
    ? { ...shared, pointer, publishIds, clear, pointAt, writer: 'view' }
    : { ...shared, pointer: null, publishIds: publishIdsThroughNapi, clear: clearThroughNapi, copyThroughNapi, writer: 'napi' };
