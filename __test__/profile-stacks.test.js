'use strict';
// Whole user stacks from `otel-thread-ctx profile`: through glibc and other
// code built without frame pointers, so a wait or a libc-heavy call shows
// the JavaScript function above it, under that function's span; and a C
// target built without frame pointers whose stacks come out whole. Needs
// root (BPF) and a reader built with its BPF program; skips with the reason
// otherwise.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines, exited, profileUnavailable, scratchDir, runProfile } = require('./helpers');

const READER = require('../js/native').readerPath();
const FIXTURES = path.join(__dirname, 'fixtures');

const skip = profileUnavailable(READER);

const profile = (pid, args, cwd) => runProfile(READER, pid, args, cwd);

/** Folded lines as { thread, span, cpu ('[on-cpu]'/'[off-cpu]'), frames (root first), value }. */
function folded(file) {
  return fs.readFileSync(file, 'utf8').trim().split('\n').map((line) => {
    const cut = line.lastIndexOf(' ');
    const [thread, span, cpu, ...frames] = line.slice(0, cut).split(';');
    return { thread, span, cpu, frames, value: Number(line.slice(cut + 1)) };
  });
}

/** The summary's truncated shares, in percent. */
function truncatedShares(stderr) {
  const m = stderr.match(/truncated user stacks: ([\d.]+) % of on-CPU samples, ([\d.]+) % of off-CPU time \(frame pointers alone: ([\d.]+) %, ([\d.]+) %\)/);
  assert.ok(m, `no truncated shares in:\n${stderr}`);
  return { onCpu: Number(m[1]), offCpu: Number(m[2]), onCpuFramePointers: Number(m[3]), offCpuFramePointers: Number(m[4]) };
}

const sum = (lines) => lines.reduce((a, l) => a + l.value, 0);
const calls = (name) => (l) => l.frames.some((f) => new RegExp(`^JS:[*~^]?${name} `).test(f));
// The main thread's stack is whole when it starts at the executable's entry.
const whole = (l) => l.frames[0] === '_start';
const shown = (lines) => lines.slice(0, 3).map((l) => l.frames.join(';')).join('\n');

