'use strict';
// The local root of a span: the first span of its trace in this process
// (one without a parent, or with a remote one). Every span under it shares
// one LocalRoot, which holds the endpoint attributes (`http.route`, ...)
// that the records of the whole tree publish, so a sample taken in a child
// span still says which endpoint it serves.
//
// Nothing here runs per context switch. A LocalRoot's `version` changes
// when its endpoint attributes change; a cached encoding remembers the
// version it was encoded at, and the freshness check that already runs
// when a context is resumed compares the two (one load, one compare).
//
// Which span is the local root:
// - exactly, from ProcessContextSpanProcessor.onStart (it is given the
//   parent context);
// - otherwise, when a span is first encoded: its parent is the active
//   span at that moment when their ids match (startActiveSpan, and
//   `context.with(trace.setSpan(...))` as instrumentations do); a span whose
//   local parent cannot be found is its own local root.
//
// Where the endpoint comes from: the local root's own value once it has
// one; until then, the latest value a span of its tree carried (Express's
// instrumentation sets `http.route` on its handler spans, and on the
// server span only as the response ends).

const { context: contextApi, trace } = require('@opentelemetry/api');
const { methodObserver } = require('./span-methods');

const kLocalRoot = Symbol('otel-thread-ctx.local-root');

/** The endpoint keys (set by the publishing manager's schema). */
let endpointKeys = [];
/** Called after a LocalRoot's endpoint changed (the publishing mode's). */
let changed = null;

/** A value as published text, or undefined when it is not publishable. */
function attributeText(value) {
  switch (typeof value) {
    case 'string':
      return value;
    case 'number':
    case 'boolean':
    case 'bigint':
      return String(value);
    default:
      return undefined;
  }
}

class LocalRoot {
  constructor(span, spanId) {
    this.span = span;
    /** Lowercase hex, as published. */
    this.spanId = spanId;
    /** Bumped whenever `values` changes. */
    this.version = 0;
    /** Endpoint values by key (text); null until the first one. */
    this.values = null;
    /** Keys whose value came from the local root itself (it then wins); null until one did. */
    this.fromRoot = null;
    /** Its entries as the publishing schema encodes them, per version (span-attributes.js). */
    this.encoded = null;
    /** The span id as published bytes (set at its first encoding). */
    this.spanIdBytes = undefined;
    /** Frame mode: the live records of the tree, rewritten on a change. */
    this.records = null;
  }

  /** The endpoint value of `key`, or undefined. */
  value(key) {
    return this.values === null ? undefined : this.values.get(key);
  }

  /** Takes the endpoint attributes `span` (of this tree) carries now. Cannot throw. */
  note(span) {
    try {
      const attributes = span.attributes;
      if (attributes === null || typeof attributes !== 'object') return;
      const own = span === this.span;
      let bumped = false;
      for (const key of endpointKeys) {
        const text = attributeText(attributes[key]);
        if (text === undefined || (!own && this.fromRoot !== null && this.fromRoot.has(key))) continue;
        if (own) (this.fromRoot ??= new Set()).add(key);
        if (this.values !== null && this.values.get(key) === text) continue;
        (this.values ??= new Map()).set(key, text);
        bumped = true;
      }
      if (bumped) {
        this.version++;
        if (changed !== null) changed(this);
      }
    } catch {
      // A throwing attributes getter: the endpoint stays as it was.
    }
  }
}

/** The parent span id of an SDK span (2.x: parentSpanContext, 1.x: parentSpanId), with whether it is remote. */
function parentOf(span) {
  const parent = span.parentSpanContext;
  if (typeof parent === 'object' && parent !== null) {
    return typeof parent.spanId === 'string' ? { spanId: parent.spanId, remote: parent.isRemote === true } : null;
  }
  return typeof span.parentSpanId === 'string' && span.parentSpanId !== '' ? { spanId: span.parentSpanId, remote: false } : null;
}

function spanIdOf(span) {
  const sc = span.spanContext();
  return typeof sc === 'object' && sc !== null && typeof sc.spanId === 'string' ? sc.spanId.toLowerCase() : '';
}

function assign(span, root) {
  if (Object.isExtensible(span)) span[kLocalRoot] = root;
  observeSpanClass(span);
  root.note(span);
  return root;
}

/**
 * The LocalRoot of `span`, found (and cached on it) the first time.
 * `parentSpan` is the span of the context it started in when known (the
 * span processor's), else undefined: the active span is tried.
 */
function localRootOf(span, parentSpan) {
  const cached = span[kLocalRoot];
  if (cached !== undefined) return cached;
  const parent = parentOf(span);
  if (parent !== null && !parent.remote) {
    const candidate = parentSpan !== undefined ? parentSpan : trace.getSpan(contextApi.active());
    if (candidate !== undefined && candidate !== span && typeof candidate?.spanContext === 'function' && spanIdOf(candidate) === parent.spanId.toLowerCase()) {
      return assign(span, localRootOf(candidate, null));
    }
  }
  return assign(span, new LocalRoot(span, spanIdOf(span)));
}

/** ProcessContextSpanProcessor.onStart: the exact parent. Cannot throw. */
function spanStarted(span, parentContext) {
  try {
    if (typeof span !== 'object' || span === null || typeof span.spanContext !== 'function') return;
    const parentSpan = parentContext === undefined ? undefined : (trace.getSpan(parentContext) ?? null);
    localRootOf(span, parentSpan === null ? null : parentSpan);
  } catch {
    // Left to the first encoding.
  }
}

function afterEndpointChange(span) {
  try {
    const root = span?.[kLocalRoot];
    if (root !== undefined) root.note(span);
  } catch {
    // A Proxy span: its endpoint is read at its next encoding.
  }
}

/**
 * Makes `setAttribute()`/`setAttributes()` of `span`'s class pass new
 * endpoint values to the span's LocalRoot at once, so samples taken after
 * a late `http.route` carry it. Once per prototype (./span-methods.js); a
 * class that cannot be patched keeps the values its spans had when first
 * seen.
 */
const observeSpanClass = methodObserver([
  ['setAttribute', afterEndpointChange],
  ['setAttributes', afterEndpointChange],
]);

/** Sets the endpoint keys (a new publishing schema) and the change listener. */
function configure(keys, onChange) {
  endpointKeys = keys;
  changed = onChange;
}

module.exports = { localRootOf, spanStarted, configure, attributeText };
