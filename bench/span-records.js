#!/usr/bin/env node
'use strict';
// Frame mode's per-span native records over many spans: each span is
// started with the SDK, entered with startActiveSpan (its record is made),
// awaited across, and ended; records must be freed once nothing reaches
// them, so the live-record count and RSS stay flat however many spans ran.
//
//   node --expose-gc bench/span-records.js [--spans N] [--mode frame|record]
//
// Prints one line per tenth of the run and a JSON summary; exits 1 when the
// live records or RSS grow with the span count.

const { context } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager, ProcessContextSpanProcessor } = require('..');
const binding = require('../js/binding');

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : fallback;
};
const spans = Number(option('spans', '1000000'));
const mode = option('mode', 'frame');

const manager = new ProfilingContextManager({ mode });
context.setGlobalContextManager(manager.enable());
const tracer = new BasicTracerProvider({ spanProcessors: [new ProcessContextSpanProcessor()] }).getTracer('span-records');

async function settle() {
  for (let i = 0; i < 5; i++) {
    globalThis.gc?.();
    await new Promise((r) => setImmediate(r));
  }
}

async function main() {
  const CONCURRENCY = 100;
  const step = Math.max(CONCURRENCY, Math.floor(spans / 10));
  const samples = [];
  const start = process.hrtime.bigint();
  let done = 0;
  /** Records seen alive inside spans: proof that spans did get records. */
  let peakLive = 0;
  while (done < spans) {
    const batch = [];
    for (let i = 0; i < CONCURRENCY && done < spans; i++, done++) {
      const probe = done % 1000 === 0;
      batch.push(tracer.startActiveSpan('op', async (span) => {
        await null;
        if (probe) peakLive = Math.max(peakLive, binding.spanRecordSlabs());
        span.end();
      }));
    }
    await Promise.all(batch);
    if (done % step < CONCURRENCY) {
      await settle();
      const sample = { spans: done, liveRecords: binding.spanRecordSlabs(), rssMiB: process.memoryUsage().rss / 2 ** 20 };
      samples.push(sample);
      console.log(`${sample.spans} spans: ${sample.liveRecords} live records, RSS ${sample.rssMiB.toFixed(1)} MiB`);
    }
  }
  const nsPerSpan = Number(process.hrtime.bigint() - start) / spans;
  const first = samples[Math.min(1, samples.length - 1)];
  const last = samples[samples.length - 1];
  const summary = { node: process.version, mode: manager.mode, spans, nsPerSpan, peakLive, first, last, rssGrowthMiB: last.rssMiB - first.rssMiB };
  console.log(JSON.stringify(summary));
  // A leak of one record per span would be spans/10 records and 64+ bytes
  // per span between the first and the last sample.
  const leaking = (manager.mode === 'frame' && peakLive === 0) || last.liveRecords > first.liveRecords + 1000 || summary.rssGrowthMiB > Math.max(32, (spans * 16) / 2 ** 20);
  process.exitCode = leaking ? 1 : 0;
}

main();
