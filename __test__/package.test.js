'use strict';
// The package as users get it: `npm pack`, then `npm install` of the
// tarball into fresh applications, read from outside with
// `npx otel-thread-ctx`.
// - built from source (the install script runs cargo), with the
//   OpenTelemetry Node SDK set up as the README's first snippet: the
//   addon loads, the record and a non-empty Resource are published from
//   the first span on, the installed package is small and has no nested
//   @opentelemetry/api;
// - with a locally packed prebuilt platform package and no Rust toolchain,
//   and an older supported @opentelemetry/api: nothing is built, the record
//   follows spans;
// - without its install script, and without cargo: the errors say what to do.
//
// Cargo builds in a shared scratch target directory, so dependencies are
// compiled once. The application of the source build is named after the
// tarball's hash and kept: a second run of the same tarball (another Node
// line) reuses that build (npm extracts files with new mtimes, so cargo would
// recompile the package's own crates) and repeats every check of the
// running application; the install script itself runs on every line in the
// two other installs.
const test = require('node:test');
const assert = require('node:assert');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync, execFileSync } = require('node:child_process');
const { jsonLines, scratchDir } = require('./helpers');
const { packPlatformPackage } = require('../scripts/release');

const ROOT = path.resolve(__dirname, '..');
const SCRATCH = path.join(os.tmpdir(), 'otel-thread-ctx-package-test');
const SDK_NODE = '@opentelemetry/sdk-node@0.223.0';
const API = '@opentelemetry/api@1.9.0';
const OLDEST_API = '@opentelemetry/api@1.0.4';
const FOOTPRINT_LIMIT = 20 * 2 ** 20;
const INSTALL_TIMEOUT_MS = 15 * 60 * 1000;

/** The environment of a user's shell: nothing from the `npm test` running us. */
function userEnv(extra = {}) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k)));
  return { ...env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false', ...extra };
}

/** PATH without any directory that holds cargo or rustc. */
function pathWithoutRust() {
  return process.env.PATH.split(path.delimiter)
    .filter((dir) => dir && !['cargo', 'rustc'].some((bin) => fs.existsSync(path.join(dir, bin))))
    .join(path.delimiter);
}

function npm(args, cwd, env) {
  const r = spawnSync('npm', args, { cwd, env, encoding: 'utf8', timeout: INSTALL_TIMEOUT_MS });
  return { status: r.status, output: `${r.stdout}\n${r.stderr}`, error: r.error };
}

function makeApp(dir) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'scratch-app', version: '1.0.0', private: true }));
  return dir;
}

/** Bytes under `dir`, symlinks not followed. */
function diskSize(dir) {
  let total = 0;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) total += diskSize(p);
    else total += fs.lstatSync(p).size;
  }
  return total;
}

/** Whether a process with this pid exists (EPERM: it does, as another user's). */
function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === 'EPERM';
  }
}

/**
 * Holds the shared scratch directory until the test ends: two checkouts
 * testing at once would otherwise remove each other's application while it
 * installs. The lock is a directory (mkdir is atomic) naming its owner; an
 * owner that died leaves a lock the next run takes over.
 */
