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
const { attributeText } = require('./local-root');

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


/** Validates the `attributes` option of ProfilingContextManager. */
function validateKeys(keys, option = 'attributes') {
  if (keys === undefined) return [];
  if (!Array.isArray(keys)) {
    throw new TypeError(`The "${option}" option must be an array of strings`);
  }
  const seen = new Set();
  for (const key of keys) {
    if (typeof key !== 'string') throw new TypeError(`The "${option}" option must be an array of strings`);
    if (key === '') throw new RangeError(`The "${option}" option must not contain an empty key`);
    if (seen.has(key)) throw new RangeError(`The "${option}" option lists "${key}" twice`);
    seen.add(key);
  }
  if (keys.length > MAX_KEYS) {
    throw new RangeError(`The "${option}" option allows at most ${MAX_KEYS} keys`);
  }
  return [...keys];
}

/**
 * The published UTF-8 bytes of short texts seen recently that are written
 * from bytes (non-ASCII ones: see putText), encoded once, not per span
 * (names and routes repeat from span to span).
 */
const recentValues = new Map();
const RECENT_VALUES = 512;
const RECENT_VALUE_LENGTH = 64;

function valueBytesOf(text) {
  if (text.length > RECENT_VALUE_LENGTH) return truncatedUtf8(text, MAX_VALUE_BYTES);
  let bytes = recentValues.get(text);
  if (bytes === undefined) {
    bytes = truncatedUtf8(text, MAX_VALUE_BYTES);
    if (recentValues.size >= RECENT_VALUES) recentValues.clear();
    recentValues.set(text, bytes);
  }
  return bytes;
}

/** The key of the span's name in the key map. */
const SPAN_NAME_KEY = abi.attrs.spanNameKey;
/** The key of the local root span's id (16 lowercase hex digits). */
const LOCAL_ROOT_SPAN_ID_KEY = abi.attrs.localRootSpanIdKey;
/** The local root's attributes every span of its tree publishes, by default. */
const DEFAULT_LOCAL_ROOT_ATTRIBUTES = Object.freeze([abi.attrs.routeKey]);

/** Validates a boolean option (undefined: `fallback`). */
function booleanOption(value, name, fallback) {
  if (value === undefined) return fallback;
  if (typeof value !== 'boolean') throw new TypeError(`The "${name}" option must be a boolean`);
  return value;
}

/**
 * What a manager publishes in attrs_data, from its options: the span's own
 * `attributes`, its name (`spanName`, default on), its local root span's
 * id (`localRootSpanId`, default on) and the local root's
 * `localRootAttributes` (default `['http.route']`). Null when nothing.
 */
function schemaFromOptions(options) {
  const own = validateKeys(options.attributes);
  const endpoint =
    options.localRootAttributes === undefined ? [...DEFAULT_LOCAL_ROOT_ATTRIBUTES] : validateKeys(options.localRootAttributes, 'localRootAttributes');
  const spanName = booleanOption(options.spanName, 'spanName', true);
  const localRootSpanId = booleanOption(options.localRootSpanId, 'localRootSpanId', true);
  const keys = [];
  if (localRootSpanId) keys.push(LOCAL_ROOT_SPAN_ID_KEY);
  keys.push(...endpoint);
  if (spanName && !keys.includes(SPAN_NAME_KEY)) keys.push(SPAN_NAME_KEY);
  const ownOnly = own.filter((key) => !keys.includes(key));
  keys.push(...ownOnly);
  if (keys.length > MAX_KEYS) throw new RangeError(`The manager publishes at most ${MAX_KEYS} attribute keys`);
  if (keys.length === 0) return null;
  return new AttributeSchema(keys, { own: ownOnly, endpoint, spanName, localRootSpanId });
}

