'use strict';
// Record mode: the thread's one OTEP 4947 record (otel_thread_ctx_v1),
// kept equal to the active span whenever JavaScript runs.
//
// Where the active context changes, and who publishes it:
// - `with()` / `bind()` / `attach()`: the manager calls publishContext()
//   on entry and republish() on exit (exit by throw included);
// - a callback starting in a stored context (await continuation, timer,
//   immediate, nextTick, queueMicrotask, I/O callback): the hooks in
//   ../continuations.js call publishContext();
// - the event loop going idle: the native side clears the record from a
//   libuv prepare handle, right before the thread blocks (src/idle.rs).

const { diag, trace } = require('@opentelemetry/api');
const binding = require('../binding');
const view = require('../record-view');
const continuations = require('../continuations');
const sdkResource = require('../sdk-resource');
const localRoot = require('../local-root');

const { NO_SPAN, validFlags } = view;

/** Whether a record-mode manager publishes on this thread. */
let active = false;

/** Per-context and per-span cache of the record entry (never enumerated). */
const kEntry = Symbol('otel-thread-ctx.entry');

// A plain symbol-keyed property: far cheaper to add than
// Object.defineProperty (BENCHMARKS.md), and symbols stay out of for-in,
// Object.keys and JSON. Frozen or sealed objects are simply not cached.
function cache(holder, entry) {
  if (Object.isExtensible(holder)) holder[kEntry] = entry;
  return entry;
}

/** AttributeSchema of the publishing manager, or null when it publishes no attributes. */
let schema = null;

/**
 * Whether a cached entry can be published as is: its span not ended, built
 * for the current schema, and its span's configured attributes unchanged
 * since. `ended` is the SDK span's getter (other spans do not have it); once
 * it is true the context's cache becomes NO_SPAN, so ended spans cost this
 * check only once per context.
 */
function isFresh(entry) {
  if (entry === NO_SPAN) return true;
  return entry.schema === schema && entry.span.ended !== true && (schema === null || schema.isCurrent(entry.attributes));
}

function entryForSpan(span) {
  // Anything may be stored under the span key; only objects with a
  // spanContext() method are spans.
  if (typeof span !== 'object' || span === null || typeof span.spanContext !== 'function') return NO_SPAN;
  const cached = span[kEntry];
  if (cached !== undefined && isFresh(cached)) return cached;
  sdkResource.onNewSpan(span);
  // A span outside its lifetime is never published.
  if (span.ended === true) return cache(span, NO_SPAN);
  const sc = span.spanContext();
  if (typeof sc !== 'object' || sc === null) return cache(span, NO_SPAN);
  const flags = validFlags(sc.traceFlags);
  // entryFromIds returns NO_SPAN for malformed or all-zero (invalid) ids.
  let entry = flags < 0 ? NO_SPAN : view.entryFromIds(sc.traceId, sc.spanId, flags);
  if (entry === NO_SPAN) return cache(span, entry);
  if (schema !== null) entry = view.withAttributes(entry, schema, schema.encode(span));
  entry.span = span;
  return cache(span, entry);
}

/**
 * The record entry for a context not cached yet (or cached stale): read from
 * its span, then cached on the context. Any value may be a context, as with
 * the stock manager: only objects with a getValue() method (OpenTelemetry
 * contexts) can carry a span.
 */
function lookupEntry(ctx) {
  if (typeof ctx !== 'object' || ctx === null) return NO_SPAN;
  if (typeof ctx.getValue !== 'function') return cache(ctx, NO_SPAN);
  return cache(ctx, entryForSpan(trace.getSpan(ctx)));
}

let failureReported = false;

/**
 * A context whose span could not be read (a throwing getter, Proxy trap,
 * getValue or spanContext) publishes no span; the first such failure on
 * the thread is reported through diag. Cannot throw.
 */
function publishFailure(ctx, error) {
  view.publish(NO_SPAN);
  try {
    cache(ctx, NO_SPAN);
  } catch {
    // A Proxy refusing the property: the lookup is simply repeated next time.
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
 * so it cannot throw: a Proxy context can throw even from the cached-entry
 * load, which no cheaper check rules out, and try/catch costs nothing on
 * the path that does not throw. The hot path is one cached load
 * (primitives have no such key), the freshness check and the record's
 * stores; no object is stored into long-lived state except when an entry
 * takes its slot in the writer's ring (./record-view.js).
 */
function publishContext(ctx) {
  try {
    const cached = ctx?.[kEntry];
    view.publish(cached !== undefined && isFresh(cached) ? cached : lookupEntry(ctx));
  } catch (error) {
    publishFailure(ctx, error);
  }
}

/**
 * Publishes `entry` again (the record's entry before a with() call), or
 * what its span publishes now if it went stale meanwhile. Cannot throw.
 */
function republish(entry) {
  try {
    view.publish(isFresh(entry) ? entry : entryForSpan(entry.span));
  } catch (error) {
    publishFailure(entry.span, error);
  }
}

/**
 * Called as a span ends (ProcessContextSpanProcessor.onEnd): if the record
 * carries that span, it stops now rather than at the next context switch,
 * so the code after `span.end()` is not attributed to the span. Cannot throw.
 */
function spanEnded(span) {
  if (active && view.publishedEntry().span === span) view.publish(NO_SPAN);
}

/**
 * A local root's endpoint changed (a late `http.route`): the record follows
 * now if it carries a span of that tree; other contexts of the tree follow
 * when resumed (their cached entries are stale by the root's version).
 * Cannot throw.
 */
function endpointChanged(root) {
  try {
    const entry = view.publishedEntry();
    if (entry !== NO_SPAN && entry.attributes !== null && entry.attributes.root === root) republish(entry);
  } catch {
    // Nothing to do: the next switch publishes the new endpoint.
  }
}

/** Makes `manager` (record mode) the thread's publisher. */
function activate(manager) {
  active = true;
  continuations.activate(manager, publishContext);
  schema = manager._attributeSchema;
  localRoot.configure(schema === null ? [] : schema.endpointKeys, endpointChanged);
  binding.setClearOnIdle(true);
  publishContext(manager.active());
}

/** Stops `manager` publishing records; the record is left invalid. */
function deactivate(manager) {
  active = false;
  continuations.deactivate(manager);
  schema = null;
  localRoot.configure([], null);
  binding.setClearOnIdle(false);
  view.publish(NO_SPAN);
}

module.exports = {
  NO_SPAN,
  activate,
  deactivate,
  publishContext,
  republish,
  spanEnded,
  publishedEntry: view.publishedEntry,
  publishNoSpan: view.publishNoSpan,
};
