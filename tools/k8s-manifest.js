'use strict';
// The Kubernetes manifest checker (tools/k8s-manifest/, Go): decodes
// manifests with the Kubernetes API's own types, strictly, with no cluster.
// Built once per source version from the Go module proxy and cached
// outside the clone.
//
// `node tools/k8s-manifest.js FILE...` prints each object as JSON.

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const SOURCE = path.join(__dirname, 'k8s-manifest');

/** The binary's cache path, keyed by its sources. */
function cachedPath() {
  const hash = crypto.createHash('sha256');
  for (const file of ['go.mod', 'go.sum', 'main.go']) hash.update(fs.readFileSync(path.join(SOURCE, file)));
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
  return path.join(cache, 'otel-thread-ctx', `k8s-manifest-${hash.digest('hex').slice(0, 16)}`, 'k8s-manifest');
}

/** {binary}, built if needed, or {reason} why it cannot be had here (no Go, a failed build). */
function manifestChecker() {
  const binary = cachedPath();
  if (fs.existsSync(binary)) return { binary };
  const go = spawnSync('go', ['version'], { encoding: 'utf8' });
  if (go.error || go.status !== 0) return { reason: `Go is not installed (${go.error?.code ?? go.stderr.trim()})` };
  const built = `${binary}.${process.pid}`;
  fs.mkdirSync(path.dirname(binary), { recursive: true });
  const build = spawnSync('go', ['build', '-trimpath', '-o', built, '.'], {
    cwd: SOURCE,
    env: { ...process.env, CGO_ENABLED: '0', GOFLAGS: '-mod=readonly' },
    encoding: 'utf8',
  });
  if (build.status !== 0) return { reason: `go build failed: ${(build.stderr || String(build.error)).trim().slice(-2000)}` };
  // Another process may have built it meanwhile: the rename is atomic either way.
  fs.renameSync(built, binary);
  return { binary };
}

/** The objects of manifest `file`, decoded strictly; throws with the checker's message on any error. */
function decodeManifest(binary, file) {
  const run = spawnSync(binary, [file], { encoding: 'utf8' });
  if (run.status !== 0) throw new Error(run.stderr.trim() || `k8s-manifest exited with ${run.status}`);
  return run.stdout.trim().split('\n').map((line) => JSON.parse(line));
}

module.exports = { manifestChecker, decodeManifest };

if (require.main === module) {
  const got = manifestChecker();
  if (got.reason !== undefined) {
    console.error(got.reason);
    process.exit(1);
  }
  for (const file of process.argv.slice(2)) for (const object of decodeManifest(got.binary, file)) console.log(JSON.stringify(object));
}