class AttributeSchema {
  /**
   * @param {string[]} keys every key published, in encoding order
   * @param {{ own: string[], endpoint: string[], spanName: boolean, localRootSpanId: boolean }} [roles]
   *   which keys are the span's own attributes (all of them when omitted)
   */
  constructor(keys, roles = { own: keys, endpoint: [], spanName: false, localRootSpanId: false }) {
    this.keys = keys;
    /** The span's own attributes, compared when a context is resumed. */
    this.ownKeys = roles.own;
    this.ownPositions = roles.own.map((key) => keys.indexOf(key));
    /** The local root's attributes, published on every span of its tree. */
    this.endpointKeys = roles.endpoint;
    this.endpointPositions = roles.endpoint.map((key) => keys.indexOf(key));
    this.spanName = roles.spanName;
    this.spanNamePosition = keys.indexOf(SPAN_NAME_KEY);
    this.localRootSpanId = roles.localRootSpanId;
    /** The attribute keys whose change a span's record follows. */
    this.watchedKeys = [...roles.endpoint, ...roles.own];
    /** Whether encoding needs the span's LocalRoot. */
    this.needsRoot = roles.localRootSpanId || roles.endpoint.length !== 0;
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

  /** Whether setting attribute `key` can change what a span publishes. */
  watches(key) {
    const keys = this.watchedKeys;
    for (let i = 0; i < keys.length; i++) if (keys[i] === key) return true;
    return false;
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

  /**
   * Writes what `span` publishes as attrs_data entries into `out` from
   * `at`, within `capacity` bytes: its local root's id and endpoint
   * attributes (`root`, or null), its name, then its own configured
   * attributes (the room runs out in that order; an entry that does not
   * fit is left out whole). The own values read go into `seen` when given.
   * Returns the bytes written. Allocates nothing once the values' bytes
   * are cached (names, routes and ids repeat from span to span).
   */
  encodeInto(out, at, capacity, span, root, seen) {
    let size = 0;
    if (root !== null) {
      if (this.localRootSpanId && root.spanId !== '') {
        size = this.putAscii(out, at, size, capacity, 0, root.spanId);
      }
      for (let i = 0; i < this.endpointKeys.length; i++) {
        size = this.putText(out, at, size, capacity, this.endpointPositions[i], root.value(this.endpointKeys[i]));
      }
    }
    if (this.spanName) size = this.putText(out, at, size, capacity, this.spanNamePosition, span.name);
    const ownKeys = this.ownKeys;
    if (ownKeys.length !== 0) {
      const spanAttributes = span.attributes;
      if (spanAttributes !== null && typeof spanAttributes === 'object') {
        for (let i = 0; i < ownKeys.length; i++) {
          const value = spanAttributes[ownKeys[i]];
          if (seen !== null) seen[i] = value;
          size = this.putText(out, at, size, capacity, this.ownPositions[i], value);
        }
      }
    }
    return size;
  }

  /**
   * putText for a value given as text (or anything: unpublishable values
   * are skipped). ASCII text, what names, routes and ids almost always
   * are, is written from its characters: a Map lookup of a string hashes
   * it, and span names are often built per span (a fresh string each
   * time). Other text goes through its cached UTF-8 bytes.
   */
  putText(out, at, size, capacity, position, value) {
    const text = attributeText(value);
    if (text === undefined) return size;
    const length = text.length < MAX_VALUE_BYTES ? text.length : MAX_VALUE_BYTES;
    if (size + 2 + length <= capacity) {
      const offset = this.entryAt(out, at, size, capacity, position, length);
      if (offset < 0) return size;
      let k = 0;
      for (; k < length; k++) {
        const c = text.charCodeAt(k);
        if (c >= 0x80) break;
        out[offset + k] = c;
      }
      if (k === length) return size + 2 + length;
      // Not ASCII: the entry is written again from its UTF-8 bytes, over
      // what was written here (they are at least as long). Left out whole
      // when they do not fit, and then nothing of it stays behind: a new
      // record is encoded in place, and the bytes past it are the next
      // record's, which must start zeroed.
      const next = this.put(out, at, size, capacity, position, valueBytesOf(text));
      if (next === size) out.fill(0, at + size, offset + k);
      return next;
    }
    // No room for as many bytes as characters: cut at a character
    // boundary, its UTF-8 may still fit.
    return this.put(out, at, size, capacity, position, valueBytesOf(text));
  }

  /**
   * Writes the header of an entry of key `position` with `length` bytes of
   * value if it fits: where its value goes, or -1 (left out whole).
   */
  entryAt(out, at, size, capacity, position, length) {
    if (size + 2 + length > capacity) return -1;
    const index = this.keyIndex(position);
    if (index < 0) return -1;
    out[at + size] = index;
    out[at + size + 1] = length;
    return at + size + 2;
  }

  /** Writes the entry of key `position` with `valueBytes` if it fits; the new size. */
  put(out, at, size, capacity, position, valueBytes) {
    const length = valueBytes.length;
    const offset = this.entryAt(out, at, size, capacity, position, length);
    if (offset < 0) return size;
    // A byte loop: a typed array's set() costs more than these few bytes.
    for (let k = 0; k < length; k++) out[offset + k] = valueBytes[k];
    return size + 2 + length;
  }

  /** put() for an ASCII string (a hex id), written from its characters: no bytes to allocate. */
  putAscii(out, at, size, capacity, position, text) {
    const length = text.length;
    const offset = this.entryAt(out, at, size, capacity, position, length);
    if (offset < 0) return size;
    for (let k = 0; k < length; k++) out[offset + k] = text.charCodeAt(k);
    return size + 2 + length;
  }

  /**
   * Whether what `record` published still matches its span: the local
   * root's endpoint unchanged (its version), the name, the span's own
   * attributes. Needed only for spans whose class is not observed
   * (./span-records.js), where nothing else tells of a change.
   */
  isCurrent(record) {
    const root = record.root;
    if (root !== null && root.version !== record.rootVersion) return false;
    const span = record.span;
    if (this.spanName && span.name !== record.name) return false;
    const seen = record.seen;
    if (seen === null) return true;
    const spanAttributes = span.attributes;
    if (spanAttributes === null || typeof spanAttributes !== 'object') return true;
    const keys = this.ownKeys;
    for (let i = 0; i < keys.length; i++) {
      if (spanAttributes[keys[i]] !== seen[i]) return false;
    }
    return true;
  }
}

module.exports = {
  AttributeSchema,
  schemaFromOptions,
  SPAN_NAME_KEY,
  LOCAL_ROOT_SPAN_ID_KEY,
  DEFAULT_LOCAL_ROOT_ATTRIBUTES,
  validateKeys, truncatedUtf8, MAX_VALUE_BYTES, ATTRS_CAPACITY };
