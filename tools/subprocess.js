'use strict';
// Child processes of the samplers and the accuracy harness: reading their
// output line by line, and stopping them the way they expect.
const readline = require('node:readline');

/** Calls `onLine(line)` for every line `stream` produces (the last one too, without its newline). */
function onLines(stream, onLine) {
  readline.createInterface({ input: stream, crlfDelay: Infinity }).on('line', onLine);
}

/** SIGINT to `child` unless it has exited: samplers write their results and exit on it. */
function interrupt(child) {
  if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
}

module.exports = { onLines, interrupt };
