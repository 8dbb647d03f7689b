'use strict';
// The kernel's own count of a process's BPF programs' run time
// (kernel.bpf_stats_enabled, read from each program's fdinfo): a figure the
// machine's noise does not move, unlike the target's CPU time.

const fs = require('node:fs');

const BPF_STATS = '/proc/sys/kernel/bpf_stats_enabled';

/**
 * Turns the kernel's BPF run-time counters on until this process exits.
 * False when they cannot be (not root, an old kernel).
 */
function enableBpfStats() {
  let were;
  try {
    were = fs.readFileSync(BPF_STATS, 'utf8').trim();
    fs.writeFileSync(BPF_STATS, '1');
  } catch {
    return false;
  }
  process.on('exit', () => fs.writeFileSync(BPF_STATS, were));
  return true;
}

/** Run time and runs of each BPF program `pid` holds ([] when unreadable). */
function bpfPrograms(pid) {
  let dir;
  try {
    dir = fs.readdirSync(`/proc/${pid}/fdinfo`);
  } catch {
    return [];
  }
  const programs = [];
  for (const fd of dir) {
    let info;
    try {
      info = fs.readFileSync(`/proc/${pid}/fdinfo/${fd}`, 'utf8');
    } catch {
      continue;
    }
    if (!/^prog_type:/m.test(info)) continue;
    programs.push({
      runTimeNs: Number(info.match(/^run_time_ns:\s+(\d+)/m)?.[1] ?? 0),
      runs: Number(info.match(/^run_cnt:\s+(\d+)/m)?.[1] ?? 0),
    });
  }
  return programs;
}

/**
 * Polls `pid`'s programs until `done` settles, keeping the reading with the
 * most run time: the profiler exits with its target and takes the counters
 * with it, and a reading while it closes its descriptors is partial.
 */
async function pollBpfPrograms(pid, done) {
  let best = [];
  const total = (ps) => ps.reduce((sum, p) => sum + p.runTimeNs, 0);
  const poll = setInterval(() => {
    const now = bpfPrograms(pid);
    if (total(now) > total(best)) best = now;
  }, 100);
  try {
    await done;
  } finally {
    clearInterval(poll);
  }
  return best;
}

module.exports = { enableBpfStats, bpfPrograms, pollBpfPrograms };
