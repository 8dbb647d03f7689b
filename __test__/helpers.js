'use strict';
// Shared test helpers: reading records the way an outside reader does, and
// running child processes that park threads inside spans.
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const readline = require('node:readline');
const { context, trace, TraceFlags } = require('@opentelemetry/api');
const { record } = require('../js/abi');
const { decodeHeader, decodeAttrs } = require('../tools/record');

const ROOT = path.resolve(__dirname, '..');
const HEADER_SIZE = record.headerSize;

/** Reads and decodes a record header from `pid`'s memory (/proc/<pid>/mem). */
function readRecord(pid, address) {
  const fd = fs.openSync(`/proc/${pid}/mem`, 'r');
  try {
    const buf = Buffer.alloc(HEADER_SIZE);
    const n = fs.readSync(fd, buf, 0, HEADER_SIZE, BigInt(address));
    if (n !== HEADER_SIZE) throw new Error(`short read of record at ${address}: ${n}`);
    return decodeHeader(buf);
  } finally {
    fs.closeSync(fd);
  }
}

/** The pointer `otel_thread_ctx_v1` holds, read from `pid`'s memory at the variable's address. */
function readPointer(pid, tlsAddress) {
  const fd = fs.openSync(`/proc/${pid}/mem`, 'r');
  try {
    const buf = Buffer.alloc(8);
    const n = fs.readSync(fd, buf, 0, 8, BigInt(tlsAddress));
    if (n !== 8) throw new Error(`short read of otel_thread_ctx_v1 at ${tlsAddress}: ${n}`);
    return buf.readBigUInt64LE(0);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * What an OTEP 4947 reader reads for a thread of `pid` whose
 * `otel_thread_ctx_v1` is at `tlsAddress`: the record its pointer points
 * at now (record mode points it at the active span's record), or
 * NO_RECORD when the pointer is NULL.
 */
function readRecordVia(pid, tlsAddress) {
  const pointer = readPointer(pid, tlsAddress);
  return pointer === 0n ? NO_RECORD : readRecord(pid, pointer);
}

/** A decoded header that publishes nothing (what a reader reports when a walk finds no record). */
const NO_RECORD = Object.freeze({ traceId: '0'.repeat(32), spanId: '0'.repeat(16), valid: 0, traceFlags: 0, attrsDataSize: 0 });

/**
 * The address a reader reads for the calling thread now, in the mode in
 * force: the OTEP 4947 record (record mode), or where the Node.js schema's
 * walk from the thread's `otel_thread_ctx_nodejs_v1` block ends (frame
 * mode; null when it ends at no record).
 */
function ownRecordAddress() {
  const { threadInfo } = require(ROOT);
  const info = threadInfo();
  if (info.mode !== 'frame') return info.tlsValue === 0n ? null : info.tlsValue;
  return require('../js/binding').frameWalk().record ?? null;
}

/**
 * What a reader finds for a thread described by its `threadInfo()` (taken
 * on that thread) while that thread is parked: its OTEP 4947 record (record
 * mode), or where the Node.js schema's walk from its
 * `otel_thread_ctx_nodejs_v1` block ends (frame mode), read through
 * /proc/self/mem. Frame mode's walk is the package's own non-faulting one.
 */
function readThreadRecord(info) {
  if (info.mode !== 'frame') return readRecordVia('self', info.tlsAddress);
  const { record } = require('../js/binding').frameWalkAt(BigInt(info.frame.tlsAddress));
  return record == null ? NO_RECORD : readRecord('self', record);
}

/**
 * readThreadRecord() for a thread that keeps running JavaScript while it is
 * read (profilers stop the thread first; this test reader cannot). In frame
 * mode such a thread closes its gate (cped_slot = 0) while its isolate
 * moves objects in a GC, and a read that lands there sees no record: read
 * again, a bounded number of times, until the gate is open. A record that
 * is present is returned as read, right or wrong.
 */
function readRunningThreadRecord(info, tries = 200) {
  let r = readThreadRecord(info);
  for (let i = 1; i < tries && info.mode === 'frame' && r === NO_RECORD; i++) {
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    r = readThreadRecord(info);
  }
  return r;
}

/**
 * What a profiler reads for thread `th` (`{ tid, mode, tlsAddress }` as
 * the target printed them) of process `pid`, from outside: the OTEP 4947
 * record its pointer points at, through /proc/<pid>/mem, in record mode; in frame mode, what the
 * reader CLI's walk of the Node.js schema finds (`inspect --json`), with
 * `reason` saying why there is no span.
 */
function readFromOutside(pid, th) {
  if (th.mode !== 'frame') return th.tlsAddress === undefined ? readRecord(pid, th.recordAddress) : readRecordVia(pid, th.tlsAddress);
  const reader = require('../js/native').readerPath();
  if (reader === null) throw new Error('the reader CLI is not built (npm run build)');
  const r = require('node:child_process').spawnSync(reader, ['inspect', '--pid', String(pid), '--json'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`inspect failed: ${r.stderr}`);
  const entry = JSON.parse(r.stdout).threads.find((x) => x.tid === Number(th.tid));
  if (entry === undefined) throw new Error(`thread ${th.tid} is not in the reader's report`);
  if (entry.status !== 'valid') return { ...NO_RECORD, reason: entry.no_span_reason ?? entry.status };
  const { record } = entry;
  return { valid: record.valid, traceId: record.trace_id, spanId: record.span_id, traceFlags: record.trace_flags, attrsDataSize: record.attrs_data_size, reason: null };
}

/** The calling thread's published record, read through /proc/self/mem (not through the JS view). */
function readOwnRecord() {
  const address = ownRecordAddress();
  return address === null ? NO_RECORD : readRecord('self', address);
}

let counter = 0;
/** A context carrying a fresh, recognisable, valid span context. */
function spanContextFor(label, flags = TraceFlags.SAMPLED) {
  counter++;
  const hex = (n, width) => n.toString(16).padStart(width, '0');
  const traceId = hex(0xabc000 + counter, 16) + hex(Buffer.from(label).reduce((a, b) => a * 31 + b, 7) >>> 0, 16);
  const spanId = hex(0x5000 + counter, 16);
  const spanContext = { traceId, spanId, traceFlags: flags, isRemote: false };
  return { spanContext, ctx: trace.setSpanContext(context.active(), spanContext) };
}

/**
 * Reads `stream` as JSON lines (one value per line, through node:readline).
 * `next(what)` resolves with the next line not yet taken, in order; it
 * rejects if the stream ends first, or after `timeoutMs` when one is given.
 */
function jsonLines(stream, { timeoutMs } = {}) {
  const queue = [];
  const waiters = [];
  let ended = false;
  readline
    .createInterface({ input: stream, crlfDelay: Infinity })
    .on('line', (text) => {
      const value = JSON.parse(text);
      if (waiters.length) waiters.shift().resolve(value);
      else queue.push(value);
    })
    .on('close', () => {
      ended = true;
      for (const waiter of waiters.splice(0)) waiter.reject(new Error(`output ended before ${waiter.what}`));
    });
  const next = (what = 'the expected line') => {
    if (queue.length) return Promise.resolve(queue.shift());
    if (ended) return Promise.reject(new Error(`output ended before ${what}`));
    return new Promise((resolve, reject) => {
      const timer = timeoutMs && setTimeout(() => reject(new Error(`no ${what} within ${timeoutMs} ms`)), timeoutMs);
      const settle = (fn) => (value) => (clearTimeout(timer), fn(value));
      waiters.push({ what, resolve: settle(resolve), reject: settle(reject) });
    });
  };
  return { next };
}

/**
 * Spawns `node -e script` (with the Node running the tests) and resolves once
 * the child printed `count` JSON lines, with the child, those lines, and
 * `next()` for the lines that follow.
 */
async function spawnNode(script, { count = 1, args = [], env = {} } = {}) {
  const child = spawn(process.execPath, [...args, '-e', script], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const { next } = jsonLines(child.stdout);
  const lines = [];
  while (lines.length < count) lines.push(await next(`line ${lines.length + 1} of the child (exit ${child.exitCode ?? child.signalCode})`));
  return { child, lines, next };
}

/** Resolves when `child` exits; kills it if it has not after `ms`. */
function exited(child, ms = 10000) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), ms);
    child.removeAllListeners('exit');
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve(code);
    });
  });
}

