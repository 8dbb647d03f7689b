'use strict';
// Record mode: OTEP 4947 behind the thread's `otel_thread_ctx_v1`, kept
// pointing at the active span's record whenever JavaScript runs.
//
// Every span has its own complete record (../span-records.js), so a switch
// is one store: the record's address into the thread's pointer, which
// readers follow at every sample (OTEP 4947's "swap the pointer between
// complete records"). The record's bytes are written once per span, never
// per switch.
//
// Where the active context changes, and who publishes it:
// - `with()` / `bind()` / `attach()`: the manager stores the context's
//   store (storeFor()), calls enter() on entry and republish() on exit
//   (exit by throw included);
// - a callback starting in a stored context (await continuation, timer,
//   immediate, nextTick, queueMicrotask, I/O callback): the hooks in
//   ../continuations.js call publishStore() with the storage's store;
// - the event loop going idle: the native side points the pointer back at
//   the thread's own record, invalid, from a libuv prepare handle right
//   before the thread blocks (src/idle.rs).

const { trace } = require('@opentelemetry/api');
const binding = require('../binding');
const view = require('../record-view');
const continuations = require('../continuations');
const spanRecords = require('../span-records');
const { Stamp } = require('../hidden-state');
const abi = require('../abi');

const HEADER_SIZE = abi.record.headerSize;

/** The thread's `otel_thread_ctx_v1` as one double (../record-view.js), or null (no external buffers). */
const pointer = view.pointer;

/**
 * The schema of the publishing manager: a cached record encoded for it,
 * of a span whose class reports its changes, is published as it is.
 */
let schema = null;

/**
 * The records the pointer pointed at most recently, by slot (slot 0:
 * NO_SPAN): a slab is unmapped only once nothing references it, and the
 * ring references the record the pointer holds. The writer remembers it as
 * a slot number, not as an object: storing an object into long-lived state
 * costs a write barrier, at every switch. A slot is taken over only when
 * another record with the same slot is published, so the ring keeps at most
 * RING_SIZE - 1 records alive beyond their use (an ended span's record no
 * longer holds the span).
 */
const RING_SIZE = 256;
let lastSlot = 0;
/** The slot of the record the pointer was pointed at last. */
let heldSlot = 0;

/**
 * Readies `record` for the pointer, once: its slot (round-robin over
 * 1..RING_SIZE - 1) and its address as pointer bits.
 */
function prepare(record) {
  if (record.slot === 0 && record.span !== null) {
    lastSlot = lastSlot === RING_SIZE - 1 ? 1 : lastSlot + 1;
    record.slot = lastSlot;
  }
  spanRecords.pointerOf(record);
  return record;
}

/** What "no span" publishes: a record that is never valid, in slot 0. */
const NO_SPAN = prepare(spanRecords.blankRecord());
const ring = new Array(RING_SIZE).fill(NO_SPAN);

/**
 * Makes `record` (prepared) the thread's published record: one aligned
 * 8-byte store of its address into the thread's pointer, which a sampler
 * interrupting the thread sees whole or not at all.
 */
function pointAt(record) {
  const slot = record.slot;
  // ORDER: the ring is JavaScript's own state; the pointer store is what a
  // sampler sees, and the record it points at is complete.
  if (ring[slot] !== record) ring[slot] = record;
  heldSlot = slot;
  pointer[0] = record.address;
}

/**
 * The record the pointer holds now: the one published last while the
 * pointer still points at it (an idle clear or the direct API point it at
 * the thread's own record), NO_SPAN otherwise.
 */
function pointedRecord() {
  const held = ring[heldSlot];
  return pointer[0] === held.address ? held : NO_SPAN;
}

// Where records are not native memory (no external buffers), there is no
// pointer to swap: every switch copies the record's bytes into the
// thread's own record through a napi call (../record-view.js).

let copiedRecord = NO_SPAN;

function copy(record) {
  copiedRecord = record;
  if (record.ended) binding.clearRecord();
  else view.copyThroughNapi(record.slab.bytes, record.byteOffset, HEADER_SIZE + record.attrsSize);
}

const publish = pointer === null ? copy : pointAt;
const publishedRecord = pointer === null ? () => copiedRecord : pointedRecord;

/**
 * What a record-mode manager's AsyncLocalStorage stores for a context: the
 * context, as active() returns it, and the prepared record it publishes.
 * A callback start then reads the record straight from the store, with no
 * lookup on the context.
 */
class RecordStore {
  constructor(context, record) {
    this.context = context;
    this.record = record;
  }
}

/** Each context's store, made at its first with(), in a private field of the context (../hidden-state.js). */
class StoreSlot extends Stamp {
  #store;

  constructor(context, store) {
    super(context);
    this.#store = store;
  }

  /** The store of `context` (an object or function), undefined before its first with(). */
  static get(context) {
    return #store in context ? context.#store : undefined;
  }

  /** Gives a store to a context get() just found without one (nothing runs in between). */
  static add(context, store) {
    new StoreSlot(context, store);
  }
}

