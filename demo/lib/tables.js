'use strict';
// The demo's tables: top spans, share by span name, and each thread's idle
// share, from one sampler's samples [{tid, count, traceId, spanId}].

const { traceRoutes } = require('./routes');

const pct = (n, d) => (d ? `${((100 * n) / d).toFixed(1)}%` : 'n/a');
const short = (id) => (id ? `${id.slice(0, 16)}…` : '-');

/**
 * Prints the tables of one sampler. `cpuSamplesPerThread` (CPU samplers
 * only): how many samples a thread on CPU all the time would have.
 */
function printTables({ label, samples, threads, spans, routes, cpuSamplesPerThread = null }) {
  const threadName = new Map(threads.map((t) => [t.tid, t.name]));
  const js = samples.filter((s) => threadName.has(s.tid));
  const total = js.reduce((n, s) => n + s.count, 0);
  console.log(`\n${label}: ${total} samples on ${threads.length} JavaScript threads`);
  const bySpan = new Map();
  const byName = new Map();
  for (const s of js) {
    if (!s.spanId) continue;
    const key = `${s.traceId}/${s.spanId}/${s.tid}`;
    const e = bySpan.get(key) ?? { traceId: s.traceId, spanId: s.spanId, tid: s.tid, count: 0 };
    e.count += s.count;
    bySpan.set(key, e);
    const info = spans.get(s.spanId);
    const name = info?.name ?? `span ${s.spanId}`;
    byName.set(name, (byName.get(name) ?? 0) + s.count);
  }
  const traceRoute = traceRoutes(routes, spans);
  const top = [...bySpan.values()].sort((a, b) => b.count - a.count).slice(0, 8);
  console.log('  top spans');
  console.log(`  ${'trace id'.padEnd(18)} ${'span'.padEnd(24)} ${'route (from records)'.padEnd(24)} ${'thread'.padEnd(7)} share`);
  for (const e of top) {
    const info = spans.get(e.spanId);
    const route = routes.get(e.spanId) ?? traceRoute.get(e.traceId) ?? '-';
    console.log(`  ${short(e.traceId).padEnd(18)} ${(info?.name ?? '?').padEnd(24)} ${route.padEnd(24)} ${threadName.get(e.tid).padEnd(7)} ${pct(e.count, total)}`);
  }
  console.log('  by span name');
  for (const [name, count] of [...byName].sort((a, b) => b[1] - a[1])) console.log(`    ${name.padEnd(28)} ${pct(count, total).padStart(6)}`);
  const idle = threads.map((t) => {
    const mine = js.filter((s) => s.tid === t.tid);
    const all = mine.reduce((n, s) => n + s.count, 0);
    const none = mine.filter((s) => !s.spanId).reduce((n, s) => n + s.count, 0);
    return `${t.name} ${pct(none, all)}`;
  });
  const none = js.filter((s) => !s.spanId).reduce((n, s) => n + s.count, 0);
  if (cpuSamplesPerThread === null) {
    console.log(`  idle (no span published: loop idle, or between callbacks): ${idle.join(', ')}; overall ${pct(none, total)}`);
  } else {
    // A CPU sampler sees a thread only while it runs: idle is the time it did not.
    const busy = threads.map((t) => {
      const n = js.filter((s) => s.tid === t.tid).reduce((k, s) => k + s.count, 0);
      return `${t.name} ${pct(Math.max(0, cpuSamplesPerThread - n), cpuSamplesPerThread)}`;
    });
    console.log(`  idle (off CPU): ${busy.join(', ')}`);
    console.log(`  on CPU with no span published (Node.js between callbacks, GC): ${idle.join(', ')}; overall ${pct(none, total)}`);
  }
}

module.exports = { printTables };
