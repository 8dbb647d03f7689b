'use strict';
// What a span publishes: one native OTEP 4947 record per span, shared by
// both publishing modes (frame mode's wrappers view it; record mode points
// the thread's `otel_thread_ctx_v1` at it).
//
// - a span's record is written once, the first time a context holding the
//   span is entered: its ids, then its identity attributes (local root id,
//   endpoint, name) and configured attributes, straight into the record's
//   bytes (./span-attributes.js);
// - it is kept current in place, never per context switch: `valid = 0`
//   when the span ends, new attributes when they change. Both are seen
//   from the span's own methods (`end`, `setAttribute`, `setAttributes`,
//   `updateName`, observed once per class: ./span-methods.js), and a
//   local root's new endpoint rewrites the live records of its tree. For a
//   span whose class cannot be observed, the publishing mode asks
//   isCurrent() when it enters the span;
// - records are carved out of slabs of native memory, each behind an
//   external ArrayBuffer (no napi call per span, no finalizer per span); a
//   slab's memory goes back to the addon (src/span_slab.rs) when its
//   buffer's finalizer runs, once nothing references it;
// - nothing observable is added to spans or contexts: a span's record is
//   held in a private field (./hidden-state.js) until the span ends. Then
//   the field lets go of it: an ended span waits in the SDK's export queue
//   long enough to be promoted, and whatever it holds is copied and marked
//   with it. A context that held the span keeps its record (ended, invalid).

const { diag } = require('@opentelemetry/api');
const abi = require('./abi');
const binding = require('./binding');
const view = require('./record-view');
const localRoot = require('./local-root');
const { methodObserver } = require('./span-methods');
const { Stamp } = require('./hidden-state');

const { offsets } = abi.record;
const TAIL_INDEX_U32 = offsets.valid / 4;
/** Record sizes are multiples of this, so every record starts 32-byte aligned. */
const RECORD_ALIGN = 32;
/** A record without attributes, rounded up to the record alignment. */
const HEADER_RECORD_SIZE = Math.ceil(abi.record.headerSize / RECORD_ALIGN) * RECORD_ALIGN;
const FULL_RECORD_SIZE = abi.record.size;
const ATTRS_CAPACITY = abi.record.attrsCapacity;
/**
 * Room a span's record keeps beyond its first encoding, for values that
 * come later (a route set after routing): records are sized to what they
 * carry, not 640 bytes each. A later value that does not fit is left out
 * whole, as one past the record's size always is.
 */
const LATER_VALUES_ROOM = 96;
/**
 * Bytes per slab of records: one napi call and one finalizer per this many
 * bytes of spans, and what one long-lived record (a span a timer's frame
 * keeps) holds mapped.
 */
const SLAB_BYTES = 32768;

/** Records are carved from slabs: native memory where external buffers are allowed. */
class Slab {
  constructor(buffer, address) {
    this.buffer = buffer;
    /** Views shared by the slab's records: no view per span. */
    this.words = new Uint32Array(buffer);
    this.bytes = new Uint8Array(buffer);
    /** The memory's address, or 0 where it is a plain ArrayBuffer (no external buffers). */
    this.address = address;
    this.used = 0;
  }
}

/** Why slabs are plain ArrayBuffers here (external buffers forbidden), or null. */
let noExternalSlabs = null;

function newSlab(bytes) {
  if (noExternalSlabs === null) {
    try {
      const buffer = binding.spanRecordSlab(bytes);
      return new Slab(buffer, binding.bufferAddress(buffer));
    } catch (error) {
      noExternalSlabs = error;
    }
  }
  return new Slab(new ArrayBuffer(bytes), 0);
}

/** The slab records are carved from now. */
let slab = null;

/** `size` bytes (a multiple of RECORD_ALIGN) in the current slab, which it may replace. */
function carve(size) {
  if (slab === null || slab.used + size > SLAB_BYTES) slab = newSlab(SLAB_BYTES);
  return slab;
}

