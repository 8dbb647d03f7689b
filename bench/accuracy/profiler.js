'use strict';
// The reader's eBPF `profile` command as a sampler: `profile --pid N --hz F
// --off-cpu --format jsonl` samples on CPU from a perf event per CPU and
// records waits at sched_switch, reading the record inside the kernel. It
// writes one JSON line per sample when it stops (SIGINT); on-CPU samples
// become {tid, t, valid, spanId, traceId, attributes}, waits become intervals {tid, out,
// in, valid, spanId, syscall, epoll} (it records only waits, not
// preemptions; the system call comes from the wait's kernel stack).

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { BINARY } = require('./reader');
const { interrupt } = require('../../tools/subprocess');

// x86-64 numbers of the system calls the scoring names.
const SYSCALL_NUMBERS = { read: 0, write: 1, poll: 7, wait4: 61, futex: 202, epoll_wait: 232, epoll_pwait: 281, epoll_pwait2: 441, execve: 59, clone: 56, clone3: 435, clock_nanosleep: 230 };
// The scoring's "voluntary" bit: TASK_INTERRUPTIBLE (profile only records waits).
const WAITING = 1;

/** Why `profile` cannot sample here, or null when it can. */
function unavailableReason() {
  if (!fs.existsSync(BINARY)) return `no reader binary at ${BINARY}`;
  if (process.getuid() !== 0) return 'profile loads BPF programs: needs root';
  const probe = spawnSync(BINARY, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  if (/unrecognized subcommand/.test(probe.stderr)) return 'the reader has no `profile` command';
  if (/no kernel sampler/.test(probe.stderr)) return probe.stderr.trim();
  return null;
}

/**
 * The `profile` arguments for `pid`: on and off CPU at `hz` for at most
 * `durationS`, written as `format` to `output` (`extra`: more options).
 */
function profileArgs(pid, { hz, durationS, format, output, extra = [] }) {
  return ['profile', '--pid', String(pid), '--hz', String(hz), '--duration', String(durationS), '--off-cpu', '--format', format, ...extra, '-o', output];
}

/**
 * Reads a `--format jsonl` file: on-CPU samples [{tid, t, valid, spanId,
 * traceId, attributes}] and waits [{tid, out, in, valid, spanId, state,
 * syscall, epoll}].
 */
function readSamples(file) {
  const samples = [];
  const offcpu = [];
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line) continue;
    const s = JSON.parse(line);
    const valid = s.valid ? 1 : 0;
    if (s.kind === 'cpu') {
      samples.push({ tid: s.tid, t: BigInt(s.t_ns), valid, spanId: s.span_id ?? '', traceId: s.trace_id ?? '', attributes: s.attributes ?? {} });
    } else {
      const t = BigInt(s.t_ns);
      const syscall = SYSCALL_NUMBERS[s.syscall] ?? -1;
      offcpu.push({ tid: s.tid, out: t, in: t + BigInt(s.off_cpu_ns), valid, spanId: s.span_id ?? '', state: WAITING, syscall, epoll: /^epoll_/.test(s.syscall ?? '') });
    }
  }
  return { samples, offcpu };
}

/** Starts profiling `pid`; `done` resolves after `stop()` with {samples, offcpu, summary}. */
function start(pid, { hz = 997, durationS }) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-accuracy-profile-'));
  const out = path.join(dir, 'samples.jsonl');
  const child = spawn(BINARY, profileArgs(pid, { hz, durationS, format: 'jsonl', output: out }), { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (c) => (stderr += c));
  const done = new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => {
      try {
        if (code !== 0) throw new Error(`profile exited ${code}: ${stderr.trim()}`);
        resolve({ ...readSamples(out), summary: stderr.trim() });
      } catch (e) {
        reject(e);
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });
  });
  return { child, done, stop: () => interrupt(child) };
}

module.exports = { unavailableReason, start, profileArgs, readSamples };
