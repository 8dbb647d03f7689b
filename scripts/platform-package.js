'use strict';
// Fills npm/<platform>/ with the addon and the reader built in this checkout
// (`npm run build`), at the main package's version: the prebuilt platform
// package that the loader and the install script pick up. With
// `--pack <dir>`, fills a temporary copy instead, packs it into <dir> and
// prints the tarball's path.
//
// Publishing: publish each npm/<platform> package, then add them to the main
// package's optionalDependencies at the same version (what `napi pre-publish`
// does), so npm installs the one matching the user's platform and the
// install script skips building from source.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const native = require('../js/native');

const os = require('node:os');

const key = native.platform();
const source = path.join(native.ROOT, 'npm', key);
if (!fs.existsSync(path.join(source, 'package.json'))) throw new Error(`no platform package for ${key} in ${path.dirname(source)}`);
const packAt = process.argv.indexOf('--pack');
let dir = source;
if (packAt >= 0) {
  dir = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'otel-thread-ctx-platform-')), key);
  fs.cpSync(source, dir, { recursive: true });
}
const manifestPath = path.join(dir, 'package.json');
const addon = path.join(native.ROOT, native.addonFile(key));
const reader = path.join(native.ROOT, 'bin', 'otel-thread-ctx');
for (const file of [addon, reader]) {
  if (!fs.existsSync(file)) throw new Error(`${file} is missing: run \`npm run build\` first`);
}

const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
const { version } = require('../package.json');
if (manifest.version !== version) {
  manifest.version = version;
  fs.writeFileSync(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
}
fs.copyFileSync(addon, path.join(dir, path.basename(addon)));
fs.mkdirSync(path.join(dir, 'bin'), { recursive: true });
fs.copyFileSync(reader, path.join(dir, 'bin', 'otel-thread-ctx'));
fs.chmodSync(path.join(dir, 'bin', 'otel-thread-ctx'), 0o755);

if (packAt >= 0) {
  const into = path.resolve(process.argv[packAt + 1]);
  const [packed] = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', into], { cwd: dir, encoding: 'utf8' }));
  fs.rmSync(path.dirname(dir), { recursive: true, force: true });
  console.log(path.join(into, packed.filename));
}
