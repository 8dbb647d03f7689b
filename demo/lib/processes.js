'use strict';
// The demo's processes: every child it starts and every file it leaves is
// cleaned up however the demo ends (normal exit, error, Ctrl-C, watchdog).

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { fork } = require('node:child_process');

const children = new Set();
const leftovers = new Set();

/** Registers `child` to be killed if the demo ends before it does. */
function track(child) {
  children.add(child);
  child.on('exit', () => children.delete(child));
  return child;
}

/** Registers a file or directory to remove however the demo ends. */
function leaveBehind(file) {
  leftovers.add(file);
}

function killAll() {
  for (const c of children) c.kill('SIGKILL');
  for (const f of leftovers) fs.rmSync(f, { recursive: true, force: true });
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });
}

/**
 * Forks the example service (demo/service.js) with `execArgv`. Returns
 * {child, next(type)}: `next` resolves with its next IPC message of that
 * type, and rejects if it exits first.
 */
function startService(execArgv) {
  // --perf-basic-prof also makes V8 write isolate-*-v8.log files in the
  // working directory: give the service a scratch one.
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-demo-'));
  leaveBehind(cwd);
  const child = track(fork(path.join(__dirname, '..', 'service.js'), [], { cwd, execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
  child.on('exit', () => fs.rmSync(cwd, { recursive: true, force: true }));
  const replies = new Map();
  child.on('message', (msg) => {
    replies.get(msg.type)?.(msg);
    replies.delete(msg.type);
  });
  const next = (type) => new Promise((resolve, reject) => {
    replies.set(type, resolve);
    child.once('exit', (code) => reject(new Error(`the service exited (${code}) before '${type}'`)));
  });
  return { child, next };
}

/** Asks the service to exit and waits for it (SIGKILL after a grace period). */
async function stopService(service) {
  if (service.child.connected) service.child.send({ type: 'exit' });
  await new Promise((resolve) => {
    if (service.child.exitCode !== null) return resolve();
    service.child.once('exit', resolve);
    setTimeout(() => service.child.kill('SIGKILL'), 3000).unref();
  });
}

module.exports = { track, leaveBehind, killAll, startService, stopService };
