'use strict';
// Builds the release artifacts (`npm run build:release`), in dist/ (or
// --out DIR):
// - the platform package's tarball, `otel-thread-ctx-<platform>-<version>.tgz`:
//   npm/<platform>/ with the addon and the reader CLI, at the main package's
//   version;
// - the main package's tarball, whose package.json names the platform
//   package as an optional dependency at that same version (what
//   `napi pre-publish` does), so npm installs it where it matches and the
//   install script then builds nothing;
// - release.json: what was built, from which commit, the sizes, the newest
//   glibc symbol version each binary needs, sha256 sums.
//
// The binaries are the release profile's (LTO, one codegen unit), built by
// cargo-zigbuild (tools/zigbuild.js) for x86_64-unknown-linux-gnu against
// glibc 2.28 headers and stubs, so they load on any glibc from 2.28 on (the
// oldest that official Node.js 20+ binaries need). The reader's BPF program
// is compiled by its build script with clang and libbpf's headers, here,
// and embedded in the binary (CO-RE: relocated against the running kernel's
// BTF when loaded): users need neither. The build fails rather than ship a
// reader without it.
//
// Reproducible: the same sources and toolchain give the same bytes. The
// checkout, cargo's home and the target directory are remapped out of the
// Rust and C debug info and panic messages, and npm packs with fixed
// timestamps. Two absolute paths remain, so a byte-identical rebuild needs
// the same checkout path and cache directory: zig's cache, in the debug info
// of the runtime pieces zig compiles there (libunwind, the C start files),
// and the checkout, in the debug info of the BPF program (compiled by the
// reader's build script). `--check-reproducible` builds a second time in
// another target directory and compares every output.
//
// Usage: node scripts/release.js [--out DIR] [--check-reproducible]
const { execFileSync, spawnSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const native = require('../js/native');
const { shippedPackages, READER_BINARY } = require('./cargo-packages');

const ROOT = native.ROOT;
const PLATFORM = 'linux-x64-gnu';
const RUST_TARGET = 'x86_64-unknown-linux-gnu';
const GLIBC = '2.28';

/** The environment of a plain shell: nothing from an `npm run` around us. */
function cleanEnv(extra = {}) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k)));
  return { ...env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false', ...extra };
}

