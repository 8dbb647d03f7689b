'use strict';
// Example service for the demo: an HTTP API on 127.0.0.1 with a worker pool,
// traced with the OpenTelemetry SDK and ProfilingContextManager, so a
// profiler outside the process can tell which request each thread serves.
//
// Routes (each sets `http.route` on its server span, which the manager
// publishes in the record's attributes):
//   GET /api/products/:id   main thread: render a product page, one db call
//   GET /api/search         main thread: scan a catalog, CPU heavy
//   GET /api/checkout       main thread: a chain of awaits and a payment
//                           child span hashing with pbkdf2 (native code)
//   GET /api/export         main thread: the expensive outlier, builds and
//                           deflates a large document
//   GET /api/reports/:id    offloaded to the worker pool: the worker's
//                           span continues the request's trace
//   GET /api/login          main thread queues a password hash
//                           (crypto.pbkdf2) on libuv's threadpool: the
//                           pool thread's CPU belongs to the request's span
//
// Started by demo/run.js with an IPC channel: it sends {type: 'listening'}
// once ready, answers {type: 'report'} with the spans it recorded (ids,
// names, routes) and exits on {type: 'exit'}.

const crypto = require('node:crypto');
const zlib = require('node:zlib');
const path = require('node:path');
const { isMainThread, Worker, parentPort } = require('node:worker_threads');
const api = require('@opentelemetry/api');
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const { SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { registerInstrumentations } = require('@opentelemetry/instrumentation');
const { HttpInstrumentation } = require('@opentelemetry/instrumentation-http');

const ROOT = path.resolve(__dirname, '..');
const { ProfilingContextManager, ProcessContextSpanProcessor, registerAttributeKeys, threadInfo } = require(ROOT);

const ROUTE = 'http.route';
const POOL_SIZE = 2;

// ------------------------------------------------------------ tracing setup

/** Keeps {traceId, spanId, name, route} of every ended span of this thread. */
class RecordingExporter {
  constructor() {
    this.spans = [];
  }
  export(spans, done) {
    for (const s of spans) {
      const { traceId, spanId } = s.spanContext();
      this.spans.push({ traceId, spanId, name: s.name, route: s.attributes[ROUTE] ?? null });
    }
    done({ code: 0 });
  }
  shutdown() {
    return Promise.resolve();
  }
}

const exporter = new RecordingExporter();
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': 'demo-shop', 'service.version': '1.0.0' }),
  spanProcessors: [new ProcessContextSpanProcessor(), new SimpleSpanProcessor(exporter)],
});
provider.register({ contextManager: new ProfilingContextManager({ attributes: [ROUTE] }) });
const tracer = api.trace.getTracer('demo-shop');

// ------------------------------------------------------------ work

