'use strict';
// ProfilingContextManager: the stock AsyncLocalStorageContextManager, plus
// keeping this thread's OTEP 4947 record equal to the active span whenever
// JavaScript runs.
//
// Where the active context changes, and who publishes it:
// - `with()` / `bind()` / `attach()`: published here, synchronously, on
//   entry and on exit (exit by throw included).
// - a callback starting in a stored context (await continuation, timer,
//   immediate, nextTick, queueMicrotask, I/O callback): published by the
//   hooks in ./continuations.js.
// - the event loop going idle: the native side clears the record from a
//   libuv prepare handle, right before the thread blocks (src/idle.rs).

const { context: contextApi, diag, trace } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const binding = require('./binding');
const view = require('./record-view');
const continuations = require('./continuations');
const { AttributeSchema, validateKeys } = require('./span-attributes');
const sdkResource = require('./sdk-resource');

const { NO_SPAN } = view;

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

/**
 * A span's trace flags as published, or -1 when they are invalid. One rule
 * for the manager and the direct API: `undefined` means 0, anything but an
 * integer in 0..255 makes the span context invalid (the direct API throws
 * a RangeError, the manager publishes no span).
 */
function validFlags(traceFlags) {
  if (traceFlags === undefined) return 0;
  return typeof traceFlags === 'number' && (traceFlags & 0xff) === traceFlags ? traceFlags : -1;
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
  if (publisher !== null && view.publishedEntry().span === span) view.publish(NO_SPAN);
}

/**
 * Readers need `threadlocal.schema_version` to interpret the records, so an
 * enabled manager makes sure a process context exists. One published by the
 * application (or ProcessContextSpanProcessor) is left as it is.
 */
function publishMinimalProcessContext() {
  try {
    if (binding.processContextInfo() === null) binding.publishProcessContext({});
  } catch (err) {
    diag.warn(`otel-thread-ctx: cannot publish the process context: ${err.message}`);
  }
}

/**
 * This thread's enabled managers; the last one publishes. Disabling the
 * publisher hands publishing back to the most recently enabled one still
 * enabled.
 */
const enabledManagers = [];
let publisher = null;

/** The API's global context manager, or null where the API does not say. */
function registeredManager() {
  try {
    return typeof contextApi._getContextManager === 'function' ? contextApi._getContextManager() : null;
  } catch {
    return null;
  }
}

/**
 * Puts `manager` on the stack: on top, unless another enabled manager is the
 * API's global context manager. Then it goes just below that one, which
 * keeps publishing: the API refuses a second registration (a second
 * `provider.register()`), and the callbacks that run are the registered
 * manager's.
 */
function pushEnabled(manager) {
  const index = enabledManagers.indexOf(manager);
  if (index >= 0) enabledManagers.splice(index, 1);
  const registered = registeredManager();
  const below = registered !== manager && registered instanceof ProfilingContextManager ? enabledManagers.indexOf(registered) : -1;
  if (below >= 0) enabledManagers.splice(below, 0, manager);
  else enabledManagers.push(manager);
}

/** Makes the top of the stack the publisher (or stops publishing when it is empty). */
function updatePublisher() {
  const next = enabledManagers.length === 0 ? null : enabledManagers[enabledManagers.length - 1];
  if (next === publisher) return;
  const previous = publisher;
  if (previous !== null) previous._publishing = false;
  publisher = next;
  if (next === null) {
    continuations.deactivate(previous);
    schema = null;
    binding.setClearOnIdle(false);
    view.publish(NO_SPAN);
    return;
  }
  next._publishing = true;
  continuations.activate(next, publishContext);
  schema = next._attributeSchema;
  binding.setClearOnIdle(true);
  publishContext(next.active());
}

class ProfilingContextManager extends AsyncLocalStorageContextManager {
  /**
   * @param {{ attributes?: string[] }} [options] `attributes`: span attribute
   *   keys to publish in the record (e.g. 'http.route') when present.
   */
  constructor(options = {}) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('The "options" argument must be an object');
    }
    const keys = validateKeys(options.attributes);
    super();
    /** On this thread's stack of enabled managers. */
    this._enabled = false;
    /** The top of the stack: the manager whose contexts are published. */
    this._publishing = false;
    this._attributeSchema = keys.length === 0 ? null : new AttributeSchema(keys);
  }

  enable() {
    super.enable();
    if (!this._publishing) {
      if (!this._enabled) {
        // Keys first: registering them publishes the context if it is absent.
        this._attributeSchema?.registerAll();
        publishMinimalProcessContext();
      }
      this._enabled = true;
      pushEnabled(this);
      updatePublisher();
    }
    return this;
  }

  disable() {
    if (this._enabled) {
      this._enabled = false;
      enabledManagers.splice(enabledManagers.indexOf(this), 1);
      updatePublisher();
    }
    return super.disable();
  }

  with(context, fn, thisArg, ...args) {
    // The base class's body, with the publishing around it: super.with()
    // would add a call frame and repeat the bind check on the hottest path
    // (BENCHMARKS.md, "The upstream manager's surface").
    const cb = thisArg == null ? fn : fn.bind(thisArg);
    if (!this._publishing) return this._asyncLocalStorage.run(context, cb, ...args);
    const outer = view.publishedEntry();
    publishContext(context);
    try {
      return this._asyncLocalStorage.run(context, cb, ...args);
    } finally {
      // Leaving to no span (a with() at the root, as a request's first
      // is) needs no freshness check and no record write but the tail
      // word's: one call less, on the exit every request takes.
      if (outer === NO_SPAN) view.publishNoSpan();
      else republish(outer);
    }
  }

  attach(context) {
    const token = super.attach(context);
    if (!this._publishing) return token;
    publishContext(context);
    const manager = this;
    const dispose = () => {
      token.dispose();
      if (manager._publishing) publishContext(manager.active());
    };
    const wrapped = { dispose };
    if (typeof Symbol.dispose === 'symbol') wrapped[Symbol.dispose] = dispose;
    return wrapped;
  }
}

module.exports = { ProfilingContextManager, spanEnded };
