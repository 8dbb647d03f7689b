#!/usr/bin/env node
'use strict';
// `npx otel-thread-ctx inspect|sample ...`: runs the reader CLI (a native
// binary, built from source or shipped in the platform package) with the
// same arguments, and exits as it does.
const { spawn } = require('node:child_process');
const native = require('../js/native');

const reader = native.readerPath();
if (reader === null) {
  console.error(native.missingMessage('reader binary'));
  process.exit(127);
}

const child = spawn(reader, process.argv.slice(2), { stdio: 'inherit' });
// The reader finishes the read in progress and releases every thread when
// told to stop: pass termination signals on and wait for it.
const forward = (signal) => child.kill(signal);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT']) process.on(signal, forward);
child.on('error', (error) => {
  console.error(`otel-thread-ctx: cannot run ${reader}: ${error.message}`);
  process.exit(127);
});
child.on('exit', (code, signal) => {
  const numbers = require('node:os').constants.signals;
  process.exit(code ?? 128 + (numbers[signal] ?? 0));
});
