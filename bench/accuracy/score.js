'use strict';
// Scores what a sampler saw against the workload's ground truth.
//
// On-CPU: a sample whose time falls inside a CPU segment of its thread is
// correct (valid record, the segment's span), wrong (valid, another span) or
// missing (invalid record); samples between segments are counted apart.
//
// Off-CPU: each interval a thread spent off the CPU (switch-out to
// switch-in) carries the record read at switch-out. Its overlap with the
// thread's logged blocking calls is blocked time, attributed to the blocking
// span, to another span, or to none. The rest of the interval is idle time
// when the thread was blocked in epoll (the event loop waiting), else other
// (preemption, page faults, V8 platform waits).

const fs = require('node:fs');
const path = require('node:path');

/** Loads the truth files a workload run wrote to `dir`. */
function loadTruth(dir) {
  return fs
    .readdirSync(dir)
    .filter((f) => /^truth-\d+\.json$/.test(f))
    .map((f) => {
      const t = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
      const segments = t.segments.map(([span, start, end]) => ({ spanId: t.spanIds[span], start: BigInt(start), end: BigInt(end) }));
      const blocks = t.blocks.map(([span, kind, start, end]) => ({
        spanId: t.spanIds[span],
        kind,
        start: BigInt(start),
        end: BigInt(end),
      }));
      segments.sort((a, b) => (a.start < b.start ? -1 : 1));
      blocks.sort((a, b) => (a.start < b.start ? -1 : 1));
      return { tid: t.tid, thread: t.thread, spans: t.spanIds.length, segments, blocks, gcs: t.gcs ?? null };
    })
    .sort((a, b) => a.thread - b.thread);
}

/** Index of the last interval starting at or before `t`, or -1. */
function lastStartingBefore(list, t) {
  let lo = 0;
  let hi = list.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid].start <= t) {
      found = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return found;
}

const ZERO_ID = '0000000000000000';

const counts = () => ({ samples: 0, correct: 0, wrong: 0, missing: 0, outside: 0, outsideValid: 0 });

function addCounts(into, c) {
  for (const k of Object.keys(into)) into[k] += c[k];
}

/** On-CPU scoring of `samples` [{tid, t, valid, spanId}] against `truth`. */
function scoreOnCpu(truth, samples) {
  const byTid = new Map(truth.map((th) => [th.tid, { th, c: counts(), misses: [] }]));
  let otherThreads = 0;
  for (const s of samples) {
    const entry = byTid.get(s.tid);
    if (!entry) {
      otherThreads++;
      continue;
    }
    const { th, c } = entry;
    c.samples++;
    const i = lastStartingBefore(th.segments, s.t);
    const seg = i >= 0 ? th.segments[i] : null;
    if (seg === null || s.t > seg.end) {
      c.outside++;
      if (s.valid === 1) c.outsideValid++;
      continue;
    }
    if (s.valid !== 1) c.missing++;
    else if (s.spanId === seg.spanId) {
      c.correct++;
      continue;
    } else c.wrong++;
    entry.misses.push({
      kind: s.valid === 1 ? 'wrong' : 'missing',
      tid: s.tid,
      intoSegmentUs: Number(s.t - seg.start) / 1000,
      segmentUs: Number(seg.end - seg.start) / 1000,
      seen: s.valid === 1 ? s.spanId : null,
      expected: seg.spanId,
      // Was the seen span the one of the thread's previous segment?
      previousSegmentSpan: s.valid === 1 && i > 0 && th.segments[i - 1].spanId === s.spanId,
      // The record pointer read fine but every record byte read as zero: the
      // read faulted (a published or invalidated record keeps its span id).
      unreadable: s.valid !== 1 && s.pointer === true && s.spanId === ZERO_ID,
      // The thread's TLS slot read as NULL: a JS thread inside a segment is
      // registered, so its slot holds a record address; the sampler's read
      // of the slot faulted.
      slotUnreadable: s.valid !== 1 && s.pointer === false,
    });
  }
  const perThread = [...byTid.values()].map(({ th, c }) => ({ tid: th.tid, thread: th.thread, ...c }));
  const overall = counts();
  for (const c of perThread) addCounts(overall, c);
  const misses = [...byTid.values()].flatMap((e) => e.misses);
  return { perThread, overall, otherThreads, misses };
}

