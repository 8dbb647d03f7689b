'use strict';
// Where the native files are, napi-rs style: a platform-named addon
// (`otel-thread-ctx.linux-x64-gnu.node`) and the reader binary, either built
// from source into this package by its install script, or shipped prebuilt
// in the platform package `otel-thread-ctx-linux-x64-gnu` (an optional
// dependency once such packages are published).
const fs = require('node:fs');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..');
const BINARY_NAME = 'otel-thread-ctx';
const PACKAGE_NAME = 'otel-thread-ctx';
/** Where installing from source is explained (shipped with the package). */
const README = `"Installing" in ${path.join(ROOT, 'README.md')}`;

/** Platforms the addon supports, in napi-rs's naming. */
const SUPPORTED = ['linux-x64-gnu'];

function isMusl() {
  // Reading ldd is cheap; the process report (where glibc gives its version
  // and musl nothing) takes milliseconds, and every thread loads this.
  try {
    return fs.readFileSync('/usr/bin/ldd', 'latin1').includes('musl');
  } catch {
    const report = process.report?.getReport?.();
    return report ? !report.header?.glibcVersionRuntime : false;
  }
}

let platformCache;
/** This process's platform in napi-rs's naming, e.g. 'linux-x64-gnu'. */
function platform() {
  if (platformCache === undefined) {
    platformCache = `${process.platform}-${process.arch}`;
    if (process.platform === 'linux') platformCache += isMusl() ? '-musl' : '-gnu';
  }
  return platformCache;
}

const addonFile = (key) => `${BINARY_NAME}.${key}.node`;

/** This package's version, read once. */
let versionCache;
function ownVersion() {
  versionCache ??= JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')).version;
  return versionCache;
}

/** {dir, version} of the installed platform package, or null. */
function platformPackage(key) {
  let manifest;
  try {
    manifest = require.resolve(`${PACKAGE_NAME}-${key}/package.json`, { paths: [ROOT] });
  } catch {
    return null;
  }
  return { dir: path.dirname(manifest), version: JSON.parse(fs.readFileSync(manifest, 'utf8')).version };
}

/**
 * Directory of the installed platform package, or null. One of another
 * version is not used: its binaries were built from other sources, and the
 * record layout, the process context and the JS side change together.
 */
function platformPackageDir(key = platform()) {
  const found = platformPackage(key);
  return found !== null && found.version === ownVersion() ? found.dir : null;
}

/** `file` from the build from source, else from the platform package, else null. */
function find(file) {
  const local = path.join(ROOT, file);
  if (fs.existsSync(local)) return local;
  const prebuilt = platformPackageDir();
  return prebuilt !== null && fs.existsSync(path.join(prebuilt, file)) ? path.join(prebuilt, file) : null;
}

/** The addon's path, or null when it is not installed. */
function addonPath() {
  return find(addonFile(platform()));
}

/** The reader CLI's path, or null when it is not installed. */
function readerPath() {
  return find(path.join('bin', BINARY_NAME));
}

/** Why nothing can be loaded, and what to do about it. */
function missingMessage(what) {
  const key = platform();
  if (!SUPPORTED.includes(key)) {
    return `${PACKAGE_NAME}: ${key} is not supported (supported: ${SUPPORTED.join(', ')}).`;
  }
  const found = platformPackage(key);
  const prebuilt = found !== null && found.version !== ownVersion()
    ? `the prebuilt package ${PACKAGE_NAME}-${key} is at version ${found.version}, not ${ownVersion()}, so it is not used`
    : `the prebuilt package ${PACKAGE_NAME}-${key} is not installed`;
  return (
    `${PACKAGE_NAME}: the ${what} for ${key} is not installed: ${path.join(ROOT, what === 'native addon' ? addonFile(key) : path.join('bin', BINARY_NAME))} ` +
    `does not exist and ${prebuilt}. The package's install script builds it from source, ` +
    `and it did not run (installed with --ignore-scripts, or install scripts are not allowed for ${PACKAGE_NAME}) or it failed. ` +
    `Run \`npm rebuild ${PACKAGE_NAME}\` (it needs a Rust toolchain, see ${README}), ` +
    `or allow the package's install script and reinstall.`
  );
}

/** Loads the addon, or throws an Error that says what to run. */
function loadAddon() {
  const file = addonPath();
  if (file === null) {
    const error = new Error(missingMessage('native addon'));
    error.code = 'OTEL_THREAD_CTX_ADDON_MISSING';
    throw error;
  }
  try {
    return require(file);
  } catch (cause) {
    throw new Error(`${PACKAGE_NAME}: cannot load ${file}: ${cause.message}. Rebuild it with \`npm rebuild ${PACKAGE_NAME}\`.`, { cause });
  }
}

module.exports = { ROOT, README, SUPPORTED, platform, addonFile, addonPath, readerPath, platformPackageDir, missingMessage, loadAddon };
