'use strict';
// Decoding OTEP 4947 record bytes read from outside the writing thread
// (/proc/PID/mem, a bpftrace map): the header fields and the attrs_data
// entries {u8 key_index, u8 len, u8 value[len]}. Offsets and sizes come from
// the ABI the addon exports (js/abi.js).

const os = require('node:os');
const { record } = require('../js/abi');

const { offsets } = record;
const TRACE_ID_BYTES = 16;
const SPAN_ID_BYTES = 8;
const BIG_ENDIAN = os.endianness() === 'BE';

/** Decodes a record header (at least `record.headerSize` bytes). */
function decodeHeader(buf) {
  return {
    traceId: buf.subarray(offsets.traceId, offsets.traceId + TRACE_ID_BYTES).toString('hex'),
    spanId: buf.subarray(offsets.spanId, offsets.spanId + SPAN_ID_BYTES).toString('hex'),
    valid: buf[offsets.valid],
    traceFlags: buf[offsets.traceFlags],
    // Host endian.
    attrsDataSize: BIG_ENDIAN ? buf.readUInt16BE(offsets.attrsDataSize) : buf.readUInt16LE(offsets.attrsDataSize),
  };
}

/**
 * Parses attrs_data bytes into [{ keyIndex, value (Buffer) }]. A truncated
 * entry throws, unless `prefix` says the bytes are only the start of
 * attrs_data: then the cut-off entry ends the list.
 */
function decodeAttrs(bytes, { prefix = false } = {}) {
  const entries = [];
  for (let i = 0; i < bytes.length; ) {
    const truncated = i + 2 > bytes.length ? 'truncated attrs_data entry' : i + 2 + bytes[i + 1] > bytes.length ? 'attrs_data value overruns' : null;
    if (truncated) {
      if (prefix) break;
      throw new Error(`${truncated} at ${i}`);
    }
    const keyIndex = bytes[i];
    const len = bytes[i + 1];
    entries.push({ keyIndex, value: Buffer.from(bytes.subarray(i + 2, i + 2 + len)) });
    i += 2 + len;
  }
  return entries;
}

module.exports = { decodeHeader, decodeAttrs };
