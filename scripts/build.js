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
// npm shows an install script's output only when it fails (or with
// --foreground-scripts), so the build says in one line what it is about to
// do and in another how long it took; both are there when anyone looks.
//
// Usage: node scripts/build.js [--from-source]
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
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

// napi build warns that it generates no bindings when napi-derive's
// `type-def` feature is off. Here that is intended: index.d.ts and the JS
// entry points are written by hand (`--no-js`), and napi has no option that
// says so, so exactly this line is left out of its output.
const NO_TYPE_DEF_WARNING = /^\s*WARNING\s+`napi-derive` crate is not used or `type-def` feature is not enabled for `napi-derive` crate\. Will skip binding generation for `\.node`, `\.wasi` and `\.d\.ts` files\.$/;
// eslint-disable-next-line no-control-regex
const ANSI_ESCAPE = /\x1b\[[0-9;]*m/g;

/** Like run(), for napi build: its stderr passes through line by line, but for NO_TYPE_DEF_WARNING. */
function runNapi(args) {
  // Cargo colours its messages only on a terminal; the pipe below is not one.
  const env = process.stderr.isTTY ? { ...process.env, CARGO_TERM_COLOR: process.env.CARGO_TERM_COLOR ?? 'always' } : process.env;
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['inherit', 'inherit', 'pipe'], env });
  readline.createInterface({ input: child.stderr, crlfDelay: Infinity }).on('line', (line) => {
    if (!NO_TYPE_DEF_WARNING.test(line.replace(ANSI_ESCAPE, ''))) process.stderr.write(`${line}\n`);
  });
  return new Promise((resolve) => {
    child.on('error', (error) => fail(`otel-thread-ctx: cannot run napi build: ${error.message}`));
    child.on('close', (code, signal) => {
      if (code !== 0) fail(`otel-thread-ctx: \`napi ${args.slice(1).join(' ')}\` failed (${signal ?? `exit ${code}`}); its output is above.`);
      resolve();
    });
  });
}

/** "2 min 05 s" or "48 s". */
function duration(ms) {
  const s = Math.round(ms / 1000);
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
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
// However the build ends (fail() exits at once).
if (scratch !== null) process.on('exit', () => fs.rmSync(scratch, { recursive: true, force: true }));

async function build() {
  // Only what users run: the addon and the reader (not the demo's tools),
  // in one cargo invocation with the package selection and flags of
  // scripts/test.js, so that shared dependencies resolve to the same
  // features and `cargo test` reuses them.
  const cargoArgs = ['--release', '--locked', '--target', host, '--target-dir', targetDir];
  const packages = ['-p', 'otel-thread-ctx', '-p', 'otel-thread-ctx-cli'];
  let napiCli = null;
  try {
    const manifest = require.resolve('@napi-rs/cli/package.json', { paths: [ROOT] });
    napiCli = path.join(path.dirname(manifest), require(manifest).bin.napi);
  } catch {
    // @napi-rs/cli is not installed: cargo builds both below.
  }
  if (napiCli !== null) {
    // napi copies the addon out; cargo arguments after `--` add the reader.
    await runNapi([napiCli, 'build', '--platform', '--no-js', '--release', '--target', host,
      '--target-dir', targetDir, '-p', 'otel-thread-ctx', '--', '--locked', '-p', 'otel-thread-ctx-cli']);
  } else {
    run('cargo', ['build', ...cargoArgs, ...packages]);
    install(path.join(targetDir, host, 'release', 'libotel_thread_ctx.so'), path.join(ROOT, native.addonFile(key)));
  }
  install(path.join(targetDir, host, 'release', 'otel-thread-ctx'), path.join(ROOT, 'bin', 'otel-thread-ctx'), 0o755);
}

const started = Date.now();
console.error('otel-thread-ctx: building the addon and the reader from source with cargo (a few minutes the first time)...');
build().then(() => console.error(`otel-thread-ctx: built the addon and the reader in ${duration(Date.now() - started)}`));
