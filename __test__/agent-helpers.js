'use strict';
// What the agent's end-to-end suites share: traced services to profile
// (fixtures/profiled-service.js), the agent itself with its log, and the
// reading of its OTLP exports with protobufjs and an independent .proto.
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const protobuf = require('protobufjs');
const { jsonLines, exited } = require('./helpers');
const { onLines } = require('../tools/subprocess');

const READER = require('../js/native').readerPath();
const SERVICE = path.join(__dirname, 'fixtures', 'profiled-service.js');
const Request = protobuf.loadSync(path.join(__dirname, 'fixtures', 'profiles.proto')).lookupType('otlp.profiles.test.ExportProfilesServiceRequest');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Waits until `check()` returns a truthy value (polling), or fails saying what was awaited. */
async function until(what, check, { timeoutMs = 120000, explain = () => '' } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${explain()}`);
    await sleep(250);
  }
}

/** What `seen` holds, for a failure message. */
function describe(seen) {
  return [...seen]
    .map(([pid, p]) => `\npid ${pid}: ${JSON.stringify(p.resource)}; links ${JSON.stringify([...p.links])}; threads ${[...p.threads]}; ${[...p.functions].filter((f) => /spinCpu/.test(f)).length} spinCpu frames`)
    .join('');
}

/**
 * A service in `mode` (undefined: the default) named `name`, run in `cwd`;
 * resolves with its ids once both threads run.
 */
async function startService(t, cwd, name, mode) {
  const env = { ...process.env, SERVICE_NAME: name };
  delete env.OTEL_THREAD_CTX_MODE;
  if (mode) env.OTEL_THREAD_CTX_MODE = mode;
  const child = spawn(process.execPath, ['--perf-basic-prof', SERVICE], { cwd, env, stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => {
    child.kill('SIGKILL');
    fs.rmSync(`/tmp/perf-${child.pid}.map`, { force: true });
  });
  const ids = await jsonLines(child.stdout).next(`the line of service ${name}`);
  return { child, ids, name };
}

/** This process's environment without the OpenTelemetry exporter variables (the agent reads them), plus `extra`. */
function withoutExporterEnv(extra = {}) {
  const env = { ...process.env };
  for (const name of Object.keys(env)) if (name.startsWith('OTEL_EXPORTER_OTLP_')) delete env[name];
  return { ...env, ...extra };
}

/**
 * Starts the agent in `cwd` with `env` (by default this process's without
 * the exporter variables); `waitFor(re)` resolves with the first log line
 * matching `re`, `stop()` sends SIGTERM and resolves with the exit code
 * and the log.
 */
function startAgent(t, cwd, args, env = withoutExporterEnv()) {
  const child = spawn(READER, ['agent', ...args], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = [];
  const waiters = [];
  const take = (line) => {
    lines.push(line);
    for (const w of waiters) if (!w.done && w.re.test(line)) (w.done = true), w.resolve(line);
  };
  onLines(child.stderr, take);
  child.stdout.resume();
  t.after(() => child.kill('SIGKILL'));
  const waitFor = (re, what = String(re)) => {
    const seen = lines.find((l) => re.test(l));
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const w = { re, resolve, done: false };
      waiters.push(w);
      child.once('exit', (code, signal) => {
        if (!w.done) reject(new Error(`the agent exited (${code ?? signal}) before ${what}:\n${lines.join('\n')}`));
      });
    });
  };
  const stop = async () => {
    child.kill('SIGTERM');
    const code = await exited(child, 30000);
    return { code, log: lines.join('\n') };
  };
  return { child, lines, waitFor, stop };
}

/**
 * What an export says about each process: by pid, its Resource attributes,
 * the spans its samples link to (span id -> trace id), the JavaScript
 * function names in its stacks, the profile types, and the samples'
 * thread ids.
 */
function byProcess(bytes) {
  const msg = Request.toObject(Request.decode(bytes), { longs: Number, bytes: Buffer, defaults: false });
  const dict = msg.dictionary;
  const str = (i) => dict.stringTable[i ?? 0];
  // A string may be given inline or, as the Collector re-encodes profiles
  // (proto v1.11), as an index into the dictionary's string table.
  const value = (v) => v.stringValue ?? (v.stringValueStrindex !== undefined ? str(v.stringValueStrindex) : v.intValue);
  const key = (kv) => kv.key || str(kv.keyStrindex);
  const out = new Map();
  for (const rp of msg.resourceProfiles ?? []) {
    const resource = Object.fromEntries(rp.resource.attributes.map((kv) => [key(kv), value(kv.value)]));
    const p = { resource, links: new Map(), functions: new Set(), types: [], threads: new Set() };
    for (const profile of rp.scopeProfiles[0].profiles) {
      p.types.push(str(profile.sampleType.typeStrindex));
      for (const s of profile.samples ?? []) {
        if (s.linkIndex) {
          const link = dict.linkTable[s.linkIndex];
          p.links.set(link.spanId.toString('hex'), link.traceId.toString('hex'));
        }
        for (const i of s.attributeIndices ?? []) {
          const kv = dict.attributeTable[i];
          if (str(kv.keyStrindex) === 'thread.id') p.threads.add(Number(value(kv.value)));
        }
        for (const l of dict.stackTable[s.stackIndex ?? 0].locationIndices ?? []) {
          for (const line of dict.locationTable[l].lines ?? []) p.functions.add(str(dict.functionTable[line.functionIndex ?? 0].nameStrindex));
        }
      }
    }
    out.set(Number(resource['process.pid']), p);
  }
  return out;
}

/** Merges the per-process views of several exports. */
function merge(into, from) {
  for (const [pid, p] of from) {
    const q = into.get(pid);
    if (!q) {
      into.set(pid, p);
      continue;
    }
    for (const [k, v] of p.links) q.links.set(k, v);
    for (const f of p.functions) q.functions.add(f);
    for (const tid of p.threads) q.threads.add(tid);
    q.types = [...new Set([...q.types, ...p.types])];
  }
  return into;
}

/** Merges the files of `dir` not in `read` yet into `seen`. */
function readNewFiles(dir, read, seen) {
  for (const name of fs.readdirSync(dir).filter((n) => n.endsWith('.otlp.pb')).sort()) {
    if (read.has(name)) continue;
    read.add(name);
    merge(seen, byProcess(fs.readFileSync(path.join(dir, name))));
  }
  return seen;
}

/** Whether `seen` shows `service` whole: its resource, both threads' spans with their traces, JS names. */
function complete(seen, service) {
  const p = seen.get(service.ids.pid);
  if (!p) return false;
  const { main, worker } = service.ids;
  return (
    p.resource['service.name'] === service.name &&
    p.links.get(main.cpu.spanId) === main.cpu.traceId &&
    p.links.get(worker.span.spanId) === worker.span.traceId &&
    [...p.functions].some((f) => /spinCpu/.test(f)) &&
    p.threads.has(main.tid) &&
    p.threads.has(worker.tid)
  );
}

function assertComplete(seen, service) {
  const p = seen.get(service.ids.pid);
  assert.ok(p, `no profile of pid ${service.ids.pid}`);
  assert.strictEqual(p.resource['service.name'], service.name);
  assert.strictEqual(p.resource['process.executable.path'], fs.readlinkSync(`/proc/${service.ids.pid}/exe`));
  assert.strictEqual(p.resource['process.runtime.name'], 'nodejs');
  assert.strictEqual(p.links.get(service.ids.main.cpu.spanId), service.ids.main.cpu.traceId);
  assert.strictEqual(p.links.get(service.ids.worker.span.spanId), service.ids.worker.span.traceId);
  assert.ok([...p.functions].some((f) => /spinCpu/.test(f)), `no spinCpu frame in ${[...p.functions].slice(0, 50)}`);
  // Every link is to a span the service made.
  const known = new Set([service.ids.main.cpu.spanId, service.ids.main.wait.spanId, service.ids.worker.span.spanId]);
  for (const spanId of p.links.keys()) assert.ok(known.has(spanId), `pid ${service.ids.pid} links to an unknown span ${spanId}`);
}

module.exports = { READER, sleep, until, describe, startService, withoutExporterEnv, startAgent, byProcess, merge, readNewFiles, complete, assertComplete };
