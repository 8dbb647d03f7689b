'use strict';
// fastify: a Fastify 5 server under load, with the http case's handler (a
// little JSON work and one await; Fastify serializes the returned object).
// Traced variants use the Node SDK (NodeTracerProvider, BatchSpanProcessor
// with an exporter that drops the spans) with what a Fastify user runs: the
// http instrumentation and @fastify/otel, Fastify's own instrumentation
// (registered through its `fastify.initialization` diagnostics channel; it
// brings its own @opentelemetry/instrumentation 0.222, and works with the
// SDK 2.x and instrumentation 0.223 of the others). Each request makes the
// http server span, @fastify/otel's request span and its handler span.
// 'none' runs the same server without any tracing.
//
// Prints {"port", "pid", "managers"} (the kinds it has) once listening on
// 127.0.0.1; on stdin end or SIGTERM it prints {"spans", "served"} and
// exits.
//
// params: { manager } (a kind, or a list of kinds to switch between:
// bench/lib/common.js, answerSwitches)

const { params, report, traceService, answerSwitches } = require('../lib/common');

const { manager } = params();
const tracing = traceService(manager, () => [
  new (require('@opentelemetry/instrumentation-http').HttpInstrumentation)(),
  new (require('@fastify/otel').FastifyOtelInstrumentation)({ registerOnInitialization: true }),
]);

// Required after the instrumentations are registered, so node:http is
// patched and @fastify/otel sees the instance created.
const fastify = require('fastify');

const TEMPLATE = JSON.stringify({
  user: { id: 0, name: 'benchmark', roles: ['reader', 'writer'] },
  items: Array.from({ length: 8 }, (_, i) => ({ sku: `item-${i}`, qty: i + 1, price: 9.5 * (i + 1) })),
});
let served = 0;

async function lookup(order) {
  return order.items.reduce((sum, item) => sum + item.qty * item.price, 0);
}

const app = fastify();
app.get('/', async () => {
  const order = JSON.parse(TEMPLATE);
  order.user.id = ++served;
  order.total = await lookup(order);
  return order;
});

app.listen({ port: 0, host: '127.0.0.1' }).then(() => {
  report({ port: app.server.address().port, pid: process.pid, managers: tracing.kinds });
});

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  app.server.close();
  app.server.closeAllConnections?.();
  report({ spans: await tracing.shutdown(), served });
  process.exit(0);
}
process.on('SIGTERM', stop);
if (Array.isArray(manager)) answerSwitches(tracing, stop);
else process.stdin.on('end', stop);
process.stdin.resume();
