'use strict';
// Frame mode: the Node.js schema `nodejs_v1_dev` (abi/src/node_schema.rs).
//
// Where AsyncLocalStorage runs on V8's AsyncContextFrame, V8 restores the
// current frame on every `await` without running JavaScript. So nothing
// runs per async switch here: the manager's AsyncLocalStorage stores a
// wrapper per context, a typed array over the native OTEP 4947 record of
// the context's span (../span-records.js), and a profiler walks from the
// thread's `otel_thread_ctx_nodejs_v1` block through the current frame to
// the wrapper, whose data pointer (at a fixed offset in the object) is the
// record's address. `active()` returns the wrapper's `context`.
//
// - a context's wrapper is made at its first with() and held in a private
//   field of the context (../hidden-state.js): nothing observable is added
//   to the application's contexts;
// - the wrapper keeps the record's slab alive, so a slab is unmapped only
//   once no frame can reach a wrapper over any of its records;
// - nothing is published before the whole walk was done in-process over
//   our own objects and ended at the expected record (see `availability`).

const asyncHooks = require('node:async_hooks');
const { trace } = require('@opentelemetry/api');
const binding = require('../binding');
const view = require('../record-view');
const spanRecords = require('../span-records');
const { Stamp } = require('../hidden-state');

const { HEADER_RECORD_SIZE, RECORD_ALIGN } = spanRecords;

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

/** Each context's wrapper, made at its first with(), in a private field of the context. */
class WrapperSlot extends Stamp {
  #wrapper;

  constructor(context, wrapper) {
    super(context);
    this.#wrapper = wrapper;
  }

  /** The wrapper of `context` (an object or function), undefined before its first with(). */
  static get(context) {
    return #wrapper in context ? context.#wrapper : undefined;
  }

  /** Replaces the wrapper of a context that has one. */
  static replace(context, wrapper) {
    context.#wrapper = wrapper;
  }

  /**
   * Gives a wrapper to a context get() just found without one, with no
   * second brand check (an `in` on an object without the field is one of
   * the costlier steps of a context's first entry). Code run in between may
   * have given it one (a context whose getValue() enters it): replaced.
   */
  static add(context, wrapper) {
    try {
      new WrapperSlot(context, wrapper);
    } catch {
      context.#wrapper = wrapper;
    }
  }
}
const wrappers = WrapperSlot;

/** This thread's record of "no span" (valid = 0, never written). */
let noSpanRecord = null;

/** A wrapper of `context` over the no-span record. */
function noSpanWrapper(context) {
  noSpanRecord ??= spanRecords.blankRecord();
  return new ContextWrapper(noSpanRecord.slab.buffer, noSpanRecord.byteOffset, HEADER_RECORD_SIZE, context, null);
}

/** A new wrapper of `context` (an object), remembered for it; `had`: whether it had one. */
function newWrapper(context, had) {
  let record = null;
  try {
    if (typeof context.getValue === 'function') record = spanRecords.recordOf(trace.getSpan(context));
  } catch (error) {
    spanRecords.reportUnreadableSpan(error);
  }
  const wrapper =
    record === null ? noSpanWrapper(context) : new ContextWrapper(record.slab.buffer, record.byteOffset, record.size, context, record);
  if (had) wrappers.replace(context, wrapper);
  else wrappers.add(context, wrapper);
  return wrapper;
}

let undefinedWrapper = null;
let nullWrapper = null;

/**
 * What the manager's AsyncLocalStorage stores for `context`, any value as
 * with the stock manager. Cannot throw.
 *
 * The path a context takes after its first entry (one private-field lookup
 * and a few loads) is all that with() inlines: a first entry and a stale
 * record go to storeForSlow(), so TurboFan's inlining budget is left for
 * AsyncLocalStorage's run() and the caller's code.
 */
function storeFor(context) {
  if ((typeof context !== 'object' && typeof context !== 'function') || context === null) return wrapperOfValue(context);
  // A private-field lookup runs no trap or getter: it cannot throw on an object.
  const cached = wrappers.get(context);
  if (cached !== undefined) {
    const record = cached.record;
    if (record === null || spanRecords.isKnownFresh(record)) return cached;
  }
  return storeForSlow(context, cached);
}

/** The wrapper of a context that is not an object: no span, as with the stock manager any value is a context. */
function wrapperOfValue(context) {
  if (context === undefined) return (undefinedWrapper ??= noSpanWrapper(undefined));
  if (context === null) return (nullWrapper ??= noSpanWrapper(null));
  return noSpanWrapper(context);
}

/**
 * storeFor() for a context (an object or function) entered for the first
 * time (`cached` undefined: no second private-field lookup) or whose
 * record may no longer say what its span says. Cannot throw.
 */
function storeForSlow(context, cached) {
  try {
    if (cached !== undefined) {
      const record = cached.record;
      if (spanRecords.isFresh(record)) return cached;
      // Rewrites the record in place when it can; else a new wrapper.
      if (spanRecords.recordOf(record.span) === record) return cached;
    }
    return newWrapper(context, cached !== undefined);
  } catch (error) {
    spanRecords.reportUnreadableSpan(error);
    return noSpanWrapper(context);
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

/** Tries of discover() before frame mode is given up on a thread. */
const DISCOVERY_ATTEMPTS = 3;

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
  const outerBuffer = binding.spanRecordSlab(HEADER_RECORD_SIZE);
  const innerBuffer = binding.spanRecordSlab(HEADER_RECORD_SIZE);
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
      // The scans read a few words past our own objects, so an unrelated
      // word can match once, e.g. when a scavenge has just placed a buffer's
      // object right after its wrapper. Fresh objects on another try do not
      // repeat that; a layout that is really different fails every try.
      let reason = null;
      for (let attempt = 0; attempt < DISCOVERY_ATTEMPTS; attempt++) {
        try {
          return { offsets: discover() };
        } catch (error) {
          reason = error.message;
        }
      }
      return { reason };
    })();
    if (discovered.reason !== undefined) return discovered;
    const { cpedOffset, recordOffset } = discovered.offsets;
    // A record inside a slab, not at its start: as span records are.
    const buffer = binding.spanRecordSlab(2 * RECORD_ALIGN);
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
  const storage = manager._asyncLocalStorage;
  spanRecords.configure(manager._attributeSchema, () => storage.getStore());
  view.clear();
  binding.setClearOnIdle(true);
  binding.framePublish(manager._asyncLocalStorage, cpedOffset, recordOffset);
}

/** Stops publishing frames on this thread; the record is left invalid. */
function deactivate(_manager) {
  spanRecords.configure(null);
  binding.frameUnpublish();
  binding.setClearOnIdle(false);
  view.clear();
}

module.exports = { storeFor, availability, activate, deactivate, usesAsyncContextFrame };
