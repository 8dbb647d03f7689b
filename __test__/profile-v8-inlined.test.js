'use strict';
// Functions that V8 inlined, named from V8's own heap with no flag on the
// target: `otel-thread-ctx profile --off-cpu=all` against a target whose
// work (`burnSmall`) and waits (`waitSmall`) happen in small functions
// inlined into their optimized callers, each caller in a span of its own.
// The perf map cannot name them (it has one entry per code object, the
// caller's); V8's source position tables and deoptimization data can.
// Needs root (BPF) and a reader built with its BPF program; skips with the
// reason otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines, exited, profileUnavailable, scratchDir, goTool, runProfile } = require('./helpers');

const READER = require('../js/native').readerPath();
const TARGET = path.join(__dirname, 'fixtures', 'inlined-work.js');
const skip = profileUnavailable(READER);

/** The 1-based lines of the fixture from the one holding `from` to the one holding `to`. */
function linesOf(from, to) {
  const text = fs.readFileSync(TARGET, 'utf8');
  const line = (s) => text.slice(0, text.indexOf(s)).split('\n').length;
  return [line(from), line(to)];
}

/** The frame's function name: `JS:<name>` without its place. */
const fn = (frame) => frame.split(' ')[0];

const profile = (pid, args, cwd) => runProfile(READER, pid, args, cwd);

/**
 * The stacks of a pprof file as `go tool pprof -raw` reads them, leaf
 * first: each JavaScript frame as { name, line } (line 0: no line), other
 * frames undefined.
 */
function pprofStacks(go, pb) {
  const raw = spawnSync(go, ['tool', 'pprof', '-raw', pb], { encoding: 'utf8' });
  assert.strictEqual(raw.status, 0, raw.stderr);
  const text = raw.stdout;
  const locations = text.slice(text.indexOf('Locations'));
  const placeOf = new Map();
  for (const [, id, name, line] of locations.matchAll(/^\s*(\d+): \S+ M=\d+ (JS:\w+) \S+ \[jit\]:(\d+):/gm)) {
    placeOf.set(Number(id), { name, line: Number(line) });
  }
  const stacks = [...text.slice(text.indexOf('Samples'), text.indexOf('Locations')).matchAll(/^\s*(?:\d+\s+)+\d+:((?: \d+)+)\s*$/gm)].map(
    ([, ids]) => ids.trim().split(/\s+/).map((id) => placeOf.get(Number(id))),
  );
  assert.ok(stacks.length > 0, `no samples in:\n${text.slice(0, 3000)}`);
  return stacks;
}

/** Each function's first and last line in the fixture. */
const BODIES = {
  'JS:burnSmall': ['function burnSmall(', 'return y;'],
  'JS:burnLoop': ['function burnLoop(', 'return x;'],
  'JS:waitSmall': ['function waitSmall(', 'return Atomics.wait('],
  'JS:waitLoop': ['function waitLoop(', 'return timedOut;'],
};

/** Each call of a small function in its loop: callee, caller, the call's text. */
const CALLS = [
  ['JS:burnSmall', 'JS:burnLoop', 'x = burnSmall(x, i)'],
  ['JS:waitSmall', 'JS:waitLoop', 'if (waitSmall(ms)'],
];

/** The lines of `caller`'s frames right above a frame of `callee`. */
function callerLines(stacks, callee, caller) {
  return stacks.flatMap((stack) => stack.filter((f, i) => f?.name === caller && stack[i - 1]?.name === callee).map((f) => f.line));
}

/**
 * Starts the fixture with node `flags` for the test `t` (killed when it
 * ends), with a scratch directory; resolves to both and the fixture's line.
 */