/** The prepared record `context` (an object or function) publishes now. May throw (a context's or span's getters). */
function recordFor(context) {
  if (typeof context.getValue !== 'function') return NO_SPAN;
  return prepare(spanRecords.recordOf(trace.getSpan(context)) ?? NO_SPAN);
}

let undefinedStore = null;
let nullStore = null;

/**
 * What the manager's AsyncLocalStorage stores for `context`, any value as
 * with the stock manager, its record current. Cannot throw.
 *
 * The path of a context seen before whose span's class reports its changes
 * (one private-field lookup and two checks) is all that with() inlines: a
 * first entry and a stale record go to storeForSlow(), so TurboFan's
 * inlining budget is left for AsyncLocalStorage's run() and the caller's
 * code.
 */
function storeFor(context) {
  if ((typeof context !== 'object' && typeof context !== 'function') || context === null) return storeOfValue(context);
  // A private-field lookup runs no trap or getter: it cannot throw on an object.
  const store = StoreSlot.get(context);
  if (store !== undefined) {
    const record = store.record;
    if (record === NO_SPAN || spanRecords.isKnownFresh(record)) return store;
  }
  return storeForSlow(context, store);
}

/** The store of a context that is not an object: no span, as with the stock manager any value is a context. */
function storeOfValue(context) {
  if (context === undefined) return (undefinedStore ??= new RecordStore(undefined, NO_SPAN));
  if (context === null) return (nullStore ??= new RecordStore(null, NO_SPAN));
  return new RecordStore(context, NO_SPAN);
}

/**
 * storeFor() for a context (an object or function) entered for the first
 * time (`store` undefined: no second private-field lookup) or whose record
 * may no longer say what its span says. Cannot throw.
 */
function storeForSlow(context, store) {
  try {
    if (store === undefined) {
      store = new RecordStore(context, NO_SPAN);
      StoreSlot.add(context, store);
      store.record = recordFor(context);
    } else if (!spanRecords.isFresh(store.record)) {
      store.record = recordFor(context);
    }
    return store;
  } catch (error) {
    spanRecords.reportUnreadableSpan(error);
    if (store === undefined) return new RecordStore(context, NO_SPAN);
    store.record = NO_SPAN;
    return store;
  }
}

/**
 * The record a stored value publishes, its freshness checked: a store from
 * storeFor(); anything else (a value put into the storage by other code)
 * publishes no span. May throw.
 */
function storedRecord(store) {
  if (store === undefined) return NO_SPAN;
  const record = store.record;
  if (record === NO_SPAN) return NO_SPAN;
  if (record !== undefined && record !== null && record.schema === schema && record.observed) return record;
  if (!(store instanceof RecordStore)) return NO_SPAN;
  return storeFor(store.context).record;
}

/**
 * Publishes what `store` (the storage's current store) stands for. Runs
 * inside async hooks, so it cannot throw (try/catch costs nothing on the
 * path that does not throw). The hot path, a store whose record is of an
 * observed span class, is two loads, two checks and the pointer store; a
 * record whose span ended publishes `valid = 0` from where it is, as its
 * span's end() wrote it.
 */
function publishStore(store) {
  try {
    publish(storedRecord(store));
  } catch (error) {
    publish(NO_SPAN);
    spanRecords.reportUnreadableSpan(error);
  }
}

/** Publishes the record of `store`, just made current by storeFor(), as with() and attach() enter it. Cannot throw. */
function enter(store) {
  publish(store.record);
}

/**
 * Publishes `record` again (the pointer's record before a with() call), as
 * with() leaves. Cannot throw. Like storeFor(), only the path of a current
 * record is inlined into with().
 */
function republish(record) {
  if (record === NO_SPAN || (record.observed && record.schema === schema)) publish(record);
  else republishSlow(record);
}

/** republish() for a record that may no longer say what its span says. Cannot throw. */
function republishSlow(record) {
  try {
    if (!spanRecords.isFresh(record)) record = prepare(spanRecords.recordOf(record.span) ?? NO_SPAN);
    publish(record);
  } catch (error) {
    publish(NO_SPAN);
    spanRecords.reportUnreadableSpan(error);
  }
}

/** Makes `manager` (record mode) the thread's publisher. */
function activate(manager) {
  schema = manager._attributeSchema;
  const storage = manager._asyncLocalStorage;
  spanRecords.configure(schema, () => storage.getStore());
  continuations.activate(manager, publishStore);
  binding.setClearOnIdle(true);
  publishStore(manager._asyncLocalStorage.getStore());
}

/** Stops `manager` publishing records; the pointer is left at the thread's own record, invalid. */
function deactivate(manager) {
  continuations.deactivate(manager);
  schema = null;
  spanRecords.configure(null);
  binding.setClearOnIdle(false);
  view.clear();
}

module.exports = { activate, deactivate, storeFor, enter, publishStore, republish, publishedRecord };
