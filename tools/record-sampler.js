'use strict';
// The bpftrace programs that sample threads' OTEP 4947 records the way an
// eBPF profiler does, through the thread pointer, and the parsers of what
// they print. Shared by the accuracy harness (bench/accuracy/) and the demo.
//
//   variable = fs_base + tpoff        (static TLS: tpoff < 0, same for every thread)
//   record   = *(u64 *)variable       (NULL: thread not registered)
//
// Every record offset comes from the ABI the addon exports (js/abi.js).
//
// In frame mode (`nodejs` given) the record is found as this package's
// readers find it: the thread's OTEP 4947 record when it holds a valid span
// (the direct API), else the Node.js schema's walk from
// otel_thread_ctx_nodejs_v1 through V8's current AsyncContextFrame
// (./nodejs-walk.js).
//
// samplerProgram() prints one line per event; each S/O line ends with 1
// when the thread's otel_thread_ctx_v1 read non-NULL (0: not registered, or
// the read faulted):
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
// process.hrtime.bigint() on Linux.
//
// stackProgram() counts on-CPU user stacks keyed by thread and record
// (trace id, span id, attrs_data_size and the start of attrs_data), printed
// as bpftrace's map @s when it stops.

const path = require('node:path');
const { record } = require('../js/abi');
const nodejsWalk = require('./nodejs-walk');

const { offsets } = record;
/** 8-byte words of attrs_data the stack program keeps (where the first attributes sit). */
const ATTRS_WORDS = 5;
const ATTRS_PREFIX_BYTES = ATTRS_WORDS * 8;

const variableExpr = nodejsWalk.threadVariable;

/** bpftrace expression that reads a `type` at `offset` bytes into the record at `$p`. */
const field = (type, offset) => `*(${type} *)uptr($p + ${offset})`;

const read = {
  valid: field('uint8', offsets.valid),
  spanId: field('uint64', offsets.spanId),
  // The 16 trace id bytes as two words, in memory order.
  traceId: [field('uint64', offsets.traceId), field('uint64', offsets.traceId + 8)],
  attrsDataSize: field('uint16', offsets.attrsDataSize),
  attrsWords: Array.from({ length: ATTRS_WORDS }, (_, i) => field('uint64', offsets.attrsData + 8 * i)),
};

/**
 * Statements leaving in `$p` the address of the record to read (0: none):
 * the OTEP 4947 record behind otel_thread_ctx_v1 at `offset` from fs_base;
 * with `nodejs` ({offset, recordOffset}: see ./nodejs-walk.js), the Node.js
 * schema's walk unless that record holds a valid span (`offset` null: the
 * walk only).
 */
function findRecord(offset, nodejs) {
  const fromRecord = offset === null || offset === undefined ? '$p = (uint64)0;' : `$p = *(uint64 *)uptr(${variableExpr(offset)});`;
  if (!nodejs) return fromRecord;
  return `
    ${fromRecord}
    $r_valid = (uint8)0;
    if ($p != 0) { $r_valid = ${read.valid}; }
    if ($r_valid != ${record.valid}) {${nodejsWalk.walkStatements(nodejs)}
    }`;
}

/**
 * The sampler program for process `pid`: on-CPU samples at `hz`, off-CPU
 * intervals from sched_switch, epoll idle marks, and the clock probe write of
 * thread `clockTid`. It exits by itself after `maxSeconds`, so an abandoned
 * sampler does not linger. `nodejs`: read frame mode (see findRecord).
 */
