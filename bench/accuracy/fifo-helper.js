'use strict';
// Slow peer for the workload's blocking FIFO reads: for each thread i it
// reads request bytes from `<dir>/req-i` and answers each with one byte on
// `<dir>/resp-i` after a delay of 3-8 ms, so the thread's synchronous read
// of resp-i blocks that long.
//
// Usage: node fifo-helper.js <dir> <threads>
// Exits when its standard input closes (the workload is gone).

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

const [dir, count] = process.argv.slice(2);
const { O_RDWR, O_NONBLOCK } = fs.constants;
const reply = Buffer.from('x');

for (let i = 0; i < Number(count); i++) {
  // O_RDWR: opening a FIFO this way never blocks, and keeps it open for the
  // other side.
  const resp = fs.openSync(path.join(dir, `resp-${i}`), O_RDWR);
  const req = new net.Socket({ fd: fs.openSync(path.join(dir, `req-${i}`), O_RDWR | O_NONBLOCK), readable: true });
  req.on('data', (chunk) => {
    for (let k = 0; k < chunk.length; k++) {
      setTimeout(() => fs.writeSync(resp, reply), 3 + Math.random() * 5);
    }
  });
}

process.stdin.on('end', () => process.exit(0)).resume();
