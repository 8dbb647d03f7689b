'use strict';
// The example's service: every request is traced (http and Express
// instrumentations, traces to the Collector over OTLP/HTTP), each thread
// publishes its active span for the profiler (ProfilingContextManager),
// and every local root span gets pyroscope.profile.id, so Grafana offers
// "Profiles for this span" on it. GET /sort is the busy route.
const { NodeSDK } = require('@opentelemetry/sdk-node');
const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { HttpInstrumentation } = require('@opentelemetry/instrumentation-http');
const { ExpressInstrumentation } = require('@opentelemetry/instrumentation-express');
const { ProfilingContextManager, ProfileIdSpanProcessor } = require('otel-thread-ctx');

// OTEL_SERVICE_NAME and OTEL_EXPORTER_OTLP_ENDPOINT come from the environment.
const sdk = new NodeSDK({
  contextManager: new ProfilingContextManager(),
  // Local roots (the default) to match the agent's --span-profiles root;
  // { spans: 'all' } with --span-profiles span.
  spanProcessors: [new ProfileIdSpanProcessor(), new BatchSpanProcessor(new OTLPTraceExporter())],
  instrumentations: [new HttpInstrumentation(), new ExpressInstrumentation()],
});
sdk.start();
process.once('SIGTERM', () => sdk.shutdown().finally(() => process.exit(0)));

// Required once the instrumentations are registered, so they patch it.
const express = require('express');
const { trace } = require('@opentelemetry/api');

const tracer = trace.getTracer('example');

function sortNumbers(count) {
  const numbers = Array.from({ length: count }, (_, i) => (i * 7919) % 100003);
  numbers.sort((a, b) => a - b);
  return numbers[count >> 1];
}

const app = express();
app.get('/sort', (req, res) => {
  const median = tracer.startActiveSpan('sortBigArray', (span) => {
    try {
      return sortNumbers(2_000_000);
    } finally {
      span.end();
    }
  });
  res.json({ median });
});
app.get('/ping', (req, res) => res.json({ ok: true }));
app.listen(8080, () => console.log('listening on :8080'));