test('profile: whole user stacks', { skip: skip ?? false }, async (t) => {
  const tmp = scratchDir('otel-thread-ctx-stacks-');
  t.after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  await t.test('Node: time blocked in glibc and CPU spent in it carry the JavaScript function, under its span', async (t) => {
    const service = spawn(process.execPath, ['--perf-basic-prof', '--interpreted-frames-native-stack', path.join(FIXTURES, 'blocking-service.js'), tmp], { stdio: ['ignore', 'pipe', 'inherit'] });
    const ids = await jsonLines(service.stdout).next('the service line');
    t.after(async () => {
      service.kill('SIGKILL');
      await exited(service);
      fs.rmSync(`/tmp/perf-${ids.pid}.map`, { force: true });
    });
    const out = path.join(tmp, 'node.folded');
    // Eight seconds: about 50 waits per function, so the share is not left
    // to the few waits of a short run.
    const r = await profile(ids.pid, ['--duration', '8', '--off-cpu=all', '--format', 'folded', '--group-by', 'thread', '-o', out], tmp);
    assert.strictEqual(r.code, 0, r.stderr);
    const lines = folded(out);
    const inSpan = (name) => (l) => l.span.endsWith(` (${ids.spans[name].spanId})`) && l.thread.endsWith(`(${ids.tid})`);
    for (const name of ['waitOnAtomics', 'readFromFifo', 'runChildProcess']) {
      const blocked = lines.filter((l) => l.cpu === '[off-cpu]' && inSpan(name)(l));
      const total = sum(blocked);
      assert.ok(total > 100_000, `${name}: ${total} µs blocked in its span`);
      const withCaller = sum(blocked.filter(calls(name)));
      assert.ok(withCaller >= 0.95 * total, `${name}: ${withCaller} of ${total} µs blocked have it in the stack:\n${shown(blocked.filter((l) => !calls(name)(l)))}`);
      const wholeStacks = sum(blocked.filter(whole));
      assert.ok(wholeStacks >= 0.95 * total, `${name}: ${wholeStacks} of ${total} µs blocked have a whole stack:\n${shown(blocked.filter((l) => !whole(l)))}`);
      // And the function's own waits are its span's, not another's.
      const anywhere = sum(lines.filter((l) => l.cpu === '[off-cpu]' && calls(name)(l)));
      assert.ok(withCaller >= 0.95 * anywhere, `${name}: ${withCaller} of ${anywhere} µs under its span`);
    }
    for (const name of ['compareBuffers', 'copyBuffers']) {
      const running = lines.filter((l) => l.cpu === '[on-cpu]' && inSpan(name)(l));
      const total = sum(running);
      assert.ok(total >= 5 * 10_101, `${name}: ${total} µs on CPU in its span`);
      const withCaller = sum(running.filter(calls(name)));
      assert.ok(withCaller >= 0.9 * total, `${name}: ${withCaller} of ${total} µs on CPU have it in the stack:\n${shown(running.filter((l) => !calls(name)(l)))}`);
      const wholeStacks = sum(running.filter(whole));
      assert.ok(wholeStacks >= 0.9 * total, `${name}: ${wholeStacks} of ${total} µs on CPU have a whole stack:\n${shown(running.filter((l) => !whole(l)))}`);
    }
    const shares = truncatedShares(r.stderr);
    assert.ok(shares.offCpu < 5, `off-CPU truncated: ${JSON.stringify(shares)}`);
    assert.ok(shares.onCpu < 5, `on-CPU truncated: ${JSON.stringify(shares)}`);
  });

  await t.test('C without frame pointers: every stack reaches its thread entry', async (t) => {
    const gcc = spawnSync('gcc', ['--version']);
    if (gcc.status !== 0) return t.skip('no gcc to build the native target');
    const exe = path.join(tmp, 'no-frame-pointers');
    const built = spawnSync('gcc', ['-O2', '-fomit-frame-pointer', '-pthread', '-o', exe, path.join(FIXTURES, 'no-frame-pointers.c')], { encoding: 'utf8' });
    assert.strictEqual(built.status, 0, built.stderr);
    const target = spawn(exe, [], { stdio: ['ignore', 'pipe', 'inherit'] });
    t.after(async () => {
      target.kill('SIGKILL');
      await exited(target);
    });
    const pid = await new Promise((resolve) => target.stdout.once('data', (d) => resolve(Number(String(d).trim()))));
    const out = path.join(tmp, 'native.folded');
    const r = await profile(pid, ['--duration', '3', '--off-cpu=all', '--format', 'folded', '--group-by', 'thread', '-o', out], tmp);
    assert.strictEqual(r.code, 0, r.stderr);
    const lines = folded(out);
    const nested = (names) => (l) => {
      const at = l.frames.indexOf(names[0]);
      return at >= 0 && names.every((n, i) => l.frames[at + i] === n);
    };
    const spin = lines.filter((l) => l.cpu === '[on-cpu]' && l.frames.includes('spin_inner'));
    const sleep = lines.filter((l) => l.cpu === '[off-cpu]' && l.frames.includes('sleep_inner'));
    assert.ok(sum(spin) > 0 && sum(sleep) > 0, lines.slice(0, 5).map((l) => l.frames.join(';')).join('\n'));
    for (const l of spin) assert.ok(nested(['work', 'spin_outer', 'spin_middle', 'spin_inner'])(l), l.frames.join(';'));
    for (const l of sleep) assert.ok(nested(['work', 'sleep_outer', 'sleep_middle', 'sleep_inner'])(l), l.frames.join(';'));
    // Both threads: the main one from _start through main, the other from
    // its thread entry.
    assert.ok(spin.some((l) => l.frames[0] === '_start' && l.frames.includes('main')));
    assert.ok(spin.some((l) => !l.frames.includes('main')));
    const shares = truncatedShares(r.stderr);
    assert.ok(shares.onCpu < 5 && shares.offCpu < 5, JSON.stringify(shares));
    // What the frame-pointer walk alone gives: stacks cut at the first frame.
    assert.ok(shares.onCpuFramePointers > 50, JSON.stringify(shares));
  });
});
