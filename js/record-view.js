'use strict';
// The calling thread's OTEP 4947 record, written from JavaScript through a
// typed-array view over the native record: no napi call, no allocation, no
// syscall per write. Layout and protocol: src/record.rs.
//
// Entries (the bytes of one span context) are built once per span and
// reused, so a context switch only copies a few words.

const binding = require('./binding');

const OFFSET_VALID = 24;
const OFFSET_TRACE_FLAGS = 25;
const OFFSET_ATTRS_DATA = 28;
const ATTRS_SIZE_INDEX_U16 = 13; // byte offset 26

const buffer = binding.recordBuffer();
const bytes = new Uint8Array(buffer);
const words = new Uint32Array(buffer, 0, 6); // trace id (4 words) + span id (2 words)
const halfWords = new Uint16Array(buffer, 0, 14);

/** The bytes one span context publishes, in host-endian words ready to store. */
class RecordEntry {
  constructor(valid, w0, w1, w2, w3, w4, w5, traceFlags, schema = null, attributes = null) {
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
  }
}

/** Publishes nothing: the record reads invalid. */
const NO_SPAN = Object.freeze(new RecordEntry(0, 0, 0, 0, 0, 0, 0, 0));
const HEX_ID = /^[0-9a-f]+$/;

/**
 * Builds the entry for a W3C span context (32 + 16 lowercase hex digits) and
 * optional encoded attributes. Returns NO_SPAN for ids that are malformed or
 * all zero.
 */
function entryFromIds(traceId, spanId, traceFlags, schema = null, attributes = null) {
  if (
    typeof traceId !== 'string' || traceId.length !== 32 || !HEX_ID.test(traceId) ||
    typeof spanId !== 'string' || spanId.length !== 16 || !HEX_ID.test(spanId) ||
    /^0+$/.test(traceId) || /^0+$/.test(spanId)
  ) {
    return NO_SPAN;
  }
  const scratch = new Uint8Array(24);
  for (let i = 0; i < 16; i++) scratch[i] = parseInt(traceId.substr(i * 2, 2), 16);
  for (let i = 0; i < 8; i++) scratch[16 + i] = parseInt(spanId.substr(i * 2, 2), 16);
  const w = new Uint32Array(scratch.buffer);
  return new RecordEntry(1, w[0], w[1], w[2], w[3], w[4], w[5], traceFlags & 0xff, schema, attributes);
}

let lastEntry = NO_SPAN;

/**
 * Makes `entry` the thread's published record: valid = 0, fields, valid = 1.
 * Skips the writes when the same entry is already published.
 */
function publish(entry) {
  // The native side may have cleared the record (idle event loop), so the
  // skip also checks the valid byte, not only our memory of the last entry.
  if (entry === lastEntry && bytes[OFFSET_VALID] === entry.valid) return;
  lastEntry = entry;
  // ORDER: a sampler interrupts this thread, so it needs program order only.
  // V8 emits typed-array element stores in program order and never drops or
  // merges them across one another, so valid = 0 lands before the fields and
  // valid = 1 after them. (Atomics.store would add a locked instruction per
  // store, about 7 ns each, for ordering the interrupted thread already has.)
  bytes[OFFSET_VALID] = 0;
  if (entry.valid === 0) return;
  words[0] = entry.w0;
  words[1] = entry.w1;
  words[2] = entry.w2;
  words[3] = entry.w3;
  words[4] = entry.w4;
  words[5] = entry.w5;
  bytes[OFFSET_TRACE_FLAGS] = entry.traceFlags;
  if (entry.attrsSize !== 0) bytes.set(entry.attributes.bytes, OFFSET_ATTRS_DATA);
  halfWords[ATTRS_SIZE_INDEX_U16] = entry.attrsSize;
  // ORDER: every field above is written before the record becomes valid.
  bytes[OFFSET_VALID] = 1;
}

module.exports = { NO_SPAN, entryFromIds, publish, bytes };
