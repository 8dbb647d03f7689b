'use strict';
// Running benchmark cases in child processes, optionally pinned to a core.

const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..');
const CASES = path.join(ROOT, 'bench', 'cases');

/** Whether `taskset` (util-linux) can pin processes, on a machine with 2+ cores. */
const canPin =
  os.cpus().length >= 2 && spawnSync('taskset', ['-c', '0', 'true'], { stdio: 'ignore' }).status === 0;

/** Command and arguments running `node args...`, pinned to `core` when possible. */
function command(node, args, core) {
  if (core === undefined || core === null || !canPin) return [node, args];
  return ['taskset', ['-c', String(core), node, ...args]];
}

/** The last line of `text` that parses as a JSON object. */
function lastJson(text) {
  const lines = text.trim().split('\n').reverse();
  for (const line of lines) {
    if (!line.startsWith('{')) continue;
    try {
      return JSON.parse(line);
    } catch {
      // not a result line
    }
  }
  return null;
}

/**
 * Runs bench/cases/<name>.js with `params` under `node` and resolves with its
 * JSON result. Kills the child after `timeoutMs`.
 */
function runCase(node, name, params, { core, timeoutMs = 180000 } = {}) {
  const [cmd, args] = command(node, [path.join(CASES, `${name}.js`), JSON.stringify(params)], core);
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const result = lastJson(out);
      if (code === 0 && result !== null) resolve(result);
      else reject(new Error(`${name} ${JSON.stringify(params)} exited with ${code ?? signal}: ${err.trim().slice(-1500)}`));
    });
  });
}

/**
 * Starts a long-running case (a server). Resolves with { child, first } once
 * it printed its first JSON line; `stop()` closes its stdin and resolves with
 * its last JSON line (killing it if it does not exit in time). `nodeArgs`
 * go to node before the script (V8 flags, say).
 */
function startCase(node, name, params, { core, timeoutMs = 20000, nodeArgs = [] } = {}) {
  const [cmd, args] = command(node, [...nodeArgs, path.join(CASES, `${name}.js`), JSON.stringify(params)], core);
  const child = spawn(cmd, args, { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  const started = new Promise((resolve, reject) => {
    let up = false;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${name} did not start within ${timeoutMs} ms: ${err.trim().slice(-1500)}`));
    }, timeoutMs);
    child.stdout.on('data', (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl >= 0 && !up) {
        up = true;
        clearTimeout(timer);
        resolve(JSON.parse(out.slice(0, nl)));
      }
    });
    child.on('error', reject);
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      if (!up) reject(new Error(`${name} exited with ${code ?? signal} before starting: ${err.trim().slice(-1500)}`));
    });
  });
  const stop = async (graceMs = 10000) => {
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
    return lastJson(out.slice(out.indexOf('\n') + 1));
  };
  return started.then(
    (first) => ({ child, first, stop }),
    async (e) => {
      child.kill('SIGKILL');
      throw e;
    },
  );
}

const CLOCK_TICKS = (() => {
  const r = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
  const n = Number.parseInt(r.stdout, 10);
  return Number.isFinite(n) && n > 0 ? n : 100;
})();

/** CPU time (utime + stime, all threads) of process `pid` in ns, from /proc/<pid>/stat. */
function processCpuNs(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  const ticks = Number(fields[11]) + Number(fields[12]);
  return (ticks * 1e9) / CLOCK_TICKS;
}

/**
 * On-CPU time of process `pid` in ns, to the nanosecond: the first field
 * of /proc/<pid>/task/<tid>/schedstat (the scheduler's sum_exec_runtime)
 * summed over all its threads (main, libuv pool, V8's GC and compiler
 * threads). A running thread's figure is brought up to date only at a tick
 * or a switch, so read it while the process sleeps (settledCpuNs). Null
 * when there is no such process (anymore).
 */
function threadsCpuNs(pid) {
  let tids;
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return null;
  }
  let ns = 0;
  for (const tid of tids) {
    try {
      ns += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'latin1').split(' ', 1)[0]);
    } catch {
      // A thread that exited since the listing: its time left with it.
    }
  }
  return ns;
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * threadsCpuNs(pid) once the process has stopped running: read every
 * `stepMs` until two reads agree (it used no CPU in between), at most
 * `maxSteps` times (then the last read). Resolves with { ns, steps }.
 */
async function settledCpuNs(pid, { stepMs = 1, maxSteps = 50 } = {}) {
  let last = threadsCpuNs(pid);
  for (let step = 1; step <= maxSteps; step++) {
    await pause(stepMs);
    const now = threadsCpuNs(pid);
    if (now === last) return { ns: now, steps: step };
    last = now;
  }
  return { ns: last, steps: maxSteps };
}

module.exports = { ROOT, canPin, command, lastJson, runCase, startCase, processCpuNs, threadsCpuNs, settledCpuNs, CLOCK_TICKS };
