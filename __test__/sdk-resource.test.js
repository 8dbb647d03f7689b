'use strict';
// Zero-config process context: with the manager alone registered on an SDK
// tracer provider, the provider's Resource is published from the first span
// on, read from outside through /proc/<pid>/mem.
const test = require('node:test');
const assert = require('node:assert');
const { findMappings, MemoryReader, decodePayload } = require('./fixtures/otel-ctx-reader');
const { spawnNode, exited } = require('./helpers');

function readResource(pid) {
  const [mapping] = findMappings(pid);
  assert.ok(mapping, 'an OTEL_CTX mapping exists');
  const reader = new MemoryReader(pid);
  try {
    return decodePayload(reader.readConsistent(mapping.start).bytes).resource;
  } finally {
    reader.close();
  }
}

// A provider registered with only the manager, as NodeSDK does it, whose
// Resource has one async attribute settled by a line on stdin. The child
// counts the manager's calls into the zero-config hook.
const CHILD = (setup) => `
  const readline = require('node:readline');
  const { context, trace } = require('@opentelemetry/api');
  const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
  const { resourceFromAttributes } = require('@opentelemetry/resources');
  const sdkResource = require('./js/sdk-resource');
  const { ProfilingContextManager, publishProcessContext, processContextInfo } = require('.');
  let calls = 0;
  const onNewSpan = sdkResource.onNewSpan;
  sdkResource.onNewSpan = (span) => (calls++, onNewSpan(span));
  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  let settle;
  const hostId = new Promise((resolve) => (settle = resolve));
  ${setup}
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'zero-config', 'process.pid': process.pid, 'host.id': hostId }),
  });
  provider.register({ contextManager: new ProfilingContextManager() });
  const tracer = trace.getTracer('test');
  const say = (phase, extra) => console.log(JSON.stringify({ phase, publications: processContextInfo().publications, calls, ...extra }));
  tracer.startActiveSpan('first', async (first) => {
    say('first-span');
    await lines.next();
    const second = tracer.startSpan('second');
    const inSecond = trace.setSpan(context.active(), second);
    for (let i = 0; i < 1000; i++) {
      context.with(inSecond, () => {});
      context.with(trace.setSpan(inSecond, first), () => {});
    }
    settle('host-1234');
    await first.resource.waitForAsyncAttributes();
    await new Promise((resolve) => setImmediate(resolve));
    say('settled');
    await lines.next();
    process.exit(0);
  });
`;

test('only the manager: the Resource is published at the first span, completed once async attributes settle; the hook runs for new spans until it saw one', async () => {
  const { child, lines, next } = await spawnNode(CHILD(''));
  try {
    const [first] = lines;
    assert.strictEqual(first.phase, 'first-span');
    assert.strictEqual(first.calls, 1, 'the first span reached the hook once');
    const early = readResource(child.pid);
    assert.strictEqual(early['service.name'], 'zero-config');
    assert.strictEqual(early['process.pid'], BigInt(child.pid));
    assert.strictEqual(early['host.id'], undefined, 'not settled yet');

    child.stdin.write('\n');
    const settled = await next('settled');
    assert.strictEqual(settled.phase, 'settled');
    // 4,000 context switches over two spans: the hook ran for the first
    // span only, and no more once it had seen a Resource.
    assert.strictEqual(settled.calls, 1);
    const full = readResource(child.pid);
    assert.strictEqual(full['host.id'], 'host-1234');
    assert.strictEqual(full['service.name'], 'zero-config');
    child.stdin.write('\n');
  } finally {
    await exited(child);
  }
});

test('a Resource the application published itself is left as it is', async () => {
  const { child, lines } = await spawnNode(CHILD("publishProcessContext({ resource: { 'service.name': 'explicit' } });"));
  try {
    assert.strictEqual(lines[0].phase, 'first-span');
    assert.deepStrictEqual(readResource(child.pid), { 'service.name': 'explicit' });
    child.stdin.write('\n\n');
  } finally {
    await exited(child);
  }
});

test('a Resource another thread published is left as it is: the process context is process-wide', async () => {
  // A worker publishes before the main thread's first span; the main
  // thread's manager must not replace it with the provider's Resource.
  const setup = `
    const { Worker } = require('node:worker_threads');
    const published = new Int32Array(new SharedArrayBuffer(4));
    new Worker(
      "const { workerData } = require('node:worker_threads');" +
        "require(process.cwd()).publishProcessContext({ resource: { 'service.name': 'from-worker' } });" +
        'Atomics.store(workerData, 0, 1); Atomics.notify(workerData, 0);',
      { eval: true, workerData: published },
    ).unref();
    if (Atomics.wait(published, 0, 0, 20000) === 'timed-out') throw new Error('the worker did not publish');
  `;
  const { child, lines } = await spawnNode(CHILD(setup));
  try {
    assert.strictEqual(lines[0].phase, 'first-span');
    assert.deepStrictEqual(readResource(child.pid), { 'service.name': 'from-worker' });
    child.stdin.write('\n\n');
  } finally {
    await exited(child);
  }
});
