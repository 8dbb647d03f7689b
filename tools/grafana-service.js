'use strict';
// The Express service of the Grafana end-to-end check (tools/grafana-check.js):
// traced with NodeTracerProvider, the http and Express instrumentations,
// ProfilingContextManager and ProfileIdSpanProcessor (`PROFILE_ID_SPANS`:
// 'local-roots' or 'all'). Two busy routes, each doing its CPU work in a
// child span and a function of its own: GET /sort in `sortNumbers` (span
// "sortBigArray"), GET /hash in `hashStrings` (span "hashStrings").
// Prints {"pid", "port", "mode"} once listening on 127.0.0.1, then one line
// {"span": {name, traceId, spanId, parentSpanId, profileId}} per ended span.
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..');
const fromRoot = require('node:module').createRequire(path.join(ROOT, 'index.js'));
const api = fromRoot('@opentelemetry/api');
const { NodeTracerProvider } = fromRoot('@opentelemetry/sdk-trace-node');
const { SimpleSpanProcessor } = fromRoot('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = fromRoot('@opentelemetry/resources');
const { ExportResultCode } = fromRoot('@opentelemetry/core');
const { registerInstrumentations } = fromRoot('@opentelemetry/instrumentation');
const { HttpInstrumentation } = fromRoot('@opentelemetry/instrumentation-http');
const { ExpressInstrumentation } = fromRoot('@opentelemetry/instrumentation-express');
const { ProfilingContextManager, ProfileIdSpanProcessor, publishProcessContext, threadInfo } = fromRoot('.');

const SERVICE_NAME = process.env.SERVICE_NAME || 'grafana-check';
const BUSY_MS = Number(process.env.BUSY_MS || 300);

/** Writes every ended span as one JSON line (what Tempo would receive). */
class LineExporter {
  export(spans, done) {
    for (const s of spans) {
      const sc = s.spanContext();
      const span = {
        name: s.name,
        traceId: sc.traceId,
        spanId: sc.spanId,
        parentSpanId: s.parentSpanContext?.spanId ?? s.parentSpanId ?? null,
        route: s.attributes['http.route'] ?? null,
        profileId: s.attributes['pyroscope.profile.id'] ?? null,
      };
      process.stdout.write(`${JSON.stringify({ span })}\n`);
    }
    done({ code: ExportResultCode.SUCCESS });
  }
  shutdown() {
    return Promise.resolve();
  }
}

publishProcessContext({ resource: { 'service.name': SERVICE_NAME } });
new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': SERVICE_NAME }),
  spanProcessors: [new ProfileIdSpanProcessor({ spans: process.env.PROFILE_ID_SPANS || 'local-roots' }), new SimpleSpanProcessor(new LineExporter())],
}).register({ contextManager: new ProfilingContextManager() });
registerInstrumentations({ instrumentations: [new HttpInstrumentation(), new ExpressInstrumentation()] });
const tracer = api.trace.getTracer('grafana-service');

// Required after the instrumentations are registered, so they are patched.
const express = fromRoot('express');

function sortNumbers(ms) {
  const end = Date.now() + ms;
  let median = 0;
  while (Date.now() < end) {
    const numbers = Array.from({ length: 20000 }, (_, i) => (i * 7919 + end) % 100003);
    numbers.sort((a, b) => a - b);
    median = numbers[10000];
  }
  return median;
}

function hashStrings(ms) {
  const end = Date.now() + ms;
  let h = 0;
  while (Date.now() < end) {
    for (let i = 0; i < 20000; i++) h = (Math.imul(h, 31) + i * 2654435761) | 0;
  }
  return h;
}

// The check looks for these functions in flame graphs: a function V8 may
// not optimize is never inlined into its caller, so its frame stays.
require('node:v8').setFlagsFromString('--allow-natives-syntax');
new Function('f', 'g', '%NeverOptimizeFunction(f); %NeverOptimizeFunction(g)')(sortNumbers, hashStrings);

function busy(name, fn) {
  return (req, res) => {
    const result = tracer.startActiveSpan(name, (span) => {
      try {
        return fn(BUSY_MS);
      } finally {
        span.end();
      }
    });
    res.json({ result });
  };
}

const app = express();
app.get('/sort', busy('sortBigArray', sortNumbers));
app.get('/hash', busy('hashStrings', hashStrings));

const server = app.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ pid: process.pid, port: server.address().port, mode: threadInfo().mode }));
});
