'use strict';
// Frame mode: the Node.js schema `nodejs_v1_dev` (abi/src/node_schema.rs).
//
// Where AsyncLocalStorage runs on V8's AsyncContextFrame, V8 restores the
// current frame on every `await` without running JavaScript. So nothing
// runs per async switch here: the manager's AsyncLocalStorage stores a
// wrapper per context, a typed array over the native OTEP 4947 record of the
// context's span, and a profiler walks from the thread's
// `otel_thread_ctx_nodejs_v1` block through the current frame to the
// wrapper, whose data pointer (at a fixed offset in the object) is the
// record's address. `active()` returns the wrapper's `context`.
//
// - a span's record is written once, when a context holding the span is
//   first entered, and in place afterwards: `valid = 0` when the span ends
//   (ProcessContextSpanProcessor.onEnd, or the SDK's `ended` seen at the
//   next `with()`), new attributes when a `with()` finds them changed;
// - records are carved out of slabs of native memory, each behind an
//   external ArrayBuffer (no napi call per span); a slab is freed by its
//   buffer's finalizer, so never while a frame can still reach a wrapper
//   over any of its records;
// - nothing is published before the whole walk was done in-process over
//   our own objects and ended at the expected record (see `availability`).

const asyncHooks = require('node:async_hooks');
const { diag, trace } = require('@opentelemetry/api');
const abi = require('../abi');
const binding = require('../binding');
const view = require('../record-view');
const sdkResource = require('../sdk-resource');
const { methodObserver } = require('../span-methods');
const localRoot = require('../local-root');

const { offsets } = abi.record;
const TAIL_INDEX_U32 = offsets.valid / 4;
/** Record sizes are multiples of this, so every record starts 32-byte aligned. */
const RECORD_ALIGN = 32;
/** A record without attributes, rounded up to the record alignment. */
const HEADER_RECORD_SIZE = Math.ceil(abi.record.headerSize / RECORD_ALIGN) * RECORD_ALIGN;
const FULL_RECORD_SIZE = abi.record.size;
/**
 * Room a span's record keeps beyond its first encoding, for values that
 * come later (a route set after routing): records are sized to what they
 * carry, not 640 bytes each. A later value that does not fit is left out
 * whole, as one past the record's size always is.
 */
const LATER_VALUES_ROOM = 96;

/** The record size for `attributes`, a multiple of the record alignment. */
function recordSize(attributes) {
  const wanted = abi.record.headerSize + attributes.bytes.length + LATER_VALUES_ROOM;
  return Math.min(FULL_RECORD_SIZE, Math.ceil(wanted / RECORD_ALIGN) * RECORD_ALIGN);
}

/** Bytes of attrs_data a record has room for. */
function attributesRoom(record) {
  return record.size - abi.record.headerSize;
}

/** Bytes per slab of records: one napi call and one finalizer per this many bytes of spans. */
const SLAB_BYTES = 16384;

/** What the manager's AsyncLocalStorage stores: the context, over its span's record. */
class ContextWrapper extends Uint8Array {
  /** `buffer`, `byteOffset`, `length`: the record's bytes; its address ends up at the offset readers use. */
  constructor(buffer, byteOffset, length, context, record) {
    super(buffer, byteOffset, length);
    /** The context given to with()/attach(), as active() returns it. */
    this.context = context;
    /** The SpanRecord this wrapper views, or null (no span). */
    this.record = record;
  }
}

/** A span's native record and what was written into it. */
class SpanRecord {
  constructor(buffer, byteOffset, size, span, traceFlags, schema, attributes) {
    this.buffer = buffer;
    this.byteOffset = byteOffset;
    this.size = size;
    /** The slab's views (shared by its records) and this record's first word. */
    this.words = slabWordsView;
    this.bytes = slabBytesView;
    this.base = byteOffset / 4;
    this.span = span;
    this.traceFlags = traceFlags;
    /** The AttributeSchema the attributes were encoded for (null: none). */
    this.schema = schema;
    /** EncodedAttributes or null. */
    this.attributes = attributes;
    /** Set once `valid` was cleared for good (the span ended). */
    this.ended = false;
  }
}

/** Per-context wrapper and per-span record caches (never enumerated). */
const kWrapper = Symbol('otel-thread-ctx.wrapper');
const kRecord = Symbol('otel-thread-ctx.record');

/** The publishing manager's AttributeSchema (null: no attributes). */
let schema = null;

/**
 * The slab records are carved from now, the views its records write
 * through (one pair per slab: no view per span), and how much of it is used.
 */
let slab = null;
let slabWordsView = null;
let slabBytesView = null;
let slabUsed = 0;

/**
 * A zeroed, never used record of `size` bytes (a multiple of RECORD_ALIGN)
 * in `slab` (which it may replace): its byte offset.
 */