/** A span's native record and what was written into it. */
class SpanRecord {
  constructor(slab, size, span, spanId, traceFlags, schema, root, name, seen, observed) {
    this.slab = slab;
    this.byteOffset = slab.used;
    /** Index of its first word in the slab's word view. */
    this.base = slab.used / 4;
    this.size = size;
    /** Its address as pointer bits, made at its first publication in record mode (pointerBits()). */
    this.address = 0;
    /** Record mode's slot for it while it may be published (0: none yet). */
    this.slot = 0;
    this.span = span;
    /** The span's id as its span context gave it (hex text), for its children's local root lookup. */
    this.spanId = spanId;
    this.traceFlags = traceFlags;
    /** The AttributeSchema the attributes were encoded for (null: none). */
    this.schema = schema;
    /**
     * The span's LocalRoot (null: none published) and its version when
     * encoded. Kept once the span ended: a child started after its parent
     * ended (a late callback) still joins the tree.
     */
    this.root = root;
    this.rootVersion = root === null ? 0 : root.version;
    /** The span's name and own attribute values when encoded (for isCurrent). */
    this.name = name;
    this.seen = seen;
    /** Whether the span's class reports its changes (end, attributes, name). */
    this.observed = observed;
    /** Set once `valid` was cleared for good (the span ended). */
    this.ended = false;
    this.attrsSize = 0;
    /** The live records of the same local root's tree, linked both ways. */
    this.previousInTree = null;
    this.nextInTree = null;
  }
}

/** Each span's record (null: the span publishes nothing), in a private field of the span. */
class SpanRecordSlot extends Stamp {
  #record;

  constructor(span, record) {
    super(span);
    this.#record = record;
  }

  /** The record of `span` (an object), undefined before its first. */
  static get(span) {
    return #record in span ? span.#record : undefined;
  }

  /**
   * Gives a record to a span get() just found without one, with no second
   * brand check; a record given to it meanwhile (a getter of the span
   * entering a context that holds it) is replaced.
   */
  static add(span, record) {
    try {
      new SpanRecordSlot(span, record);
    } catch {
      span.#record = record;
    }
  }

  /** Replaces the record of a span that has one. */
  static replace(span, record) {
    span.#record = record;
  }
}
const records = SpanRecordSlot;

/** The publishing manager's AttributeSchema (null: no attributes). */
let schema = null;

/** Where a record's attributes are encoded again before they replace its own. */
const scratch = new Uint8Array(ATTRS_CAPACITY);

/** The record size for `attrsSize` bytes of attributes, a multiple of the record alignment. */
function recordSize(attrsSize) {
  const wanted = abi.record.headerSize + attrsSize + LATER_VALUES_ROOM;
  return Math.min(FULL_RECORD_SIZE, Math.ceil(wanted / RECORD_ALIGN) * RECORD_ALIGN);
}

/**
 * Writes the scratch's first `attrsSize` bytes as the record's attributes
 * and makes it valid. Its ids were stored when it was carved out and never
 * change.
 */
function write(record, attrsSize) {
  const words = record.slab.words;
  const tail = record.base + TAIL_INDEX_U32;
  // ORDER: a sampler interrupts this thread, so program order is enough:
  // valid = 0 first, the fields, then the tail word (valid = 1) last, each
  // a typed-array store V8 neither drops nor reorders (as in record-view).
  words[tail] = 0;
  const bytes = record.slab.bytes;
  const at = record.byteOffset + offsets.attrsData;
  for (let i = 0; i < attrsSize; i++) bytes[at + i] = scratch[i];
  record.attrsSize = attrsSize;
  words[tail] = view.tailWord(record.traceFlags, attrsSize);
}

/** Stores the ids decodeIds() left in view.decodedIds into a new record (still invalid). */
function writeIds(record) {
  const words = record.slab.words;
  const base = record.base;
  const ids = view.decodedIds;
  words[base] = ids[0];
  words[base + 1] = ids[1];
  words[base + 2] = ids[2];
  words[base + 3] = ids[3];
  words[base + 4] = ids[4];
  words[base + 5] = ids[5];
}

