'use strict';
// Links traces to span profiles in Grafana: Grafana offers "Profiles for
// this span" from a trace only for spans that carry the attribute
// `pyroscope.profile.id` (16 hex digits), and sends that value as the span
// selector of its query to Pyroscope, which matches it against the span id
// each sample was labelled with. The profiler labels a sample with the
// span it ran in, or with that span's local root (the agent's and
// `profile`'s span-profile setting), so the spans that carry the attribute
// must match that choice:
// - 'local-roots' (the default, Grafana's convention): the first span of
//   the trace in this process (no parent, or a remote one, e.g. the HTTP
//   server span); its flame graph holds the work of every span under it;
// - 'all': every span, for profiles labelled with the innermost span.
// Spans of unsampled traces are never exported, so they are left alone.

const { trace, TraceFlags } = require('@opentelemetry/api');
const { warnUnknownOptions } = require('./warnings');

/** The attribute Grafana reads to link a span to its profile. */
const PROFILE_ID_ATTRIBUTE = 'pyroscope.profile.id';
const SPANS = ['local-roots', 'all'];

/** Whether a span started in `parentContext` is a local root: no parent span here, or a remote one. */
function startsLocalRoot(parentContext) {
  const parent = parentContext === undefined ? undefined : trace.getSpan(parentContext);
  if (parent === undefined) return true;
  const sc = parent.spanContext();
  return sc === undefined || sc === null || sc.isRemote === true;
}

class ProfileIdSpanProcessor {
  /**
   * @param {{ spans?: 'local-roots' | 'all' }} [options] which spans get
   *   `pyroscope.profile.id` (default 'local-roots').
   */
  constructor(options = {}) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('The "options" argument must be an object');
    }
    const spans = options.spans ?? 'local-roots';
    if (typeof spans !== 'string') throw new TypeError('The "spans" option must be "local-roots" or "all"');
    if (!SPANS.includes(spans)) throw new RangeError(`The "spans" option must be "local-roots" or "all", not "${spans}"`);
    warnUnknownOptions(options, ['spans'], 'ProfileIdSpanProcessor');
    this._allSpans = spans === 'all';
  }

  /** Which spans it marks: 'local-roots' or 'all'. */
  get spans() {
    return this._allSpans ? 'all' : 'local-roots';
  }

  onStart(span, parentContext) {
    // A span processor runs inside the SDK's startSpan: nothing it meets
    // (a throwing getter, a span class of another SDK) is thrown back.
    try {
      const sc = span.spanContext();
      if ((sc.traceFlags & TraceFlags.SAMPLED) === 0) return;
      if (!this._allSpans && !startsLocalRoot(parentContext)) return;
      span.setAttribute(PROFILE_ID_ATTRIBUTE, sc.spanId);
    } catch {
      // Left unmarked: Grafana offers no profile link for this span.
    }
  }

  onEnd() {}

  forceFlush() {
    return Promise.resolve();
  }

  shutdown() {
    return Promise.resolve();
  }
}

module.exports = { ProfileIdSpanProcessor, PROFILE_ID_ATTRIBUTE };
