'use strict';
// The Datadog peer: the stock manager driving Datadog's nodejs_v1_dev
// writer (@datadog/pprof's otelThreadCtx, a native record per context kept
// in an AsyncLocalStorage of its own) the way a tracer drives it:
// - one native ThreadContext per span, made the first time the span is
//   entered (its ids, its flags, no attributes) and found afterwards in a
//   private field of the span: a tracer keeps it on its own span object,
//   and a private field is that without a property the application sees
//   (a WeakMap would add the garbage collector's cost of an ephemeron per
//   span, which a tracer does not pay);
// - with() of a context that has a span runs inside that ThreadContext's
//   run(), so the writer's storage follows the same frames as the stock
//   one; a context without a span enters nothing (the record stays the
//   outer span's, as with a tracer that activates spans only);
// - invalidate() when the span ends (a span processor's onEnd), as a tracer
//   does at span finish.
// The writer publishes only where AsyncLocalStorage runs on
// AsyncContextFrame (Node 24 and later by default); elsewhere the kind is
// unavailable (datadogUnavailable()).

const { trace } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');

let writer = null;

/** @datadog/pprof's otelThreadCtx, loaded once and only by the processes that use it. */
function otelThreadCtx() {
  writer ??= require('@datadog/pprof').otelThreadCtx;
  return writer;
}

/** Why the writer cannot publish in this process (its own check), or null when it can. */
function datadogUnavailable() {
  try {
    // Throws with the writer's reason when it cannot publish here.
    otelThreadCtx().getProcessContextAttributes([]);
    return null;
  } catch (err) {
    return err.message;
  }
}

/** The native context of each span entered so far. */
class ThreadContextSlot extends require('../../js/hidden-state').Stamp {
  #threadContext;

  constructor(span, threadContext) {
    super(span);
    this.#threadContext = threadContext;
  }

  static get(span) {
    return #threadContext in span ? span.#threadContext : undefined;
  }

  static set(span, threadContext) {
    if (!(#threadContext in span)) new ThreadContextSlot(span, threadContext);
  }
}
const threadContexts = ThreadContextSlot;

/** The ThreadContext of `span`, made on its first entry. */
function threadContextOf(span) {
  let tc = threadContexts.get(span);
  if (tc === undefined) {
    const sc = span.spanContext();
    // Buffers are Uint8Arrays; an OpenTelemetry span has its ids as hex only.
    tc = new (otelThreadCtx().ThreadContext)(Buffer.from(sc.traceId, 'hex'), Buffer.from(sc.spanId, 'hex'), sc.traceFlags);
    threadContexts.set(span, tc);
  }
  return tc;
}

class DatadogContextManager extends AsyncLocalStorageContextManager {
  constructor() {
    super();
    const reason = datadogUnavailable();
    if (reason !== null) throw new Error(`datadog: unavailable on Node ${process.versions.node}: ${reason}`);
    this._on = false;
    const manager = this;
    // Invalidates the span's record at span end. Added to the provider by
    // traceService (bench/lib/common.js); idle while another manager of a
    // switching process is the global one (switches happen with no request
    // in flight, so no span entered under this one ends under another).
    this.spanProcessor = {
      onStart() {},
      onEnd(span) {
        if (!manager._on) return;
        const tc = threadContexts.get(span);
        if (tc !== undefined) tc.invalidate();
      },
      forceFlush: () => Promise.resolve(),
      shutdown: () => Promise.resolve(),
    };
  }

  enable() {
    super.enable();
    this._on = true;
    return this;
  }

  disable() {
    this._on = false;
    return super.disable();
  }

  with(context, fn, thisArg, ...args) {
    const span = trace.getSpan(context);
    if (span === undefined) return super.with(context, fn, thisArg, ...args);
    return threadContextOf(span).run(() => super.with(context, fn, thisArg, ...args));
  }
}

module.exports = { DatadogContextManager, datadogUnavailable };