function linkIntoTree(record) {
  const root = record.root;
  const first = root.records;
  record.nextInTree = first;
  if (first !== null) first.previousInTree = record;
  root.records = record;
}

function unlinkFromTree(record) {
  const root = record.root;
  if (root === null) return;
  const { previousInTree: previous, nextInTree: next } = record;
  if (previous !== null) previous.nextInTree = next;
  else if (root.records === record) root.records = next;
  if (next !== null) next.previousInTree = previous;
  record.previousInTree = null;
  record.nextInTree = null;
}

/**
 * Stops `record` publishing its span, for good, and lets go of the span:
 * a record can outlive it (record mode's ring, a frame a timer keeps), and
 * an ended span and its attributes should not live on through it.
 */
function end(record) {
  record.ended = true;
  record.slab.words[record.base + TAIL_INDEX_U32] = 0;
  unlinkFromTree(record);
  record.span = null;
  record.seen = null;
  record.name = undefined;
}

/** Encodes what its span publishes now into `record`, in place (what fits its size). */
function rewrite(record) {
  const span = record.span;
  const root = record.root;
  if (root !== null) record.rootVersion = root.version;
  record.name = span.name;
  const attrsSize = schema.encodeInto(scratch, 0, record.size - abi.record.headerSize, span, root, record.seen);
  write(record, attrsSize);
}

/**
 * `record`'s address as view.pointerBits(), what record mode stores into
 * the thread's pointer; 0 where records are not native memory. Made once,
 * on first use: frame mode never needs it.
 */
function pointerOf(record) {
  let bits = record.address;
  if (bits === 0 && record.slab.address !== 0) record.address = bits = view.pointerBits(record.slab.address + record.byteOffset);
  return bits;
}

/** A record that publishes nothing, ever (valid = 0, never written). */
function blankRecord() {
  const record = new SpanRecord(carve(HEADER_RECORD_SIZE), HEADER_RECORD_SIZE, null, '', 0, null, null, undefined, null, true);
  record.slab.used += HEADER_RECORD_SIZE;
  record.ended = true;
  return record;
}

/**
 * Observers of a span class's methods, each wrapping its methods once per
 * prototype (./span-methods.js) and saying whether they report here:
 * `end()` always; `setAttribute()`/`setAttributes()` where the schema
 * publishes attributes, `updateName()` where it publishes the name. A
 * class is wrapped only for what some manager publishes: a method call
 * through a wrapper costs a few ns more.
 */
const observeEnd = methodObserver([['end', endObserved]]);
const observeAttributes = methodObserver([
  ['setAttribute', attributeSet],
  ['setAttributes', attributesSet],
]);
const observeName = methodObserver([['updateName', changeObserved]]);

/** Whether `span`'s class reports every change that matters to what the schema publishes. */
function observeSpanClass(span) {
  const ended = observeEnd(span);
  if (schema === null) return ended;
  const attributes = schema.watchedKeys.length === 0 || observeAttributes(span);
  const name = !schema.spanName || observeName(span);
  return ended && attributes && name;
}

/**
 * Called with each span given its first record, until it returns false
 * (the zero-config process context's look at the SDK's Resource, wired by
 * the manager); null: none.
 */
let newSpanObserver = null;

/** Sets what newSpanObserver is (a function that cannot throw, or null). */
function observeNewSpans(observer) {
  newSpanObserver = observer;
}

/**
 * A new record for `span`, or null when it publishes no span. `knownRoot`:
 * the LocalRoot of the record it replaces, or null.
 */
