'use strict';
// Span attributes published in the record's attrs_data: which keys, their
// indexes in the process context's `threadlocal.attribute_key_map`, and
// their encoding as `{u8 key_index; u8 len; u8 value[len]}` entries.
//
// Encoding happens once per (span, attribute change), never per context
// switch: an entry remembers the values it encoded, and the manager only
// compares them with the span's current values when the span is resumed.

const { diag } = require('@opentelemetry/api');
const abi = require('./abi');
const binding = require('./binding');

/** Longest value an entry can carry (its length is one byte). */
const MAX_VALUE_BYTES = abi.attrs.maxValueBytes;
/** Room for attrs_data in a record after its header. */
const ATTRS_CAPACITY = abi.record.attrsCapacity;
/** Key indexes are one byte. */
const MAX_KEYS = abi.processContext.maxKeys;

/** The UTF-8 bytes of `text`, cut to at most `max` bytes at a character boundary. */
function truncatedUtf8(text, max) {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= max) return bytes;
  let end = max;
  // Back up over continuation bytes (10xxxxxx) so no character is split.
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end);
}

/** A value as published text, or undefined when it is not publishable. */
function attributeText(value) {
  switch (typeof value) {
    case 'string':
      return value;
    case 'number':
    case 'boolean':
    case 'bigint':
      return String(value);
    default:
      return undefined; // arrays and objects are not published
  }
}

/** Validates the `attributes` option of ProfilingContextManager. */
function validateKeys(keys) {
  if (keys === undefined) return [];
  if (!Array.isArray(keys)) {
    throw new TypeError('The "attributes" option must be an array of strings');
  }
  const seen = new Set();
  for (const key of keys) {
    if (typeof key !== 'string') throw new TypeError('The "attributes" option must be an array of strings');
    if (key === '') throw new RangeError('The "attributes" option must not contain an empty key');
    if (seen.has(key)) throw new RangeError(`The "attributes" option lists "${key}" twice`);
    seen.add(key);
  }
  if (keys.length > MAX_KEYS) {
    throw new RangeError(`The "attributes" option allows at most ${MAX_KEYS} keys`);
  }
  return [...keys];
}

/** The encoded attributes of one span, as RecordEntry carries them. */
class EncodedAttributes {
  constructor(spanAttributes, seen, bytes) {
    this.spanAttributes = spanAttributes;
    this.seen = seen;
    this.bytes = bytes;
  }
}

class AttributeSchema {
  /** @param {string[]} keys validated with validateKeys */
  constructor(keys) {
    this.keys = keys;
    /** Index in the key map, -1 until the key is first seen on a span. */
    this.keyIndexes = new Int16Array(keys.length).fill(-1);
    this.warned = false;
  }

  /**
   * Puts every configured key in the key map now, in one publication, so a
   * profiler that reads the process context before the first span already
   * knows them (some re-read it only when they re-sync a process). Keys that
   * cannot be registered now (a full key map, a payload at its limit) are
   * reported and tried again on the first span that carries them. Cannot throw.
   */
  registerAll() {
    try {
      const indexes = binding.registerAttributeKeys(this.keys);
      indexes.forEach((index, i) => {
        this.keyIndexes[i] = index;
      });
    } catch (err) {
      if (!this.warned) diag.warn(`otel-thread-ctx: attribute keys not published yet: ${err.message}`);
      this.warned = true;
    }
  }

  keyIndex(i) {
    let index = this.keyIndexes[i];
    if (index < 0) {
      try {
        index = binding.registerAttributeKeys([this.keys[i]])[0];
      } catch (err) {
        if (!this.warned) diag.warn(`otel-thread-ctx: attribute "${this.keys[i]}" not published: ${err.message}`);
        this.warned = true;
        return -1;
      }
      this.keyIndexes[i] = index;
    }
    return index;
  }

  /** Encodes the configured attributes present on `span`. */
  encode(span) {
    const spanAttributes = span.attributes;
    const seen = new Array(this.keys.length);
    const parts = [];
    let size = 0;
    if (spanAttributes !== null && typeof spanAttributes === 'object') {
      for (let i = 0; i < this.keys.length; i++) {
        const value = spanAttributes[this.keys[i]];
        seen[i] = value;
        const text = attributeText(value);
        if (text === undefined) continue;
        const valueBytes = truncatedUtf8(text, MAX_VALUE_BYTES);
        // An attribute that does not fit is left out whole; the record
        // never grows past the record's size.
        if (size + 2 + valueBytes.length > ATTRS_CAPACITY) continue;
        const index = this.keyIndex(i);
        if (index < 0) continue;
        parts.push(Buffer.from([index, valueBytes.length]), valueBytes);
        size += 2 + valueBytes.length;
      }
    }
    const bytes = new Uint8Array(size);
    let offset = 0;
    for (const part of parts) {
      bytes.set(part, offset);
      offset += part.length;
    }
    return new EncodedAttributes(spanAttributes, seen, bytes);
  }

  /** Whether `encoded` still matches its span's attributes. */
  isCurrent(encoded) {
    const spanAttributes = encoded.spanAttributes;
    if (spanAttributes === null || typeof spanAttributes !== 'object') return true;
    const keys = this.keys;
    const seen = encoded.seen;
    for (let i = 0; i < keys.length; i++) {
      if (spanAttributes[keys[i]] !== seen[i]) return false;
    }
    return true;
  }
}

module.exports = { AttributeSchema, validateKeys, truncatedUtf8, MAX_VALUE_BYTES, ATTRS_CAPACITY };
