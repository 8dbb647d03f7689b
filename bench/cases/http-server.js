'use strict';
// http: the server under load. With manager 'stock' or 'ours' it traces
// every request with the OpenTelemetry Node SDK (NodeTracerProvider, the
// http instrumentation, a BatchSpanProcessor with an exporter that drops the
// spans); with 'none' it runs the same handler without any tracing.
// The handler does a little JSON work and one await.
//
// Prints {"port", "pid", "managers"} (the kinds it has) once listening on
// 127.0.0.1; on stdin end or SIGTERM it prints {"spans"} (spans exported)
// and exits.
//
// params: { manager } (a kind, or a list of kinds to switch between:
// bench/lib/common.js, answerSwitches)

const { params, report, traceService, answerSwitches } = require('../lib/common');

const { manager } = params();
const tracing = traceService(manager, () => [new (require('@opentelemetry/instrumentation-http').HttpInstrumentation)()]);

// Required after the instrumentation is registered, so it is patched.
const http = require('node:http');

const TEMPLATE = JSON.stringify({
  user: { id: 0, name: 'benchmark', roles: ['reader', 'writer'] },
  items: Array.from({ length: 8 }, (_, i) => ({ sku: `item-${i}`, qty: i + 1, price: 9.5 * (i + 1) })),
});
let served = 0;

async function lookup(order) {
  return order.items.reduce((sum, item) => sum + item.qty * item.price, 0);
}

const server = http.createServer(async (req, res) => {
  const order = JSON.parse(TEMPLATE);
  order.user.id = ++served;
  order.total = await lookup(order);
  const body = JSON.stringify(order);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
});

server.listen(0, '127.0.0.1', () => {
  report({ port: server.address().port, pid: process.pid, managers: tracing.kinds });
});

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  server.close();
  server.closeAllConnections?.();
  report({ spans: await tracing.shutdown(), served });
  process.exit(0);
}
process.on('SIGTERM', stop);
if (Array.isArray(manager)) answerSwitches(tracing, stop);
else process.stdin.on('end', stop);
process.stdin.resume();
