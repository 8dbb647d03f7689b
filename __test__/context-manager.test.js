'use strict';
// ProfilingContextManager keeps the record equal to the active span at the
// start of every callback, with two or more contexts interleaving. Every
// check reads the record through /proc/self/mem, as an outside reader would.
const test = require('node:test');
const assert = require('node:assert');
const { EventEmitter, once } = require('node:events');
const crypto = require('node:crypto');
const fs = require('node:fs');
const fsp = require('node:fs/promises');
const http = require('node:http');
const net = require('node:net');
const timersPromises = require('node:timers/promises');
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { ProfilingContextManager, threadInfo } = require('..');
const { readOwnRecord, spanContextFor } = require('./helpers');

const manager = new ProfilingContextManager();
context.setGlobalContextManager(manager.enable());

/** Asserts that the record publishes `expected` (a span context), or nothing. */
function assertPublished(expected, where) {
  const r = readOwnRecord();
  if (expected === null) {
    assert.strictEqual(r.valid, 0, `${where}: expected no span, got ${r.traceId}/${r.spanId}`);
    return;
  }
  assert.strictEqual(r.valid, 1, `${where}: record invalid, expected ${expected.spanId}`);
  assert.strictEqual(r.traceId, expected.traceId, `${where}: trace id`);
  assert.strictEqual(r.spanId, expected.spanId, `${where}: span id`);
  assert.strictEqual(r.traceFlags, expected.traceFlags, `${where}: trace flags`);
}

/**
 * Runs `body(check)` in `n` concurrent contexts (plus one without a span),
 * where `check(label)` asserts that the calling callback's span is published.
 * Returns the number of checks made, so tests can prove they checked.
 */
async function interleaved(n, body) {
  let checks = 0;
  const runs = [];
  for (let i = 0; i < n; i++) {
    const { spanContext, ctx } = spanContextFor(`ctx${i}`);
    runs.push(context.with(ctx, () => body((where) => (checks++, assertPublished(spanContext, where)))));
  }
  runs.push(context.with(ROOT_CONTEXT, () => body((where) => (checks++, assertPublished(null, where)))));
  await Promise.all(runs);
  return checks;
}

test('with(): published on entry, restored on exit, nested, and on exit by throw', () => {
  const a = spanContextFor('a');
  const b = spanContextFor('b');
  const c = spanContextFor('c');
  assertPublished(null, 'before');
  context.with(a.ctx, () => {
    assertPublished(a.spanContext, 'in a');
    context.with(b.ctx, () => {
      assertPublished(b.spanContext, 'in b');
      assert.throws(() =>
        context.with(c.ctx, () => {
          assertPublished(c.spanContext, 'in c');
          throw new Error('boom');
        }),
      );
      assertPublished(b.spanContext, 'b after c threw');
      context.with(ROOT_CONTEXT, () => assertPublished(null, 'root inside b'));
      assertPublished(b.spanContext, 'b after root');
    });
    assertPublished(a.spanContext, 'back in a');
  });
  assertPublished(null, 'after');
});

test('with(): deep nesting', () => {
  const frames = Array.from({ length: 50 }, (_, i) => spanContextFor(`deep${i}`));
  const descend = (i) => {
    if (i === frames.length) return;
    context.with(frames[i].ctx, () => {
      assertPublished(frames[i].spanContext, `depth ${i}`);
      descend(i + 1);
      assertPublished(frames[i].spanContext, `depth ${i} after return`);
    });
  };
  descend(0);
  assertPublished(null, 'after');
});

test('with(): the outer span comes back after more spans than the writer keeps at hand', () => {
  const outer = spanContextFor('long-lived');
  const many = Array.from({ length: 600 }, (_, i) => spanContextFor(`short-lived ${i}`));
  context.with(outer.ctx, () => {
    for (const [i, inner] of many.entries()) {
      context.with(inner.ctx, () => assertPublished(inner.spanContext, `inner ${i}`));
      assertPublished(outer.spanContext, `outer after inner ${i}`);
    }
    for (const [i, inner] of many.entries()) {
      context.with(inner.ctx, () => assertPublished(inner.spanContext, `inner ${i}, published before`));
    }
    assertPublished(outer.spanContext, 'outer at the end');
  });
  assertPublished(null, 'after');
});

test('with(): passes thisArg and arguments and returns the result', () => {
  const a = spanContextFor('args');
  const self = { k: 2 };
  const result = context.with(a.ctx, function (x, y) { return this.k * x + y; }, self, 3, 4);
  assert.strictEqual(result, 10);
});

