'use strict';
// Reading `perf script` call stacks of a traced server (recorded with
// `perf record -g`, the server run with --perf-basic-prof so JavaScript
// frames have names): which samples are the package's work, and the names
// of their functions. Shared by bench/self-time.js and
// bench/request-breakdown.js. A frame is `<address> <symbol> (<object>)`
// as `perf script -F ip,sym,dso` prints it; stacks are innermost first.

const { spawnSync } = require('node:child_process');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..');

/** Files whose frames are the package's own code. */
const OURS = [path.join(ROOT, 'js') + path.sep, path.join(ROOT, 'index.js')];
const addon = require('../../js/native').addonPath();
if (addon) OURS.push(path.basename(addon));

const isOurs = (frame) => OURS.some((needle) => frame.includes(needle));

/**
 * AsyncLocalStorage's run(), on either implementation: what runs above it
 * is the callback that with() runs (application and instrumentation code),
 * not the package's work.
 */
const RUNS_CALLBACK = /JS:\S*\brun node:(async_hooks|internal\/async_local_storage\/)/;

/** The script of a JavaScript frame (`node:...` for Node's own), or null. */
function scriptOf(frame) {
  const m = /JS:.*?(\S+):\d+:\d+(?: \(|$)/.exec(frame);
  return m ? m[1] : null;
}

/**
 * Whether a sample was spent in the package's code or in what that code
 * calls (getStore(), the runtime, a collection it sets off): the nearest
 * package frame up the stack is reached through native frames and Node's
 * own JavaScript only, and before any run() of a with(). Where V8 inlined
 * run() into with(), the callback's own frame (application code) still
 * ends the walk.
 */
function inPackageWork(frames) {
  for (const frame of frames) {
    if (isOurs(frame)) return true;
    if (RUNS_CALLBACK.test(frame)) return false;
    const script = scriptOf(frame);
    if (script !== null && !script.startsWith('node:')) return false;
  }
  return false;
}

/**
 * The samples of a perf.data file recorded with `-g`: `{ seconds, frames }`,
 * frames innermost first, `seconds` on the clock perf stamped them with
 * (`perf record -k CLOCK_MONOTONIC` makes it the one process.hrtime() reads).
 */
function perfSamples(data) {
  const r = spawnSync('perf', ['script', '-i', data, '-F', 'time,ip,sym,dso'], { encoding: 'utf8', maxBuffer: 4096 * 2 ** 20 });
  if (r.status !== 0) throw new Error(`perf script failed: ${r.stderr}`);
  const samples = [];
  for (const block of r.stdout.split(/\n\s*\n/)) {
    const lines = block.split('\n').map((line) => line.trim()).filter(Boolean);
    if (lines.length < 2) continue;
    const seconds = Number.parseFloat(lines[0]);
    if (Number.isFinite(seconds)) samples.push({ seconds, frames: lines.slice(1) });
  }
  return samples;
}

/**
 * A frame's function: `7f.. JS:*storeFor /path/js/publish/frame.js:126:24
 * (/tmp/perf-1.map)` → `storeFor (frame.js)`; a native symbol without its
 * address, object and arguments.
 */
function functionName(frame) {
  const js = /JS:[*~^'+]*([^ ]*) (\S+?):\d+:\d+/.exec(frame);
  if (js) return `${js[1] || '(anonymous)'} (${path.basename(js[2])})`;
  const symbol = frame.replace(/^[0-9a-f]+\s+/, '').replace(/\s+\([^)]*\)$/, '');
  return symbol.replace(/\(.*$/, '').replace(/\+0x[0-9a-f]+$/, '');
}

module.exports = { addon, perfSamples, isOurs, inPackageWork, functionName };
