'use strict';
// The calling thread's OTEP 4947 record, written from JavaScript through a
// typed-array view over the native record: no napi call, no allocation, no
// syscall per write. Layout: abi/ (through ./abi); protocol: src/record.rs.
//
// Entries (the bytes of one span context) are built once per span and
// reused, so a context switch copies seven words.

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

/**
 * Why the record cannot be viewed directly, or null. Where the runtime
 * forbids external ArrayBuffers (V8 sandbox builds), the writers below
 * build the record in a buffer of their own and copy it through a napi
 * call: slower, same protocol.
 */
let noViewReason = null;
let buffer;
try {
  buffer = binding.recordBuffer();
} catch (error) {
  noViewReason = error;
  buffer = new ArrayBuffer(RECORD_SIZE);
}
const bytes = new Uint8Array(buffer);
const words = new Uint32Array(buffer, 0, TAIL_INDEX_U32 + 1);
const ids = new DataView(buffer, 0, OFFSET_VALID);

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

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
 * The entries the record held most recently, by slot (slot 0: NO_SPAN).
 * The writer remembers which entry the record holds as a slot number, not
 * as an object: storing a short-lived object into a long-lived one costs a
 * write barrier, at every context switch. A slot's entry is replaced only
 * when another entry with the same slot is published, so the ring keeps at
 * most RING_SIZE - 1 entries (and their spans) alive beyond their use.
 */
const RING_SIZE = 256;
const ring = [];
let lastSlot = 0;

/** The next entry's slot, round-robin over 1..RING_SIZE - 1. */
function nextSlot() {
  lastSlot = lastSlot === RING_SIZE - 1 ? 1 : lastSlot + 1;
  return lastSlot;
}

/** The bytes one span context publishes, in host-endian words ready to store. */
class RecordEntry {
  constructor(valid, w0, w1, w2, w3, w4, w5, traceFlags, schema = null, attributes = null) {
    /** Where the writer keeps it while the record holds its bytes (0 for NO_SPAN). */
    this.slot = valid === 0 ? 0 : nextSlot();
    this.valid = valid;
    this.w0 = w0;
    this.w1 = w1;
    this.w2 = w2;
    this.w3 = w3;
    this.w4 = w4;
    this.w5 = w5;
    this.traceFlags = traceFlags;
    /** The AttributeSchema `attributes` was encoded for (null: none). */
    this.schema = schema;
    /** EncodedAttributes (js/span-attributes.js) or null. */
    this.attributes = attributes;
    this.attrsSize = attributes === null ? 0 : attributes.bytes.length;
    /** Bytes 24..27 as published; 0 (valid = 0) for NO_SPAN. */
    this.tail = valid === 0 ? 0 : tailWord(traceFlags, this.attrsSize);
    /** The span these bytes are of (set by the manager; null for NO_SPAN). */
    this.span = null;
  }
}

/** Publishes nothing: the record reads invalid. */
const NO_SPAN = Object.freeze(new RecordEntry(0, 0, 0, 0, 0, 0, 0, 0));
for (let i = 0; i < RING_SIZE; i++) ring.push(NO_SPAN);

/** Each hex digit's value by character code (either case, as the API accepts); -1 for the rest. */
const HEX_VALUE = new Int8Array(256).fill(-1);
for (let d = 0; d < 16; d++) {
  HEX_VALUE['0123456789abcdef'.charCodeAt(d)] = d;
  HEX_VALUE['0123456789ABCDEF'.charCodeAt(d)] = d;
}

/**
 * The value of the hex digit `hex[i]`, or -1. A table lookup rather than
 * range tests: random ids mix digits and letters, so a branch on which one
 * a character is mispredicts often.
 */
function digitAt(hex, i) {
  const code = hex.charCodeAt(i);
  return code < 256 ? HEX_VALUE[code] : -1;
}

/** Set negative by wordAt() on a character that is not a hex digit. */
let badDigits = 0;

/**
 * The 4 bytes that the 8 hex digits of `hex` from `at` encode, as the
 * host-endian word storing them in order. An int32 (the Uint32Array store
 * keeps its bits), so an entry holds small integers rather than boxed
 * numbers, and its publish loads each word directly.
 */
