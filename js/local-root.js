'use strict';
// The local root of a span: the first span of its trace in this process
// (one without a parent, or with a remote one). Every span under it shares
// one LocalRoot, which holds the endpoint attributes (`http.route`, ...)
// that the records of the whole tree publish, so a sample taken in a child
// span still says which endpoint it serves.
//
// Nothing here runs per context switch, and nothing observable is added to
// spans. A published span's LocalRoot is held by its record
// (./span-records.js); only the span processor, which sees spans before
// any record exists, keeps it in a private field of the span
// (./hidden-state.js). A LocalRoot's `version`
// changes when its endpoint attributes change, and the records of its tree
// are rewritten then (./span-records.js), since a frame resumes without
// running anything.
//
// Which span is the local root:
// - exactly, from ProcessContextSpanProcessor.onStart (it is given the
//   parent context);
// - otherwise, when a span is first published: its parent is the active
//   span at that moment when their ids match (startActiveSpan, and
//   `context.with(trace.setSpan(...))` as instrumentations do), and the
//   active span's record already holds the tree's LocalRoot; a span whose
//   local parent cannot be found is its own local root.
//
// Where the endpoint comes from: the local root's own value once it has
// one; until then, the latest value a span of its tree carried (Express's
// instrumentation sets `http.route` on its handler spans, and on the
// server span only as the response ends).
//
// Across threads: a span whose parent is in another thread of this process
// (a worker given the trace context by message) has a remote parent. While
// more than one thread has the addon loaded, each local root is also put in
// the process's trace-root table (src/trace_roots.rs), and a span with a
// parent but no local one joins the root found there for its trace: the
// request's local root id and its endpoint as they are at that moment.

const { context: contextApi, trace } = require('@opentelemetry/api');
const binding = require('./binding');
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
    stampedAny = true;
  }
}
const roots = LocalRootSlot;

/**
 * Whether any span was given a LocalRoot in its own private field (the
 * span processor's path): until then no span has one, and a span's first
 * record skips the lookup (a private-field check on an object of another
 * class is one of the costlier steps of a new span).
 */
let stampedAny = false;

/** The LocalRoot stamped on `span` by the span processor's path, or undefined. */
function stampedRoot(span) {
  return stampedAny ? roots.get(span) : undefined;
}

/** A span's record (./span-records.js), or null/undefined: set by configure(). */
let recordOfSpan = () => undefined;
/** The active context's record (./span-records.js), or null: set by configure(). */
let activeRecord = () => null;

/** The LocalRoot `span` already has, stamped or held by its record, else undefined. */
function heldRoot(span) {
  const stamped = stampedRoot(span);
  if (stamped !== undefined) return stamped;
  const record = recordOfSpan(span);
  return record !== undefined && record !== null && record.root !== null ? record.root : undefined;
}

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

/** How long the answer of otherThreadsMayAsk() is kept. */
const THREADS_RECHECK_MS = 1000;
let otherThreadsKnown = false;
let otherThreadsCheckedAt = -Infinity;

/**
 * Whether another thread of this process has the addon loaded, and so may
 * look a trace's local root up: asked of the registry at most once a
 * second, so a process with one JS thread pays nothing per span.
 */
function otherThreadsMayAsk() {
  const now = Date.now();
  if (now - otherThreadsCheckedAt >= THREADS_RECHECK_MS) {
    otherThreadsCheckedAt = now;
    try {
      otherThreadsKnown = binding.registryStats().attached > 1;
    } catch {
      otherThreadsKnown = false;
    }
  }
  return otherThreadsKnown;
}