async function holdScratch(t) {
  const lock = path.join(SCRATCH, 'lock');
  const owner = path.join(lock, 'pid');
  for (;;) {
    try {
      fs.mkdirSync(lock);
      fs.writeFileSync(owner, String(process.pid));
      break;
    } catch (err) {
      if (err.code !== 'EEXIST') throw err;
    }
    let pid = 0;
    let stale = false;
    try {
      pid = Number(fs.readFileSync(owner, 'utf8'));
    } catch {
      // Not written yet by its new owner, or never: its owner died between
      // the two steps when the lock is older than a few seconds.
      try {
        stale = Date.now() - fs.statSync(lock).mtimeMs > 30000;
      } catch {
        continue; // released meanwhile
      }
    }
    if (stale || (pid && !alive(pid))) {
      fs.rmSync(lock, { recursive: true, force: true });
      continue;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  t.after(() => fs.rmSync(lock, { recursive: true, force: true }));
}

/** Runs `npx otel-thread-ctx inspect --pid N --json` in `app`. */
function npxInspect(app, pid, env) {
  const r = spawnSync('npx', ['--no-install', 'otel-thread-ctx', 'inspect', '--pid', String(pid), '--json'], { cwd: app, env, encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stdout + r.stderr);
  return JSON.parse(r.stdout);
}

/** Starts `script` in `app`; returns the child and a reader of its JSON lines. */
function startApp(t, app, script, env) {
  const file = path.join(app, 'app.js');
  fs.writeFileSync(file, script);
  const child = spawn(process.execPath, [file], { cwd: app, env, stdio: ['pipe', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGKILL'));
  const lines = jsonLines(child.stdout, { timeoutMs: 60000 });
  return { child, next: async (phase) => {
    const m = await lines.next(`phase ${phase}`);
    assert.strictEqual(m.phase, phase, JSON.stringify(m));
    return m;
  } };
}

let work;
let tarball;
let platformTarball;

test.before(() => {
  fs.mkdirSync(SCRATCH, { recursive: true });
  work = scratchDir('otel-thread-ctx-package-');
  const [packed] = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', work], { cwd: ROOT, env: userEnv(), encoding: 'utf8' }));
  tarball = path.join(work, packed.filename);
  // The checkout's own binaries as a platform package (the release build's
  // are release.test.js's).
  const native = require('../js/native');
  platformTarball = packPlatformPackage({ addon: native.addonPath(), reader: native.readerPath(), outDir: work }).file;
});

test.after(() => fs.rmSync(work, { recursive: true, force: true }));

test('the tarball holds sources and JS, no build output', () => {
  const files = execFileSync('tar', ['tzf', tarball], { encoding: 'utf8' }).split('\n').filter(Boolean);
  assert.ok(files.includes('package/bin/otel-thread-ctx.js'));
  assert.ok(files.includes('package/Cargo.lock'));
  assert.ok(files.includes('package/register.js'), 'the early-load entry point');
  assert.ok(files.includes('package/docs/agent.md'), 'the documents README links to');
  for (const f of files) {
    assert.ok(!/^package\/(target|node_modules)\//.test(f), f);
    assert.ok(!f.endsWith('.node') && f !== 'package/bin/otel-thread-ctx', `${f} is a build output`);
  }
});

test('built from source: addon, npx reader, Resource from the first span with only `new NodeSDK({ contextManager })`, < 20 MB', { timeout: INSTALL_TIMEOUT_MS + 120000 }, async (t) => {
  const hash = crypto.createHash('sha256').update(fs.readFileSync(tarball)).digest('hex').slice(0, 16);
  const app = path.join(SCRATCH, `app-${hash}`);
  const done = path.join(app, '.installed');
  const env = userEnv({ CARGO_TARGET_DIR: path.join(SCRATCH, 'target') });
  await holdScratch(t);
  if (!fs.existsSync(done)) {
    for (const old of fs.readdirSync(SCRATCH)) {
      if (old.startsWith('app-')) fs.rmSync(path.join(SCRATCH, old), { recursive: true, force: true });
    }
    makeApp(app);
    const installed = npm(['install', '--prefer-offline', tarball, API, SDK_NODE], app, env);
    assert.strictEqual(installed.status, 0, installed.output);
    fs.writeFileSync(done, `${process.version}\n`);
  }

  const pkg = path.join(app, 'node_modules', 'otel-thread-ctx');
  assert.ok(fs.existsSync(path.join(pkg, 'otel-thread-ctx.linux-x64-gnu.node')), 'the addon was built');
  assert.ok(fs.existsSync(path.join(pkg, 'bin', 'otel-thread-ctx')), 'the reader was built');
  assert.ok(!fs.existsSync(path.join(pkg, 'target')), 'no cargo build tree in the package');
  const size = diskSize(pkg);
  console.log(`installed otel-thread-ctx: ${(size / 2 ** 20).toFixed(1)} MiB`);
  assert.ok(size < FOOTPRINT_LIMIT, `node_modules/otel-thread-ctx is ${size} bytes`);
  assert.ok(!fs.existsSync(path.join(pkg, 'node_modules', '@opentelemetry', 'api')), 'the application\'s @opentelemetry/api is used, not a copy');

  // The README's first snippet, and one span the process blocks in.
  const { child, next } = startApp(t, app, `
const { NodeSDK } = require('@opentelemetry/sdk-node');
const { ProfilingContextManager } = require('otel-thread-ctx');
const { trace } = require('@opentelemetry/api');
const fs = require('node:fs');
const sdk = new NodeSDK({ contextManager: new ProfilingContextManager() });
sdk.start();
trace.getTracer('app').startActiveSpan('work', (span) => {
  const { traceId, spanId } = span.spanContext();
  console.log(JSON.stringify({ phase: 'in-span', traceId, spanId }));
  fs.readSync(0, Buffer.alloc(1));
  span.end();
  console.log(JSON.stringify({ phase: 'done' }));
});
`, { ...env, OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:1', OTEL_METRICS_EXPORTER: 'none', OTEL_LOGS_EXPORTER: 'none', OTEL_SERVICE_NAME: 'package-test' });
  const inSpan = await next('in-span');
  const report = npxInspect(app, child.pid, env);
  assert.strictEqual(report.conformant, true, JSON.stringify(report.problems));
  assert.strictEqual(report.symbol.module, fs.realpathSync(path.join(pkg, 'otel-thread-ctx.linux-x64-gnu.node')));
  const main = report.threads.find((th) => th.tid === child.pid);
  assert.strictEqual(main.status, 'valid');
  assert.deepStrictEqual([main.record.trace_id, main.record.span_id], [inSpan.traceId, inSpan.spanId]);
  assert.strictEqual(report.process_context.status, 'ok');
  assert.strictEqual(report.process_context.resource['service.name'], 'package-test');
  assert.strictEqual(report.process_context.resource['process.pid'], child.pid, 'detected attributes are published');
  child.stdin.write('\n');
  await next('done');
});

test('with a prebuilt platform package, no Rust toolchain and @opentelemetry/api 1.0: nothing is built, the record follows spans', { timeout: INSTALL_TIMEOUT_MS }, async (t) => {
  const app = makeApp(path.join(work, 'prebuilt-app'));
  const env = userEnv({ PATH: pathWithoutRust() });
  const installed = npm(['install', '--prefer-offline', '--foreground-scripts', platformTarball, tarball, OLDEST_API], app, env);
  assert.strictEqual(installed.status, 0, installed.output);
  assert.match(installed.output, /using the prebuilt linux-x64-gnu binaries/);
  const pkg = path.join(app, 'node_modules', 'otel-thread-ctx');
  assert.ok(!fs.existsSync(path.join(pkg, 'otel-thread-ctx.linux-x64-gnu.node')), 'nothing was built');
  assert.strictEqual(require(path.join(app, 'node_modules', '@opentelemetry', 'api', 'package.json')).version, OLDEST_API.split('@').pop());

  const { child, next } = startApp(t, app, `
const { context, trace } = require('@opentelemetry/api');
const { ProfilingContextManager } = require('otel-thread-ctx');
const fs = require('node:fs');
context.setGlobalContextManager(new ProfilingContextManager().enable());
const span = (traceId, spanId) => trace.wrapSpanContext({ traceId, spanId, traceFlags: 1 });
const wait = (phase, sc) => {
  console.log(JSON.stringify({ phase, ...sc }));
  fs.readSync(0, Buffer.alloc(1));
};
const outer = span('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7');
context.with(trace.setSpan(context.active(), outer), async () => {
  wait('outer', outer.spanContext());
  const inner = span('4bf92f3577b34da6a3ce929d0e0e4736', '10f067aa0ba902b7');
  await context.with(trace.setSpan(context.active(), inner), async () => {
    await new Promise((resolve) => setImmediate(resolve));
    wait('inner', inner.spanContext());
  });
  await new Promise((resolve) => setImmediate(resolve));
  wait('outer-again', outer.spanContext());
});
`, env);
  for (const phase of ['outer', 'inner', 'outer-again']) {
    const expected = await next(phase);
    const report = npxInspect(app, child.pid, env);
    const main = report.threads.find((th) => th.tid === child.pid);
    assert.strictEqual(main.status, 'valid', `${phase}: ${JSON.stringify(main)}`);
    assert.deepStrictEqual([main.record.trace_id, main.record.span_id], [expected.traceId, expected.spanId], phase);
    child.stdin.write('\n');
  }
});

test('install errors: without the install script, and without cargo, they say what happened and what to run', { timeout: INSTALL_TIMEOUT_MS }, () => {
  const app = makeApp(path.join(work, 'no-scripts-app'));
  const env = userEnv({ PATH: pathWithoutRust() });
  const installed = npm(['install', '--prefer-offline', '--ignore-scripts', tarball, API], app, env);
  assert.strictEqual(installed.status, 0, installed.output);

  const loaded = spawnSync(process.execPath, ['-e', "require('otel-thread-ctx')"], { cwd: app, env, encoding: 'utf8' });
  assert.notStrictEqual(loaded.status, 0);
  assert.match(loaded.stderr, /native addon for linux-x64-gnu is not installed/);
  assert.match(loaded.stderr, /--ignore-scripts/);
  assert.match(loaded.stderr, /npm rebuild otel-thread-ctx/);

  const npx = spawnSync('npx', ['--no-install', 'otel-thread-ctx', 'inspect', '--pid', String(process.pid)], { cwd: app, env, encoding: 'utf8' });
  assert.strictEqual(npx.status, 127);
  assert.match(npx.stderr, /reader binary for linux-x64-gnu is not installed.*npm rebuild otel-thread-ctx/s);

  const rebuilt = npm(['rebuild', 'otel-thread-ctx'], app, env);
  assert.notStrictEqual(rebuilt.status, 0);
  assert.match(rebuilt.output, /needs a Rust toolchain \(cargo, rustc\)/);
  assert.match(rebuilt.output, /"Installing" in .*README\.md/);
  assert.doesNotMatch(rebuilt.output, /ENOENT|at .*\(node:/);
});
