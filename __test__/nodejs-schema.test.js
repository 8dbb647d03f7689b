'use strict';
// The reader against Datadog's writer of the Node.js schema nodejs_v1_dev
// (@datadog/pprof, written elsewhere): `inspect`, `sample` and `profile`
// must report exactly the ids and the attribute the main thread and a
// worker run under (see fixtures/datadog-writer.js), and no span for a
// worker idle between contexts. The writer needs AsyncContextFrame (Node 24
// and later, Node 22 with --experimental-async-context-frame): elsewhere the
// tests skip with the writer's own reason. `profile` also needs root and the
// BPF build.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines, exited, profileUnavailable, scratchDir } = require('./helpers');

const READER = require('../js/native').readerPath();
const WRITER = path.join(__dirname, 'fixtures', 'datadog-writer.js');
const ROOT = path.resolve(__dirname, '..');
const major = Number(process.versions.node.split('.')[0]);
// Node 22 has AsyncContextFrame behind a flag; later lines have it on.
const nodeArgs = major === 22 ? ['--experimental-async-context-frame'] : [];
// Node 22's V8 keeps a wrapper's internal field 0 one word earlier (0x18,
// no cpp_heap_wrappable slot) than the schema's default layout (0x20, Node
// 24 and 26), and Datadog's writer publishes no
// threadlocal.js_object_record_offset: there the reader must find no span
// (the word at 0x20 is no record), never a wrong one.
const layoutKnown = major >= 24;

/** Why Datadog's writer cannot publish on this Node, or null. */
function writerUnavailable() {
  const probe = spawnSync(
    process.execPath,
    [...nodeArgs, '-e', "require('@datadog/pprof').otelThreadCtx.getProcessContextAttributes([])"],
    { cwd: ROOT, encoding: 'utf8' },
  );
  if (probe.status === 0) return null;
  const line = probe.stderr.split('\n').find((l) => /^\w*Error: /.test(l)) ?? probe.stderr.trim();
  return `Datadog's writer cannot publish nodejs_v1_dev on Node ${process.versions.node}: ${line.trim()}`;
}

const skip = READER === null ? 'the reader is not built (npm install builds it)' : writerUnavailable();