/** Deterministic CPU work of roughly `ms` milliseconds. */
function compute(ms) {
  const until = performance.now() + ms;
  let h = 0;
  while (performance.now() < until) {
    for (let i = 0; i < 500; i++) h = (Math.imul(h, 31) + i) | 0;
  }
  return h;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function renderReport(id) {
  // Sort a pseudo-random table: a few ms of CPU in JS.
  const rows = Array.from({ length: 20000 }, (_, i) => ((i * 2654435761) ^ id) >>> 0);
  rows.sort((a, b) => a - b);
  return compute(4) ^ rows[id % rows.length];
}

if (!isMainThread) {
  // ---------------------------------------------------------- worker pool member
  parentPort.postMessage({ type: 'ready', tid: threadInfo().tid, tlsAddress: String(threadInfo().tlsAddress) });
  parentPort.on('message', (msg) => {
    if (msg.type === 'spans') {
      parentPort.postMessage({ type: 'spans', spans: exporter.spans });
      return;
    }
    const parent = api.propagation.extract(api.ROOT_CONTEXT, msg.carrier);
    // The first span of the trace on this thread (its local root, its parent
    // being remote) names the endpoint it works for, so the worker's CPU is
    // counted under that endpoint too.
    tracer.startActiveSpan('render-report', { attributes: { [ROUTE]: '/api/reports/:id' } }, parent, async (span) => {
      span.setAttribute('report.id', msg.id);
      const digest = renderReport(msg.id);
      await sleep(1);
      const more = renderReport(msg.id + 1);
      span.end();
      parentPort.postMessage({ type: 'done', job: msg.job, digest: digest ^ more });
    });
  });
} else {
  // ---------------------------------------------------------- main thread
  registerInstrumentations({ instrumentations: [new HttpInstrumentation()] });
  const http = require('node:http');
  const [routeKeyIndex] = registerAttributeKeys([ROUTE]);

  const pool = [];
  const pending = new Map();
  let nextJob = 0;
  const workerThreads = [];
  for (let i = 0; i < POOL_SIZE; i++) {
    const w = new Worker(__filename);
    w.on('message', (msg) => {
      if (msg.type === 'ready') workerThreads.push(msg);
      if (msg.type === 'done') {
        pending.get(msg.job)?.(msg.digest);
        pending.delete(msg.job);
      }
    });
    pool.push(w);
  }

  /** Runs a report on the next pool worker, carrying the active trace. */
  function offload(id) {
    const carrier = {};
    api.propagation.inject(api.context.active(), carrier);
    const job = nextJob++;
    return new Promise((resolve) => {
      pending.set(job, resolve);
      pool[job % POOL_SIZE].postMessage({ type: 'job', job, id, carrier });
    });
  }

  function dbQuery(name, ms) {
    return tracer.startActiveSpan(`db ${name}`, async (span) => {
      await sleep(ms);
      compute(0.5); // decode the rows
      span.end();
    });
  }

  const catalog = Array.from({ length: 3000 }, (_, i) => `product-${i}-${(i * 7919).toString(36)}`);

  const routes = [
    [/^\/api\/products\/(\d+)$/, '/api/products/:id', async (m) => {
      await dbQuery('products', 2);
      compute(2); // render
      return { id: Number(m[1]), name: catalog[Number(m[1]) % catalog.length] };
    }],
    [/^\/api\/search$/, '/api/search', async () => {
      await null;
      let hits = 0;
      for (let pass = 0; pass < 3; pass++) {
        const re = new RegExp(`-${pass}[0-9a-z]*7`);
        for (const p of catalog) if (re.test(p)) hits++;
        compute(2);
        await null;
      }
      return { hits };
    }],
    [/^\/api\/checkout$/, '/api/checkout', async () => {
      await dbQuery('cart', 1);
      compute(1);
      await tracer.startActiveSpan('payment', async (span) => {
        await null;
        crypto.pbkdf2Sync('card', 'salt', 3000, 32, 'sha256');
        span.end();
      });
      await dbQuery('orders', 1);
      return { ok: true };
    }],
    [/^\/api\/export$/, '/api/export', async () => {
      // The expensive outlier: builds and compresses a large document.
      const rows = [];
      for (let part = 0; part < 4; part++) {
        await dbQuery('export', 1);
        for (let i = 0; i < 4000; i++) rows.push({ id: i, name: catalog[i % catalog.length], part });
        compute(8);
      }
      const packed = zlib.deflateSync(JSON.stringify(rows));
      return { bytes: packed.length };
    }],
    [/^\/api\/login$/, '/api/login', async () => {
      await dbQuery('users', 1);
      const hash = await new Promise((resolve, reject) =>
        crypto.pbkdf2('password', 'per-user-salt', 250000, 32, 'sha256', (err, key) => (err ? reject(err) : resolve(key))),
      );
      return { ok: hash.length === 32 };
    }],
    [/^\/api\/reports\/(\d+)$/, '/api/reports/:id', async (m) => {
      await null;
      return { digest: await offload(Number(m[1])) };
    }],
  ];

  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    const span = api.trace.getActiveSpan();
    for (const [re, route, handler] of routes) {
      const m = re.exec(url.pathname);
      if (!m) continue;
      span?.setAttribute(ROUTE, route);
      span?.updateName(`GET ${route}`);
      handler(m).then(
        (body) => {
          res.setHeader('content-type', 'application/json');
          res.end(JSON.stringify(body));
        },
        (err) => {
          res.statusCode = 500;
          res.end(String(err));
        },
      );
      return;
    }
    res.statusCode = 404;
    res.end();
  });

  async function report() {
    const workerSpans = await Promise.all(
      pool.map((w) => new Promise((resolve) => {
        const onMessage = (msg) => {
          if (msg.type !== 'spans') return;
          w.off('message', onMessage);
          resolve(msg.spans);
        };
        w.on('message', onMessage);
        w.postMessage({ type: 'spans' });
      })),
    );
    return [...exporter.spans, ...workerSpans.flat()];
  }

  process.on('message', (msg) => {
    if (msg.type === 'report') report().then((spans) => process.send({ type: 'report', spans }));
    if (msg.type === 'exit') {
      server.close();
      process.exit(0);
    }
  });
  process.on('disconnect', () => process.exit(0));

  server.listen(0, '127.0.0.1', function announce() {
    if (workerThreads.length < POOL_SIZE) {
      setTimeout(announce.bind(this), 20);
      return;
    }
    process.send({
      type: 'listening',
      port: server.address().port,
      pid: process.pid,
      routeKeyIndex,
      threads: [
        { tid: threadInfo().tid, name: 'main', tlsAddress: String(threadInfo().tlsAddress) },
        ...workerThreads.map(({ tid, tlsAddress }, i) => ({ tid, name: `pool-${i + 1}`, tlsAddress })),
      ],
    });
  });
}
