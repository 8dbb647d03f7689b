'use strict';
// What other readers need from the writer, checked from outside the
// publishing process:
// - a process context payload no larger than the OpenTelemetry eBPF
//   profiler accepts (64 KiB), refused with a RangeError beyond it;
// - every configured attribute key in the key map from `enable()` on, before
//   any span (a profiler may read the context only once);
// - `threadInfo().tlsModel` and the reader CLI agreeing on static or dynamic
//   TLS, for both kinds;
// - `node --require otel-thread-ctx/register` keeping the variable in static
//   TLS where loading the package later would not.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync, execFileSync } = require('node:child_process');
const { findMappings, MemoryReader, decodePayload } = require('./fixtures/otel-ctx-reader');
const { ROOT, jsonLines, exited, readFullRecord, scratchDir } = require('./helpers');
const native = require('../js/native');

const MAX_PAYLOAD_BYTES = 64 * 1024;
/** glibc's default `glibc.rtld.optional_static_tls`, set explicitly below. */
const OPTIONAL_STATIC_TLS = 512;
/**
 * TLS of the other addon: half the surplus. It fits in what is left of the
 * surplus at startup on every Node line (some use a little of it), and
 * leaves less than this package's block needs.
 */
const OTHER_ADDON_TLS = OPTIONAL_STATIC_TLS / 2;

// Defined for every child script: `out(value)` prints one JSON line (bigints
// as strings); `waitForInput()` returns once the test writes a line.
const PRELUDE = `
  const out = (o) => console.log(JSON.stringify(o, (_k, v) => (typeof v === 'bigint' ? v.toString() : v)));
  const waitForInput = () => require('node:fs').readSync(0, Buffer.alloc(1));
`;

/**
 * Runs `script` (after PRELUDE) as `node <args> <app>/<name>`, from `app`
 * (a scratch directory unless given); the child is ended when the test
 * ends. `next()` resolves with its next JSON line.
 */