/** Starts the writer in `mode`; resolves with the child and its three threads by name. */
async function startWriter(mode) {
  const child = spawn(process.execPath, [...nodeArgs, WRITER, mode], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
  const { next } = jsonLines(child.stdout, { timeoutMs: 30000 });
  const threads = {};
  for (let i = 0; i < 3; i++) {
    const line = await next(`thread ${i + 1} of the writer`);
    threads[line.who] = line;
  }
  return { child, threads };
}

function run(args) {
  const r = spawnSync(READER, args, { encoding: 'utf8', maxBuffer: 64 << 20 });
  assert.ok(r.status === 0, `${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return r.stdout;
}

test('inspect and sample read Datadog\'s writer', { skip: skip ?? false }, async (t) => {
  const { child, threads } = await startWriter('park');
  t.after(() => {
    child.kill('SIGKILL');
    return exited(child, 5000);
  });
  const pid = String(child.pid);

  await t.test('inspect', () => {
    const report = JSON.parse(run(['inspect', '--pid', pid, '--json']));
    // This package's addon defines both schemas' variables (it publishes
    // the record schema here, its Node.js block stays unpublished);
    // Datadog's defines the Node.js one. Every Node.js definition is read.
    const modules = report.modules.map((m) => `${m.schema} ${/dd_pprof/.test(m.path) ? 'datadog' : 'ours'} ${m.read}`).sort();
    assert.deepStrictEqual(modules, ['nodejs_v1_dev datadog true', 'nodejs_v1_dev ours true', 'tlsdesc_v1_dev ours true']);
    assert.strictEqual(report.nodejs_symbol.st_size, 32);
    assert.strictEqual(report.process_context.schema_version, 'nodejs_v1_dev');
    for (const who of ['main', 'a']) {
      const want = threads[who];
      const got = report.threads.find((x) => x.tid === want.tid);
      assert.ok(got, `thread ${who} (${want.tid}) in the report`);
      if (!layoutKnown) {
        assert.strictEqual(got.status, 'no-span', JSON.stringify(got));
        assert.ok(['record-invalid', 'unreadable'].includes(got.no_span_reason), JSON.stringify(got));
        continue;
      }
      assert.strictEqual(got.status, 'valid', JSON.stringify(got));
      assert.strictEqual(got.schema, 'nodejs_v1_dev');
      assert.strictEqual(got.record.trace_id, want.traceId);
      assert.strictEqual(got.record.span_id, want.spanId);
      assert.strictEqual(got.record.trace_flags, 1);
      assert.deepStrictEqual(
        got.record.attributes.map((a) => [a.key, a.value]),
        [['http.route', want.route]],
      );
      assert.ok(got.walk.hops >= 1 && got.walk.bucket_count >= 1, JSON.stringify(got.walk));
    }
    const idle = report.threads.find((x) => x.tid === threads.idle.tid);
    assert.strictEqual(idle.status, 'no-span', JSON.stringify(idle));
    assert.strictEqual(idle.schema, 'nodejs_v1_dev');
    assert.ok(['no-frame', 'store-absent', 'store-undefined'].includes(idle.no_span_reason), JSON.stringify(idle));
    // Every other thread in a span is one of the two.
    const inSpan = report.threads.filter((x) => x.status === 'valid').map((x) => x.tid).sort();
    assert.deepStrictEqual(inSpan, layoutKnown ? [threads.main.tid, threads.a.tid].sort() : []);
  });

  await t.test('sample', () => {
    const raw = run(['sample', '--pid', pid, '--hz', '20', '--duration', '0.5', '--raw'])
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    for (const who of ['main', 'a']) {
      const want = threads[who];
      const reads = raw.filter((r) => r.tid === want.tid);
      assert.ok(reads.length > 0, `reads of ${who}`);
      for (const r of reads) {
        if (!layoutKnown) {
          assert.strictEqual(r.valid, false, JSON.stringify(r));
          assert.ok(['record-invalid', 'unreadable'].includes(r.no_span_reason), JSON.stringify(r));
          continue;
        }
        assert.strictEqual(r.valid, true, JSON.stringify(r));
        assert.strictEqual(r.schema, 'nodejs_v1_dev');
        assert.strictEqual(r.trace_id, want.traceId);
        assert.strictEqual(r.span_id, want.spanId);
        assert.deepStrictEqual(r.attributes, { 'http.route': want.route });
      }
    }
    const idle = raw.filter((r) => r.tid === threads.idle.tid);
    assert.ok(idle.length > 0);
    for (const r of idle) {
      assert.strictEqual(r.valid, false, JSON.stringify(r));
      assert.ok(r.no_span_reason, JSON.stringify(r));
    }
  });
});

test('profile reads Datadog\'s writer at the sample', { skip: skip ?? profileUnavailable(READER) ?? false }, async (t) => {
  const { child, threads } = await startWriter('busy');
  t.after(() => {
    child.kill('SIGKILL');
    return exited(child, 5000);
  });
  const tmp = scratchDir('otel-thread-ctx-nodejs-');
  t.after(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const out = path.join(tmp, 'p.jsonl');
  run(['profile', '--pid', String(child.pid), '--duration', '2', '--off-cpu', '--format', 'jsonl', '-o', out]);
  const samples = fs
    .readFileSync(out, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  for (const who of ['main', 'a']) {
    const want = threads[who];
    const cpu = samples.filter((s) => s.tid === want.tid && s.kind === 'cpu');
    assert.ok(cpu.length > 0, `on-CPU samples of ${who}`);
    for (const s of cpu) {
      if (!layoutKnown) {
        assert.strictEqual(s.valid, false, JSON.stringify(s));
        continue;
      }
      assert.strictEqual(s.valid, true, JSON.stringify(s));
      assert.strictEqual(s.schema, 'nodejs_v1_dev');
      assert.strictEqual(s.trace_id, want.traceId);
      assert.strictEqual(s.span_id, want.spanId);
      assert.deepStrictEqual(s.attributes, { 'http.route': want.route });
    }
  }
  const idle = samples.filter((s) => s.tid === threads.idle.tid);
  assert.ok(idle.length > 0, 'samples of the idle worker (its waits, off CPU)');
  for (const s of idle) {
    assert.strictEqual(s.valid, false, JSON.stringify(s));
    assert.strictEqual(s.schema, 'nodejs_v1_dev');
    assert.ok(['no-frame', 'store-absent', 'store-undefined'].includes(s.record), JSON.stringify(s));
  }
});
