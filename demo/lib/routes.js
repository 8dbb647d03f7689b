'use strict';
// The http.route of each span, as published in the records the samplers
// read (attrs_data), not as the service reports it.

const { decodeAttrs } = require('../../tools/record');

/**
 * Map(spanId -> route) from bpftrace stacks (the start of attrs_data, key
 * `routeKeyIndex`) and from profile's samples (attributes decoded by the
 * reader).
 */
function recordRoutes({ stackEntries, profileSamples, routeKeyIndex }) {
  const routes = new Map();
  for (const e of stackEntries) {
    for (const a of decodeAttrs(e.attrs, { prefix: true })) if (a.keyIndex === routeKeyIndex && e.spanId) routes.set(e.spanId, a.value.toString('utf8'));
  }
  for (const s of profileSamples) if (s.spanId && s.route) routes.set(s.spanId, s.route);
  return routes;
}

/** The route is published on the server span: Map(traceId -> route) gives it to every span of its trace. */
function traceRoutes(routes, spans) {
  const byTrace = new Map();
  for (const [spanId, route] of routes) {
    const info = spans.get(spanId);
    if (info) byTrace.set(info.traceId, route);
  }
  return byTrace;
}

module.exports = { recordRoutes, traceRoutes };