/**
 * For a sampler that reads threads whether they run or not (the reader's
 * ptrace rounds): reads that fall inside a logged blocking call, scored like
 * on-CPU samples against the blocking span.
 */
function scoreReadsInBlocks(truth, samples) {
  const byTid = new Map(truth.map((th) => [th.tid, th]));
  const c = { scored: 0, correct: 0, wrong: 0, missing: 0 };
  for (const s of samples) {
    const th = byTid.get(s.tid);
    if (!th) continue;
    const i = lastStartingBefore(th.blocks, s.t);
    if (i < 0 || s.t > th.blocks[i].end) continue;
    c.scored++;
    if (s.valid !== 1) c.missing++;
    else if (s.spanId === th.blocks[i].spanId) c.correct++;
    else c.wrong++;
  }
  return c;
}

const PREEMPTED_STATE_MASK = 0xff; // S = 1, D = 2; 0 or TASK_REPORT_MAX mean preempted

const attribution = () => ({ ns: 0n, correct: 0n, wrong: 0n, none: 0n });

/** Off-CPU scoring of `intervals` [{tid, out, in, valid, spanId, state, epoll}]. */
function scoreOffCpu(truth, intervals) {
  const byTid = new Map(truth.map((th) => [th.tid, th]));
  const blocked = attribution();
  const byKind = {};
  const idle = { ns: 0n, attributedNs: 0n, intervals: 0, attributedIntervals: 0 };
  const other = { ns: 0n, attributedNs: 0n, preemptedNs: 0n, bySyscall: {} };
  const perThread = new Map();
  const blockedMisses = [];
  const idleMisses = [];
  let blocksWithOffCpu = 0;
  let unreadableNs = 0n;
  const seenBlocks = new Set();
  for (const iv of intervals) {
    const th = byTid.get(iv.tid);
    if (!th) continue;
    const pt = perThread.get(iv.tid) ?? { tid: iv.tid, thread: th.thread, blocked: attribution(), idleNs: 0n, idleAttributedNs: 0n };
    perThread.set(iv.tid, pt);
    const attributedTo = iv.valid === 1 ? iv.spanId : null;
    let covered = 0n;
    // Blocks overlapping [out, in]: start from the last one starting before `in`.
    for (let i = lastStartingBefore(th.blocks, iv.in); i >= 0; i--) {
      const b = th.blocks[i];
      if (b.end <= iv.out) break;
      const from = b.start > iv.out ? b.start : iv.out;
      const to = b.end < iv.in ? b.end : iv.in;
      if (to <= from) continue;
      const ns = to - from;
      covered += ns;
      seenBlocks.add(b);
      const verdict = attributedTo === null ? 'none' : attributedTo === b.spanId ? 'correct' : 'wrong';
      for (const acc of [blocked, pt.blocked, (byKind[b.kind] ??= attribution())]) {
        acc.ns += ns;
        acc[verdict] += ns;
      }
      if (verdict !== 'correct') {
        if (verdict === 'none' && iv.pointer && iv.spanId === ZERO_ID) unreadableNs += ns;
        blockedMisses.push({
          tid: iv.tid,
          kind: b.kind,
          verdict,
          ns: Number(ns),
          state: iv.state,
          syscall: iv.syscall,
          pointerRead: iv.pointer,
          rawSpan: iv.spanId,
          intoBlockUs: Number(iv.out - b.start) / 1000,
          blockUs: Number(b.end - b.start) / 1000,
          thread: th.thread,
          expected: b.spanId,
          seen: attributedTo,
        });
      }
    }
    const rest = iv.in - iv.out - covered;
    if (rest <= 0n) continue;
    const voluntary = (iv.state & PREEMPTED_STATE_MASK) !== 0;
    if (iv.epoll && voluntary) {
      idle.ns += rest;
      idle.intervals++;
      pt.idleNs += rest;
      if (attributedTo !== null) {
        idle.attributedNs += rest;
        idle.attributedIntervals++;
        pt.idleAttributedNs += rest;
        idleMisses.push({ tid: iv.tid, ns: Number(rest), span: attributedTo, at: String(iv.out) });
      }
    } else {
      other.ns += rest;
      if (!voluntary) other.preemptedNs += rest;
      if (attributedTo !== null) other.attributedNs += rest;
      if (voluntary) {
        const sc = (other.bySyscall[iv.syscall ?? -1] ??= { ns: 0n, attributedNs: 0n, intervals: 0 });
        sc.ns += rest;
        sc.intervals++;
        if (attributedTo !== null) sc.attributedNs += rest;
      }
    }
  }
  blocksWithOffCpu = seenBlocks.size;
  const totalBlocks = truth.reduce((n, th) => n + th.blocks.length, 0);
  return {
    blocked,
    byKind,
    idle,
    other,
    blocks: { total: totalBlocks, withOffCpu: blocksWithOffCpu },
    unreadableNs,
    perThread: [...perThread.values()].sort((a, b) => a.thread - b.thread),
    blockedMisses,
    idleMisses,
  };
}

