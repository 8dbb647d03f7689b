'use strict';
// Runs every test: the Rust unit tests, then the node:test suites in
// __test__/ with the Node binary running this script (so that
// `PATH=<node 24>/bin:$PATH npm test` tests Node 24). Ends with a summary
// naming every failure.
//
// `cargo test` uses the package selection, target and profile that the
// build (scripts/build.js) used, so it reuses what `npm install` compiled
// and builds only the test harnesses. SKIP_CARGO_TEST=1 skips it (e.g. when
// it already ran on another Node line). SKIP_LINE_INDEPENDENT=1 leaves out
// the suites whose subject is the same on every Node line (LINE_INDEPENDENT),
// for a run after another line already ran them.
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const run = (cmd, args) => {
  const { status, signal, error } = spawnSync(cmd, args, { cwd: root, stdio: 'inherit' });
  if (error) console.error(`cannot run ${cmd}: ${error.message}`);
  return status === 0 && !signal && !error;
};

let cargoPassed = null;
if (!process.env.SKIP_CARGO_TEST) {
  const rustc = spawnSync('rustc', ['-vV'], { encoding: 'utf8' });
  const host = /^host: (\S+)$/m.exec(rustc.stdout ?? '')?.[1];
  cargoPassed =
    host !== undefined &&
    run('cargo', ['test', '--release', '--locked', '--target', host,
      '-p', 'otel-thread-ctx', '-p', 'otel-thread-ctx-abi', '-p', 'otel-thread-ctx-otlp', '-p', 'otel-thread-ctx-reader',
      '-p', 'otel-thread-ctx-profiler', '-p', 'otel-thread-ctx-formats', '-p', 'otel-thread-ctx-agent', '-p', 'otel-thread-ctx-cli']);
}
// The Rust workspace's dependency rules, the addon's ELF symbols, the
// deployment files, the module graph of js/ and the conversion of profile
// files: none runs JavaScript of the line under test in what it checks.
const LINE_INDEPENDENT = ['convert', 'crates', 'deploy', 'js-structure', 'layout'];
const skipped = process.env.SKIP_LINE_INDEPENDENT ? LINE_INDEPENDENT.map((name) => `${name}.test.js`) : [];
const suites = fs
  .readdirSync(path.join(root, '__test__'))
  .filter((f) => f.endsWith('.test.js') && !skipped.includes(f))
  .sort()
  .map((f) => path.join('__test__', f));
console.log(`node ${process.version}: ${suites.length} suites${skipped.length > 0 ? ` (left out, the same on every line: ${LINE_INDEPENDENT.join(', ')})` : ''}`);
// A test that hangs fails after half an hour instead of holding the run
// (tests that need longer say so themselves).
const nodePassed = run(process.execPath, [
  '--test', '--test-concurrency=1', '--test-timeout=1800000',
  '--test-reporter=spec', '--test-reporter-destination=stdout',
  `--test-reporter=${path.join(__dirname, 'test-summary.mjs')}`, '--test-reporter-destination=stdout',
  ...suites,
]);
if (cargoPassed === false) console.log('✖ cargo test failed (its output is above the node:test suites)');
process.exit(nodePassed && cargoPassed !== false ? 0 : 1);
