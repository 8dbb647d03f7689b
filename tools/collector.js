'use strict';
// A real OpenTelemetry Collector for the tests: built once with the
// Collector builder (from the Go module proxy) with the OTLP receiver and
// the OTLP/HTTP exporter, cached outside the clone, and run on 127.0.0.1
// with profiles enabled. The exporter forwards what the receiver accepted
// to an HTTP sink of the caller's, so a test reads the Collector's own
// output, decoded with the official .proto.
//
// `node tools/collector.js [version]` builds (or finds) the binary and
// prints its path.

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { onLines } = require('./subprocess');

const VERSION = '0.165.0';

/** Where the binary of a Collector version is cached. */
function cacheOf(version) {
  return path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'otel-thread-ctx', `collector-${version}`);
}

/** The builder's manifest: only what the tests use. */
function manifest(version) {
  return [
    'dist:',
    '  name: otelcol-profiles',
    '  description: OpenTelemetry Collector for the otel-thread-ctx tests',
    `  output_path: ${JSON.stringify(path.join(cacheOf(version), 'build'))}`,
    'receivers:',
    `  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver v${version}`,
    'exporters:',
    `  - gomod: go.opentelemetry.io/collector/exporter/otlphttpexporter v${version}`,
    `  - gomod: go.opentelemetry.io/collector/exporter/debugexporter v${version}`,
    '',
  ].join('\n');
}

/**
 * The binary of Collector `version` (default {@link VERSION}): {binary} when
 * it is cached or was just built, or {reason} why it cannot be had here (no
 * Go, the build failed). The first build takes a few minutes.
 */
function collectorBinary(version = VERSION) {
  const CACHE = cacheOf(version);
  const BINARY = path.join(CACHE, 'otelcol-profiles');
  if (fs.existsSync(BINARY)) return { binary: BINARY };
  const go = spawnSync('go', ['version'], { encoding: 'utf8' });
  if (go.error || go.status !== 0) return { reason: `Go is not installed (${go.error?.code ?? go.stderr.trim()}): the Collector cannot be built` };
  fs.mkdirSync(CACHE, { recursive: true });
  const gobin = path.join(CACHE, 'bin');
  const env = { ...process.env, GOBIN: gobin, GOFLAGS: '-mod=mod', CGO_ENABLED: '0' };
  const install = spawnSync('go', ['install', `go.opentelemetry.io/collector/cmd/builder@v${version}`], { env, encoding: 'utf8' });
  if (install.status !== 0) return { reason: `go install of the Collector builder failed: ${install.stderr.trim().slice(-2000)}` };
  const manifestPath = path.join(CACHE, 'manifest.yaml');
  fs.writeFileSync(manifestPath, manifest(version));
  const build = spawnSync(path.join(gobin, 'builder'), ['--config', manifestPath], { env, encoding: 'utf8' });
  const built = path.join(CACHE, 'build', 'otelcol-profiles');
  if (build.status !== 0 || !fs.existsSync(built)) {
    return { reason: `the Collector builder failed: ${(build.stderr || String(build.error)).trim().slice(-2000)}` };
  }
  // Keep the binary only: the generated sources are not needed again.
  fs.renameSync(built, BINARY);
  fs.rmSync(path.join(CACHE, 'build'), { recursive: true, force: true });
  return { binary: BINARY };
}

/**
 * Starts the Collector: OTLP/gRPC on `grpcPort`, OTLP/HTTP on `httpPort`,
 * profiles forwarded to `sinkUrl` (an OTLP/HTTP receiver of the caller's)
 * uncompressed. Resolves once it is ready, with {child, stop(), log()}.
 */
function startCollector(binary, { grpcPort, httpPort, sinkUrl, dir }) {
  const config = path.join(dir, `collector-${grpcPort}.yaml`);
  fs.writeFileSync(
    config,
    [
      'receivers:',
      '  otlp:',
      '    protocols:',
      '      grpc:',
      `        endpoint: 127.0.0.1:${grpcPort}`,
      '      http:',
      `        endpoint: 127.0.0.1:${httpPort}`,
      'exporters:',
      '  otlphttp:',
      `    endpoint: ${sinkUrl}`,
      '    compression: none',
      '    retry_on_failure:',
      '      enabled: false',
      'service:',
      '  telemetry:',
      '    metrics:',
      '      level: none',
      '  pipelines:',
      '    profiles:',
      '      receivers: [otlp]',
      '      exporters: [otlphttp]',
      '',
    ].join('\n'),
  );
  const child = spawn(binary, ['--config', config, '--feature-gates=+service.profilesSupport'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = [];
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  return new Promise((resolve, reject) => {
    let ready = false;
    const take = (line) => {
      lines.push(line);
      if (!ready && /Everything is ready/.test(line)) {
        ready = true;
        resolve({ child, stop, log: () => lines.join('\n') });
      }
    };
    onLines(child.stdout, take);
    onLines(child.stderr, take);
    exited.then(({ code, signal }) => {
      if (!ready) reject(new Error(`the Collector exited (${code ?? signal}) before it was ready:\n${lines.join('\n')}`));
    });
  });
}

module.exports = { VERSION, collectorBinary, startCollector };

if (require.main === module) {
  const got = collectorBinary(process.argv[2] || VERSION);
  if (got.reason) {
    console.error(got.reason);
    process.exit(1);
  }
  console.log(got.binary);
}