function sha256(file) {
  return crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

/** "1.2.3" < "1.10" */
function compareVersions(a, b) {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The newest GLIBC_x.y symbol version `file` needs (readelf's version sections). */
function newestGlibc(file) {
  const text = execFileSync('readelf', ['--version-info', '--wide', file], { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
  const versions = [...text.matchAll(/\bGLIBC_(\d+(?:\.\d+)+)\b/g)].map((m) => m[1]);
  return versions.sort(compareVersions).at(-1) ?? null;
}

/** The checkout's commit (with -dirty when it has changes), or null outside git. */
function commit() {
  const r = spawnSync('git', ['describe', '--always', '--dirty', '--abbrev=12'], { cwd: ROOT, encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

function run(cmd, args, options) {
  const r = spawnSync(cmd, args, { cwd: ROOT, stdio: 'inherit', ...options });
  if (r.error || r.status !== 0) {
    throw new Error(`\`${path.basename(cmd)} ${args.join(' ')}\` failed (${r.error?.message ?? r.signal ?? `exit ${r.status}`})`);
  }
}

/** Builds the addon and the reader in `targetDir`; returns their paths. */
function buildBinaries(targetDir) {
  const { zigbuild } = require('../tools/zigbuild');
  const tools = zigbuild();
  const crates = shippedPackages(ROOT);
  const cargoHome = process.env.CARGO_HOME || path.join(os.homedir(), '.cargo');
  // The last matching prefix wins: the target directory may sit in the checkout.
  const remaps = [[cargoHome, '/cargo'], [ROOT, '/otel-thread-ctx'], [targetDir, '/target']];
  // Appended to the checkout's own build.rustflags (cargo merges config arrays).
  const rustflags = remaps.map(([from, to]) => `--remap-path-prefix=${from}=${to}`);
  const cflags = remaps.map(([from, to]) => `-ffile-prefix-map=${from}=${to}`).join(' ');
  const env = { ...process.env, ...tools.env, [`CFLAGS_${RUST_TARGET.replace(/-/g, '_')}`]: cflags };
  run(tools.cargoZigbuild, ['zigbuild', '--release', '--locked', '--target', `${RUST_TARGET}.${GLIBC}`, '--target-dir', targetDir,
    '-p', crates.addon.package, '-p', crates.reader.package, '--config', `build.rustflags=${JSON.stringify(rustflags)}`], { env });
  const out = path.join(targetDir, RUST_TARGET, 'release');
  const binaries = { addon: path.join(out, crates.addon.file), reader: path.join(out, crates.reader.file) };
  // A reader built without clang or libbpf's headers leaves `profile` out and says so first.
  const probe = spawnSync(binaries.reader, ['profile', '--pid', '2147483647', '--duration', '1'], { encoding: 'utf8' });
  if (/no kernel sampler/.test(probe.stderr)) {
    throw new Error(`the reader was built without its BPF program (install clang and libbpf's headers): ${probe.stderr.trim()}`);
  }
  return binaries;
}

/** `npm pack` of `dir` into `outDir`; returns npm's report of the tarball. */
function npmPack(dir, outDir) {
  const [packed] = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', outDir], { cwd: dir, env: cleanEnv(), encoding: 'utf8' }));
  return { file: path.join(outDir, packed.filename), size: packed.size, unpackedSize: packed.unpackedSize };
}

/** Packs npm/<platform>/ with these two binaries into `outDir`. */
function packPlatformPackage({ addon, reader, outDir }) {
  const { version } = require('../package.json');
  const staging = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-platform-'));
  try {
    const dir = path.join(staging, PLATFORM);
    fs.cpSync(path.join(ROOT, 'npm', PLATFORM), dir, { recursive: true });
    const manifestPath = path.join(dir, 'package.json');
    const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
    manifest.version = version;
    fs.writeFileSync(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
    fs.copyFileSync(addon, path.join(dir, native.addonFile(PLATFORM)));
    fs.mkdirSync(path.join(dir, 'bin'));
    fs.copyFileSync(reader, path.join(dir, 'bin', READER_BINARY));
    fs.chmodSync(path.join(dir, 'bin', READER_BINARY), 0o755);
    return { ...npmPack(dir, outDir), name: manifest.name };
  } finally {
    fs.rmSync(staging, { recursive: true, force: true });
  }
}

/** Packs the main package, with the platform package as an optional dependency, into `outDir`. */
function packMainPackage({ platformName, outDir }) {
  const [listing] = JSON.parse(execFileSync('npm', ['pack', '--dry-run', '--json'], { cwd: ROOT, env: cleanEnv(), encoding: 'utf8' }));
  const staging = fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-main-'));
  try {
    for (const { path: file, mode } of listing.files) {
      fs.mkdirSync(path.join(staging, path.dirname(file)), { recursive: true });
      fs.copyFileSync(path.join(ROOT, file), path.join(staging, file));
      fs.chmodSync(path.join(staging, file), mode & 0o777);
    }
    const manifestPath = path.join(staging, 'package.json');
    const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
    manifest.optionalDependencies = { ...manifest.optionalDependencies, [platformName]: manifest.version };
    fs.writeFileSync(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
    return npmPack(staging, outDir);
  } finally {
    fs.rmSync(staging, { recursive: true, force: true });
  }
}

function packAll(binaries, outDir) {
  fs.mkdirSync(outDir, { recursive: true });
  const platform = packPlatformPackage({ ...binaries, outDir });
  const main = packMainPackage({ platformName: platform.name, outDir });
  return { main, platform };
}

function describe(tarball) {
  return { file: path.basename(tarball.file), size: tarball.size, unpackedSize: tarball.unpackedSize, sha256: sha256(tarball.file) };
}

function main() {
  const args = process.argv.slice(2);
  const outAt = args.indexOf('--out');
  const outDir = path.resolve(outAt >= 0 ? args[outAt + 1] : path.join(ROOT, 'dist'));
  if (native.platform() !== PLATFORM) throw new Error(`the release build runs on ${PLATFORM}, not ${native.platform()}`);
  const started = Date.now();
  const targetDir = path.join(shippedPackages(ROOT).targetDirectory, 'release-artifacts');

  console.error(`release: building the addon and the reader for ${RUST_TARGET} (glibc ${GLIBC}) in ${targetDir}`);
  const binaries = buildBinaries(targetDir);
  const buildSeconds = (Date.now() - started) / 1000;
  const check = args.includes('--check-reproducible');
  let again = null;
  if (check) {
    console.error('release: building again in another target directory to compare');
    again = buildBinaries(`${targetDir}-again`);
  }
  // Both sets are packed only now, one after the other, from the same checkout.
  fs.rmSync(outDir, { recursive: true, force: true });
  const tarballs = packAll(binaries, outDir);
  const scratch = check ? fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-release-again-')) : null;
  const repacked = check ? packAll(again, scratch) : null;

  const report = {
    version: require('../package.json').version,
    platform: PLATFORM,
    target: `${RUST_TARGET}.${GLIBC}`,
    commit: commit(),
    buildSeconds: Math.round(buildSeconds),
    tarballs: { main: describe(tarballs.main), platform: describe(tarballs.platform) },
    binaries: Object.fromEntries(Object.entries(binaries).map(([name, file]) => [name, {
      size: fs.statSync(file).size, sha256: sha256(file), glibc: newestGlibc(file),
    }])),
  };
  fs.writeFileSync(path.join(outDir, 'release.json'), `${JSON.stringify(report, null, 2)}\n`);

  console.log(`release: built in ${report.buildSeconds} s (${report.target}), in ${outDir}:`);
  for (const t of Object.values(report.tarballs)) console.log(`  ${t.file}: ${mib(t.size)} packed, ${mib(t.unpackedSize)} unpacked`);
  for (const [name, b] of Object.entries(report.binaries)) console.log(`  ${name}: ${mib(b.size)}, needs GLIBC_${b.glibc} at most`);

  if (check) {
    const pairs = [
      ['addon', binaries.addon, again.addon], ['reader', binaries.reader, again.reader],
      ['main tarball', tarballs.main.file, repacked.main.file], ['platform tarball', tarballs.platform.file, repacked.platform.file],
    ];
    const differing = pairs.filter(([, a, b]) => sha256(a) !== sha256(b)).map(([name]) => name);
    fs.rmSync(scratch, { recursive: true, force: true });
    if (differing.length > 0) throw new Error(`not reproducible: these differ between the two builds: ${differing.join(', ')}`);
    console.log('release: reproducible (the second build gave byte-identical binaries and tarballs)');
  }
}

module.exports = { newestGlibc, packPlatformPackage, compareVersions, PLATFORM };

if (require.main === module) {
  try {
    main();
  } catch (error) {
    console.error(`\nrelease: ${error.message}\n`);
    process.exit(1);
  }
}
