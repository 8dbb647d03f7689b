'use strict';
// Builds the addon and the reader CLI from source (release mode), or, as the
// package's install script, does nothing when a prebuilt platform package
// is installed.
//
// The addon is built with `napi build --platform` where @napi-rs/cli is
// installed (a development checkout); an application installing this
// package does not get the CLI (a development tool, far larger than this
// package), so there the same build runs through cargo directly. Both put
// `otel-thread-ctx.<platform>.node` in the package root and the reader at
// bin/otel-thread-ctx.
//
// Cargo's build tree stays out of an installed package: under node_modules
// the build runs in a scratch target directory (CARGO_TARGET_DIR if set,
// else a temporary one, removed afterwards) and only the two binaries are
// copied out. A checkout builds in ./target, so rebuilds are incremental.
//
// Usage: node scripts/build.js [--from-source]
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const native = require('../js/native');

const ROOT = native.ROOT;
const fromSource = process.argv.includes('--from-source') || Boolean(process.env.OTEL_THREAD_CTX_FROM_SOURCE);
const asInstallScript = process.env.npm_lifecycle_event === 'install';

function fail(message) {
  console.error(`\n${message}\n`);
  process.exit(1);
}

function run(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { cwd: ROOT, stdio: 'inherit', ...options });
  if (r.error) fail(`otel-thread-ctx: cannot run ${cmd}: ${r.error.message}`);
  if (r.status !== 0) fail(`otel-thread-ctx: \`${cmd} ${args.join(' ')}\` failed (${r.signal ?? `exit ${r.status}`}); its output is above.`);
}

/** Copies then renames: running processes keep the inode they mapped. */
function install(from, to, mode) {
  fs.mkdirSync(path.dirname(to), { recursive: true });
  const staging = `${to}.${process.pid}.tmp`;
  fs.copyFileSync(from, staging);
  if (mode !== undefined) fs.chmodSync(staging, mode);
  fs.renameSync(staging, to);
}

const key = native.platform();
if (asInstallScript && !fromSource) {
  const prebuilt = native.platformPackageDir(key);
  if (prebuilt !== null && fs.existsSync(path.join(prebuilt, native.addonFile(key)))) {
    console.log(`otel-thread-ctx: using the prebuilt ${key} binaries from ${prebuilt}`);
    process.exit(0);
  }
}
if (!native.SUPPORTED.includes(key)) fail(native.missingMessage('native addon'));

const rustc = spawnSync('rustc', ['-vV'], { encoding: 'utf8' });
const cargo = spawnSync('cargo', ['--version'], { encoding: 'utf8' });
if (rustc.error || cargo.error || rustc.status !== 0 || cargo.status !== 0) {
  fail(
    `otel-thread-ctx: no prebuilt binary for ${key} is installed, and building it from source needs a Rust ` +
      `toolchain (cargo, rustc) and a C compiler, which were not found on the PATH.\n` +
      `Install Rust (https://rustup.rs), then run \`npm rebuild otel-thread-ctx\`. ` +
      `Details: ${native.README}.`,
  );
}
const host = /^host: (\S+)$/m.exec(rustc.stdout)[1];

const insideNodeModules = ROOT.split(path.sep).includes('node_modules');
let targetDir;
let scratch = null;
if (process.env.CARGO_TARGET_DIR) targetDir = path.resolve(ROOT, process.env.CARGO_TARGET_DIR);
else if (insideNodeModules) targetDir = scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-build-'));
else targetDir = path.join(ROOT, 'target');

try {
  // Only what users run: the addon and the reader (not the demo's tools),
  // in one cargo invocation with the package selection and flags of
  // scripts/test.js, so that shared dependencies resolve to the same
  // features and `cargo test` reuses them.
  const cargoArgs = ['--release', '--locked', '--target', host, '--target-dir', targetDir];
  const packages = ['-p', 'otel-thread-ctx', '-p', 'otel-thread-ctx-inspect'];
  let napiCli = null;
  try {
    const manifest = require.resolve('@napi-rs/cli/package.json', { paths: [ROOT] });
    napiCli = path.join(path.dirname(manifest), require(manifest).bin.napi);
  } catch {
    // @napi-rs/cli is not installed: cargo builds both below.
  }
  if (napiCli !== null) {
    // napi copies the addon out; cargo arguments after `--` add the reader.
    run(process.execPath, [napiCli, 'build', '--platform', '--no-js', '--release', '--target', host,
      '--target-dir', targetDir, '-p', 'otel-thread-ctx', '--', '--locked', '-p', 'otel-thread-ctx-inspect']);
  } else {
    run('cargo', ['build', ...cargoArgs, ...packages]);
    install(path.join(targetDir, host, 'release', 'libotel_thread_ctx.so'), path.join(ROOT, native.addonFile(key)));
  }
  install(path.join(targetDir, host, 'release', 'otel-thread-ctx'), path.join(ROOT, 'bin', 'otel-thread-ctx'), 0o755);
} finally {
  if (scratch !== null) fs.rmSync(scratch, { recursive: true, force: true });
}