class LocalRoot {
  constructor(span, spanId) {
    /** The local root span itself until it ends (then null: nothing keeps it alive through here). */
    this.span = span;
    /** Lowercase hex, as published. */
    this.spanId = spanId;
    /** The trace's id (lowercase hex) while in the process's trace-root table, else null. */
    this.sharedAs = null;
    /** Joined from another thread's root: its values are that root's, never this thread's spans'. */
    this.inherited = false;
    /** Bumped whenever `endpoint` changes. */
    this.version = 0;
    /**
     * The endpoint values as [key, text, fromRoot] triples, null until the
     * first; `fromRoot`: the value came from the local root itself, which
     * then wins. A tree has one or two endpoint keys: a short array scanned
     * by key allocates less per request than a Map and a Set.
     */
    this.endpoint = null;
    /** The first of the live records of the tree, linked through `nextInTree` (./span-records.js). */
    this.records = null;
  }

  /** Where `key`'s triple starts in `endpoint`, or -1. */
  indexOf(key) {
    const endpoint = this.endpoint;
    if (endpoint !== null) {
      for (let i = 0; i < endpoint.length; i += 3) if (endpoint[i] === key) return i;
    }
    return -1;
  }

  /** The endpoint value of `key`, or undefined. */
  value(key) {
    const at = this.indexOf(key);
    return at < 0 ? undefined : this.endpoint[at + 1];
  }

  /**
   * Sets `key`'s value, `own` when it came from the local root itself; a
   * value the local root set is kept against any other span's. Returns
   * whether the value changed.
   */
  put(key, text, own) {
    const at = this.indexOf(key);
    if (at < 0) {
      // The first triple as a literal: an empty array's first push would
      // reserve room for many more.
      if (this.endpoint === null) this.endpoint = [key, text, own];
      else this.endpoint.push(key, text, own);
      return true;
    }
    const endpoint = this.endpoint;
    if (own) endpoint[at + 2] = true;
    else if (endpoint[at + 2] === true) return false;
    if (endpoint[at + 1] === text) return false;
    endpoint[at + 1] = text;
    return true;
  }

