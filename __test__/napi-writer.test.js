'use strict';
// Where the runtime forbids external ArrayBuffers, the package still loads
// and publishes, through napi calls. The failure is simulated with
// OTEL_THREAD_CTX_SIMULATE_NO_EXTERNAL_BUFFERS; the records are read from
// outside the child.
const test = require('node:test');
const assert = require('node:assert');
const { readFullRecord, spawnNode, exited } = require('./helpers');

const CHILD = `
  const fs = require('node:fs');
  const { context, trace, diag, ROOT_CONTEXT } = require('@opentelemetry/api');
  const warnings = [];
  diag.setLogger({ warn: (m) => warnings.push(m), error() {}, info() {}, debug() {}, verbose() {} });
  const { ProfilingContextManager, setSpanContext, clearSpanContext, threadInfo } = require('.');
  // The span's own attributes only (the identity attributes published by
  // default are tested in local-root.test.js).
  const OWN_ATTRIBUTES_ONLY = { localRootAttributes: [], spanName: false, localRootSpanId: false };
  const manager = new ProfilingContextManager({ attributes: ['http.route'], ...OWN_ATTRIBUTES_ONLY });
  context.setGlobalContextManager(manager.enable());
  const out = (o) => console.log(JSON.stringify(o, (_k, v) => (typeof v === 'bigint' ? String(v) : v)));
  // Each step publishes, tells the parent, and blocks until it has read the record.
  // Frame mode is tried (and its failure reported) unless record mode was chosen.
  const frameCapable = require('./js/publish/frame').usesAsyncContextFrame() && process.env.OTEL_THREAD_CTX_MODE !== 'record';
  const step = (name) => { out({ step: name, address: threadInfo().recordAddress, warnings, frameCapable }); fs.readSync(0, Buffer.alloc(1)); };
  const span = {
    spanContext: () => ({ traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: 1 }),
    attributes: { 'http.route': '/users/:id' },
  };
  context.with(trace.setSpan(ROOT_CONTEXT, span), () => {
    step('in span');
    context.with(ROOT_CONTEXT, () => step('in root'));
    step('back in span');
  });
  step('outside');
  // The record's entry is what the next with() saves and restores.
  context.with(ROOT_CONTEXT, () => {});
  step('outside, after a with() at the root');
  setSpanContext(1n, 2n, 3n, 1);
  step('direct');
  clearSpanContext();
  step('cleared');
  process.exit(0);
`;

test('without external buffers: loads, publishes through napi calls, warns once', async () => {
  const { child, lines, next } = await spawnNode(CHILD, { env: { OTEL_THREAD_CTX_SIMULATE_NO_EXTERNAL_BUFFERS: '1' } });
  const seen = [];
  let line = lines[0];
  for (;;) {
    const r = readFullRecord(child.pid, line.address);
    seen.push([line.step, r.valid, r.valid === 1 ? `${r.traceId}/${r.spanId}/${r.traceFlags}` : null, r.valid === 1 ? r.attrs.map((a) => a.value.toString()) : null]);
    child.stdin.write('x');
    if (line.step === 'cleared') break;
    line = await next('the next step');
  }
  const span = '0af7651916cd43dd8448eb211c80319c/b7ad6b7169203331/1';
  assert.deepStrictEqual(seen, [
    ['in span', 1, span, ['/users/:id']],
    ['in root', 0, null, null],
    ['back in span', 1, span, ['/users/:id']],
    ['outside', 0, null, null],
    ['outside, after a with() at the root', 0, null, null],
    ['direct', 1, '00000000000000010000000000000002/0000000000000003/1', []],
    ['cleared', 0, null, null],
  ]);
  // One warning for the napi writer; where AsyncLocalStorage runs on
  // AsyncContextFrame, one more saying why frame mode (whose records are
  // external buffers too) is not used.
  const napi = line.warnings.filter((w) => /napi calls/.test(w));
  const frame = line.warnings.filter((w) => /frame mode is unavailable/.test(w));
  assert.strictEqual(napi.length, 1, JSON.stringify(line.warnings));
  assert.strictEqual(frame.length, line.frameCapable ? 1 : 0, JSON.stringify(line.warnings));
  assert.strictEqual(napi.length + frame.length, line.warnings.length, JSON.stringify(line.warnings));
  assert.strictEqual(await exited(child), 0);
});
