'use strict';
// The reader's eBPF `profile` command on the demo service: flame graphs,
// the `--format top` tables and one JSON line per sample, all over the same
// interval.

const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const reader = require('../../bench/accuracy/reader');
const profiler = require('../../bench/accuracy/profiler');
const { track } = require('./processes');
const { interrupt } = require('../../tools/subprocess');

/**
 * Runs `profile` three times on `pid` (flame graphs, the tables of
 * `--format top`, and one JSON line per sample) writing into `outDir`,
 * until `stop()`; `done` resolves with their summary lines, the tables'
 * text and the on-CPU samples [{tid, count, traceId, spanId, route}].
 */
function startProfile(pid, { hz, durationS, outDir }) {
  const run = (format, file) => {
    const args = profiler.profileArgs(pid, { hz, durationS, format, output: path.join(outDir, file), extra: ['--max-traces', '3'] });
    const child = track(spawn(reader.BINARY, args, { stdio: ['ignore', 'ignore', 'pipe'] }));
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    const done = new Promise((resolve) => child.on('close', (code) => resolve({ code, stderr })));
    return { child, done };
  };
  const samplesFile = path.join(outDir, 'samples.jsonl');
  const topFile = path.join(outDir, 'top.txt');
  const runs = [run('svg', 'profile.svg'), run('top', 'top.txt'), run('jsonl', 'samples.jsonl')];
  return {
    stop() {
      for (const r of runs) interrupt(r.child);
    },
    done: Promise.all(runs.map((r) => r.done)).then((results) => {
      const samples = [];
      if (fs.existsSync(samplesFile)) {
        for (const s of profiler.readSamples(samplesFile).samples) {
          samples.push({ tid: s.tid, count: 1, traceId: s.traceId || null, spanId: s.spanId || null, route: s.attributes['http.route'] ?? null });
        }
        fs.rmSync(samplesFile);
      }
      const top = fs.existsSync(topFile) ? fs.readFileSync(topFile, 'utf8') : null;
      fs.rmSync(topFile, { force: true });
      // One run's summary says it all: the three ran over the same interval.
      // The demo itself ends the runs with SIGINT once the load is over: the
      // reader's "ended by signal 2" is that, not a failure.
      const summary = results[0].stderr
        .trim()
        .split('\n')
        .filter((l) => l && !/^thread context/.test(l))
        .map((l) => (/^ended by signal \d+$/.test(l) ? 'stopped by the demo after the load' : l));
      return { samples, top, summary };
    }),
  };
}

module.exports = { startProfile };
