'use strict';
// Kernel sampler: bpftrace reading each thread's OTEP 4947 record the way an
// eBPF profiler does, through the thread pointer:
//
//   variable = fs_base + tpoff        (static TLS: tpoff < 0, same for every thread)
//   record   = *(u64 *)variable       (NULL: thread not registered)
//   header   = record[0..28]          (trace_id, span_id, valid, trace_flags)
//
// Probes:
// Each line ends with 1 when the thread's otel_thread_ctx_v1 read non-NULL
// (0: not registered, or the read faulted).
// - profile:hz:F           on-CPU samples:  S tid nsecs valid span trace_hi trace_lo
// - sched:sched_switch     off-CPU intervals: O tid nsecs valid span trace_hi trace_lo prev_state syscall
//                          when a thread of the target leaves the CPU, I tid nsecs when
//                          it comes back
// - raw_syscalls           the system call each thread is in (-1: none), so an
//                          off-CPU interval in epoll_wait/epoll_pwait(2) is the
//                          event loop waiting (idle)
// - syscalls sys_enter_write (first one of `clockTid`): W nsecs, to check clocks
//
// bpftrace `nsecs` is bpf_ktime_get_ns(): CLOCK_MONOTONIC, the clock of
// process.hrtime.bigint() on Linux. The workload brackets one write(2) with
// hrtime readings so every run checks that.