// ---------------------------------------------------------------- printing

// x86-64 system call names for the ones a Node.js thread sleeps in.
const SYSCALLS = { '-1': 'none (page fault, preempted)', 0: 'read', 1: 'write', 7: 'poll', 61: 'wait4', 202: 'futex', 232: 'epoll_wait', 281: 'epoll_pwait', 441: 'epoll_pwait2', 59: 'execve', 56: 'clone', 435: 'clone3', 230: 'clock_nanosleep' };

const pct = (n, d) => (d === 0 || d === 0n ? '   n/a' : `${((Number(n) / Number(d)) * 100).toFixed(2).padStart(6)}%`);
const ms = (ns) => `${(Number(ns) / 1e6).toFixed(1)} ms`;

/** Human-readable lines for an on-CPU score. */
function formatOnCpu(score, label) {
  const lines = [`on-CPU, ${label}: samples in segments scored as correct / wrong / missing`];
  const row = (name, c) => {
    const scored = c.correct + c.wrong + c.missing;
    return `  ${name.padEnd(16)} ${String(scored).padStart(6)} scored  ${pct(c.correct, scored)} correct  ${pct(c.wrong, scored)} wrong  ${pct(c.missing, scored)} missing  (${c.outside} outside segments, ${c.outsideValid} of them valid)`;
  };
  for (const c of score.perThread) row && lines.push(row(`${c.thread === 0 ? 'main' : `worker ${c.thread}`} ${c.tid}`, c));
  lines.push(row('overall', score.overall));
  const unreadable = score.misses.filter((m) => m.unreadable).length;
  const slotUnreadable = score.misses.filter((m) => m.slotUnreadable).length;
  if (score.misses.length) {
    const near = score.misses.filter((m) => m.intoSegmentUs < 50).length;
    lines.push(`  misses: ${score.misses.length} (${unreadable} with the record unreadable, all bytes 0; ${slotUnreadable} with the TLS slot unreadable; ${near} within 50 us of a segment start; ${score.misses.filter((m) => m.previousSegmentSpan).length} showing the previous segment's span)`);
  }
  if (score.otherThreads) lines.push(`  (${score.otherThreads} samples on threads without a record: V8 platform, libuv pool)`);
  return lines;
}

