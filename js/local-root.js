'use strict';
// The local root of a span: the first span of its trace in this process
// (one without a parent, or with a remote one). Every span under it shares
// one LocalRoot, which holds the endpoint attributes (`http.route`, ...)
// that the records of the whole tree publish, so a sample taken in a child
// span still says which endpoint it serves.
//
// Nothing here runs per context switch, and nothing observable is added to
// spans: a span's LocalRoot is held in a private field (./hidden-state.js). A LocalRoot's `version`
// changes when its endpoint attributes change, and the records of its tree
// are rewritten then (./span-records.js), since a frame resumes without
// running anything.
//
// Which span is the local root:
// - exactly, from ProcessContextSpanProcessor.onStart (it is given the
//   parent context);
// - otherwise, when a span is first published: its parent is the active
//   span at that moment when their ids match (startActiveSpan, and
//   `context.with(trace.setSpan(...))` as instrumentations do); a span whose
//   local parent cannot be found is its own local root.
//
// Where the endpoint comes from: the local root's own value once it has
// one; until then, the latest value a span of its tree carried (Express's
// instrumentation sets `http.route` on its handler spans, and on the
// server span only as the response ends).

const { context: contextApi, trace } = require('@opentelemetry/api');
const { Stamp } = require('./hidden-state');

/** Each span's LocalRoot, once found, in a private field of the span. */
class LocalRootSlot extends Stamp {
  #root;

  constructor(span, root) {
    super(span);
    this.#root = root;
  }

  /** The LocalRoot of `span` (an object), undefined until found. */
  static get(span) {
    return #root in span ? span.#root : undefined;
  }

  /** Set once per span. */
  static set(span, root) {
    if (!(#root in span)) new LocalRootSlot(span, root);
  }
}
const roots = LocalRootSlot;

/** The endpoint keys (set by the publishing manager's schema). */
let endpointKeys = [];
/** Called after a LocalRoot's endpoint changed (./span-records.js). */
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
    /** The first of the live records of the tree, linked through `nextInTree` (./span-records.js). */
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
      for (let i = 0; i < endpointKeys.length; i++) {
        const key = endpointKeys[i];
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

/**
 * The parent span context of an SDK span (2.x: parentSpanContext, 1.x:
 * parentSpanId), or null: `{ spanId, isRemote }` as the SDK holds it, or
 * the 1.x id string. Allocates nothing.
 */
function parentIdOf(span) {
  const parent = span.parentSpanContext;
  if (typeof parent === 'object' && parent !== null) {
    return typeof parent.spanId === 'string' && parent.isRemote !== true ? parent.spanId : null;
  }
  const id = span.parentSpanId;
  return typeof id === 'string' && id !== '' ? id : null;
}

function spanIdOf(span) {
  const sc = span.spanContext();
  return typeof sc === 'object' && sc !== null && typeof sc.spanId === 'string' ? sc.spanId.toLowerCase() : '';
}

/** Whether hex ids `a` (lowercase) and `b` (any case) are the same. */
function sameId(a, b) {
  return a === b || a === b.toLowerCase();
}

function assign(span, root) {
  roots.set(span, root);
  root.note(span);
  return root;
}

/**
 * The LocalRoot of `span`, found the first time. `parentSpan` is the span
 * of the context it started in when known (the span processor's), else
 * undefined: the active span is tried.
 */
function localRootOf(span, parentSpan) {
  const cached = roots.get(span);
  if (cached !== undefined) return cached;
  const parentId = parentIdOf(span);
  if (parentId !== null) {
    const candidate = parentSpan !== undefined ? parentSpan : trace.getSpan(contextApi.active());
    if (candidate !== undefined && candidate !== null && candidate !== span && typeof candidate.spanContext === 'function' && sameId(spanIdOf(candidate), parentId)) {
      return assign(span, localRootOf(candidate, null));
    }
  }
  return assign(span, new LocalRoot(span, spanIdOf(span)));
}

/** The LocalRoot of `span` if one was found already, else undefined. */
function knownLocalRoot(span) {
  return roots.get(span);
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

/** Sets the endpoint keys (a new publishing schema) and the change listener. */
function configure(keys, onChange) {
  endpointKeys = keys;
  changed = onChange;
}

module.exports = { localRootOf, knownLocalRoot, spanStarted, configure, attributeText };
