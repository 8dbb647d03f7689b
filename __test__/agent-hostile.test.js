'use strict';
// `otel-thread-ctx agent` beside processes that publish a thread context
// the way no writer should (fixtures/hostile-target.c, built here with the
// C compiler): torn records, sizes past every limit, pointers to nowhere,
// V8 "heaps" of cycles and junk, process contexts of random bytes, a huge
// key map, wrong layout integers, a header left mid-update; one target
// forks hundreds of short-lived children, one executes itself again
// mid-run, and short-lived ones keep exiting. The agent must keep running
// with bounded memory, keep a well-behaved traced service's profile whole,
// write only files that pass the conformance rules, and exit cleanly.
// Needs root (BPF) and a C compiler; skips with the reason otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const protobuf = require('protobufjs');
const { profileUnavailable, scratchDir, exited } = require('./helpers');
const { READER, until, describe, startService, startAgent, readNewFiles, complete, assertComplete } = require('./agent-helpers');

const SOURCE = path.join(__dirname, 'fixtures', 'hostile-target.c');
const ProcessContext = protobuf
  .loadSync(path.join(__dirname, 'fixtures', 'process_context.proto'))
  .lookupType('opentelemetry.proto.processcontext.v1development.ProcessContext');
/** How long the hostile targets run. */
const HOSTILE_SECONDS = 20;
/** The agent's memory bound under this load (its RSS, sampled each second). */
const RSS_BOUND_MIB = 256;

function unavailable() {
  const profile = profileUnavailable(READER);
  if (profile !== null) return profile;
  if (spawnSync('cc', ['--version']).status !== 0) return 'no C compiler (cc) to build the hostile target';
  return null;
}

const skip = unavailable();
const tmp = scratchDir('otel-thread-ctx-agent-hostile-');

function build() {
  const out = path.join(tmp, 'hostile-target');
  const r = spawnSync('cc', ['-O1', '-pthread', '-rdynamic', '-o', out, SOURCE], { encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stderr);
  return out;
}

const kv = (key, value) => ({ key, value });
const text = (s) => ({ stringValue: s });
const int = (n) => ({ intValue: n });

/** Process-context payloads a buggy or hostile writer publishes, written to files the target reads. */
function payloadFiles() {
  const nested = (depth) => (depth === 0 ? text('leaf') : { arrayValue: { values: [nested(depth - 1)] } });
  const contexts = [
    // A key map of thousands of keys (more than a record's one-byte index reaches).
    { resource: { attributes: [kv('service.name', text('hostile'))] }, attributes: [kv('threadlocal.attribute_key_map', { arrayValue: { values: Array.from({ length: 3000 }, (_, i) => text(`k${i}`)) } })] },
    // The Node.js schema with layout integers no V8 has.
    {
      attributes: [
        kv('threadlocal.schema_version', text('nodejs_v1_dev')),
        kv('threadlocal.js_object_record_offset', int(1 << 20)),
        kv('threadlocal.tagged_size', int(4)),
        kv('threadlocal.js_map_table_offset', int(-8)),
        kv('threadlocal.ordered_hash_map_header_size', int(Number.MAX_SAFE_INTEGER)),
      ],
    },
    // A key map of non-strings, nesting as deep as a decoder allows, a schema it does not know.
    { attributes: [kv('threadlocal.attribute_key_map', { arrayValue: { values: [int(1), nested(14)] } }), kv('threadlocal.schema_version', text('x'.repeat(3000)))] },
    // A resource of many large attributes, past the payload limit.
    { resource: { attributes: Array.from({ length: 40 }, (_, i) => kv(`a${i}`, text('v'.repeat(2000)))) } },
  ];
  return contexts.map((c, i) => {
    const file = path.join(tmp, `payload-${i}.pb`);
    fs.writeFileSync(file, ProcessContext.encode(ProcessContext.fromObject(c)).finish());
    return file;
  });
}

/** Starts the hostile target; resolves with the child once it publishes. */
async function startHostile(t, binary, { seconds, forks = 0, execAfterMs = 0, payloads }) {
  const child = spawn(binary, [String(seconds), String(forks), String(execAfterMs), ...payloads], { cwd: tmp, stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGKILL'));
  await new Promise((resolve, reject) => {
    child.stdout.once('data', resolve);
    child.once('exit', (code) => reject(new Error(`the hostile target exited (${code}) before publishing`)));
  });
  child.stdout.resume();
  return child;
}

function rssMiB(pid) {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : 0;
}

test('agent: hostile targets cannot crash it, grow it, or spoil a traced service\'s profile', { skip: skip ?? false, timeout: 300000 }, async (t) => {
  const binary = build();
  const payloads = payloadFiles();
  const good = await startService(t, tmp, 'agent-hostile-neighbour', undefined);
  const dir = path.join(tmp, 'out');
  const agent = startAgent(t, tmp, ['--interval', '1', '--hz', '499', '--off-cpu', '--output-dir', dir, '--output-max-mib', '64']);
  await agent.waitFor(new RegExp(`profiling pid ${good.ids.pid} `), 'the traced service');

  const forker = await startHostile(t, binary, { seconds: HOSTILE_SECONDS, forks: 1000, payloads });
  const execer = await startHostile(t, binary, { seconds: HOSTILE_SECONDS, execAfterMs: 4000, payloads });
  await agent.waitFor(new RegExp(`profiling pid ${forker.pid} `), 'the forking hostile target');
  await agent.waitFor(new RegExp(`profiling pid ${execer.pid} `), 'the hostile target that executes itself');

  // Short-lived targets, one after another, each exiting while it is read.
  const deadline = Date.now() + HOSTILE_SECONDS * 1000;
  const rss = [];
  let shortLived = 0;
  const read = new Set();
  const seen = new Map();
  while (Date.now() < deadline) {
    const brief = spawn(binary, ['1', '20', '0', ...payloads], { cwd: tmp, stdio: 'ignore' });
    shortLived++;
    await exited(brief, 10000);
    assert.strictEqual(agent.child.exitCode, null, `the agent exited:\n${agent.lines.join('\n')}`);
    rss.push(rssMiB(agent.child.pid));
    readNewFiles(dir, read, seen);
  }
  t.diagnostic(`${shortLived} short-lived hostile targets; agent RSS ${Math.min(...rss).toFixed(1)}-${Math.max(...rss).toFixed(1)} MiB`);
  assert.ok(Math.max(...rss) <= RSS_BOUND_MIB, `agent RSS reached ${Math.max(...rss).toFixed(1)} MiB: ${rss.map((r) => r.toFixed(0))}`);

  // The neighbour's profile is whole and links only to its own spans.
  await until('the traced service whole in the files', () => complete(readNewFiles(dir, read, seen), good), { explain: () => describe(seen) });
  assertComplete(seen, good);
  // The targets end (the forker reaps its children, the other ran a new program mid-way).
  await exited(forker, 30000);
  await exited(execer, 30000);

  const { code, log } = await agent.stop();
  assert.strictEqual(code, 0, log);
  assert.match(log, /ended by signal 15/);
  // Every file passes the conformance rules, whatever the targets published.
  const files = fs.readdirSync(dir).filter((n) => n.endsWith('.otlp.pb')).map((n) => path.join(dir, n));
  assert.ok(files.length >= HOSTILE_SECONDS / 2, `only ${files.length} files`);
  const check = spawnSync(READER, ['check-otlp', ...files], { encoding: 'utf8', maxBuffer: 64 << 20 });
  assert.strictEqual(check.status, 0, check.stdout.slice(0, 4000) + check.stderr);
});