function startChild(t, script, { args = [], env = {}, app = null, name = 'app.js' } = {}) {
  const dir = app ?? scratchDir('otel-reader-compat-');
  const file = path.join(dir, name);
  fs.writeFileSync(file, PRELUDE + script);
  const child = spawn(process.execPath, [...args, file], {
    cwd: dir,
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  t.after(async () => {
    child.stdin.end();
    await exited(child, 5000);
    if (app === null) fs.rmSync(dir, { recursive: true, force: true });
  });
  const { next } = jsonLines(child.stdout, { timeoutMs: 20000 });
  return { child, next };
}

/** Reads `pid`'s whole process context from outside. */
function readContext(pid) {
  const mappings = findMappings(pid);
  assert.strictEqual(mappings.length, 1, 'exactly one OTEL_CTX mapping');
  const reader = new MemoryReader(pid);
  try {
    const { header, bytes } = reader.readConsistent(mappings[0].start);
    return { header, context: decodePayload(bytes) };
  } finally {
    reader.close();
  }
}

test('a payload of 64 KiB is published; 64 KiB + 1 is a RangeError naming what to trim, and changes nothing', async (t) => {
  const { next } = startChild(
    t,
    `
    const { publishProcessContext, processContextInfo } = require(${JSON.stringify(ROOT)});
    // Find the blob length that makes the payload exactly 64 KiB: past 16 KiB
    // every protobuf length prefix here is 3 bytes, so size grows 1:1 with it.
    publishProcessContext({ resource: { 'service.name': 'limit', blob: 'x'.repeat(60000) } });
    const length = 60000 + ${MAX_PAYLOAD_BYTES} - processContextInfo().payloadSize;
    publishProcessContext({ resource: { 'service.name': 'limit', blob: 'x'.repeat(length) } });
    const atLimit = processContextInfo();
    let error = null;
    try {
      publishProcessContext({ resource: { 'service.name': 'limit', blob: 'x'.repeat(length + 1) } });
    } catch (e) {
      error = { name: e.name, message: e.message };
    }
    out({ pid: process.pid, length, atLimit, error, after: processContextInfo() });
    waitForInput();
  `,
  );
  const { pid, length, atLimit, error, after } = await next();
  assert.strictEqual(atLimit.payloadSize, MAX_PAYLOAD_BYTES);
  assert.ok(error !== null, 'a payload of 64 KiB + 1 bytes is refused');
  assert.strictEqual(error.name, 'RangeError');
  assert.match(error.message, /65537 bytes/);
  assert.match(error.message, /65536/);
  assert.match(error.message, /trim it by 1 bytes/);
  assert.match(error.message, /the Resource attribute "blob"/);
  assert.deepStrictEqual(after, atLimit, 'nothing was published');

  const { header, context } = readContext(pid);
  assert.strictEqual(header.payloadSize, MAX_PAYLOAD_BYTES);
  assert.strictEqual(header.publishedAt, BigInt(atLimit.publishedAtNs), 'the 64 KiB publication is current');
  assert.strictEqual(context.resource.blob.length, length);
});

test('every configured attribute key is in the key map from enable() on, before any span; later keys still join', async (t) => {
  const { child, next } = startChild(
    t,
    `
    const fromRoot = require('node:module').createRequire(${JSON.stringify(path.join(ROOT, 'index.js'))});
    const { context, trace } = fromRoot('@opentelemetry/api');
    const { BasicTracerProvider } = fromRoot('@opentelemetry/sdk-trace-base');
    const otc = fromRoot('.');
    // The OTEP 4947 readers' view (schema, key map, record): record mode.
    // The span's own attributes only: identity attributes are tested in local-root.test.js.
    const manager = new otc.ProfilingContextManager({
      attributes: ['http.route', 'user.id'],
      mode: 'record',
      localRootAttributes: [],
      spanName: false,
      localRootSpanId: false,
    });
    context.setGlobalContextManager(manager.enable());
    out({ pid: process.pid, phase: 'enabled', info: otc.processContextInfo() });
    waitForInput();
    otc.registerAttributeKeys(['tenant.id']);
    out({ phase: 'registered' });
    waitForInput();
    const tracer = new BasicTracerProvider().getTracer('keys');
    const span = tracer.startSpan('request', { attributes: { 'user.id': 'u-7', 'http.route': '/users/:id' } });
    context.with(trace.setSpan(context.active(), span), () => {
      out({ phase: 'in-span', record: otc.threadInfo().tlsValue, info: otc.processContextInfo() });
      waitForInput();
    });
  `,
  );
  const enabled = await next();
  let { context } = readContext(enabled.pid);
  assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], ['http.route', 'user.id']);
  assert.strictEqual(context.attributes['threadlocal.schema_version'], 'tlsdesc_v1_dev');
  assert.strictEqual(enabled.info.publications, 1, 'the keys and the minimal context in one publication');

  child.stdin.write('\n');
  await next();
  ({ context } = readContext(enabled.pid));
  assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], ['http.route', 'user.id', 'tenant.id']);

  child.stdin.write('\n');
  const inSpan = await next();
  const record = readFullRecord(enabled.pid, inSpan.record);
  assert.strictEqual(record.valid, 1);
  const keyMap = readContext(enabled.pid).context.attributes['threadlocal.attribute_key_map'];
  assert.deepStrictEqual(keyMap, ['http.route', 'user.id', 'tenant.id'], 'the span added no key');
  const attributes = Object.fromEntries(record.attrs.map((a) => [keyMap[a.keyIndex], a.value.toString()]));
  assert.deepStrictEqual(attributes, { 'http.route': '/users/:id', 'user.id': 'u-7' });
});

// ---------------------------------------------------------------------------
// Static and dynamic TLS

let reader = native.readerPath();