/** Human-readable lines for an off-CPU score. */
function formatOffCpu(score) {
  const b = score.blocked;
  const unreadable = score.unreadableNs ? ` (${ms(score.unreadableNs)} of it read while the record was unreadable, all bytes 0)` : '';
  const lines = [
    `off-CPU: blocked time inside blocking calls ${ms(b.ns)} (${score.blocks.withOffCpu} of ${score.blocks.total} calls went off CPU)`,
    `  to the blocking span ${pct(b.correct, b.ns)}   to another span ${pct(b.wrong, b.ns)}   to no span ${pct(b.none, b.ns)}${unreadable}`,
  ];
  for (const [kind, k] of Object.entries(score.byKind)) {
    lines.push(`    ${kind.padEnd(8)} ${ms(k.ns).padStart(10)}  ${pct(k.correct, k.ns)} to the blocking span`);
  }
  for (const t of score.perThread) {
    lines.push(
      `    ${(t.thread === 0 ? 'main' : `worker ${t.thread}`).padEnd(8)} blocked ${ms(t.blocked.ns).padStart(10)} ${pct(t.blocked.correct, t.blocked.ns)} to the blocking span; idle ${ms(t.idleNs)}, ${ms(t.idleAttributedNs)} attributed to a span`,
    );
  }
  lines.push(
    `  idle in the event loop ${ms(score.idle.ns)} in ${score.idle.intervals} waits: ${ms(score.idle.attributedNs)} (${score.idle.attributedIntervals} waits) attributed to a span`,
    `  other off-CPU ${ms(score.other.ns)} (preempted ${ms(score.other.preemptedNs)}), ${ms(score.other.attributedNs)} of it with a span published`,
  );
  const waits = Object.entries(score.other.bySyscall).sort((a, b) => Number(b[1].ns - a[1].ns));
  if (waits.length) {
    lines.push(`    other sleeps by system call: ${waits.map(([sc, v]) => `${SYSCALLS[sc] ?? `#${sc}`} ${ms(v.ns)} (${ms(v.attributedNs)} with a span)`).join(', ')}`);
  }
  return lines;
}

/** Human-readable line for reads inside blocking calls. */
function formatReadsInBlocks(c) {
  return `  reads inside blocking calls: ${c.scored}, ${pct(c.correct, c.scored)} on the blocking span, ${pct(c.wrong, c.scored)} on another, ${pct(c.missing, c.scored)} on none`;
}

/** Plain-number summary (rates as fractions) for JSON output and tests. */
function summarize(onCpu, offCpu) {
  const rate = (n, d) => (Number(d) === 0 ? null : Number(n) / Number(d));
  const on = (c) => {
    const scored = c.correct + c.wrong + c.missing;
    return { scored, correct: rate(c.correct, scored), wrong: rate(c.wrong, scored), missing: rate(c.missing, scored), outside: c.outside };
  };
  const out = {};
  if (onCpu) out.onCpu = { overall: on(onCpu.overall), perThread: onCpu.perThread.map((c) => ({ tid: c.tid, thread: c.thread, ...on(c) })) };
  if (offCpu) {
    out.offCpu = {
      blockedMs: Number(offCpu.blocked.ns) / 1e6,
      toBlockingSpan: rate(offCpu.blocked.correct, offCpu.blocked.ns),
      toOtherSpan: rate(offCpu.blocked.wrong, offCpu.blocked.ns),
      toNoSpan: rate(offCpu.blocked.none, offCpu.blocked.ns),
      byKind: Object.fromEntries(Object.entries(offCpu.byKind).map(([k, v]) => [k, { ms: Number(v.ns) / 1e6, toBlockingSpan: rate(v.correct, v.ns) }])),
      idleMs: Number(offCpu.idle.ns) / 1e6,
      idleAttributedMs: Number(offCpu.idle.attributedNs) / 1e6,
    };
  }
  return out;
}

module.exports = { loadTruth, scoreOnCpu, scoreOffCpu, scoreReadsInBlocks, formatOnCpu, formatOffCpu, formatReadsInBlocks, summarize };