function allocate(size) {
  if (slab === null || slabUsed + size > SLAB_BYTES) {
    slab = binding.frameSpanRecord(SLAB_BYTES);
    slabWordsView = new Uint32Array(slab);
    slabBytesView = new Uint8Array(slab);
    slabUsed = 0;
  }
  const byteOffset = slabUsed;
  slabUsed += size;
  return byteOffset;
}

/** This thread's record of "no span" (valid = 0, never written). */
let noSpanBuffer = null;
function noSpan() {
  noSpanBuffer ??= binding.frameSpanRecord(HEADER_RECORD_SIZE);
  return noSpanBuffer;
}

/** A wrapper of `context` over the no-span record. */
function noSpanWrapper(context) {
  return new ContextWrapper(noSpan(), 0, HEADER_RECORD_SIZE, context, null);
}

/**
 * Writes the record's attributes (EncodedAttributes or null) and makes it
 * valid. Its ids were stored when it was carved out (writeIds) and never
 * change.
 */
function write(record, attributes) {
  const words = record.words;
  const base = record.base;
  // ORDER: a sampler interrupts this thread, so program order is enough:
  // valid = 0 first, the fields, then the tail word (valid = 1) last, each
  // a typed-array store V8 neither drops nor reorders (as in record-view).
  words[base + TAIL_INDEX_U32] = 0;
  const size = attributes === null ? 0 : attributes.bytes.length;
  if (size !== 0) {
    // Through a byte view of the whole slab, shared by its records: a view
    // per write would cost more than these few bytes.
    const bytes = record.bytes;
    const values = attributes.bytes;
    const at = record.byteOffset + offsets.attrsData;
    for (let i = 0; i < values.length; i++) bytes[at + i] = values[i];
  }
  words[base + TAIL_INDEX_U32] = view.tailWord(record.traceFlags, size);
}

/** Stores the ids decodeIds() left in view.decodedIds into a new record (still invalid). */
function writeIds(record) {
  const words = record.words;
  const base = record.base;
  const ids = view.decodedIds;
  words[base] = ids[0];
  words[base + 1] = ids[1];
  words[base + 2] = ids[2];
  words[base + 3] = ids[3];
  words[base + 4] = ids[4];
  words[base + 5] = ids[5];
}

/** A span's attributes changed: its record follows now when it has one. Cannot throw. */
function attributesChanged(span) {
  try {
    const record = cachedRecord(span);
    if (schema !== null && record !== undefined && record.span === span && !record.ended) recordOfSpan(span);
  } catch {
    // A throwing attribute getter: the record follows at the next with().
  }
}

/**
 * `end()` returned or threw: if the span now says it has ended (the SDK's
 * `ended`, the rule every path applies), its record stops publishing it.
 * Spans without `ended` (NonRecordingSpan) stay published while a context
 * holds them, as in record mode. Cannot throw.
 */
function endObserved(span) {
  try {
    if (span.ended === true) spanEnded(span);
  } catch {
    // A throwing `ended` getter: the record ends at the next with(), if ever.
  }
}

const OBSERVED_METHODS = [
  ['end', endObserved],
  ['setAttribute', attributesChanged],
  ['setAttributes', attributesChanged],
];

/**
 * Makes `end()` of `span`'s class clear the span's record in place, and
 * `setAttribute()`/`setAttributes()` update it, so a frame that resumes
 * later without any with() publishes what the span says now: record mode
 * notices at the next callback, and frame mode runs nothing then. Once per
 * prototype (./span-methods.js); a method that cannot be wrapped is left to
 * ProcessContextSpanProcessor.onEnd and to with(). Cannot throw.
 */
const observeSpanClass = methodObserver(OBSERVED_METHODS);

/**
 * Records of spans that cannot take a property (frozen, sealed or otherwise
 * non-extensible), looked up only for those: the common path stays one
 * property load.
 */
const recordsOfFixedSpans = new WeakMap();

/** The record cached for `span`, or undefined. */
function cachedRecord(span) {
  const record = span[kRecord];
  if (record !== undefined || Object.isExtensible(span)) return record;
  return recordsOfFixedSpans.get(span);
}

/** A new record for `span`, or null when it publishes no span. */
function newRecord(span) {
  sdkResource.onNewSpan(span);
  observeSpanClass(span);
  if (span.ended === true) return null;
  const sc = span.spanContext();
  if (typeof sc !== 'object' || sc === null) return null;
  const flags = view.validFlags(sc.traceFlags);
  if (flags < 0 || !view.decodeIds(sc.traceId, sc.spanId)) return null;
  const attributes = schema === null ? null : schema.encode(span);
  const size = schema === null ? HEADER_RECORD_SIZE : recordSize(attributes);
  // decodedIds stay valid until the next decode: encode() above decodes none.
  const byteOffset = allocate(size);
  const record = new SpanRecord(slab, byteOffset, size, span, flags, schema, attributes);
  writeIds(record);
  write(record, attributes);
  if (attributes !== null && attributes.root !== null) (attributes.root.records ??= new Set()).add(record);
  return record;
}