/** Runs `reader profile --pid <pid> <args>` in `cwd`; resolves to its exit code and stderr. */
function runProfile(reader, pid, args, cwd) {
  return new Promise((resolve) => {
    const child = spawn(reader, ['profile', '--pid', String(pid), ...args], { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    child.on('exit', (code) => resolve({ code, stderr }));
  });
}

/**
 * Why `otel-thread-ctx profile` cannot run here, or null: `reader` is the
 * reader's path (null when it is not built).
 */
function profileUnavailable(reader) {
  if (reader === null) return 'the reader is not built (npm install builds it)';
  if (process.getuid() !== 0) return 'profile loads BPF programs: run the tests as root';
  // A pid that cannot exist: a build without the BPF program says so first.
  const probe = spawnSync(reader, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  if (/no kernel sampler/.test(probe.stderr)) return probe.stderr.trim();
  return null;
}

/** Reads a whole record (header + attrs_data) from `pid`'s memory. */
function readFullRecord(pid, address) {
  const header = readRecord(pid, address);
  const fd = fs.openSync(`/proc/${pid}/mem`, 'r');
  try {
    const attrs = Buffer.alloc(header.attrsDataSize);
    fs.readSync(fd, attrs, 0, attrs.length, BigInt(address) + BigInt(record.offsets.attrsData));
    return { ...header, attrs: decodeAttrs(attrs) };
  } finally {
    fs.closeSync(fd);
  }
}

/** The Go toolchain's `go` (for `go tool pprof`), or null when there is none. */
function goTool() {
  for (const go of ['go', '/usr/local/go/bin/go']) {
    if (spawnSync(go, ['version'], { encoding: 'utf8' }).status === 0) return go;
  }
  return null;
}

/** What `go tool pprof -raw` prints: each sample's values by sample type and its labels, and the lines from Locations on. */
function rawSamples(text) {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.startsWith('Samples:'));
  const end = lines.findIndex((l) => l.startsWith('Locations'));
  assert.ok(start >= 0 && end > start, `no Samples section in:\n${text.slice(0, 2000)}`);
  const types = lines[start + 1].trim().split(/\s+/).map((t) => t.replace('[dflt]', '').split('/')[0]);
  const samples = [];
  for (const line of lines.slice(start + 2, end)) {
    const values = line.match(/^\s*((?:-?\d+\s+)*-?\d+):/);
    if (values) {
      const nums = values[1].trim().split(/\s+/).map(Number);
      samples.push({ values: Object.fromEntries(types.map((t, i) => [t, nums[i]])), labels: {} });
      continue;
    }
    for (const [, k, v] of line.matchAll(/([\w.]+):\[([^\]]*)\]/g)) samples.at(-1).labels[k] = v;
  }
  return { samples, locations: lines.slice(end) };
}

const scratchDirs = [];
process.on('exit', () => {
  for (const dir of scratchDirs) fs.rmSync(dir, { recursive: true, force: true });
});

/**
 * A new directory in $TMPDIR named `prefix` + random characters, removed
 * when the test process exits, whichever of its tests ran.
 */
function scratchDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  scratchDirs.push(dir);
  return dir;
}

/** V8's gc(), with or without --expose-gc (takes `{ type: 'minor' }` for a scavenge). */
function gcFunction() {
  if (typeof globalThis.gc === 'function') return globalThis.gc;
  require('node:v8').setFlagsFromString('--expose-gc');
  return require('node:vm').runInNewContext('gc');
}

/** A full GC, with or without --expose-gc. */
function collectGarbage() {
  gcFunction()();
}

/**
 * Full GCs with event-loop turns between them, so that finalizers V8 posts
 * (external buffers', napi's) run and what they free is freed too.
 */
async function collectUntilSettled(rounds = 10) {
  for (let i = 0; i < rounds; i++) {
    collectGarbage();
    await new Promise((resolve) => setImmediate(resolve));
  }
}

module.exports = { ROOT, gcFunction, collectGarbage, collectUntilSettled, scratchDir, NO_RECORD, ownRecordAddress, readThreadRecord, readRunningThreadRecord, readFromOutside, readRecord, readPointer, readRecordVia, readOwnRecord, readFullRecord, spanContextFor, jsonLines, spawnNode, exited, profileUnavailable, runProfile, goTool, rawSamples };
