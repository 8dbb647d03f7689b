'use strict';
// A load generator that stays up between bursts, for a server whose
// managers switch (bench/lib/suites.js, switchingLoad) or for several
// servers loaded in turns (interleavedLoad). Each stdin line is a request
// count, optionally followed by a target's index in `urls` (0 when
// absent): it sends that many GET requests to that target over
// `connections` keep-alive connections, then prints
// {"requests", "errors", "latencyUs"}: every successful request's time from
// sending to the end of its body, in µs (for percentiles over many bursts).
// (autocannon, which the other cases use, ends a fixed-count run on its
// one-second ticker: most of a short burst would be waiting.)
//
// Without `persistent`, each burst opens its connections and closes them
// at its end. With `persistent`, each target has one agent for the whole
// run, so its connections stay open from one burst to the next and no
// burst pays a server for accepting or closing them.
//
// Prints {"ready"} first; exits on stdin end.
//
// params: { url | urls, connections, persistent }

const http = require('node:http');
const { params, report, onLines, since } = require('../lib/common');

const { url, urls = [url], connections = 10, persistent = false } = params();
for (const u of urls) {
  if (!/^http:\/\/127\.0\.0\.1:\d+\//.test(u)) throw new Error(`refusing to load anything but 127.0.0.1: ${u}`);
}
const newAgent = () => new http.Agent({ keepAlive: true, maxSockets: connections });
const agents = persistent ? urls.map(newAgent) : null;

/** One GET of `target` over `agent`, resolving true for a 200 whose body was read. */
function get(target, agent) {
  return new Promise((resolve) => {
    http
      .get(target, { agent }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode === 200));
        res.on('error', () => resolve(false));
      })
      .on('error', () => resolve(false));
  });
}

async function burst(amount, index) {
  const target = urls[index];
  if (target === undefined) throw new Error(`no target ${index}: ${urls.length} targets`);
  const agent = persistent ? agents[index] : newAgent();
  let sent = 0;
  let requests = 0;
  let errors = 0;
  const latencyUs = [];
  const connection = async () => {
    while (sent < amount) {
      sent++;
      const start = process.hrtime.bigint();
      if (await get(target, agent)) {
        requests++;
        latencyUs.push(Math.round(since(start) / 1000));
      } else errors++;
    }
  };
  await Promise.all(Array.from({ length: connections }, connection));
  if (!persistent) agent.destroy();
  return { requests, errors, latencyUs };
}

let queue = Promise.resolve();
onLines(process.stdin, (line) => {
  const [amount, index = '0'] = line.trim().split(' ');
  queue = queue.then(async () => report(await burst(Number.parseInt(amount, 10), Number.parseInt(index, 10))));
});
process.stdin.on('end', () =>
  queue.then(() => {
    for (const agent of agents ?? []) agent.destroy();
    process.exit(0);
  }),
);
report({ ready: true });