test('a span context that is not valid publishes nothing', () => {
  const invalid = trace.setSpanContext(ROOT_CONTEXT, { traceId: '0'.repeat(32), spanId: '0'.repeat(16), traceFlags: 1 });
  const a = spanContextFor('outer');
  context.with(a.ctx, () => {
    context.with(invalid, () => assertPublished(null, 'invalid span'));
    assertPublished(a.spanContext, 'outer again');
  });
});

test('ids: every byte value in place, either case; a non-hex character or an all-zero id publishes nothing', () => {
  const withIds = (traceId, spanId) => trace.setSpanContext(ROOT_CONTEXT, { traceId, spanId, traceFlags: 1 });
  // Random ids, as SDKs make them, plus every byte value at every position.
  const ids = Array.from({ length: 64 }, () => [crypto.randomBytes(16).toString('hex'), crypto.randomBytes(8).toString('hex')]);
  for (let b = 0; b < 256; b++) {
    const traceId = Buffer.alloc(16, b);
    traceId[b % 16] ^= 0x5a;
    const spanId = Buffer.alloc(8, 255 - b);
    spanId[b % 8] = 1;
    ids.push([traceId.toString('hex'), spanId.toString('hex')]);
  }
  for (const [traceId, spanId] of ids) {
    context.with(withIds(traceId, spanId), () => assertPublished({ traceId, spanId, traceFlags: 1 }, `ids ${traceId}/${spanId}`));
  }
  // Spans of one trace in a row, another trace, the first again, and an equal copy of its string.
  const [first, second] = [crypto.randomBytes(16).toString('hex'), crypto.randomBytes(16).toString('hex')];
  for (const traceId of [first, first, first, second, first, Buffer.from(first, 'hex').toString('hex'), second]) {
    const spanId = crypto.randomBytes(8).toString('hex');
    context.with(withIds(traceId, spanId), () => assertPublished({ traceId, spanId, traceFlags: 1 }, `trace ${traceId}, span ${spanId}`));
  }
  const upper = ['0123456789ABCDEFabcdef0123456789', 'FEDCBA9876543210'];
  context.with(withIds(...upper), () =>
    assertPublished({ traceId: upper[0].toLowerCase(), spanId: upper[1].toLowerCase(), traceFlags: 1 }, 'upper case'),
  );
  const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
  const spanId = '00f067aa0ba902b7';
  // A character whose code's low byte is a hex digit ('\u0130' & 0xff is '0') is still not one.
  for (const bad of ['g', 'G', ' ', '-', '\u0130', '\u0161', '\uff10', '\u00e0']) {
    for (const at of [0, 7, 15, 31]) {
      const t = traceId.slice(0, at) + bad + traceId.slice(at + 1);
      context.with(withIds(t, spanId), () => assertPublished(null, `trace id with ${JSON.stringify(bad)} at ${at}`));
    }
    for (const at of [0, 8, 15]) {
      const s = spanId.slice(0, at) + bad + spanId.slice(at + 1);
      context.with(withIds(traceId, s), () => assertPublished(null, `span id with ${JSON.stringify(bad)} at ${at}`));
    }
  }
  context.with(withIds('0'.repeat(32), spanId), () => assertPublished(null, 'all-zero trace id'));
  context.with(withIds(traceId, '0'.repeat(16)), () => assertPublished(null, 'all-zero span id'));
  const lastByte = `${'0'.repeat(31)}1`;
  context.with(withIds(lastByte, spanId), () => assertPublished({ traceId: lastByte, spanId, traceFlags: 1 }, 'one bit set'));
});

test('trace flags are published (sampled and not sampled)', () => {
  const sampled = spanContextFor('sampled', 1);
  const unsampled = spanContextFor('unsampled', 0);
  context.with(sampled.ctx, () => assertPublished(sampled.spanContext, 'sampled'));
  context.with(unsampled.ctx, () => assertPublished(unsampled.spanContext, 'unsampled'));
});