/** Whether `record` still says what its span says (ends it in place if not). */
function isCurrent(record) {
  if (record.ended) return true;
  if (record.span.ended === true) {
    end(record);
    return true;
  }
  return record.schema === schema && (schema === null || schema.isCurrent(record.attributes));
}

function end(record) {
  record.ended = true;
  record.words[record.base + TAIL_INDEX_U32] = 0;
  record.attributes?.root?.records?.delete(record);
}

/**
 * A local root's endpoint changed (a late `http.route`): the live records
 * of its tree are rewritten in place now, as frames resume without running
 * anything. A few records per request, once per change. Cannot throw.
 */
function endpointChanged(root) {
  try {
    for (const record of root.records ?? []) {
      if (record.ended || record.schema !== schema || record.attributes.rootVersion === root.version) continue;
      record.attributes = schema.encode(record.span, attributesRoom(record));
      write(record, record.attributes);
    }
  } catch {
    // A throwing attribute getter: those records follow at their next with().
  }
}

/** The record of `span` (cached on it), or null when it publishes none. */
function recordOfSpan(span) {
  if (typeof span !== 'object' || span === null || typeof span.spanContext !== 'function') return null;
  const cached = cachedRecord(span);
  if (cached !== undefined && cached.span === span) {
    if (isCurrent(cached)) return cached;
    // Attributes or schema changed: the same record is rewritten when it
    // has room, so the wrappers over it publish the new attributes too.
    if (cached.schema === schema && schema !== null) {
      cached.attributes = schema.encode(span, attributesRoom(cached));
      write(cached, cached.attributes);
      return cached;
    }
  }
  const record = newRecord(span);
  if (Object.isExtensible(span)) span[kRecord] = record === null ? undefined : record;
  else if (record !== null) recordsOfFixedSpans.set(span, record);
  return record;
}

let failureReported = false;
function reportFailure(error) {
  if (failureReported) return;
  failureReported = true;
  try {
    diag.warn(`otel-thread-ctx: a context's span could not be read, no span is published for it: ${error}`);
  } catch {
    // A throwing diag logger or error: nothing else to report to.
  }
}

/** A new wrapper of `context` (cached on it when it can be). */
function newWrapper(context) {
  let record = null;
  try {
    if (typeof context === 'object' && context !== null && typeof context.getValue === 'function') {
      record = recordOfSpan(trace.getSpan(context));
    }
  } catch (error) {
    reportFailure(error);
  }
  const wrapper =
    record === null ? noSpanWrapper(context) : new ContextWrapper(record.buffer, record.byteOffset, record.size, context, record);
  try {
    if (typeof context === 'object' && context !== null && Object.isExtensible(context)) context[kWrapper] = wrapper;
  } catch {
    // A Proxy refusing the property: a new wrapper next time.
  }
  return wrapper;
}

let undefinedWrapper = null;
let nullWrapper = null;

/**
 * What the manager's AsyncLocalStorage stores for `context`, any value as
 * with the stock manager. One cached load and a few checks on the path a
 * context takes after its first entry. Cannot throw.
 */
function wrapperFor(context) {
  if (context === undefined) return (undefinedWrapper ??= noSpanWrapper(undefined));
  if (context === null) return (nullWrapper ??= noSpanWrapper(null));
  try {
    const cached = context[kWrapper];
    if (cached !== undefined && cached.context === context) {
      const record = cached.record;
      if (record === null || isCurrent(record)) return cached;
      // Rewrites the record in place when it can; else a new wrapper.
      if (recordOfSpan(record.span) === record) return cached;
    }
  } catch (error) {
    reportFailure(error);
  }
  return newWrapper(context);
}

/** The context a stored wrapper stands for (`active()` without the ROOT fallback). */
function contextOf(store) {
  return store === undefined ? undefined : store.context;
}

/** Called as a span ends: its record stops publishing it at once. Cannot throw. */
function spanEnded(span) {
  try {
    if (typeof span !== 'object' || span === null) return;
    const record = cachedRecord(span);
    if (record !== undefined && record.span === span && !record.ended) end(record);
  } catch {
    // A Proxy span: its record ends at the next with().
  }
}

