'use strict';
// Running bpftrace for the samplers (the accuracy harness's kernel sampler,
// the demo's stacks): whether it can run here, starting a program and
// waiting until its probes are attached, and finding where the thread
// pointer puts otel_thread_ctx_v1. The programs themselves and the parsing
// of their output: tools/record-sampler.js.

const fs = require('node:fs');
const { spawn, spawnSync } = require('node:child_process');
const { onLines, interrupt } = require('./subprocess');

const BPFTRACE = process.env.BPFTRACE || 'bpftrace';

/** Why bpftrace cannot run here, or null when it can. Mounts tracefs if needed. */
function unavailableReason() {
  if (process.platform !== 'linux' || process.arch !== 'x64') return `not Linux x86-64 (${process.platform}/${process.arch})`;
  if (typeof process.getuid === 'function' && process.getuid() !== 0) return 'not running as root';
  const version = spawnSync(BPFTRACE, ['--version'], { encoding: 'utf8' });
  if (version.error || version.status !== 0) return `no usable ${BPFTRACE} binary (${version.error?.code ?? version.stderr.trim()})`;
  if (!fs.existsSync('/sys/kernel/btf/vmlinux')) return 'kernel has no BTF (/sys/kernel/btf/vmlinux)';
  // Tracepoints need tracefs; containers often have it unmounted.
  if (!fs.existsSync('/sys/kernel/tracing/events') && !fs.existsSync('/sys/kernel/debug/tracing/events')) {
    const mount = spawnSync('mount', ['-t', 'tracefs', 'nodev', '/sys/kernel/tracing'], { encoding: 'utf8' });
    if (mount.status !== 0 || !fs.existsSync('/sys/kernel/tracing/events')) {
      return `tracefs is not mounted and mounting it failed: ${(mount.stderr || String(mount.error)).trim()}`;
    }
  }
  return null;
}

/** Removes bpftrace's harmless RLIMIT_MEMLOCK warning (memcg-accounted BPF memory). */
function cleanStderr(text) {
  return text
    .split('\n')
    .filter((l) => l.trim() && !/RLIMIT_MEMLOCK/.test(l))
    .join('\n');
}

/**
 * Starts bpftrace on `program`. Resolves once every probe is attached (its
 * BEGIN printed "B") with {child, lines, stop()}; `onLine` sees every other
 * output line. Rejects with bpftrace's error when a probe fails to attach.
 */
function startBpftrace(program, { onLine, env = {} } = {}) {
  const child = spawn(BPFTRACE, ['-B', 'line', '-e', program], {
    stdio: ['ignore', 'pipe', 'pipe'],
    // A larger perf ring per CPU so bursts of samples are not lost.
    env: { ...process.env, BPFTRACE_PERF_RB_PAGES: '2048', ...env },
  });
  let stderr = '';
  child.stderr.on('data', (c) => (stderr += c));
  let lost = 0;
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    let attached = false;
    onLines(child.stdout, (line) => {
      if (!attached) {
        if (line === 'B') {
          attached = true;
          resolve(handle);
        }
        return;
      }
      const m = /^Lost (\d+) events/.exec(line);
      if (m) lost += Number(m[1]);
      else if (line) onLine?.(line);
    });
    exited.then(({ code, signal }) => {
      if (!attached) reject(new Error(`bpftrace failed (${code ?? signal}): ${cleanStderr(stderr) || 'no output'}`));
    });
    const handle = {
      child,
      get lost() {
        return lost;
      },
      get stderr() {
        return cleanStderr(stderr);
      },
      /**
       * Stops bpftrace (SIGINT: it prints its maps and exits) and waits for
       * it, at most `graceMs` before SIGKILL.
       */
      async stop(graceMs = 5000) {
        interrupt(child);
        const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
        await exited;
        clearTimeout(timer);
      },
    };
  });
}

/**
 * Reads fs_base of each listed thread of `pid` as it enters a system call
 * (the workload's threads make one at least every 20 ms while waiting).
 * Resolves with Map(tid -> fs_base as BigInt).
 */
async function readFsBases(pid, tids, timeoutMs = 3000) {
  const bases = new Map();
  let finish;
  const complete = new Promise((resolve) => (finish = resolve));
  const program = `
    BEGIN { printf("B\\n"); }
    tracepoint:raw_syscalls:sys_enter /pid == ${pid} && @seen[tid] == 0/ {
      @seen[tid] = 1;
      printf("T %d %llu\\n", tid, curtask->thread.fsbase);
    }
    interval:s:10 { exit(); }
    END { clear(@seen); }`;
  const bt = await startBpftrace(program, {
    onLine(line) {
      const [tag, tid, base] = line.split(' ');
      if (tag !== 'T') return;
      bases.set(Number(tid), BigInt(base));
      if (tids.every((t) => bases.has(t))) finish();
    },
  });
  const timer = setTimeout(finish, timeoutMs);
  await complete;
  clearTimeout(timer);
  await bt.stop();
  return bases;
}

/**
 * The static-TLS offset of a thread variable from the thread pointer,
 * checked on every thread: `threads` are [{tid, tlsAddress}] as reported by
 * threadInfo() inside the target (`key` names another address property,
 * e.g. the frame-mode block's). Throws if threads disagree (the variable
 * would then not be in static TLS and needs the DTV walk).
 */
async function discoverTlsOffset(pid, threads, key = 'tlsAddress') {
  const bases = await readFsBases(pid, threads.map((t) => t.tid));
  const offsets = new Set();
  for (const t of threads) {
    const base = bases.get(t.tid);
    if (base === undefined) throw new Error(`no fs_base seen for thread ${t.tid}`);
    if (t[key] === null || t[key] === undefined) throw new Error(`thread ${t.tid} reports no ${key}`);
    offsets.add(BigInt(t[key]) - base);
  }
  if (offsets.size !== 1) throw new Error(`threads disagree on the TLS offset of ${key}: ${[...offsets].join(', ')}`);
  const [offset] = offsets;
  return { offset, fsBases: bases };
}

module.exports = { unavailableReason, startBpftrace, discoverTlsOffset };
