'use strict';
// Flame graphs of bpftrace's stacks: folded stacks (one line per stack,
// root first) rendered to SVG by the otel-thread-ctx-flamegraph binary,
// for the whole run and for each of the busiest traces.

const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { traceRoutes } = require('./routes');

/** Folded-stack text of `entries`, each stack under the frames `prefix(entry)` names. */
function fold(entries, prefix) {
  const lines = new Map();
  for (const e of entries) {
    const line = [...prefix(e), ...[...e.frames].reverse()].join(';');
    lines.set(line, (lines.get(line) ?? 0) + e.count);
  }
  return [...lines].map(([l, n]) => `${l} ${n}`).join('\n') + '\n';
}

/**
 * Writes into `outDir` (emptied first) the folded stacks and flame graphs
 * of the top 3 traces and of all samples by span; returns {files
 * [{foldedPath, svgPath, error}], topTraces [{traceId, count}], traceRoute}.
 */
function writeFlameGraphs(stacks, { threads, spans, routes, outDir, flamegraph }) {
  const threadName = new Map(threads.map((t) => [t.tid, t.name]));
  const mine = stacks.filter((s) => threadName.has(s.tid));
  fs.rmSync(outDir, { recursive: true, force: true });
  fs.mkdirSync(outDir, { recursive: true });
  const spanLabel = (e) => (e.spanId ? spans.get(e.spanId)?.name ?? `span ${e.spanId}` : 'no span');
  const traceRoute = traceRoutes(routes, spans);
  const files = [];
  const render = (name, text, title) => {
    const foldedPath = path.join(outDir, `${name}.folded`);
    const svgPath = path.join(outDir, `${name}.svg`);
    fs.writeFileSync(foldedPath, text);
    const r = spawnSync(flamegraph, [foldedPath, svgPath, title], { encoding: 'utf8' });
    files.push({ foldedPath, svgPath: r.status === 0 ? svgPath : null, error: r.status === 0 ? null : (r.stderr || String(r.error)).trim() });
  };
  const byTrace = new Map();
  for (const e of mine) {
    if (!e.traceId) continue;
    const t = byTrace.get(e.traceId) ?? { traceId: e.traceId, count: 0, entries: [] };
    t.count += e.count;
    t.entries.push(e);
    byTrace.set(e.traceId, t);
  }
  const topTraces = [...byTrace.values()].sort((a, b) => b.count - a.count).slice(0, 3);
  for (const t of topTraces) {
    const route = traceRoute.get(t.traceId) ?? '';
    render(`trace-${t.traceId}`, fold(t.entries, (e) => [threadName.get(e.tid), spanLabel(e)]), `trace ${t.traceId} ${route} (${t.count} samples)`);
  }
  render('all-by-span', fold(mine, (e) => [spanLabel(e), threadName.get(e.tid)]), 'demo-shop CPU by span (all samples)');
  return { files, topTraces, traceRoute };
}

module.exports = { writeFlameGraphs };