function inspect(pid) {
  const r = spawnSync(reader, ['inspect', '--pid', String(pid), '--json'], { encoding: 'utf8' });
  assert.ok(r.stdout, `inspect printed nothing: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

function inspectText(pid) {
  return spawnSync(reader, ['inspect', '--pid', String(pid)], { encoding: 'utf8' }).stdout;
}

// The main thread and a worker report their threadInfo(), then stay alive.
const THREADS_SCRIPT = (requireFirst) => `
  ${requireFirst}
  const { Worker } = require('node:worker_threads');
  const { threadInfo } = require('otel-thread-ctx');
  // The worker stays alive (its port listens) until it is terminated.
  const worker = new Worker(
    "const { parentPort } = require('node:worker_threads'); parentPort.on('message', () => {}); parentPort.postMessage(require('otel-thread-ctx').threadInfo());",
    { eval: true },
  );
  worker.once('message', (info) => {
    out({ pid: process.pid, threads: [threadInfo(), info] });
    waitForInput();
    worker.terminate();
  });
`;

/** A directory whose node_modules/otel-thread-ctx is this checkout, as after `npm install`. */
function installedApp(t) {
  const app = scratchDir('otel-reader-compat-app-');
  fs.mkdirSync(path.join(app, 'node_modules'));
  fs.symlinkSync(ROOT, path.join(app, 'node_modules', 'otel-thread-ctx'), 'dir');
  t.after(() => fs.rmSync(app, { recursive: true, force: true }));
  return app;
}

/** Checks that threadInfo() says `model` on every thread and that inspect agrees, per thread and module. */
function assertTlsModel(pid, threads, model) {
  for (const info of threads) assert.strictEqual(info.tlsModel, model, `thread ${info.tid}`);
  const report = inspect(pid);
  assert.strictEqual(report.symbol.access_model, 'tlsdesc');
  assert.strictEqual(report.symbol.resolution.tls_model, model);
  assert.strictEqual(report.symbol.resolution.path, model === 'static' ? 'tlsdesc-static' : 'tlsdesc-dtv');
  for (const info of threads) {
    const thread = report.threads.find((th) => th.tid === info.tid);
    assert.ok(thread, `inspect reports thread ${info.tid}`);
    assert.strictEqual(thread.tls.tls_model, model);
    assert.strictEqual(BigInt(thread.tls.variable_address), BigInt(info.tlsAddress), 'the same variable');
    assert.strictEqual(BigInt(thread.tls.pointer), BigInt(info.recordAddress));
  }
  assert.match(inspectText(pid), new RegExp(`^resolved: +${model} TLS, `, 'm'));
}

const glibc = process.report?.getReport().header.glibcVersionRuntime;

test('threadInfo().tlsModel and inspect agree: static by default, dynamic without static TLS surplus', { skip: !glibc && 'glibc only (GLIBC_TUNABLES)' }, async (t) => {
  if (reader === null) {
    execFileSync(process.execPath, [path.join(ROOT, 'scripts', 'build.js')], { cwd: ROOT, stdio: 'inherit' });
    reader = native.readerPath();
  }
  const app = installedApp(t);
  for (const [tunables, model] of [
    [`glibc.rtld.optional_static_tls=${OPTIONAL_STATIC_TLS}`, 'static'],
    // No optional surplus: a dlopen'ed module's TLSDESC block goes to dynamic TLS.
    ['glibc.rtld.optional_static_tls=0', 'dynamic'],
  ]) {
    const { next } = startChild(t, THREADS_SCRIPT(''), { app, name: `${model}.js`, env: { GLIBC_TUNABLES: tunables } });
    const { pid, threads } = await next();
    assertTlsModel(pid, threads, model);
  }
});

/**
 * Builds a stand-in for another native addon that uses static TLS: a module
 * Node can load (it has `napi_register_module_v1`) with an
 * OTHER_ADDON_TLS-byte TLSDESC variable. Null without a C compiler.
 */
function buildTlsAddon(dir) {
  const source = path.join(dir, 'tls-addon.c');
  fs.writeFileSync(
    source,
    `__thread char tls_addon_block[${OTHER_ADDON_TLS}] = {1};
     void *napi_register_module_v1(void *env, void *exports) { tls_addon_block[0]++; return exports; }
    `,
  );
  const output = path.join(dir, 'tls-addon.node');
  const r = spawnSync('cc', ['-shared', '-fPIC', '-O2', '-mtls-dialect=gnu2', '-o', output, source], { encoding: 'utf8' });
  return r.status === 0 ? output : null;
}

test('node --require otel-thread-ctx/register keeps static TLS where a late require gets dynamic TLS', { skip: !glibc && 'glibc only (GLIBC_TUNABLES)' }, async (t) => {
  if (reader === null) {
    execFileSync(process.execPath, [path.join(ROOT, 'scripts', 'build.js')], { cwd: ROOT, stdio: 'inherit' });
    reader = native.readerPath();
  }
  const app = installedApp(t);
  const addon = buildTlsAddon(app);
  if (addon === null) return t.skip('no C compiler (cc) to build the static-TLS addon');
  // glibc's default, set explicitly so the test does not depend on how the
  // C library was built; the other addon, loaded first, takes half of it.
  const env = { GLIBC_TUNABLES: `glibc.rtld.optional_static_tls=${OPTIONAL_STATIC_TLS}` };
  const script = THREADS_SCRIPT(`process.dlopen({ exports: {} }, ${JSON.stringify(addon)});`);

  const late = startChild(t, script, { app, name: 'late.js', env });
  const lateReport = await late.next();
  assertTlsModel(lateReport.pid, lateReport.threads, 'dynamic');

  const early = startChild(t, script, { app, name: 'early.js', env, args: ['--require', 'otel-thread-ctx/register'] });
  const earlyReport = await early.next();
  assertTlsModel(earlyReport.pid, earlyReport.threads, 'static');
});
