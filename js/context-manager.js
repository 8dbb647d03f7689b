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

const { diag, trace } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const binding = require('./binding');
const view = require('./record-view');
const continuations = require('./continuations');
const { AttributeSchema, validateKeys } = require('./span-attributes');
const sdkResource = require('./sdk-resource');

const { NO_SPAN } = view;

/** Per-context and per-span cache of the record entry (never enumerated). */
const kEntry = Symbol('otel-thread-ctx.entry');

// A plain symbol-keyed property: about ten times cheaper to add than
// Object.defineProperty, and symbols stay out of for-in, Object.keys and
// JSON. Frozen or sealed objects are simply not cached.
function cache(holder, entry) {
  if (Object.isExtensible(holder)) holder[kEntry] = entry;
  return entry;
}

/** AttributeSchema of the publishing manager, or null when it publishes no attributes. */
let schema = null;

/**
 * Whether a cached entry can be published as is: built for the current
 * schema, and its span's configured attributes unchanged since.
 */
function isFresh(entry) {
  // NO_SPAN (schema null) is checked last: without attributes configured
  // every other entry passes on the first comparison.
  if (entry.schema === schema) return schema === null || schema.isCurrent(entry.attributes);
  return entry === NO_SPAN;
}

function entryForSpan(span) {
  if (span === undefined) return NO_SPAN;
  const cached = span[kEntry];
  if (cached !== undefined && isFresh(cached)) return cached;
  sdkResource.onNewSpan(span);
  const sc = span.spanContext();
  // entryFromIds returns NO_SPAN for malformed or all-zero (invalid) ids.
  const entry = view.entryFromIds(sc.traceId, sc.spanId, sc.traceFlags);
  if (entry === NO_SPAN || schema === null) return cache(span, entry);
  return cache(span, view.withAttributes(entry, schema, schema.encode(span)));
}

/**
 * The record entry for a context: parsed once per span, then one property
 * load (plus, with attributes configured, one comparison per attribute).
 */
function entryForContext(ctx) {
  if (ctx === undefined || ctx === null) return NO_SPAN;
  const cached = ctx[kEntry];
  if (cached !== undefined && isFresh(cached)) return cached;
  return cache(ctx, entryForSpan(trace.getSpan(ctx)));
}

/** The context whose span the record carries while JS runs on this thread. */
let publishedContext;

function publishContext(ctx) {
  // Callbacks of one request often run back to back; skipping the
  // unchanged store saves its write barrier.
  if (ctx !== publishedContext) publishedContext = ctx;
  view.publish(entryForContext(ctx));
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
    this._publishing = false;
    this._attributeSchema = keys.length === 0 ? null : new AttributeSchema(keys);
  }

  enable() {
    super.enable();
    if (!this._publishing) {
      this._publishing = true;
      const replaced = continuations.activate(this, publishContext);
      // Only the most recently enabled manager of a thread publishes.
      if (replaced !== null && replaced !== this) replaced._publishing = false;
      schema = this._attributeSchema;
      binding.setClearOnIdle(true);
      publishMinimalProcessContext();
      publishContext(this._asyncLocalStorage.getStore());
    }
    return this;
  }

  disable() {
    if (this._publishing) {
      this._publishing = false;
      if (continuations.deactivate(this)) {
        schema = null;
        binding.setClearOnIdle(false);
        publishedContext = undefined;
        view.publish(NO_SPAN);
      }
    }
    return super.disable();
  }

  with(context, fn, thisArg, ...args) {
    if (!this._publishing) return super.with(context, fn, thisArg, ...args);
    const cb = thisArg == null ? fn : fn.bind(thisArg);
    const outer = publishedContext;
    publishContext(context);
    try {
      return this._asyncLocalStorage.run(context, cb, ...args);
    } finally {
      publishContext(outer);
    }
  }

  attach(context) {
    const token = super.attach(context);
    if (!this._publishing) return token;
    publishContext(context);
    const manager = this;
    const dispose = () => {
      token.dispose();
      if (manager._publishing) publishContext(manager._asyncLocalStorage.getStore());
    };
    const wrapped = { dispose };
    if (typeof Symbol.dispose === 'symbol') wrapped[Symbol.dispose] = dispose;
    return wrapped;
  }
}

module.exports = { ProfilingContextManager };