  /** Takes the endpoint attributes `span` (of this tree) carries now. Cannot throw. */
  note(span) {
    try {
      const attributes = span.attributes;
      if (attributes === null || typeof attributes !== 'object') return;
      if (this.inherited) return;
      const own = span === this.span;
      let bumped = false;
      for (let i = 0; i < endpointKeys.length; i++) {
        const key = endpointKeys[i];
        const text = attributeText(attributes[key]);
        if (text !== undefined && this.put(key, text, own)) bumped = true;
      }
      if (bumped) {
        this.version++;
        if (this.sharedAs !== null) share(this, this.sharedAs);
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

/** `span` joins `root` without a field of its own: its record holds the root. */
function join(span, root) {
  root.note(span);
  return root;
}

/** The trace id of `span` in lowercase hex, or '' when it has none. */
function traceIdOf(span) {
  const sc = span.spanContext();
  return typeof sc === 'object' && sc !== null && typeof sc.traceId === 'string' ? sc.traceId.toLowerCase() : '';
}

/** Puts `root` in the process's trace-root table as trace `traceId`'s. Cannot throw. */
function share(root, traceId) {
  try {
    const values = [];
    const endpoint = root.endpoint;
    if (endpoint !== null) for (let i = 0; i < endpoint.length; i += 3) values.push(endpoint[i], endpoint[i + 1]);
    binding.traceRootPublish(traceId, root.spanId, values);
    root.sharedAs = traceId;
  } catch {
    // Ids the table refuses (not hex): the root stays this thread's own.
    root.sharedAs = null;
  }
}

/** Whether `span` has a parent at all (local or remote). */
function hasParent(span) {
  const parent = span.parentSpanContext;
  if (typeof parent === 'object' && parent !== null) return typeof parent.spanId === 'string';
  const id = span.parentSpanId;
  return typeof id === 'string' && id !== '';
}

/**
 * A LocalRoot for `span`, whose parent is not in this thread: another
 * thread's root of its trace when the table has one, else `span` itself,
 * put in the table while other threads may ask.
 */
function newLocalRoot(span, place = assign) {
  const mayAsk = otherThreadsMayAsk();
  const traceId = mayAsk ? traceIdOf(span) : '';
  if (traceId !== '' && hasParent(span)) {
    let found = null;
    try {
      found = binding.traceRootFind(traceId);
    } catch {
      // Not a hex id: no other thread could have published it.
    }
    if (found !== null && found !== undefined) {
      const root = new LocalRoot(span, found.rootSpanId);
      root.inherited = true;
      const texts = found.values;
      for (let i = 0; i + 1 < texts.length; i += 2) root.put(texts[i], texts[i + 1], true);
      return place(span, root);
    }
  }
  const root = place(span, new LocalRoot(span, spanIdOf(span)));
  if (traceId !== '') share(root, traceId);
  return root;
}

/**
 * The LocalRoot of `span`, found the first time. `parentSpan` is the span
 * of the context it started in when known (the span processor's), else
 * undefined: the active span is tried.
 */
function localRootOf(span, parentSpan) {
  const cached = heldRoot(span);
  if (cached !== undefined) return cached;
  const parentId = parentIdOf(span);
  if (parentId !== null) {
    const candidate = parentSpan !== undefined ? parentSpan : trace.getSpan(contextApi.active());
    if (candidate !== undefined && candidate !== null && candidate !== span && typeof candidate.spanContext === 'function' && sameId(spanIdOf(candidate), parentId)) {
      return assign(span, localRootOf(candidate, null));
    }
  }
  return newLocalRoot(span);
}

/**
 * The LocalRoot of a span being given its first record, found as
 * localRootOf() finds it but kept in the record only: the active context's
 * record says which tree its span belongs to (its `root`) and the span's id
 * (`spanId`) without asking the span, after the span ended too.
 */
function localRootForRecord(span) {
  const stamped = stampedRoot(span);
  if (stamped !== undefined) return stamped;
  const parentId = parentIdOf(span);
  if (parentId !== null) {
    const record = activeRecord();
    if (record !== null && record.root !== null) {
      if (record.span !== span && (record.spanId === parentId || sameId(String(record.spanId).toLowerCase(), parentId))) {
        return join(span, record.root);
      }
    } else {
      // The active context has no record of ours with a tree (the manager
      // began publishing inside it): ask its span.
      const candidate = trace.getSpan(contextApi.active());
      if (typeof candidate === 'object' && candidate !== null && candidate !== span && typeof candidate.spanContext === 'function' && sameId(spanIdOf(candidate), parentId)) {
        return join(span, localRootOf(candidate, null));
      }
    }
  }
  return newLocalRoot(span, join);
}

/**
 * `span` ended (`root`: the LocalRoot its record holds, or undefined): if
 * it is a local root, it lets go of the span, and leaves the process's
 * trace-root table if it is there. Cannot throw.
 */
function spanEnded(span, root = undefined) {
  try {
    if (root === undefined || root === null) root = stampedRoot(span);
    if (root === undefined || root.span !== span) return;
    root.span = null;
    if (root.sharedAs === null) return;
    const traceId = root.sharedAs;
    root.sharedAs = null;
    binding.traceRootWithdraw(traceId, root.spanId);
  } catch {
    // Not an object, or the table refused: the entry gives way in time.
  }
}

/** The LocalRoot of `span` if one was found already (`record`: its record, if any), else undefined. */
function knownLocalRoot(span, record = undefined) {
  if (record !== undefined && record !== null && record.root !== null) return record.root;
  return stampedRoot(span);
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

/**
 * Sets the endpoint keys (a new publishing schema), the change listener,
 * how a span's record is found (`recordOf(span)`: it, or null/undefined)
 * and the active context's (`activeRecordNow()`: it, or null).
 */
function configure(keys, onChange, recordOf, activeRecordNow) {
  endpointKeys = keys;
  changed = onChange;
  recordOfSpan = recordOf;
  activeRecord = activeRecordNow;
}

module.exports = { localRootOf, localRootForRecord, knownLocalRoot, spanStarted, spanEnded, configure, attributeText };