function samplerProgram({ pid, offset, nodejs = null, hz = 997, offCpu = true, clockTid = 0, maxSeconds = 600 }) {
  const readRecord = (tag, extra) => `
    ${findRecord(offset, nodejs)}
    if ($p != 0) {
      printf("${tag} %d %llu %d %llx %llx %llx${extra.fmt} 1\\n", tid, nsecs,
        ${read.valid}, ${read.spanId}, ${read.traceId[0]}, ${read.traceId[1]}${extra.args});
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

/**
 * The stack program for process `pid`: user stacks at `hz` (`frames` deep)
 * counted in @s by thread, trace id (2 words), span id, attrs_data_size and
 * the first words of attrs_data. It exits by itself after `maxSeconds`.
 */
function stackProgram({ pid, offset, hz, maxSeconds, frames = 48 }) {
  const attrs = read.attrsWords.map((_, i) => `$a${i}`);
  return `
    BEGIN { printf("B\\n"); }
    interval:s:${maxSeconds} { exit(); }
    profile:hz:${hz} /pid == ${pid}/ {
      $p = *(uint64 *)uptr(${variableExpr(offset)});
      $valid = (uint8)0;
      $t0 = (uint64)0; $t1 = (uint64)0; $span = (uint64)0; $size = (uint64)0;
      ${attrs.map((a) => `${a} = (uint64)0;`).join(' ')}
      if ($p != 0) { $valid = ${read.valid}; }
      if ($valid == ${record.valid}) {
        $t0 = ${read.traceId[0]}; $t1 = ${read.traceId[1]}; $span = ${read.spanId};
        $size = (uint64)${read.attrsDataSize};
        ${attrs.map((a, i) => `${a} = ${read.attrsWords[i]};`).join(' ')}
      }
      @s[tid, $t0, $t1, $span, $size, ${attrs.join(', ')}, ustack(perf, ${frames})] = count();
    }`;
}

// x86-64 system call numbers of epoll_wait, epoll_pwait, epoll_pwait2.
const EPOLL_WAITS = new Set([232, 281, 441]);

/** Hex of a u64 read little-endian from memory (BigInt, or hex digits), in memory (W3C) byte order. */
function idHex(u64) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt.asUintN(64, typeof u64 === 'bigint' ? u64 : BigInt(`0x${u64}`)));
  return b.toString('hex');
}

/**
 * Collects samplerProgram() output lines: samples [{tid, t, valid, spanId,
 * traceId, pointer}], offcpu [{tid, out, in, valid, spanId, state, syscall,
 * pointer, epoll}] and the clock probe. bpftrace drains one ring buffer per
 * CPU, so a switch-in printed on one CPU can arrive before the switch-out
 * printed on another: switches are paired per thread in time order once
 * collection is over (`offcpu`).
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

/**
 * Parses bpftrace's printout of stackProgram()'s @s into [{tid, traceId,
 * spanId, attrs (the start of attrs_data, a Buffer), frames (leaf first), count}].
 */
function parseStacks(text) {
  const entries = [];
  let cur = null;
  for (const line of text.split('\n')) {
    if (line.startsWith('@s[')) {
      // `@s[k, k, ..., ` then one frame per line and `]: count`; all on one
      // line when the stack is empty.
      const close = line.indexOf(']: ');
      const keys = close >= 0 ? line.slice(3, close) : line.slice(3);
      const nums = keys.split(',').map((s) => s.trim()).filter(Boolean).map((s) => BigInt(s));
      const [tid, t0, t1, span, size, ...attrWords] = nums;
      const attrs = Buffer.alloc(ATTRS_PREFIX_BYTES);
      attrWords.forEach((w, i) => attrs.writeBigUInt64LE(BigInt.asUintN(64, w), i * 8));
      cur = {
        tid: Number(tid),
        traceId: span === 0n ? null : idHex(t0) + idHex(t1),
        spanId: span === 0n ? null : idHex(span),
        attrs: attrs.subarray(0, Math.min(Number(size), ATTRS_PREFIX_BYTES)),
        frames: [],
        count: 0,
      };
      if (close >= 0) {
        cur.count = Number(line.slice(close + 3));
        entries.push(cur);
        cur = null;
      }
    } else if (cur && line.startsWith('\t')) {
      cur.frames.push(frameName(line.trim()));
    } else if (cur && line.startsWith(']: ')) {
      cur.count = Number(line.slice(3));
      entries.push(cur);
      cur = null;
    }
  }
  return entries;
}

/** A readable frame name from bpftrace's `addr symbol+off (module)`. */
function frameName(raw) {
  const m = /^[0-9a-f]+ (.*) \((.*)\)$/.exec(raw);
  if (!m) return raw;
  const [, symbol, module] = m;
  if (/^0x[0-9a-f]+$/.test(symbol)) return `[${path.basename(module)}]`;
  let name = symbol.replace(/\+\d+$/, '');
  const js = /^JS:[~*^+]?(.*?) (\S+):(\d+):\d+$/.exec(name);
  if (js) name = `${js[1] || '(anonymous)'} ${path.basename(js[2])}:${js[3]}`;
  else if (name.startsWith('JS:')) name = name.slice(3).replace(/^[~*^+]/, '');
  return name.replace(/;/g, ':');
}

module.exports = { samplerProgram, stackProgram, collector, parseStacks, idHex };