async function startTarget(t, flags, prefix) {
  const tmp = scratchDir(prefix);
  const target = spawn(process.execPath, [...flags, TARGET], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(async () => {
    target.kill('SIGKILL');
    await exited(target);
    fs.rmSync(tmp, { recursive: true, force: true });
  });
  return { tmp, ids: await jsonLines(target.stdout).next('the target line') };
}

/** Whether `callee` is named right above `caller` in the stack. */
function calls(stack, caller, callee) {
  const frames = stack.map(fn);
  const at = frames.indexOf(callee);
  return at >= 0 && frames[at + 1] === caller;
}

test('profile: functions V8 inlined are named in CPU and wait stacks, without --perf-basic-prof', { skip: skip ?? false }, async (t) => {
  const { tmp, ids } = await startTarget(t, [], 'otel-thread-ctx-v8-inlined-');
  const out = path.join(tmp, 'samples.jsonl');
  // Samples on burnLoop's own loop code are rightly named burnLoop alone:
  // the fixture keeps them rare, and 6 s of samples keeps a few of them
  // from pulling the share under the bar by chance.
  const r = await profile(ids.pid, ['--duration', '6', '--off-cpu=all', '--format', 'jsonl', '-o', out], tmp);
  assert.strictEqual(r.code, 0, r.stderr);
  assert.match(r.stderr, /frames of optimized code \(with \d+ frames? of functions they inlined\)/, r.stderr);
  const samples = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l)).filter((s) => s.tid === ids.pid);

  // On CPU: the samples of the burning loop (its span, its frame).
  const burning = samples.filter((s) => s.kind === 'cpu' && s.span_id === ids.burn.spanId && s.user_stack.map(fn).includes('JS:burnLoop'));
  assert.ok(burning.length >= 50, `${burning.length} CPU samples of burnLoop`);
  const burnNamed = burning.filter((s) => calls(s.user_stack, 'JS:burnLoop', 'JS:burnSmall')).length / burning.length;

  // Off CPU: the time blocked in the waiting loop's span.
  const waiting = samples.filter((s) => s.kind !== 'cpu' && s.span_id === ids.wait.spanId);
  const waited = waiting.reduce((sum, s) => sum + s.off_cpu_ns, 0);
  assert.ok(waited >= 100e6, `${waited / 1e6} ms blocked in the wait span`);
  const waitNamed = waiting.filter((s) => calls(s.user_stack, 'JS:waitLoop', 'JS:waitSmall')).reduce((sum, s) => sum + s.off_cpu_ns, 0) / waited;

  const report = `${process.version}: burnSmall in ${(100 * burnNamed).toFixed(1)} % of ${burning.length} CPU samples of burnLoop, ` +
    `waitSmall in ${(100 * waitNamed).toFixed(1)} % of ${(waited / 1e6).toFixed(0)} ms blocked`;
  t.diagnostic(report);
  // Inlined frames carry the function's own place, as V8 names it.
  const leaf = burning.find((s) => calls(s.user_stack, 'JS:burnLoop', 'JS:burnSmall'));
  if (leaf !== undefined) assert.match(leaf.user_stack.find((f) => fn(f) === 'JS:burnSmall'), /inlined-work\.js:\d+:\d+$/);
  await t.test('accuracy', () => {
    assert.ok(burnNamed >= 0.99, report);
    assert.ok(waitNamed >= 0.95, report);
  });

  // Lines, as `go tool pprof` reads them: each function's frames are on
  // its own lines, the inlined function where it ran, each caller at the
  // line of its call.
  const go = goTool();
  await t.test('lines in pprof', { skip: go ? false : 'no Go toolchain: go tool pprof cannot read the profile' }, async () => {
    const pb = path.join(tmp, 'profile.pb.gz');
    const again = await profile(ids.pid, ['--duration', '2', '--off-cpu=all', '--format', 'pprof', '-o', pb], tmp);
    assert.strictEqual(again.code, 0, again.stderr);
    const stacks = pprofStacks(go, pb);
    const known = (name) => [...new Set(stacks.flat().filter((f) => f?.name === name && f.line !== 0).map((f) => f.line))];
    const callLine = (needle) => linesOf(needle, needle)[0];
    // Each function's frames are within its own lines: the inlined ones
    // where they ran, each loop wherever its own code was (its call, its
    // loop test, its return)...
    for (const [name, [from, to]] of Object.entries(BODIES)) {
      const [first, last] = linesOf(from, to);
      const lines = known(name);
      assert.ok(lines.length > 0, `${name} has no location with a line`);
      assert.ok(lines.every((l) => l >= first && l <= last), `${name} at lines ${lines.join(', ')}, not within ${first}-${last}`);
    }
    // ...and a caller right above the function it inlined is at the line
    // of that call, or at no line: a baseline frame (Sparkplug code), whose
    // table from instructions to bytecode offsets is not read.
    for (const [callee, caller, call] of CALLS) {
      const line = callLine(call);
      const callers = callerLines(stacks, callee, caller);
      assert.ok(callers.includes(line), `${caller} never at line ${line} above ${callee}: ${callers.join(', ')}`);
      assert.ok(callers.every((l) => l === line || l === 0), `${caller} above ${callee} at lines ${[...new Set(callers)].join(', ')}, not ${line}`);
    }
    // The burning happens in the inner loop's line.
    assert.ok(known('JS:burnSmall').includes(callLine('for (let k = 0')), known('JS:burnSmall').join(', '));
  });
});

