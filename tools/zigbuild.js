'use strict';
// cargo-zigbuild and zig, which the release build links with so that the
// binaries need no newer glibc than the one named in the target
// (`x86_64-unknown-linux-gnu.2.28`). Both come from PyPI (`ziglang` ships
// zig itself), installed with pip at pinned versions into a cache outside
// the clone, once per machine; zig's and cargo-zigbuild's own caches live
// beside them.
//
// `node tools/zigbuild.js` installs (or finds) them and prints the paths.
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const ZIG_VERSION = '0.17.1';
const CARGO_ZIGBUILD_VERSION = '0.24.1';
const CACHE = path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'otel-thread-ctx');
const DIR = path.join(CACHE, `zigbuild-${CARGO_ZIGBUILD_VERSION}-zig-${ZIG_VERSION}`);

function python() {
  for (const candidate of [process.env.PYTHON, 'python3', 'python'].filter(Boolean)) {
    const r = spawnSync(candidate, ['-m', 'pip', '--version'], { encoding: 'utf8' });
    if (r.status === 0) return candidate;
  }
  return null;
}

/**
 * {cargoZigbuild, zig, env}: the cargo-zigbuild binary, zig, and the
 * environment that points cargo-zigbuild at that zig and keeps the caches
 * here. Throws with what is missing when they cannot be installed.
 */
function zigbuild() {
  const cargoZigbuild = path.join(DIR, 'bin', 'cargo-zigbuild');
  const zig = path.join(DIR, 'ziglang', 'zig');
  if (!fs.existsSync(cargoZigbuild) || !fs.existsSync(zig)) {
    const py = python();
    if (py === null) throw new Error('the release build installs zig and cargo-zigbuild from PyPI with pip, and no python3 with pip was found');
    // Installed into a scratch directory that is renamed into place, so an
    // interrupted install leaves nothing that looks complete.
    fs.mkdirSync(CACHE, { recursive: true });
    const staging = fs.mkdtempSync(path.join(CACHE, 'zigbuild-staging-'));
    const r = spawnSync(py, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--root-user-action=ignore', '--no-deps', '--target', staging,
      `ziglang==${ZIG_VERSION}`, `cargo-zigbuild==${CARGO_ZIGBUILD_VERSION}`], { stdio: ['ignore', 'inherit', 'inherit'] });
    if (r.status !== 0) {
      fs.rmSync(staging, { recursive: true, force: true });
      throw new Error(`pip could not install ziglang ${ZIG_VERSION} and cargo-zigbuild ${CARGO_ZIGBUILD_VERSION} (${r.error?.message ?? `exit ${r.status}`})`);
    }
    fs.rmSync(DIR, { recursive: true, force: true });
    fs.renameSync(staging, DIR);
  }
  const env = {
    CARGO_ZIGBUILD_ZIG_PATH: zig,
    CARGO_ZIGBUILD_CACHE_DIR: path.join(DIR, 'cargo-zigbuild-cache'),
    ZIG_GLOBAL_CACHE_DIR: path.join(DIR, 'zig-cache'),
    ZIG_LOCAL_CACHE_DIR: path.join(DIR, 'zig-cache'),
  };
  return { cargoZigbuild, zig, env, versions: { zig: ZIG_VERSION, cargoZigbuild: CARGO_ZIGBUILD_VERSION } };
}

module.exports = { zigbuild };

if (require.main === module) {
  const { cargoZigbuild, zig } = zigbuild();
  console.log(`cargo-zigbuild: ${cargoZigbuild}\nzig: ${zig}`);
}
