'use strict';
// A load generator that stays up between bursts, for a server whose
// managers switch (bench/lib/suites.js, switchingLoad): each stdin line is a
// request count; it sends that many GET requests over `connections`
// keep-alive connections opened for the burst, then prints
// {"requests", "errors", "latencyUs"}: every successful request's time from
// sending to the end of its body, in µs (for percentiles over many bursts).
// (autocannon, which the other cases use, ends a fixed-count run on its
// one-second ticker: most of a short burst would be waiting.)
//
// Prints {"ready"} first; exits on stdin end.
//
// params: { url, connections }

const http = require('node:http');
const { params, report, onLines, since } = require('../lib/common');

const { url, connections = 10 } = params();
if (!/^http:\/\/127\.0\.0\.1:\d+\//.test(url)) throw new Error(`refusing to load anything but 127.0.0.1: ${url}`);

/** One GET over `agent`, resolving true for a 200 whose body was read. */
function get(agent) {
  return new Promise((resolve) => {
    http
      .get(url, { agent }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode === 200));
        res.on('error', () => resolve(false));
      })
      .on('error', () => resolve(false));
  });
}

async function burst(amount) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections });
  let sent = 0;
  let requests = 0;
  let errors = 0;
  const latencyUs = [];
  const connection = async () => {
    while (sent < amount) {
      sent++;
      const start = process.hrtime.bigint();
      if (await get(agent)) {
        requests++;
        latencyUs.push(Math.round(since(start) / 1000));
      } else errors++;
    }
  };
  await Promise.all(Array.from({ length: connections }, connection));
  agent.destroy();
  return { requests, errors, latencyUs };
}

let queue = Promise.resolve();
onLines(process.stdin, (line) => {
  const amount = Number.parseInt(line, 10);
  queue = queue.then(async () => report(await burst(amount)));
});
process.stdin.on('end', () => queue.then(() => process.exit(0)));
report({ ready: true });
