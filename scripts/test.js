'use strict';
// Runs every test: the Rust unit tests, then the node:test suites in
// __test__/ with the Node binary running this script (so that
// `PATH=<node 24>/bin:$PATH npm test` tests Node 24).
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const run = (cmd, args) => {
  const { status, signal } = spawnSync(cmd, args, { cwd: root, stdio: 'inherit' });
  if (status !== 0) process.exit(status ?? (signal ? 1 : 0));
};

if (!process.env.SKIP_CARGO_TEST) run('cargo', ['test', '--release', '--workspace', '--locked']);
const suites = fs
  .readdirSync(path.join(root, '__test__'))
  .filter((f) => f.endsWith('.test.js'))
  .sort()
  .map((f) => path.join('__test__', f));
console.log(`node ${process.version}: ${suites.length} suites`);
run(process.execPath, ['--test', '--test-concurrency=1', ...suites]);
