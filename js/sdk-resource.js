'use strict';
// Zero-config process context: with `new NodeSDK({ contextManager })` alone,
// the tracer provider's Resource reaches the manager on the first span it
// publishes (SDK spans carry it as `span.resource`). It is published from
// that span on, without waiting for the span to end.
//
// The manager has it called with each span given its first record (once per
// span, not per context switch: ./span-records.js), and it stops for good
// once a Resource was seen. A Resource the application published itself
// (publishProcessContext with `resource`, or ProcessContextSpanProcessor,
// which sees spans before they become active), on this thread or any other,
// is left as it is.

const processContext = require('./process-context');

let watching = true;
let publisher = null;

const isPromiseLike = (v) => v !== null && typeof v === 'object' && typeof v.then === 'function';

/**
 * The attributes of a Resource whose async detectors have not settled yet:
 * the settled ones (the first value of a key wins, as in the SDK's own
 * `attributes`), read without the SDK's early-access error log.
 */
function settledAttributes(resource) {
  const attributes = {};
  for (const [key, value] of resource.getRawAttributes()) {
    if (value != null && !isPromiseLike(value)) attributes[key] ??= value;
  }
  return attributes;
}

/**
 * Looks at a span the manager publishes for the first time; whether it
 * wants to see more spans (false once a Resource was seen). Never throws.
 */
function onNewSpan(span) {
  if (!watching) return false;
  try {
    const resource = span.resource;
    if (resource == null || typeof resource !== 'object') return true;
    watching = false;
    // Another thread (the main one, say) may have published its Resource:
    // the process context is process-wide, so only an empty one is filled.
    if (processContext.resourcePublishedExplicitly() || processContext.processContextInfo()?.resourceAttributes > 0) return false;
    if (publisher === null) {
      publisher = new processContext.ProcessContextSpanProcessor();
      publisher._explicit = false;
    }
    // Publish what is known now; the processor publishes the whole
    // Resource again once its async detectors settle.
    if (resource.asyncAttributesPending && typeof resource.getRawAttributes === 'function') {
      publisher._publish({ attributes: settledAttributes(resource) });
    }
    publisher.onStart(span);
  } catch {
    // Runs inside context switches: never throw. The processor reports a
    // failed publication through diag itself.
    watching = false;
  }
  return watching;
}

module.exports = { onNewSpan };
