'use strict';
// service: the loopback upstream the service calls, untraced, in its own
// process (pinned with the load generator, off the service's core). Answers
// every request with a small JSON document.
//
// Prints {"port", "pid"} once listening on 127.0.0.1; exits on stdin end.

const http = require('node:http');
const { report } = require('../lib/common');

const server = http.createServer((req, res) => {
  const body = JSON.stringify({ sku: req.url.slice(req.url.lastIndexOf('/') + 1), inStock: 17, warehouse: 'east-2' });
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => report({ port: server.address().port, pid: process.pid }));
process.stdin.on('end', () => {
  server.close();
  server.closeAllConnections?.();
  report({ stopped: true });
  process.exit(0);
});
process.stdin.resume();
