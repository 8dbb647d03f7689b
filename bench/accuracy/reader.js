'use strict';
// The project's reader CLI (bin/otel-thread-ctx) as a sampler:
// `sample --pid N --hz F --duration S --raw` stops each thread with ptrace,
// reads its record and prints one JSON line per read
// {tid, t_ns, valid, trace_id, span_id, trace_flags}. Each round reads every
// thread, on CPU or not, so it samples wall-clock time rather than CPU time.

const fs = require('node:fs');
const { spawn, spawnSync } = require('node:child_process');
const { onLines, interrupt } = require('../../tools/subprocess');
const { nodeSchema } = require('../../js/abi');

const BINARY = process.env.OTEL_THREAD_CTX_READER || require('../../js/native').readerPath();

/** Why the reader cannot sample, or null when it can. */
function unavailableReason() {
  if (!fs.existsSync(BINARY)) return `no reader binary at ${BINARY}`;
  const help = spawnSync(BINARY, ['sample', '--help'], { encoding: 'utf8' });
  if (help.status !== 0 || !/--raw/.test(`${help.stdout}${help.stderr}`)) return 'the reader has no `sample --raw` yet';
  return null;
}

/**
 * Runs `inspect --pid N --json` and returns the static-TLS offset of
 * otel_thread_ctx_v1 from the thread pointer it resolved (BigInt), checked
 * against `threads` [{tid, tlsAddress}] reported from inside; null when the
 * reader cannot tell (not built yet, or not static TLS).
 */
function tlsOffset(pid, threads = []) {
  if (!fs.existsSync(BINARY)) return null;
  const run = spawnSync(BINARY, ['inspect', '--pid', String(pid), '--json'], { encoding: 'utf8' });
  let report;
  try {
    report = JSON.parse(run.stdout);
  } catch {
    return null;
  }
  const resolution = report.symbol?.resolution;
  if (resolution?.path !== 'tlsdesc-static' || typeof resolution.tp_offset !== 'number') return null;
  const offset = BigInt(resolution.tp_offset);
  // Each thread's `tls` is the variable of the schema that answered for
  // it: the Node.js schema's block in frame mode.
  const byTid = new Map((report.threads ?? []).map((t) => [t.tid, t]));
  for (const t of threads) {
    const entry = byTid.get(t.tid);
    const tls = entry?.tls;
    const frame = entry?.schema === nodeSchema.schemaVersion;
    const expected = frame ? t.frameTlsAddress : t.tlsAddress;
    if (!tls || expected == null || BigInt(tls.variable_address) !== BigInt(expected) || (!frame && BigInt(tls.tp_offset) !== offset)) {
      throw new Error(`reader and thread ${t.tid} disagree on ${frame ? nodeSchema.tlsSymbol : 'otel_thread_ctx_v1'}: ${JSON.stringify(tls)} vs ${expected}`);
    }
  }
  return offset;
}

/**
 * Starts sampling `pid`; `done` resolves on exit with {samples [{tid, t,
 * valid, spanId, traceId}], errors (failed reads), summary (its stderr)}.
 */
function sample(pid, { hz = 997, durationS }) {
  const child = spawn(BINARY, ['sample', '--pid', String(pid), '--hz', String(hz), '--duration', String(durationS), '--raw'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const samples = [];
  let errors = 0;
  let stderr = '';
  child.stderr.on('data', (c) => (stderr += c));
  onLines(child.stdout, (line) => {
    if (!line.startsWith('{')) return;
    const s = JSON.parse(line);
    if (s.error) {
      errors++;
      return;
    }
    samples.push({
      tid: Number(s.tid),
      t: BigInt(s.t_ns),
      valid: Number(s.valid),
      spanId: s.span_id ?? '',
      traceId: s.trace_id ?? '',
    });
  });
  const done = new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code, signal) => {
      // 130: stopped by our SIGINT after the workload finished.
      if (code !== 0 && code !== 130 && signal === null) reject(new Error(`reader sample exited ${code}: ${stderr.trim()}`));
      else resolve({ samples, errors, summary: stderr.trim() });
    });
  });
  return { child, done, stop: () => interrupt(child) };
}

module.exports = { BINARY, unavailableReason, tlsOffset, sample };