function newRecord(span, knownRoot) {
  if (newSpanObserver !== null && !newSpanObserver(span)) newSpanObserver = null;
  const observed = observeSpanClass(span);
  if (span.ended === true) return null;
  const sc = span.spanContext();
  if (typeof sc !== 'object' || sc === null) return null;
  const flags = view.validFlags(sc.traceFlags);
  if (flags < 0) return null;
  if (!view.decodeIds(sc.traceId, sc.spanId)) return null;
  // decodedIds hold until the next decode: nothing below decodes.
  let root = null;
  let name;
  let seen = null;
  let attrsSize = 0;
  let size = HEADER_RECORD_SIZE;
  let slab;
  if (schema === null) {
    slab = carve(size);
  } else {
    if (schema.needsRoot) root = knownRoot ?? localRoot.localRootForRecord(span);
    if (schema.ownKeys.length !== 0) seen = new Array(schema.ownKeys.length);
    name = span.name;
    // Encoded in place, with room for the largest record reserved: the
    // bytes past `used` belong to no record yet, and the record keeps
    // only the size its attributes need.
    slab = carve(FULL_RECORD_SIZE);
    attrsSize = schema.encodeInto(slab.bytes, slab.used + offsets.attrsData, ATTRS_CAPACITY, span, root, seen);
    size = recordSize(attrsSize);
  }
  const record = new SpanRecord(slab, size, span, sc.spanId, flags, schema, root, name, seen, observed);
  slab.used += size;
  writeIds(record);
  record.attrsSize = attrsSize;
  // ORDER: the tail word (valid = 1) last, after the ids and attributes.
  slab.words[record.base + TAIL_INDEX_U32] = view.tailWord(flags, attrsSize);
  if (root !== null) linkIntoTree(record);
  return record;
}

/**
 * Whether `record` still says what its span says: ends it in place if the
 * span ended; false when it was encoded for another schema, or (a span
 * whose class is not observed) its attributes changed.
 */
function isCurrent(record) {
  if (record.ended) return true;
  if (record.span.ended === true) {
    end(record);
    return true;
  }
  if (record.schema !== schema) return false;
  return record.observed || schema === null || schema.isCurrent(record);
}

/**
 * Whether `record` is an observed span's record of the current schema: then
 * it follows every change of its span, and nothing needs checking. Two
 * loads; cannot throw.
 */
function isKnownFresh(record) {
  return record.observed && record.schema === schema;
}

/**
 * isCurrent() with the answer for an observed span's record of the current
 * schema first: two loads, on the path of every record-mode switch. May
 * throw (a span's getters).
 */
function isFresh(record) {
  return isKnownFresh(record) || isCurrent(record);
}

/**
 * The record of `span` (any value), or null when it publishes none. May
 * throw (a span's getters): the publishing modes catch.
 */
function recordOf(span) {
  if (typeof span !== 'object' || span === null || typeof span.spanContext !== 'function') return null;
  const cached = records.get(span);
  let knownRoot = null;
  if (cached !== undefined) {
    if (cached === null || isCurrent(cached)) return cached;
    // Attributes changed: the same record is rewritten, so what already
    // points at it publishes them too.
    if (cached.schema === schema && schema !== null) {
      rewrite(cached);
      return cached;
    }
    unlinkFromTree(cached);
    knownRoot = cached.root;
  }
  const record = newRecord(span, knownRoot);
  if (cached === undefined) records.add(span, record);
  else records.replace(span, record);
  return record;
}

/**
 * Called as a span ends: its record stops publishing it at once, and a
 * local root leaves the process's trace-root table. Cannot throw.
 */
function spanEnded(span) {
  let record;
  try {
    record = records.get(span);
  } catch {
    // Not an object: nothing was published for it.
    return;
  }
  if (record === undefined || record === null) {
    localRoot.spanEnded(span, undefined);
    return;
  }
  localRoot.spanEnded(span, record.root);
  if (!record.ended) end(record);
  // The span publishes nothing from now on, as its ended record did.
  records.replace(span, null);
}

/**
 * `end()` returned or threw: if the span now says it has ended (the SDK's
 * `ended`, the rule every path applies), its record stops publishing it.
 * Spans without `ended` (NonRecordingSpan) stay published while a context
 * holds them. Cannot throw.
 */