const fs = require('node:fs');
const { spawn, spawnSync } = require('node:child_process');

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
  let pending = '';
  let lost = 0;
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    let attached = false;
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk) => {
      pending += chunk;
      let i;
      while ((i = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, i);
        pending = pending.slice(i + 1);
        if (!attached) {
          if (line === 'B') {
            attached = true;
            resolve(handle);
          }
          continue;
        }
        const m = /^Lost (\d+) events/.exec(line);
        if (m) lost += Number(m[1]);
        else if (line) onLine?.(line);
      }
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
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
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
 * The static-TLS offset of otel_thread_ctx_v1 from the thread pointer,
 * checked on every thread: `threads` are [{tid, tlsAddress}] as reported by
 * threadInfo() inside the target. Throws if threads disagree (the variable
 * would then not be in static TLS and needs the DTV walk).
 */
async function discoverTlsOffset(pid, threads) {
  const bases = await readFsBases(pid, threads.map((t) => t.tid));
  const offsets = new Set();
  for (const t of threads) {
    const base = bases.get(t.tid);
    if (base === undefined) throw new Error(`no fs_base seen for thread ${t.tid}`);
    offsets.add(BigInt(t.tlsAddress) - base);
  }
  if (offsets.size !== 1) throw new Error(`threads disagree on the TLS offset: ${[...offsets].join(', ')}`);
  const [offset] = offsets;
  return { offset, fsBases: bases };
}

/** `fs_base + offset` as bpftrace arithmetic (offset is negative for static TLS). */
function variableExpr(offset) {
  return offset < 0n ? `curtask->thread.fsbase - ${-offset}` : `curtask->thread.fsbase + ${offset}`;
}

/**
 * The sampler program for process `pid`: on-CPU samples at `hz`, off-CPU
 * intervals from sched_switch, epoll idle marks, and the clock probe write of
 * thread `clockTid`. It exits by itself after `maxSeconds`, so an abandoned
 * sampler does not linger.
 */
function samplerProgram({ pid, offset, hz = 997, offCpu = true, clockTid = 0, maxSeconds = 600 }) {
  const variable = variableExpr(offset);
  const readRecord = (tag, extra) => `
    $p = *(uint64 *)uptr(${variable});
    if ($p != 0) {
      printf("${tag} %d %llu %d %llx %llx %llx${extra.fmt} 1\\n", tid, nsecs,
        *(uint8 *)uptr($p + 24), *(uint64 *)uptr($p + 16), *(uint64 *)uptr($p), *(uint64 *)uptr($p + 8)${extra.args});
    } else {
      printf("${tag} %d %llu 0 0 0 0${extra.fmt} 0\\n", tid, nsecs${extra.args});
    }`;
  let program = `
    BEGIN { printf("B\\n"); }
    interval:s:${maxSeconds} { exit(); }
    profile:hz:${hz} /pid == ${pid}/ {${readRecord('S', { fmt: '', args: '' })}
    }`;
  if (offCpu) {
    program += `
    tracepoint:raw_syscalls:sys_enter /pid == ${pid}/ { @syscall[tid] = args->id + 1; }
    tracepoint:raw_syscalls:sys_exit /pid == ${pid}/ { delete(@syscall[tid]); }
    tracepoint:sched:sched_switch {
      if (pid == ${pid}) {
        @mine[tid] = 1;${readRecord('O', { fmt: ' %lld %d', args: ', args->prev_state, @syscall[tid] - 1' })}
      }
      if (@mine[args->next_pid] == 1) {
        printf("I %d %llu\\n", args->next_pid, nsecs);
      }
    }
    tracepoint:syscalls:sys_enter_write /tid == ${clockTid} && args->fd == 1 && @clock == 0/ {
      @clock = 1;
      printf("W %d %llu\\n", tid, nsecs);
    }
    END { clear(@syscall); clear(@mine); clear(@clock); }`;
  }
  return program;
}

// x86-64 system call numbers of epoll_wait, epoll_pwait, epoll_pwait2.
const EPOLL_WAITS = new Set([232, 281, 441]);

/** Swaps the bytes of a u64 read little-endian back to W3C hex order. */
function idHex(u64hex) {
  const v = BigInt(`0x${u64hex}`);
  let out = '';
  for (let i = 0n; i < 8n; i++) out += ((v >> (8n * i)) & 0xffn).toString(16).padStart(2, '0');
  return out;
}

/**
 * Collects sampler output lines: samples [{tid, t, valid, spanId, traceId}],
 * offcpu [{tid, out, in, valid, spanId, state, syscall, epoll}] and the clock
 * probe. bpftrace drains one ring buffer per CPU, so a switch-in printed on
 * one CPU can arrive before the switch-out printed on another: switches are
 * paired per thread in time order once collection is over (`offcpu`).
 */
function collector() {
  const samples = [];
  const switches = [];
  let clock = null;
  let offcpu = null;
  return {
    samples,
    get offcpu() {
      offcpu ??= pairSwitches(switches);
      return offcpu;
    },
    get clock() {
      return clock;
    },
    onLine(line) {
      const f = line.split(' ');
      switch (f[0]) {
        case 'S':
          samples.push({
            tid: Number(f[1]),
            t: BigInt(f[2]),
            valid: Number(f[3]),
            spanId: idHex(f[4]),
            traceId: idHex(f[5]) + idHex(f[6]),
            pointer: f[7] === '1',
          });
          break;
        case 'O':
          switches.push({
            out: true,
            tid: Number(f[1]),
            t: BigInt(f[2]),
            valid: Number(f[3]),
            spanId: idHex(f[4]),
            state: Number(f[7]),
            syscall: Number(f[8]),
            pointer: f[9] === '1',
          });
          break;
        case 'I':
          switches.push({ out: false, tid: Number(f[1]), t: BigInt(f[2]) });
          break;
        case 'W':
          clock = { tid: Number(f[1]), t: BigInt(f[2]) };
          break;
        default:
      }
    },
  };
}

/** Pairs each switch-out with the same thread's next switch-in, in time order. */
function pairSwitches(switches) {
  const sorted = [...switches].sort((a, b) => (a.t < b.t ? -1 : a.t > b.t ? 1 : 0));
  const open = new Map();
  const intervals = [];
  for (const e of sorted) {
    if (e.out) {
      open.set(e.tid, e);
      continue;
    }
    const o = open.get(e.tid);
    if (!o) continue;
    open.delete(e.tid);
    intervals.push({
      tid: o.tid,
      out: o.t,
      in: e.t,
      valid: o.valid,
      spanId: o.spanId,
      state: o.state,
      syscall: o.syscall,
      pointer: o.pointer,
      epoll: EPOLL_WAITS.has(o.syscall),
    });
  }
  return intervals;
}

module.exports = { unavailableReason, startBpftrace, discoverTlsOffset, samplerProgram, collector, idHex };
