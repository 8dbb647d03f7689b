'use strict';
// The workspace packages that make the two shipped binaries, found with
// `cargo metadata` rather than named here: the addon is the package with a
// cdylib target, the reader the package with a binary target named like the
// CLI (`otel-thread-ctx`), whatever the crates are called or where they sit.
const { execFileSync } = require('node:child_process');

const READER_BINARY = 'otel-thread-ctx';

/**
 * {addon: {package, file}, reader: {package, file}, targetDirectory}: the
 * package to pass to `cargo build -p` and the file it leaves in
 * <target>/<triple>/release/.
 */
function shippedPackages(root) {
  const metadata = JSON.parse(execFileSync('cargo', ['metadata', '--format-version', '1', '--no-deps', '--locked'], {
    cwd: root, encoding: 'utf8', maxBuffer: 64 * 2 ** 20,
  }));
  const find = (what, matches) => {
    const found = [];
    for (const pkg of metadata.packages) {
      for (const target of pkg.targets) if (matches(target)) found.push({ pkg, target });
    }
    if (found.length !== 1) {
      throw new Error(`expected one workspace package with ${what}, found ${found.length}: ${found.map((f) => f.pkg.name).join(', ') || 'none'}`);
    }
    return found[0];
  };
  const addon = find('a cdylib target', (t) => t.kind.includes('cdylib'));
  const reader = find(`a binary named ${READER_BINARY}`, (t) => t.kind.includes('bin') && t.name === READER_BINARY);
  return {
    addon: { package: addon.pkg.name, file: `lib${addon.target.name.replace(/-/g, '_')}.so` },
    reader: { package: reader.pkg.name, file: reader.target.name },
    targetDirectory: metadata.target_directory,
  };
}

module.exports = { shippedPackages, READER_BINARY };

if (require.main === module) console.log(JSON.stringify(shippedPackages(require('node:path').resolve(__dirname, '..')), null, 2));
