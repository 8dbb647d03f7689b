'use strict';
// Load for the demo service: autocannon when installed, else a small
// keep-alive loop; bounded in time and in requests.

const http = require('node:http');

const CONNECTIONS = 8;
const MAX_REQUESTS = 50000;
// Each connection cycles through this list: one export (the outlier) and
// one login (a password hash on libuv's threadpool) per 17 requests.
const PATHS = [
  ...Array.from({ length: 3 }, (_, i) => [`/api/products/${17 + i}`, '/api/search', `/api/reports/${i}`, '/api/checkout', `/api/products/${40 + i}`]).flat(),
  '/api/export',
  '/api/login',
];

/** What the load does, in one line. */
function describeLoad(seconds) {
  return `${CONNECTIONS} connections for ${seconds} s (at most ${MAX_REQUESTS} requests) cycling over ${[...new Set(PATHS.map((p) => p.replace(/\d+$/, ':id')))].join(' ')}`;
}

/** Drives load with autocannon when installed, else with a small keep-alive loop. */
async function drive(port, seconds) {
  let autocannon = null;
  try {
    autocannon = require('autocannon');
  } catch {
    // not installed (production install): use the built-in loop
  }
  if (autocannon) {
    const result = await autocannon({
      url: `http://127.0.0.1:${port}`,
      connections: CONNECTIONS,
      duration: seconds,
      maxOverallRequests: MAX_REQUESTS,
      requests: PATHS.map((p) => ({ method: 'GET', path: p })),
    });
    return { tool: 'autocannon', requests: result.requests.total, errors: result.errors + result.non2xx, seconds: result.duration };
  }
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const deadline = Date.now() + seconds * 1000;
  let requests = 0;
  let errors = 0;
  const get = (p) => new Promise((resolve) => {
    http
      .get({ host: '127.0.0.1', port, path: p, agent }, (res) => {
        if (res.statusCode !== 200) errors++;
        res.resume().on('end', resolve);
      })
      .on('error', () => {
        errors++;
        resolve();
      });
  });
  const started = Date.now();
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async (_, c) => {
      for (let i = c; Date.now() < deadline && requests < MAX_REQUESTS; i++) {
        requests++;
        await get(PATHS[i % PATHS.length]);
      }
    }),
  );
  agent.destroy();
  return { tool: 'built-in loop', requests, errors, seconds: (Date.now() - started) / 1000 };
}

module.exports = { describeLoad, drive };
