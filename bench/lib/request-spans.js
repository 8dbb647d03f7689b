'use strict';
// A unit of spans shaped like a traced request, and a step that evicts the
// CPU's caches between units (bench/cold-spans.js). Loaded once per variant
// (bench/lib/turns.js), so each has its own API, SDK and call sites.
//
// - unit(): a root span entered with with() around an async body, four
//   child spans each entered once, the root's http.route set after the
//   third child (as Express's instrumentation sets it on the way), an
//   `await`, then the root ends;
// - evict(): a few thousand distinct small functions (each its own machine
//   code and feedback), objects of many shapes, and a walk over 8 MiB at
//   cache-line stride: what the rest of a server's request leaves in the
//   caches and branch predictors.

const { context, trace } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');

const SPANS_PER_UNIT = 5;

const tracer = new BasicTracerProvider().getTracer('request-spans');
const ROUTES = ['/users/:id', '/orders/:id', '/items', '/health'];

let sink = 0;
let n = 0;

function leaf(m) {
  sink += m;
}

async function unit() {
  n++;
  const root = tracer.startSpan('GET', { attributes: { 'http.method': 'GET' } });
  await context.with(trace.setSpan(context.active(), root), async () => {
    for (let m = 0; m < 4; m++) {
      // Names built per span, as instrumentations build them.
      const child = tracer.startSpan(m === 3 ? `request handler - ${ROUTES[n & 3]}` : `middleware - m${m}`);
      context.with(trace.setSpan(context.active(), child), leaf, undefined, m);
      if (m === 2) root.setAttribute('http.route', ROUTES[n & 3]);
      child.end();
    }
    await null;
    root.end();
  });
}

const data = new Float64Array((8 << 20) / 8);
const functions = [];
for (let k = 0; k < 3000; k++) {
  functions.push(new Function('a', 'b', `let x = a * ${k} + b; if (x & ${k & 7}) x ^= ${k}; for (let i = 0; i < 3; i++) x = (x * 31 + i + ${k}) | 0; return x;`));
}
const shapes = [];
for (let k = 0; k < 3000; k++) {
  const o = {};
  o[`p${k % 50}`] = k;
  o[`q${k % 37}`] = k;
  shapes.push(o);
}

function evict() {
  let s = 0;
  for (let k = 0; k < functions.length; k++) s = functions[k](s, k);
  for (const o of shapes) for (const key in o) s += o[key];
  for (let i = 0; i < data.length; i += 8) s += data[i]++;
  sink += s;
}

module.exports = { unit, evict, SPANS_PER_UNIT, sink: () => sink };
