'use strict';
// JavaScript frames named from V8's own heap, with no flag on the target:
// `otel-thread-ctx profile` against a node running a hot loop without
// --perf-basic-prof names the hot function with its script, line and
// column, the same name V8's perf map gives it when node runs with the
// flag. Runs against this node and every node binary listed (colon
// separated) in OTEL_THREAD_CTX_TEST_NODES. Needs root (BPF) and a reader
// built with its BPF program; skips with the reason otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { jsonLines, exited, profileUnavailable, scratchDir, runProfile } = require('./helpers');

const READER = require('../js/native').readerPath();
const HOT_LOOP = path.join(__dirname, 'fixtures', 'hot-loop.js');

const skip = profileUnavailable(READER);

const NODES = [process.execPath, ...(process.env.OTEL_THREAD_CTX_TEST_NODES ?? '').split(':').filter(Boolean)];

/** `JS:<fn> <file>:<line>:<column>`, the column at its parameter list's `(`, as V8 names it. */
function expectedName(fn) {
  const text = fs.readFileSync(HOT_LOOP, 'utf8');
  const paren = text.indexOf(`function ${fn}(`) + `function ${fn}`.length;
  const before = text.slice(0, paren).split('\n');
  return `JS:${fn} ${HOT_LOOP}:${before.length}:${before.at(-1).length + 1}`;
}

const profile = (pid, args, cwd) => runProfile(READER, pid, args, cwd);

/** Profiles the hot loop run by `node` with `flags`; returns its on-CPU samples of the main thread and the summary. */
async function profileHotLoop(t, node, flags, tmp) {
  const target = spawn(node, [...flags, HOT_LOOP], { stdio: ['ignore', 'pipe', 'inherit'] });
  const { pid, version } = await jsonLines(target.stdout).next('the target line');
  t.after(async () => {
    target.kill('SIGKILL');
    await exited(target);
    fs.rmSync(`/tmp/perf-${pid}.map`, { force: true });
  });
  const out = path.join(tmp, `${pid}.jsonl`);
  const r = await profile(pid, ['--duration', '3', '--format', 'jsonl', '-o', out], tmp);
  assert.strictEqual(r.code, 0, r.stderr);
  const samples = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l))
    .filter((s) => s.kind === 'cpu' && s.tid === pid);
  return { pid, version, samples, stderr: r.stderr };
}

const share = (samples, name) => samples.filter((s) => s.user_stack.includes(name)).length / Math.max(1, samples.length);

test('profile: JavaScript frames named from V8 without --perf-basic-prof', { skip: skip ?? false }, async (t) => {
  const tmp = scratchDir('otel-thread-ctx-v8-names-');
  t.after(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const name = expectedName('burnCpuHot');
  // Its caller runs interpreted for much of the run: named too, in each
  // sample, though its address is V8's interpreter.
  const caller = expectedName('tick');
  for (const node of NODES) {
    if (!fs.existsSync(node)) {
      await t.test(node, { skip: `${node} does not exist` }, () => {});
      continue;
    }
    await t.test(node, async (t) => {
      const plain = await profileHotLoop(t, node, [], tmp);
      assert.match(plain.stderr, /JavaScript frames named from V8's heap/, plain.stderr);
      const named = share(plain.samples, name);
      const leaves = [...new Set(plain.samples.map((s) => s.user_stack[0]))].slice(0, 8).join('\n');
      assert.ok(named >= 0.5, `${plain.version}: ${name} in ${(100 * named).toFixed(0)} % of ${plain.samples.length} samples; leaves:\n${leaves}`);
      const called = plain.samples.filter((s) => s.user_stack.includes(name) && s.user_stack.indexOf(caller) === s.user_stack.indexOf(name) + 1);
      assert.ok(called.length >= 0.5 * plain.samples.length, `${plain.version}: ${caller} calls ${name} in ${called.length} of ${plain.samples.length} samples`);

      // With the flag, V8's perf map names the function at the same place.
      const flagged = await profileHotLoop(t, node, ['--perf-basic-prof'], tmp);
      const map = fs.readFileSync(`/tmp/perf-${flagged.pid}.map`, 'utf8');
      const mapNames = new Set(map.split('\n').filter((l) => l.includes('burnCpuHot')).map((l) => l.split(' ').slice(2).join(' ').replace(/^JS:o?[~^+*]'?/, 'JS:')));
      assert.deepStrictEqual([...mapNames], [name], map.split('\n').filter((l) => l.includes('burnCpuHot')).join('\n'));
      assert.ok(share(flagged.samples, name) >= 0.5, `${flagged.version} with --perf-basic-prof: ${name} in ${(100 * share(flagged.samples, name)).toFixed(0)} %`);
    });
  }
});