function wordAt(hex, at) {
  let word = 0;
  let bad = 0;
  for (let k = 0; k < 4; k++) {
    const high = digitAt(hex, at + 2 * k);
    const low = digitAt(hex, at + 2 * k + 1);
    bad |= high | low;
    const byte = ((high << 4) | low) & 0xff;
    word |= LITTLE_ENDIAN ? byte << (8 * k) : byte << (24 - 8 * k);
  }
  badDigits |= bad;
  return word;
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
 * Builds the entry for a span context (32 + 16 hex digits) and optional
 * encoded attributes. Returns NO_SPAN for ids that are malformed or all
 * zero (the W3C invalid ids), so no separate validity check is needed.
 */
function entryFromIds(traceId, spanId, traceFlags, schema = null, attributes = null) {
  if (!decodeIds(traceId, spanId)) return NO_SPAN;
  const d = decodedIds;
  return new RecordEntry(1, d[0], d[1], d[2], d[3], d[4], d[5], traceFlags & 0xff, schema, attributes);
}

/** `entry` (a span's ids) with encoded attributes added. */
function withAttributes(entry, schema, attributes) {
  const { w0, w1, w2, w3, w4, w5, traceFlags } = entry;
  return new RecordEntry(1, w0, w1, w2, w3, w4, w5, traceFlags, schema, attributes);
}

/**
 * The slot of the entry whose ids and attributes are in the record's bytes,
 * valid or not (0 after a direct write): invalidating writes only the valid
 * byte, so re-publishing that entry only needs its tail word.
 */
let heldSlot = 0;

/**
 * Makes `entry` the thread's published record: valid = 0, fields, then
 * valid = 1 with the flags and attributes size. When the record still holds
 * that entry's bytes, only its tail word is written, and only if it differs.
 */
function publish(entry) {
  // Module bindings read through locals: each read of one costs bytecode
  // for its initialization check, and TurboFan inlines a function by its
  // bytecode size, on the with() path within a tight budget.
  const record = words;
  const tail = TAIL_INDEX_U32;
  const slots = ring;
  if (slots[heldSlot] === entry) {
    // The native side may have cleared the record (idle event loop) since,
    // so the tail word (valid byte included) is compared, not assumed.
    if (record[tail] !== entry.tail) record[tail] = entry.tail;
    return;
  }
  // ORDER: a sampler interrupts this thread, so it needs program order only.
  // V8 emits typed-array element stores in program order and never drops or
  // reorders them across one another, so valid = 0 lands before the fields
  // and the tail word (valid = 1) after them. (Atomics.store would add a
  // locked instruction per store, for ordering the interrupted thread
  // already has.)
  // valid = 0 (with trace_flags and attrs_data_size: an invalid record's
  // other fields do not matter). NO_SPAN stops here and leaves the held
  // bytes, so the next entry may still be the held one.
  record[tail] = 0;
  if (entry.valid === 0) return;
  const slot = entry.slot;
  if (slots[slot] !== entry) slots[slot] = entry;
  heldSlot = slot;
  record[0] = entry.w0;
  record[1] = entry.w1;
  record[2] = entry.w2;
  record[3] = entry.w3;
  record[4] = entry.w4;
  record[5] = entry.w5;
  if (entry.attrsSize !== 0) bytes.set(entry.attributes.bytes, OFFSET_ATTRS_DATA);
  // ORDER: last store; makes the record valid with the fields in place.
  record[tail] = entry.tail;
}

/**
 * Publishes ids given as unsigned 64-bit bigints (already validated), as
 * the direct API does: big-endian stores put the W3C bytes in hex order.
 */
function publishIds(traceIdHigh, traceIdLow, spanId, traceFlags) {
  heldSlot = 0; // the manager must rewrite its entry next time
  bytes[OFFSET_VALID] = 0; // ORDER: as in publish()
  ids.setBigUint64(0, traceIdHigh);
  ids.setBigUint64(8, traceIdLow);
  ids.setBigUint64(16, spanId);
  words[TAIL_INDEX_U32] = tailWord(traceFlags, 0); // ORDER: last store
}

/**
 * The entry the record carries now: the held one while the record is valid
 * with its tail word (an idle clear or a NO_SPAN publish leaves it
 * invalid), NO_SPAN otherwise.
 */
function publishedEntry() {
  const held = ring[heldSlot];
  return words[TAIL_INDEX_U32] === held.tail ? held : NO_SPAN;
}

/**
 * publish(NO_SPAN), small enough to inline where publish() is not: the
 * record reads invalid, and the held bytes stay for the next publish.
 */
function publishNoSpan() {
  words[TAIL_INDEX_U32] = 0;
}

/** Marks the record invalid (the ids stay; readers ignore them). */
function clear() {
  bytes[OFFSET_VALID] = 0;
}

// The writers where the record cannot be viewed: the same entries, written
// into `buffer` and copied with the protocol by the native side. They never
// skip a write: the native side may have cleared the record in between.

/** The entry the napi writers published last (null after a direct write). */
let lastEntry = NO_SPAN;

function publishedEntryThroughNapi() {
  return lastEntry === null ? NO_SPAN : lastEntry;
}

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

function publishThroughNapi(entry) {
  if (!warned) warnOnce();
  lastEntry = entry;
  if (entry.valid === 0) {
    binding.clearRecord();
    return;
  }
  // The id stores are written out here and in publish() rather than shared
  // through a helper: one more call level on publish()'s path costs the
  // with() call site inlining (BENCHMARKS.md, "More that was tried").
  words[0] = entry.w0;
  words[1] = entry.w1;
  words[2] = entry.w2;
  words[3] = entry.w3;
  words[4] = entry.w4;
  words[5] = entry.w5;
  words[TAIL_INDEX_U32] = entry.tail;
  if (entry.attrsSize !== 0) bytes.set(entry.attributes.bytes, OFFSET_ATTRS_DATA);
  binding.writeRecord(bytes.subarray(0, OFFSET_ATTRS_DATA + entry.attrsSize));
}

function publishIdsThroughNapi(traceIdHigh, traceIdLow, spanId, traceFlags) {
  if (!warned) warnOnce();
  lastEntry = null;
  ids.setBigUint64(0, traceIdHigh);
  ids.setBigUint64(8, traceIdLow);
  ids.setBigUint64(16, spanId);
  words[TAIL_INDEX_U32] = tailWord(traceFlags, 0);
  binding.writeRecord(bytes.subarray(0, OFFSET_ATTRS_DATA));
}

function publishNoSpanThroughNapi() {
  publishThroughNapi(NO_SPAN);
}

function clearThroughNapi() {
  if (!warned) warnOnce();
  binding.clearRecord();
}

module.exports =
  noViewReason === null
    ? { NO_SPAN, validFlags, tailWord, entryFromIds, decodeIds, decodedIds, withAttributes, publish, publishNoSpan, publishIds, clear, publishedEntry, writer: 'view' }
    : {
        NO_SPAN,
        validFlags,
        tailWord,
        entryFromIds,
        decodeIds,
        decodedIds,
        withAttributes,
        publish: publishThroughNapi,
        publishNoSpan: publishNoSpanThroughNapi,
        publishIds: publishIdsThroughNapi,
        clear: clearThroughNapi,
        publishedEntry: publishedEntryThroughNapi,
        writer: 'napi',
      };
