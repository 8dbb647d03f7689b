'use strict';
// service: a small Express service under load. Every request goes through
// two middlewares to a handler that awaits an outgoing HTTP call to the
// loopback upstream (bench/cases/upstream.js, over a keep-alive agent),
// then builds and serializes a JSON reply. Traced variants use the Node SDK
// (NodeTracerProvider, BatchSpanProcessor with an exporter that drops the
// spans) with the http and Express instrumentations, so each request makes
// a server span, middleware and handler spans, and a client span; 'none'
// runs the same service without any tracing.
//
// Prints {"port", "pid", "managers"} (the kinds it has) once listening on
// 127.0.0.1; on stdin end it prints {"spans", "served"} and exits.
//
// params: { manager (a kind, or a list of kinds to switch between:
// bench/lib/common.js, answerSwitches), upstream (base URL) }

const { params, report, traceService, answerSwitches } = require('../lib/common');

const { manager, upstream } = params();
if (!/^http:\/\/127\.0\.0\.1:\d+$/.test(upstream)) throw new Error(`refusing an upstream off 127.0.0.1: ${upstream}`);
const tracing = traceService(manager, () => [
  new (require('@opentelemetry/instrumentation-http').HttpInstrumentation)(),
  new (require('@opentelemetry/instrumentation-express').ExpressInstrumentation)(),
]);

// Required after the instrumentations are registered, so they are patched.
const http = require('node:http');
const express = require('express');

const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });

function getJson(url) {
  return new Promise((resolve, reject) => {
    http
      .get(url, { agent }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk) => (text += chunk));
        res.on('end', () => {
          try {
            resolve(JSON.parse(text));
          } catch (err) {
            reject(err);
          }
        });
      })
      .on('error', reject);
  });
}

let served = 0;
const app = express();
app.disable('x-powered-by');
app.disable('etag');
app.use((req, res, next) => {
  req.requestId = ++served;
  next();
});
app.use((req, res, next) => {
  res.setHeader('cache-control', 'no-store');
  next();
});
app.get('/orders/:id', async (req, res, next) => {
  try {
    const stock = await getJson(`${upstream}/inventory/${req.params.id}`);
    const items = Array.from({ length: 8 }, (_, i) => ({ sku: `item-${i}`, qty: i + 1, price: 9.5 * (i + 1) }));
    res.json({
      id: req.params.id,
      request: req.requestId,
      customer: { id: 7, name: 'benchmark', roles: ['reader', 'writer'] },
      items,
      total: items.reduce((sum, item) => sum + item.qty * item.price, 0),
      stock,
    });
  } catch (err) {
    next(err);
  }
});

const server = app.listen(0, '127.0.0.1', () => report({ port: server.address().port, pid: process.pid, managers: tracing.kinds }));

async function stop() {
  server.close();
  server.closeAllConnections?.();
  agent.destroy();
  report({ spans: await tracing.shutdown(), served });
  process.exit(0);
}
if (Array.isArray(manager)) answerSwitches(tracing, stop);
else process.stdin.on('end', stop);
process.stdin.resume();
