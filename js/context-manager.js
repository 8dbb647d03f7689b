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

const { trace, isSpanContextValid } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const binding = require('./binding');
const view = require('./record-view');
const continuations = require('./continuations');

/** Per-context and per-span cache of the record entry (never enumerated). */
const kEntry = Symbol('otel-thread-ctx.entry');

function cache(holder, entry) {
  if (Object.isExtensible(holder)) {
    Object.defineProperty(holder, kEntry, { value: entry, writable: false, enumerable: false });
  }
  return entry;
}

function entryForSpan(span) {
  if (span === undefined) return view.NO_SPAN;
  const cached = span[kEntry];
  if (cached !== undefined) return cached;
  const sc = span.spanContext();
  const entry = isSpanContextValid(sc) ? view.entryFromIds(sc.traceId, sc.spanId, sc.traceFlags) : view.NO_SPAN;
  return cache(span, entry);
}

/** The record entry for a context: parsed once per span, then one property load. */
function entryForContext(ctx) {
  if (ctx === undefined || ctx === null) return view.NO_SPAN;
  const cached = ctx[kEntry];
  if (cached !== undefined) return cached;
  return cache(ctx, entryForSpan(trace.getSpan(ctx)));
}

/** The context whose span the record carries while JS runs on this thread. */
let publishedContext;

function publishContext(ctx) {
  publishedContext = ctx;
  view.publish(entryForContext(ctx));
}

class ProfilingContextManager extends AsyncLocalStorageContextManager {
  constructor() {
    super();
    this._publishing = false;
  }

  enable() {
    super.enable();
    if (!this._publishing) {
      this._publishing = true;
      continuations.activate(this, publishContext);
      binding.setClearOnIdle(true);
      publishContext(this._asyncLocalStorage.getStore());
    }
    return this;
  }

  disable() {
    if (this._publishing) {
      this._publishing = false;
      if (continuations.deactivate(this)) {
        binding.setClearOnIdle(false);
        publishedContext = undefined;
        view.publish(view.NO_SPAN);
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

module.exports = { ProfilingContextManager, entryForContext };
