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
// - `with()` / `bind()` / `attach()`: the manager calls publishContext()
//   on entry and republish() on exit (exit by throw included);
// - a callback starting in a stored context (await continuation, timer,
//   immediate, nextTick, queueMicrotask, I/O callback): the hooks in
//   ../continuations.js call publishContext();
// - the event loop going idle: the native side points the pointer back at
//   the thread's own record, invalid, from a libuv prepare handle right
//   before the thread blocks (src/idle.rs).

const { diag, trace } = require('@opentelemetry/api');
const binding = require('../binding');
const view = require('../record-view');
const continuations = require('../continuations');
const spanRecords = require('../span-records');
const { Stamp } = require('../hidden-state');
const abi = require('../abi');

const HEADER_SIZE = abi.record.headerSize;

/**
 * Each context's span record, or NO_SPAN, in a private field of the
 * context (nothing observable is added: ../hidden-state.js). Primitives
 * and contexts without getValue() publish no span.
 */
class ContextRecordSlot extends Stamp {
  #record;

  constructor(context, record) {
    super(context);
    this.#record = record;
  }

  /** The record of `context` (an object), undefined before its first publication. */
  static get(context) {
    return #record in context ? context.#record : undefined;
  }

  static set(context, record) {
    if (#record in context) context.#record = record;
    else new ContextRecordSlot(context, record);
  }
}

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
 * The record `ctx` (an object) publishes, looked up again: its cached one
 * if still current (a span whose class is not observed), else its span's,
 * cached on it. May throw (a context's or span's getters).
 */
function refresh(ctx, cached) {
  if (cached !== undefined && cached !== NO_SPAN && spanRecords.isFresh(cached)) return cached;
  const record = typeof ctx.getValue === 'function' ? (spanRecords.recordOf(trace.getSpan(ctx)) ?? NO_SPAN) : NO_SPAN;
  ContextRecordSlot.set(ctx, prepare(record));
  return record;
}

let failureReported = false;

/**
 * A context whose span could not be read (a throwing getter, Proxy trap,
 * getValue or spanContext) publishes no span; the first such failure on
 * the thread is reported through diag. Cannot throw.
 */
function publishFailure(ctx, error) {
  publish(NO_SPAN);
  try {
    ContextRecordSlot.set(ctx, NO_SPAN);
  } catch {
    // Not an object: nothing to remember.
  }
  if (failureReported) return;
  failureReported = true;
  try {
    diag.warn(`otel-thread-ctx: a context's span could not be read, no span is published for it: ${error}`);
  } catch {
    // A throwing diag logger or error (toString): nothing else to report to.
  }
}

/**
 * Publishes the span of `ctx`, whatever `ctx` is. Runs inside async hooks,
 * so it cannot throw (try/catch costs nothing on the path that does not
 * throw). The hot path, a context seen before whose span's class reports
 * its changes, is a private-field load, two checks and the pointer store;
 * a record whose span ended publishes `valid = 0` from where it is, as its
 * span's end() wrote it.
 */
function publishContext(ctx) {
  try {
    let record = NO_SPAN;
    if (typeof ctx === 'object' && ctx !== null) {
      record = ContextRecordSlot.get(ctx);
      if (record === undefined || (record !== NO_SPAN && (record.schema !== schema || !record.observed))) record = refresh(ctx, record);
    }
    publish(record);
  } catch (error) {
    publishFailure(ctx, error);
  }
}

/** Publishes `record` again (the pointer's record before a with() call). Cannot throw. */
function republish(record) {
  try {
    if (record !== NO_SPAN && (record.schema !== schema || !record.observed) && !spanRecords.isFresh(record)) {
      record = prepare(spanRecords.recordOf(record.span) ?? NO_SPAN);
    }
    publish(record);
  } catch (error) {
    publishFailure(record.span, error);
  }
}

/** Makes `manager` (record mode) the thread's publisher. */
function activate(manager) {
  schema = manager._attributeSchema;
  spanRecords.configure(schema);
  continuations.activate(manager, publishContext);
  binding.setClearOnIdle(true);
  publishContext(manager.active());
}

/** Stops `manager` publishing records; the pointer is left at the thread's own record, invalid. */
function deactivate(manager) {
  continuations.deactivate(manager);
  schema = null;
  spanRecords.configure(null);
  binding.setClearOnIdle(false);
  view.clear();
}

module.exports = { activate, deactivate, publishContext, republish, publishedRecord };