function endObserved(span) {
  try {
    if (span.ended === true) spanEnded(span);
  } catch {
    // A throwing `ended` getter: the record ends at the next with(), if ever.
  }
}

/** setAttribute(key): only the keys a record carries matter. Cannot throw. */
function attributeSet(span, key) {
  if (schema !== null && schema.watches(key)) changeObserved(span);
}

/**
 * setAttributes(attributes): only when it carries a key a record carries.
 * The SDK's own setAttributes() calls setAttribute() per key as well, but
 * other span classes need not. Cannot throw.
 */
function attributesSet(span, attributes) {
  if (schema === null) return;
  try {
    if (typeof attributes !== 'object' || attributes === null) return;
    const keys = schema.watchedKeys;
    for (let i = 0; i < keys.length; i++) {
      if (attributes[keys[i]] !== undefined) {
        changeObserved(span);
        return;
      }
    }
  } catch {
    // A throwing attribute getter: the record follows at the next with().
  }
}

/**
 * A span's attributes or name may have changed: its local root takes new
 * endpoint values (rewriting its tree's records), and its own record
 * follows. Cannot throw.
 */
function changeObserved(span) {
  if (schema === null) return;
  try {
    const record = records.get(span);
    const root = localRoot.knownLocalRoot(span, record);
    if (root !== undefined) root.note(span);
    if (record !== undefined && record !== null && !record.ended && record.schema === schema && !schema.isCurrent(record)) {
      rewrite(record);
    }
  } catch {
    // A throwing attribute getter: the record follows at the next with().
  }
}

/**
 * A local root's endpoint changed (a late `http.route`): the live records
 * of its tree are rewritten in place now, as frames resume without running
 * anything. A few records per request, once per change. Cannot throw.
 */
function endpointChanged(root) {
  try {
    for (let record = root.records; record !== null; record = record.nextInTree) {
      if (!record.ended && record.schema === schema && record.rootVersion !== root.version) rewrite(record);
    }
  } catch {
    // A throwing attribute getter: those records follow at their next entry.
  }
}

let unreadableReported = false;

/**
 * Either mode met a context whose span could not be read (a throwing
 * getter, Proxy trap, getValue or spanContext) and publishes no span for
 * it; the first such failure on the thread is reported through diag.
 * Cannot throw.
 */
function reportUnreadableSpan(error) {
  if (unreadableReported) return;
  unreadableReported = true;
  try {
    diag.warn(`otel-thread-ctx: a context's span could not be read, no span is published for it: ${error}`);
  } catch {
    // A throwing diag logger or error (toString): nothing else to report to.
  }
}

/** The record `span` (an object) has so far: it, null (publishes none) or undefined. */
function recordOfKnown(span) {
  return records.get(span);
}

/** The publishing manager's AsyncLocalStorage store now (a wrapper or a record store), or undefined. */
let activeStore = () => undefined;

/**
 * The record of the context active now, as the publishing mode stored it
 * (a frame wrapper's or a record store's `record`), or null: a new span's
 * parent is usually that context's span, and its record knows the tree
 * even once the parent ended. May throw (a store put there by other code).
 */
function activeRecord() {
  const store = activeStore();
  if (typeof store !== 'object' || store === null) return null;
  const record = store.record;
  return record instanceof SpanRecord ? record : null;
}

/**
 * Sets the publishing manager's schema (null: none, or no manager
 * publishing) and how its active store is read (`storeNow()`).
 */
function configure(nextSchema, storeNow = () => undefined) {
  schema = nextSchema;
  activeStore = storeNow;
  localRoot.configure(schema === null ? [] : schema.endpointKeys, endpointChanged, recordOfKnown, activeRecord);
}

module.exports = {
  HEADER_RECORD_SIZE,
  RECORD_ALIGN,
  recordOf,
  isFresh,
  isKnownFresh,
  pointerOf,
  spanEnded,
  blankRecord,
  reportUnreadableSpan,
  configure,
  observeNewSpans,
};
