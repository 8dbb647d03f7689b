'use strict';
// Line-by-line reading of a child's output, shared by the samplers and the
// accuracy harness.
const readline = require('node:readline');

/** Calls `onLine(line)` for every line `stream` produces (the last one too, without its newline). */
function onLines(stream, onLine) {
  readline.createInterface({ input: stream, crlfDelay: Infinity }).on('line', onLine);
}

module.exports = { onLines };