/**
 * Checks the lines of the four functions' frames in `stacks` (from pprof):
 * each within its function, each caller above a callee at the call's line.
 */
function assertLines(stacks) {
  for (const [name, [from, to]] of Object.entries(BODIES)) {
    const [first, last] = linesOf(from, to);
    const frames = stacks.flat().filter((f) => f?.name === name);
    assert.ok(frames.length > 0, `no frame of ${name}`);
    const lines = [...new Set(frames.map((f) => f.line))];
    assert.ok(lines.every((l) => l >= first && l <= last), `${name} at lines ${lines.join(', ')}, not within ${first}-${last}`);
  }
  for (const [callee, caller, call] of CALLS) {
    const line = linesOf(call, call)[0];
    const callers = callerLines(stacks, callee, caller);
    assert.ok(callers.length > 0, `${caller} never above ${callee}`);
    assert.ok(callers.every((l) => l === line), `${caller} above ${callee} at lines ${[...new Set(callers)].join(', ')}, not ${line}`);
  }
}

test('profile: interpreted frames (a target run with --jitless) are named at their lines', { skip: skip ?? (goTool() ? false : 'no Go toolchain: go tool pprof cannot read the profile') }, async (t) => {
  const { tmp, ids } = await startTarget(t, ['--jitless'], 'otel-thread-ctx-v8-interpreted-');
  const pb = path.join(tmp, 'profile.pb.gz');
  const r = await profile(ids.pid, ['--duration', '3', '--off-cpu=all', '--format', 'pprof', '-o', pb], tmp);
  assert.strictEqual(r.code, 0, r.stderr);
  assert.match(r.stderr, /\d+ interpreted frames?\b/, r.stderr);
  const stacks = pprofStacks(goTool(), pb);
  // No JIT: every frame of these functions is interpreted, and each has a
  // line within its function (Node.js's own functions have none: their
  // scripts' source is outside V8's heap). The innermost frame's may be
  // where the function last called out (the
  // interpreter keeps its offset in a register in between), so only
  // callers are held to exact lines.
  await t.test('lines', () => assertLines(stacks));
});

test('profile: frames of baseline code (a target run with Sparkplug only) are named at their lines', { skip: skip ?? (goTool() ? false : 'no Go toolchain: go tool pprof cannot read the profile') }, async (t) => {
  // Every function compiled by Sparkplug at once, and never optimized.
  const { tmp, ids } = await startTarget(t, ['--always-sparkplug', '--no-opt', '--no-maglev'], 'otel-thread-ctx-v8-baseline-');
  const pb = path.join(tmp, 'profile.pb.gz');
  const r = await profile(ids.pid, ['--duration', '3', '--off-cpu=all', '--format', 'pprof', '-o', pb], tmp);
  assert.strictEqual(r.code, 0, r.stderr);
  assert.match(r.stderr, /[1-9]\d* frames? of baseline code/, r.stderr);
  assert.doesNotMatch(r.stderr, /baseline frames? without a line/, r.stderr);
  // Baseline code records where each bytecode's instructions end; the
  // reader walks the bytecodes to the one an instruction belongs to.
  await t.test('lines', () => assertLines(pprofStacks(goTool(), pb)));
});
