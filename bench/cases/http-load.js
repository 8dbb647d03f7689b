'use strict';
// http: the load generator, in its own process (pinned by bench/run.js to
// another core than the server). Sends a fixed number of GET requests to a
// server on 127.0.0.1 with autocannon's programmatic API, and keeps every
// response time itself (autocannon's own histogram has 1 ms buckets, too
// coarse for a local p99) and the time of the last response (autocannon
// ends a fixed-count run on its one-second ticker, so its own duration is
// rounded up to whole seconds).
//
// params: { url, amount, connections, timeoutSeconds }

const autocannon = require('autocannon');
const { params, report, since } = require('../lib/common');

const { url, amount = 20000, connections = 10, timeoutSeconds = 10 } = params();
if (!/^http:\/\/127\.0\.0\.1:\d+\//.test(url)) throw new Error(`refusing to load anything but 127.0.0.1: ${url}`);

const latencies = new Float64Array(amount + connections);
let count = 0;
let lastResponse = 0;
const start = process.hrtime.bigint();
const instance = autocannon({ url, amount, connections, timeout: timeoutSeconds }, (err, result) => {
  if (err) throw err;
  const seconds = lastResponse / 1e9;
  const sorted = latencies.subarray(0, count).sort();
  const at = (q) => sorted[Math.min(count - 1, Math.floor(q * count))];
  report({
    requests: result['2xx'],
    errors: result.errors + result.timeouts + result.non2xx,
    seconds,
    rps: result['2xx'] / seconds,
    p50Ms: at(0.5),
    p99Ms: at(0.99),
  });
});
instance.on('response', (client, statusCode, bytes, responseTime) => {
  if (statusCode === 200 && count < latencies.length) latencies[count++] = responseTime;
  lastResponse = since(start);
});