test('await continuations', async () => {
  const checks = await interleaved(3, async (check) => {
    for (let i = 0; i < 20; i++) {
      await null;
      check(`await ${i}`);
      await Promise.resolve(i);
      check(`await resolved ${i}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 1));
    check('await timer promise');
  });
  assert.strictEqual(checks, 4 * 41);
});

test('.then callbacks', async () => {
  const checks = await interleaved(3, (check) => {
    let p = Promise.resolve();
    for (let i = 0; i < 10; i++) p = p.then(() => check(`then ${i}`));
    return p.then(() => Promise.reject(new Error('x'))).catch(() => check('catch')).finally(() => check('finally'));
  });
  assert.strictEqual(checks, 4 * 12);
});

test('setTimeout, setInterval and setImmediate callbacks', async () => {
  const checks = await interleaved(3, async (check) => {
    await new Promise((resolve) => setTimeout(() => (check('timeout'), resolve()), 2));
    await new Promise((resolve) => setTimeout(() => (check('timeout 0'), resolve()), 0));
    await new Promise((resolve) => setImmediate(() => (check('immediate'), resolve())));
    await new Promise((resolve) => {
      let n = 0;
      const t = setInterval(() => {
        check(`interval ${n}`);
        if (++n === 3) (clearInterval(t), resolve());
      }, 1);
    });
    await timersPromises.setTimeout(1);
    check('timers/promises');
  });
  assert.strictEqual(checks, 4 * 7);
});

test('process.nextTick and queueMicrotask callbacks', async () => {
  const checks = await interleaved(3, async (check) => {
    await new Promise((resolve) => process.nextTick(() => (check('nextTick'), resolve())));
    await new Promise((resolve) => queueMicrotask(() => (check('queueMicrotask'), resolve())));
    // Scheduled from a timer callback, so the queues hold several contexts.
    await new Promise((resolve) => setTimeout(() => process.nextTick(() => (check('tick from timer'), resolve())), 1));
  });
  assert.strictEqual(checks, 4 * 3);
});

test('fs callbacks and fs.promises continuations', async () => {
  const checks = await interleaved(3, async (check) => {
    await new Promise((resolve, reject) =>
      fs.stat(__filename, (err) => (err ? reject(err) : (check('fs.stat'), resolve()))),
    );
    await new Promise((resolve, reject) =>
      fs.readFile(__filename, (err) => (err ? reject(err) : (check('fs.readFile'), resolve()))),
    );
    await fsp.readFile(__filename);
    check('fs.promises.readFile');
  });
  assert.strictEqual(checks, 4 * 3);
});

test('net and http callbacks', async (t) => {
  const server = http.createServer((req, res) => {
    // The server was created outside any span: its handlers run in no span.
    assertPublished(null, 'http server handler');
    setTimeout(() => res.end('hello'), 1);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.after(() => server.close());
  const { port } = server.address();

  const checks = await interleaved(3, async (check) => {
    // http client: response, data and end callbacks.
    await new Promise((resolve, reject) => {
      http
        .get({ host: '127.0.0.1', port, agent: false }, (res) => {
          check('http response');
          res.on('data', () => check('http data'));
          res.on('end', () => (check('http end'), resolve()));
        })
        .on('error', reject);
    });
    // raw net socket: connect and data callbacks.
    await new Promise((resolve, reject) => {
      const socket = net.connect({ host: '127.0.0.1', port }, () => {
        check('net connect');
        socket.write('GET / HTTP/1.0\r\n\r\n');
      });
      socket.on('data', () => check('net data'));
      socket.on('end', () => (check('net end'), resolve()));
      socket.on('error', reject);
    });
  });
  assert.ok(checks >= 4 * 6, `only ${checks} checks`);
});

test('bound functions and bound EventEmitter listeners', async () => {
  const a = spanContextFor('bound-a');
  const b = spanContextFor('bound-b');
  const emitter = new EventEmitter();
  context.bind(a.ctx, emitter);
  let heard = 0;
  emitter.on('ping', () => (heard++, assertPublished(a.spanContext, 'bound listener')));
  emitter.once('ping', () => (heard++, assertPublished(a.spanContext, 'bound once listener')));
  const boundFn = context.bind(b.ctx, () => assertPublished(b.spanContext, 'bound fn'));

  context.with(b.ctx, () => {
    emitter.emit('ping');
    assertPublished(b.spanContext, 'after emit inside b');
  });
  emitter.emit('ping'); // emitted from no span: the listener still runs in a
  assertPublished(null, 'after emit outside');
  context.with(a.ctx, () => {
    boundFn();
    assertPublished(a.spanContext, 'after bound fn inside a');
  });
  // Listeners called from a timer in yet another context.
  await new Promise((resolve) => context.with(b.ctx, () => setTimeout(() => (emitter.emit('ping'), resolve()), 1)));
  assert.strictEqual(heard, 4);
});

test('attach() and dispose()', () => {
  const a = spanContextFor('attach-a');
  const b = spanContextFor('attach-b');
  context.with(a.ctx, () => {
    const token = manager.attach(b.ctx);
    assertPublished(b.spanContext, 'attached b');
    assert.strictEqual(trace.getSpanContext(context.active()).spanId, b.spanContext.spanId);
    token.dispose();
    assertPublished(a.spanContext, 'disposed back to a');
    token.dispose(); // idempotent
    assertPublished(a.spanContext, 'second dispose');
  });
});

test('disable() leaves the record invalid and stops publishing; enable() resumes', async () => {
  const a = spanContextFor('toggle');
  await context.with(a.ctx, async () => {
    assertPublished(a.spanContext, 'enabled');
    manager.disable();
    assertPublished(null, 'just disabled');
    await null;
    assertPublished(null, 'continuation while disabled');
    context.with(spanContextFor('while-disabled').ctx, () => assertPublished(null, 'with() while disabled'));
  });
  context.setGlobalContextManager(manager.enable());
  const b = spanContextFor('re-enabled');
  await context.with(b.ctx, async () => {
    assertPublished(b.spanContext, 're-enabled');
    await null;
    assertPublished(b.spanContext, 'continuation after re-enable');
  });
});

test('the real SDK: startActiveSpan publishes the span, child spans nest', async () => {
  const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
  const provider = new BasicTracerProvider();
  const tracer = provider.getTracer('test');
  await tracer.startActiveSpan('parent', async (parent) => {
    assertPublished(parent.spanContext(), 'parent');
    await tracer.startActiveSpan('child', async (child) => {
      await null;
      assertPublished(child.spanContext(), 'child after await');
      child.end();
    });
    assertPublished(parent.spanContext(), 'parent after child');
    await null;
    assertPublished(parent.spanContext(), 'parent after await');
    parent.end();
  });
  await provider.shutdown();
});

test('no signal handler is installed (never SIGPROF)', () => {
  const caught = () => BigInt('0x' + fs.readFileSync('/proc/self/status', 'utf8').match(/^SigCgt:\s*([0-9a-f]+)/m)[1]);
  const SIGPROF = 27n;
  assert.strictEqual((caught() >> (SIGPROF - 1n)) & 1n, 0n, 'SIGPROF is caught');
  const before = caught();
  const other = new ProfilingContextManager().enable();
  other.disable();
  context.setGlobalContextManager(manager.enable());
  assert.strictEqual(caught(), before, 'enabling a manager changed the caught-signal mask');
});

test('uses the cheapest hooks for this Node.js AsyncLocalStorage', () => {
  const { strategy } = require('../js/continuations');
  const major = Number(process.versions.node.split('.')[0]);
  const frames = !process.execArgv.includes('--no-async-context-frame') && major >= 24;
  assert.strictEqual(strategy, frames ? 'async-context-frame' : 'async-hooks');
});

test('an enabled manager publishes a process context with the schema version', () => {
  const otelCtx = require('./fixtures/otel-ctx-reader');
  const [mapping] = otelCtx.findMappings('self');
  assert.ok(mapping, 'no OTEL_CTX mapping after enable()');
  const reader = new otelCtx.MemoryReader('self');
  try {
    const { attributes } = otelCtx.decodePayload(reader.readConsistent(mapping.start).bytes);
    const info = threadInfo();
    if (info.mode === 'frame') {
      assert.strictEqual(attributes['threadlocal.schema_version'], 'nodejs_v1_dev');
      assert.strictEqual(Number(attributes['threadlocal.js_object_record_offset']), info.frame.jsObjectRecordOffset);
      assert.strictEqual(Number(attributes['threadlocal.tagged_size']), 8);
    } else {
      assert.strictEqual(attributes['threadlocal.schema_version'], 'tlsdesc_v1_dev');
      assert.strictEqual(attributes['threadlocal.js_object_record_offset'], undefined);
    }
    assert.ok(Array.isArray(attributes['threadlocal.attribute_key_map']));
  } finally {
    reader.close();
  }
});

test('re-publishing a span rewrites its bytes whenever something else was written in between', () => {
  const { setSpanContext, clearSpanContext } = require('..');
  const a = spanContextFor('held-a');
  const b = spanContextFor('held-b');
  context.with(a.ctx, () => assertPublished(a.spanContext, 'a'));
  assertPublished(null, 'after a');
  context.with(a.ctx, () => assertPublished(a.spanContext, 'a again (only valid rewritten)'));
  setSpanContext(0x77n, 0x88n, 0x99n, 0); // the direct API overwrites the ids
  clearSpanContext();
  context.with(a.ctx, () => assertPublished(a.spanContext, 'a after a direct write'));
  context.with(b.ctx, () => {
    assertPublished(b.spanContext, 'b');
    context.with(a.ctx, () => assertPublished(a.spanContext, 'a inside b'));
    assertPublished(b.spanContext, 'b after a');
  });
});

test('a manager enabled while the registered one is enabled does not take publishing from it', () => {
  const a = spanContextFor('registered-manager');
  const b = spanContextFor('other-manager');
  const second = new ProfilingContextManager().enable();
  try {
    manager.with(a.ctx, () => assertPublished(a.spanContext, 'with() of the registered manager'));
    second.with(b.ctx, () => assertPublished(null, 'with() of the other manager'));
  } finally {
    second.disable();
  }
  manager.with(a.ctx, () => assertPublished(a.spanContext, 'still publishing once the other is disabled'));
});
