'use strict';
// Records read by another process from /proc/<pid>/mem, as a profiler does:
// threads parked inside spans publish them; idle threads publish nothing.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { readFromOutside, readPointer, spawnNode, exited, scratchDir } = require('./helpers');

const FIXTURE = path.join(__dirname, 'fixtures', 'parked-threads.js');

function threadState(pid, tid) {
  const stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2)[0];
}

async function waitForState(pid, tid, state, ms = 5000) {
  const deadline = Date.now() + ms;
  while (threadState(pid, tid) !== state) {
    if (Date.now() > deadline) throw new Error(`thread ${tid} never reached state ${state}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test('main thread and two workers, each blocked inside its own span, read from outside', async (t) => {
  const { child, lines, next } = await spawnNode(`require(${JSON.stringify(FIXTURE)})`, { count: 1 });
  t.after(() => child.kill('SIGKILL'));
  const [{ phase, threads }] = lines;
  assert.strictEqual(phase, 'parked');
  assert.strictEqual(threads.length, 3);
  assert.strictEqual(new Set(threads.map((th) => th.tid)).size, 3, 'three distinct threads');
  assert.strictEqual(new Set(threads.map((th) => th.spanId)).size, 3, 'three distinct spans');
  for (const th of threads) {
    await waitForState(child.pid, th.tid, 'S'); // really blocked (read / futex wait)
    const r = readFromOutside(child.pid, th);
    assert.deepStrictEqual(
      { valid: r.valid, traceId: r.traceId, spanId: r.spanId, traceFlags: r.traceFlags },
      { valid: 1, traceId: th.traceId, spanId: th.spanId, traceFlags: th.traceFlags },
      `thread ${th.tid}`,
    );
  }

  // Release them: every thread then awaits inside a new span and idles.
  child.stdin.write('\n');
  const idle = await next('the idle line');
  assert.strictEqual(idle.phase, 'idle');
  assert.strictEqual(idle.threads.length, 3);
  // Past the fixture's 100 ms delay every thread has run its continuation
  // inside the span (publishing it) and its loop is blocked.
  await new Promise((res) => setTimeout(res, 500));
  for (const th of idle.threads) {
    await waitForState(child.pid, th.tid, 'S');
    const r = readFromOutside(child.pid, th);
    assert.strictEqual(r.valid, 0, `thread ${th.tid} still publishes ${r.spanId} while idle`);
    if (th.mode === 'frame') {
      // Between callbacks V8's current frame is undefined: nothing to walk.
      assert.strictEqual(r.reason, 'no-frame', `thread ${th.tid}`);
    } else {
      // The idle loop pointed otel_thread_ctx_v1 back at the thread's own
      // record, away from the span's record it pointed at in the span.
      assert.strictEqual(readPointer(child.pid, th.tlsAddress), BigInt(th.recordAddress), `thread ${th.tid}`);
    }
    for (let i = 0; i < 5; i++) assert.strictEqual(readFromOutside(child.pid, th).valid, 0);
  }
});

const blockingCases = {
  'child_process.execSync': `require('node:child_process').execSync('sleep 30')`,
  'fs.readFileSync of a FIFO': `require('node:fs').readFileSync(process.env.FIFO)`,
  'Atomics.wait': `Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 30000)`,
};

for (const [name, blockingCall] of Object.entries(blockingCases)) {
  test(`the span stays published during a blocking ${name}`, async (t) => {
    const dir = scratchDir('otel-thread-ctx-');
    const fifo = path.join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
    const script = `
      const { context, trace } = require('@opentelemetry/api');
      const { ProfilingContextManager, threadInfo } = require('.');
      context.setGlobalContextManager(new ProfilingContextManager().enable());
      const sc = { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: 1 };
      setTimeout(() => context.with(trace.setSpanContext(context.active(), sc), async () => {
        await null;
        const info = threadInfo();
        console.log(JSON.stringify({ tid: info.tid, mode: info.mode, recordAddress: info.recordAddress.toString(), tlsAddress: info.tlsAddress.toString() }));
        ${blockingCall};
      }), 1);`;
    const { child, lines } = await spawnNode(script, { env: { FIFO: fifo } });
    t.after(() => child.kill('SIGKILL'));
    const [th] = lines;
    const { tid } = th;
    await waitForState(child.pid, tid, 'S');
    await new Promise((r) => setTimeout(r, 50)); // long enough for any idle clearing to have happened
    assert.strictEqual(threadState(child.pid, tid), 'S', 'still blocked');
    const r = readFromOutside(child.pid, th);
    assert.strictEqual(r.valid, 1);
    assert.strictEqual(r.traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
    assert.strictEqual(r.spanId, '00f067aa0ba902b7');
    child.kill('SIGKILL');
    await exited(child);
  });
}