/** True when AsyncLocalStorage is implemented with AsyncContextFrame. */
function usesAsyncContextFrame() {
  // The async_hooks-based implementation keeps its store under a per-instance
  // `kResourceStore` key; the AsyncContextFrame one has no own keys.
  return !Object.prototype.hasOwnProperty.call(new asyncHooks.AsyncLocalStorage(), 'kResourceStore');
}

/**
 * Runs `fn` in a copy of the current frame that is dropped afterwards.
 * AsyncLocalStorage.run() leaves its key mapped to `undefined` in the frame
 * it returns to; at start-up that frame is the caller's (often the top
 * level), and every frame created after it would copy the probes' dead
 * keys: 208 more bytes per run() of any AsyncLocalStorage, and the probe
 * storages kept alive. A snapshot restores the caller's frame object itself.
 */
function inScratchFrame(fn) {
  return asyncHooks.AsyncLocalStorage.snapshot()(fn);
}

/** This thread's discovered offsets, or the reason there are none. */
let discovered = null;

function only(list, what) {
  if (list.length !== 1) throw new Error(`${what}: ${list.length} candidates (${list.join(', ')})`);
  return list[0];
}

/**
 * Finds where this isolate keeps the current frame and where a wrapper
 * keeps its record's address, by walking our own objects inside two nested
 * runs; keeps only the answers both agree on.
 */
function discover() {
  if (!usesAsyncContextFrame()) {
    throw new Error('AsyncLocalStorage does not run on AsyncContextFrame here (Node 24+, or 22 with --experimental-async-context-frame)');
  }
  const storage = new asyncHooks.AsyncLocalStorage();
  const outerBuffer = binding.frameSpanRecord(HEADER_RECORD_SIZE);
  const innerBuffer = binding.frameSpanRecord(HEADER_RECORD_SIZE);
  const outer = new ContextWrapper(outerBuffer, 0, HEADER_RECORD_SIZE, null, null);
  const inner = new ContextWrapper(innerBuffer, 0, HEADER_RECORD_SIZE, null, null);
  let outerSlots = [];
  let innerSlots = [];
  inScratchFrame(() =>
    storage.run(outer, () => {
      outerSlots = binding.frameCpedCandidates(storage, outer);
      storage.run(inner, () => {
        innerSlots = binding.frameCpedCandidates(storage, inner);
      });
    }),
  );
  const cpedOffset = only(outerSlots.filter((o) => innerSlots.includes(o)), 'the isolate\'s frame slot');
  const outerOffsets = binding.frameRecordOffsetCandidates(outer, outerBuffer);
  const innerOffsets = binding.frameRecordOffsetCandidates(inner, innerBuffer);
  const recordOffset = only(outerOffsets.filter((o) => innerOffsets.includes(o)), 'the wrapper\'s record offset');
  return { cpedOffset, recordOffset };
}

/**
 * Whether frame mode works for `storage` on this thread: `{ offsets }`, or
 * `{ reason }` when it does not. Proves the reader's whole walk for this
 * very AsyncLocalStorage before anything is published.
 */
function availability(storage) {
  try {
    discovered ??= (() => {
      try {
        return { offsets: discover() };
      } catch (error) {
        return { reason: error.message };
      }
    })();
    if (discovered.reason !== undefined) return discovered;
    const { cpedOffset, recordOffset } = discovered.offsets;
    // A record inside a slab, not at its start: as span records are.
    const buffer = binding.frameSpanRecord(2 * RECORD_ALIGN);
    const probe = new ContextWrapper(buffer, RECORD_ALIGN, HEADER_RECORD_SIZE, null, null);
    inScratchFrame(() => storage.run(probe, () => binding.frameVerify(storage, buffer, RECORD_ALIGN, cpedOffset, recordOffset)));
    return discovered;
  } catch (error) {
    return { reason: error.message };
  }
}

/**
 * Makes `manager` (frame mode, verified) the thread's publisher. The
 * thread's OTEP 4947 record, which readers read before the walk, starts
 * invalid, so a span left there by the direct API before this manager
 * published does not hide the frames; it is cleared again whenever the
 * event loop idles, so a direct-API span never outlives the callbacks that
 * ran it (as record mode does).
 */
function activate(manager) {
  const { cpedOffset, recordOffset } = discovered.offsets;
  schema = manager._attributeSchema;
  localRoot.configure(schema === null ? [] : schema.endpointKeys, endpointChanged);
  view.clear();
  binding.setClearOnIdle(true);
  binding.framePublish(manager._asyncLocalStorage, cpedOffset, recordOffset);
}

/** Stops publishing frames on this thread; the record is left invalid. */
function deactivate() {
  schema = null;
  localRoot.configure([], null);
  binding.frameUnpublish();
  binding.setClearOnIdle(false);
  view.clear();
}

module.exports = { wrapperFor, contextOf, spanEnded, availability, activate, deactivate, usesAsyncContextFrame };
