'use strict';
// The OTEP 4719 process context, checked from outside the publishing
// process the way a profiler reads it: /proc/<pid>/maps to find the
// OTEL_CTX mapping, /proc/<pid>/mem to read the header and the payload, and
// protobufjs with an independent .proto description to decode it.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { findMappings, vmFlags, MemoryReader, decodePayload } = require('./fixtures/otel-ctx-reader');
const { jsonLines } = require('./helpers');

const ROOT = path.resolve(__dirname, '..');
const PAGE_SIZE = 4096;

/**
 * Spawns `node <args>` with the Node running the tests. `next()` resolves
 * with the next JSON line the child prints.
 */
function spawnNode(args) {
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] });
  const { next } = jsonLines(child.stdout);
  // Resolves when the child exited; closes its stdin (children exit on
  // end of input) and kills it if it is still there after 5 s.
  const exited = () => {
    child.stdin.end();
    if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
    return new Promise((resolve) => {
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      child.once('exit', (code) => {
        clearTimeout(timer);
        resolve(code);
      });
    });
  };
  return { child, next, exited };
}

// Defined for every child script: `out(value)` prints one JSON line (bigints
// as strings); `outcome(f)` is the name of the error `f()` throws, or 'no
// error'; `exitAtEndOfInput()` keeps the child alive until its stdin ends.
const SCRIPT_PRELUDE = `
  const out = (o) => console.log(JSON.stringify(o, (_k, v) => (typeof v === 'bigint' ? v.toString() : v)));
  const outcome = (f) => { try { f(); return 'no error'; } catch (e) { return e.name; } };
  const exitAtEndOfInput = () => {
    process.stdin.resume();
    process.stdin.on('end', () => process.exit(0));
  };
`;

/** Runs `script` (a function body, after SCRIPT_PRELUDE) in a child that prints JSON lines. */
function spawnScript(script) {
  return spawnNode(['-e', SCRIPT_PRELUDE + script]);
}

/** CLOCK_BOOTTIME in ns, as far as /proc/uptime tells it (10 ms resolution). */
function uptimeNs() {
  const seconds = fs.readFileSync('/proc/uptime', 'utf8').split(' ')[0];
  return BigInt(Math.round(Number(seconds) * 1000)) * 1000000n;
}

/** Reads a whole consistent publication of `pid`'s context from outside. */
function readContext(pid) {
  const mappings = findMappings(pid);
  assert.strictEqual(mappings.length, 1, `exactly one OTEL_CTX mapping: ${JSON.stringify(mappings, String)}`);
  const [mapping] = mappings;
  const reader = new MemoryReader(pid);
  try {
    const { header, bytes } = reader.readConsistent(mapping.start);
    return { mapping, header, bytes, context: decodePayload(bytes) };
  } finally {
    reader.close();
  }
}

/** Every AnyValue kind in a decoded attribute tree (for "no bool/double" checks). */
function kinds(value, found = new Set()) {
  if (typeof value === 'string') found.add('string');
  else if (typeof value === 'bigint') found.add('int');
  else if (Array.isArray(value)) value.forEach((v) => kinds(v, found.add('array')));
  else if ('bool' in value) found.add('bool');
  else if ('double' in value) found.add('double');
  else if ('bytes' in value) found.add('bytes');
  else if ('empty' in value) found.add('empty');
  else Object.values(value).forEach((v) => kinds(v, found.add('kvlist')));
  return found;
}

/** What the publisher promises to make of an SDK attribute value. */
function expectedValue(value) {
  if (typeof value === 'number') return Number.isInteger(value) ? BigInt(value) : String(value);
  if (typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return value.map(expectedValue);
  return value;
}

const SDK_CHILD = `
  const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
  const { resourceFromAttributes } = require('@opentelemetry/resources');
  const { ProcessContextSpanProcessor, processContextInfo } = require('.');
  const before = processContextInfo();
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({
      'service.name': 'checkout',
      'service.version': '1.4.2',
      'service.instance.id': '2b0d7a5e-5f0c-4f7e-9d36-0b1f2c3d4e5f',
      'deployment.environment.name': 'test',
      'process.pid': process.pid,
      'process.runtime.name': 'nodejs',
      'feature.enabled': true,
      'sample.ratio': 0.25,
      'host.tags': ['blue', 'canary'],
      'build.numbers': [7, 8],
    }),
    spanProcessors: [new ProcessContextSpanProcessor()],
  });
  const tracer = provider.getTracer('process-context-test');
  const span = tracer.startSpan('first');
  span.end();
  tracer.startSpan('second').end();
  tracer.startSpan('third').end();
  const info = processContextInfo();
  out({ pid: process.pid, before, info, resource: span.resource.attributes });
  exitAtEndOfInput();
`;

test('a NodeSDK-style provider with ProcessContextSpanProcessor publishes its Resource, readable from outside', async () => {
  const { next, exited } = spawnScript(SDK_CHILD);
  try {
    const report = await next();
    assert.strictEqual(report.before, null, 'nothing is published before the first span');
    assert.strictEqual(report.info.publications, 1, 'three spans, one Resource: published once');

    const { mapping, header, context } = readContext(report.pid);
    // The mapping: named as readers look for it, one page, rw-p (or rw-s), not inherited by fork.
    assert.match(mapping.name, /^(\/memfd:OTEL_CTX( \(deleted\))?|\[anon:OTEL_CTX\])$/);
    assert.ok(['rw-p', 'rw-s'].includes(mapping.perms), mapping.perms);
    assert.strictEqual(mapping.end - mapping.start, BigInt(PAGE_SIZE));
    assert.strictEqual(mapping.start, BigInt(report.info.mappingAddress));
    assert.strictEqual(report.info.backing, mapping.name.startsWith('/memfd:') ? 'memfd' : 'anonymous');
    assert.ok(vmFlags(report.pid, mapping.start).includes('dc'), 'MADV_DONTFORK (VmFlags "dc")');

    // The header.
    assert.strictEqual(header.signature, 'OTEL_CTX');
    assert.strictEqual(header.version, 2);
    assert.strictEqual(header.payloadSize, report.info.payloadSize);
    assert.strictEqual(header.payload, BigInt(report.info.payloadAddress));
    assert.strictEqual(header.publishedAt, BigInt(report.info.publishedAtNs));
    const drift = header.publishedAt - uptimeNs();
    assert.ok(drift > -60_000_000_000n && drift < 1_000_000_000n, `CLOCK_BOOTTIME-like timestamp, drift ${drift} ns`);

    // The payload: the SDK Resource's attributes, bool/double as strings.
    const expected = Object.fromEntries(Object.entries(report.resource).map(([k, v]) => [k, expectedValue(v)]));
    assert.deepStrictEqual(context.resource, expected);
    assert.strictEqual(context.resource['process.pid'], BigInt(report.pid));
    assert.strictEqual(context.resource['feature.enabled'], 'true');
    assert.strictEqual(context.resource['sample.ratio'], '0.25');
    assert.deepStrictEqual(context.resource['build.numbers'], [7n, 8n]);
    const published = kinds(context.resource);
    assert.ok(!published.has('bool') && !published.has('double') && !published.has('empty'), [...published].join());
    assert.deepStrictEqual(context.attributeOrder, ['threadlocal.schema_version', 'threadlocal.attribute_key_map']);
    assert.strictEqual(context.attributes['threadlocal.schema_version'], 'tlsdesc_v1_dev');
    assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], []);
  } finally {
    await exited();
  }
});

test('the span processor waits for async resource attributes and republishes only on a real change', async () => {
  const { child, next, exited } = spawnScript(`
    const { diag, DiagLogLevel } = require('@opentelemetry/api');
    const { resourceFromAttributes } = require('@opentelemetry/resources');
    const { ProcessContextSpanProcessor, processContextInfo } = require('.');
    const errors = [];
    diag.setLogger({ error: (m) => errors.push(m), warn: (m) => errors.push(m), info() {}, debug() {}, verbose() {} }, DiagLogLevel.WARN);
    const processor = new ProcessContextSpanProcessor();
    const asyncResource = resourceFromAttributes({
      'service.name': 'async',
      'host.id': new Promise((resolve) => setTimeout(() => resolve('host-from-detector'), 50)),
    });
    processor.onStart({ resource: asyncResource });
    const pendingInfo = processContextInfo();
    setTimeout(() => {
      const settled = processContextInfo();
      // Same attributes in a new Resource object: no republication.
      processor.onStart({ resource: resourceFromAttributes({ 'service.name': 'async', 'host.id': 'host-from-detector' }) });
      const same = processContextInfo();
      out({ pid: process.pid, pendingInfo, settled, same });
      process.stdin.once('data', () => {
        // A changed Resource: republished, and odd values are dropped instead of failing.
        processor.onStart({ resource: { attributes: { 'service.name': 'changed', odd: () => 1, bytes: new Uint8Array(2), keep: 1 } } });
        out({ changed: processContextInfo(), errors });
        exitAtEndOfInput();
      });
    }, 200);
  `);
  try {
    const first = await next();
    assert.strictEqual(first.pendingInfo, null, 'nothing published while attributes are pending');
    assert.strictEqual(first.settled.publications, 1);
    assert.strictEqual(first.same.publications, 1, 'equal attributes are not republished');
    let { context } = readContext(first.pid);
    assert.deepStrictEqual(context.resource, { 'service.name': 'async', 'host.id': 'host-from-detector' });

    child.stdin.write('next\n');
    const second = await next();
    assert.strictEqual(second.changed.publications, 2);
    assert.deepStrictEqual(second.errors, []);
    ({ context } = readContext(first.pid));
    assert.deepStrictEqual(context.resource, { 'service.name': 'changed', keep: 1n });
  } finally {
    await exited();
  }
});

test('publishProcessContext by hand: value rules, options kept across calls, errors change nothing', async () => {
  const { child, next, exited } = spawnScript(`
    const { publishProcessContext, registerAttributeKeys, processContextInfo } = require('.');
    publishProcessContext({
      resource: {
        'service.name': 'manual', int: 42, negative: -7, big: 9007199254740993n, huge: 2n ** 64n,
        fraction: 1.5, nan: NaN, infinite: -Infinity, large: 1e21, yes: true, none: null, missing: undefined,
        list: ['a', null, 'c'], ints: [1, undefined, 3], nested: { inner: { deep: 'x' }, flag: false },
      },
      attributes: { 'custom.attribute': 'on' },
      schemaVersion: 'tls_v1',
    });
    registerAttributeKeys(['http.route']);
    const errors = [];
    const cyclic = {}; cyclic.self = cyclic;
    for (const bad of [
      'nope', [], { resource: 'x' }, { resource: [] }, { resource: { f() {} } }, { resource: { s: Symbol('s') } },
      { resource: { b: Buffer.from('x') } }, { resource: { c: cyclic } }, { resource: { '': 'empty key' } },
      { attributes: { 'threadlocal.schema_version': 'x' } }, { schemaVersion: 1 }, { schemaVersion: '' },
      { resource: { ok: 'fine' }, schemaVersion: 2 }, { resource: { blob: 'x'.repeat(1 << 20) } },
    ]) {
      try { publishProcessContext(bad); errors.push('no error'); } catch (e) { errors.push(e.name); }
    }
    for (const bad of ['k', [1], [''], Array.from({ length: 256 }, (_, i) => 'key' + i)]) {
      try { registerAttributeKeys(bad); errors.push('no error'); } catch (e) { errors.push(e.name); }
    }
    out({ pid: process.pid, errors, info: processContextInfo() });
    process.stdin.once('data', () => {
      publishProcessContext({ resource: { 'service.name': 'second' } });
      out({ info: processContextInfo() });
      exitAtEndOfInput();
    });
  `);
  try {
    const first = await next();
    assert.deepStrictEqual(first.errors, [
      'TypeError', 'TypeError', 'TypeError', 'TypeError', 'TypeError', 'TypeError',
      'TypeError', 'RangeError', 'RangeError',
      'RangeError', 'TypeError', 'RangeError',
      'TypeError', 'RangeError',
      'TypeError', 'TypeError', 'RangeError', 'RangeError',
    ]);
    assert.strictEqual(first.info.publications, 2, 'failed calls published nothing');
    assert.strictEqual(first.info.keyCount, 1, 'a refused key batch registers none of its keys');
    let { header, context } = readContext(first.pid);
    assert.strictEqual(header.publishedAt, BigInt(first.info.publishedAtNs), 'the last good publication is current');
    assert.deepStrictEqual(context.resource, {
      'service.name': 'manual',
      int: 42n,
      negative: -7n,
      big: 9007199254740993n,
      huge: '18446744073709551616',
      fraction: '1.5',
      nan: 'NaN',
      infinite: '-Infinity',
      large: '1e+21',
      yes: 'true',
      list: ['a', '', 'c'],
      ints: [1n, 0n, 3n],
      nested: { inner: { deep: 'x' }, flag: 'false' },
    });
    assert.deepStrictEqual(context.attributeOrder, [
      'threadlocal.schema_version',
      'threadlocal.attribute_key_map',
      'custom.attribute',
    ]);
    assert.strictEqual(context.attributes['threadlocal.schema_version'], 'tls_v1');
    assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], ['http.route']);

    child.stdin.write('next\n');
    const second = await next();
    ({ header, context } = readContext(first.pid));
    assert.ok(header.publishedAt > BigInt(first.info.publishedAtNs), 'timestamps strictly increase');
    assert.strictEqual(second.info.mappingAddress, first.info.mappingAddress, 'one mapping per process');
    assert.deepStrictEqual(context.resource, { 'service.name': 'second' });
    assert.strictEqual(context.attributes['threadlocal.schema_version'], 'tls_v1', 'omitted options are kept');
    assert.strictEqual(context.attributes['custom.attribute'], 'on');
    assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], ['http.route']);
  } finally {
    await exited();
  }
});

test('registerAttributeKeys: append-only indexes, deduplicated, at most 256 keys', () => {
  const { registerAttributeKeys, processContextInfo } = require('..');
  assert.deepStrictEqual(registerAttributeKeys(['a', 'b', 'a']), [0, 1, 0]);
  const published = processContextInfo().publications;
  assert.deepStrictEqual(registerAttributeKeys(['b']), [1]);
  assert.strictEqual(processContextInfo().publications, published, 'no new key: no republication');
  const rest = Array.from({ length: 254 }, (_, i) => `k${i}`);
  assert.deepStrictEqual(registerAttributeKeys(rest), rest.map((_, i) => i + 2));
  assert.throws(() => registerAttributeKeys(['a', 'one-too-many']), RangeError);
  assert.deepStrictEqual(registerAttributeKeys(['k253', 'a']), [255, 0], 'a full map still resolves known keys');
  const { context } = readContext(process.pid);
  const keyMap = context.attributes['threadlocal.attribute_key_map'];
  assert.strictEqual(keyMap.length, 256);
  assert.deepStrictEqual(keyMap.slice(0, 3), ['a', 'b', 'k0']);
  assert.strictEqual(keyMap[255], 'k253');
});

test('a concurrent reader never accepts a torn payload while three threads republish 1,000 times', { timeout: 30000 }, async (t) => {
  const writer = spawnNode([path.join(__dirname, 'fixtures', 'process-context-writer.js')]);
  let poller;
  try {
    const { pid } = await writer.next();
    poller = spawnNode([path.join(__dirname, 'fixtures', 'process-context-poller.js'), String(pid), '10000', '15000']);
    assert.deepStrictEqual(await poller.next(), { polling: true });
    writer.child.stdin.write('go\n');
    const [done, summary] = await Promise.all([writer.next(), poller.next()]);

    assert.deepStrictEqual(summary.failures, []);
    assert.strictEqual(summary.timedOut, false, `reader saw the final publication in time: ${JSON.stringify(summary)}`);
    assert.ok(summary.polls >= 10000, `${summary.polls} polls`);
    assert.ok(summary.accepted > 0);
    assert.strictEqual(done.info.publications, 1001, 'one first publication and 1,000 republications');
    // The reader saw many distinct publications from every writer thread, not one burst.
    assert.ok(summary.publicationsSeen >= 50, `${summary.publicationsSeen} distinct publications seen`);
    for (const w of ['main', 'w1', 'w2', 'done']) assert.ok(summary.writersSeen.includes(w), `saw ${w}`);

    // The key map: complete (240 keys, no hole), in insertion order (the
    // indexes registerAttributeKeys handed out), each thread's keys in its order.
    assert.strictEqual(done.keyMap.length, 240);
    assert.ok(done.keyMap.every((k) => typeof k === 'string'), 'no hole in the handed-out indexes');
    assert.deepStrictEqual(summary.finalKeyMap, done.keyMap);
    for (const w of ['main', 'w1', 'w2']) {
      const own = done.keyMap.filter((k) => k.startsWith(`${w}.`));
      assert.deepStrictEqual(own, Array.from({ length: 80 }, (_, i) => `${w}.key${i}`));
    }
    const { context } = readContext(pid);
    assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], done.keyMap);
    assert.strictEqual(context.resource['test.writer'], 'done');
    t.diagnostic(
      `reader: ${summary.polls} polls, ${summary.accepted} accepted, ${summary.changed} retried (changed), ` +
        `${summary.updating} retried (updating), ${summary.publicationsSeen} distinct publications, ${summary.elapsedMs} ms`,
    );
  } finally {
    poller?.child.kill();
    await writer.exited();
  }
});

test('inputs too large for the limits are refused before they are walked, and change nothing', async () => {
  const { next, exited } = spawnScript(`
    const { publishProcessContext, registerAttributeKeys, processContextInfo } = require('.');
    publishProcessContext({ resource: { 'service.name': 'kept' } });
    registerAttributeKeys(['kept.key']);
    const before = processContextInfo();
    const sparse = []; sparse[1e7] = 'x';
    const manyKeys = {}; for (let i = 0; i < 4e5; i++) manyKeys['k' + i] = null;
    const results = {
      keysLength: outcome(() => registerAttributeKeys(new Array(2 ** 32 - 1))),
      keysSparse: outcome(() => registerAttributeKeys(sparse)),
      arrayLength: outcome(() => publishProcessContext({ resource: { x: new Array(2 ** 32 - 1) } })),
      nestedLength: outcome(() => publishProcessContext({ attributes: { a: { b: [new Array(2 ** 31)] } } })),
      sparseArray: outcome(() => publishProcessContext({ resource: { x: sparse } })),
      manyKeys: outcome(() => publishProcessContext({ resource: manyKeys })),
      manyNestedKeys: outcome(() => publishProcessContext({ resource: { nested: manyKeys } })),
      longString: outcome(() => publishProcessContext({ resource: { s: 'x'.repeat(2 ** 26) } })),
    };
    out({ pid: process.pid, results, before, after: processContextInfo() });
    exitAtEndOfInput();
  `);
  try {
    const { pid, results, before, after } = await next();
    assert.deepStrictEqual(results, {
      keysLength: 'RangeError',
      keysSparse: 'RangeError',
      arrayLength: 'RangeError',
      nestedLength: 'RangeError',
      sparseArray: 'RangeError',
      manyKeys: 'RangeError',
      manyNestedKeys: 'RangeError',
      longString: 'RangeError',
    });
    assert.deepStrictEqual(after, before, 'nothing was published');
    const { context } = readContext(pid);
    assert.deepStrictEqual(context.resource, { 'service.name': 'kept' });
    assert.deepStrictEqual(context.attributes['threadlocal.attribute_key_map'], ['kept.key']);
  } finally {
    assert.strictEqual(await exited(), 0);
  }
});

test('Map, class instances, dates and sets are a TypeError, a pending Resource a RangeError; nothing changes', async () => {
  const { next, exited } = spawnScript(`
    const { resourceFromAttributes } = require('@opentelemetry/resources');
    const { publishProcessContext, processContextInfo } = require('.');
    publishProcessContext({ resource: resourceFromAttributes({ 'service.name': 'from-resource', n: 3 }) });
    const before = processContextInfo();
    class Settings { constructor() { this.a = 1; } }
    const pending = resourceFromAttributes({ later: new Promise(() => {}) });
    const results = [
      outcome(() => publishProcessContext({ resource: new Map([['a', 1]]) })),
      outcome(() => publishProcessContext({ resource: new Settings() })),
      outcome(() => publishProcessContext({ resource: { nested: new Settings() } })),
      outcome(() => publishProcessContext({ resource: { when: new Date() } })),
      outcome(() => publishProcessContext({ attributes: new Set() })),
      outcome(() => publishProcessContext({ resource: pending })),
      outcome(() => publishProcessContext({ resource: Object.assign(Object.create(null), { plain: 'yes' }) })),
    ];
    out({ pid: process.pid, results, before, after: processContextInfo() });
    exitAtEndOfInput();
  `);
  try {
    const { pid, results, before, after } = await next();
    assert.deepStrictEqual(results, ['TypeError', 'TypeError', 'TypeError', 'TypeError', 'TypeError', 'RangeError', 'no error']);
    assert.strictEqual(after.publications, before.publications + 1, 'only the null-prototype object was published');
    const { context } = readContext(pid);
    assert.deepStrictEqual(context.resource, { plain: 'yes' });
    assert.strictEqual(before.publications, 1);
  } finally {
    assert.strictEqual(await exited(), 0);
  }
});

test('an SDK Resource published by hand is read from outside with its service.name', async () => {
  const { next, exited } = spawnScript(`
    const { resourceFromAttributes } = require('@opentelemetry/resources');
    const { publishProcessContext } = require('.');
    publishProcessContext({ resource: resourceFromAttributes({ 'service.name': 'from-resource', n: 3 }) });
    out({ pid: process.pid });
    exitAtEndOfInput();
  `);
  try {
    const { pid } = await next();
    assert.deepStrictEqual(readContext(pid).context.resource, { 'service.name': 'from-resource', n: 3n });
  } finally {
    assert.strictEqual(await exited(), 0);
  }
});

test('ProcessContextSpanProcessor never throws into the SDK', () => {
  const { ProcessContextSpanProcessor } = require('..');
  const { diag, DiagLogLevel } = require('@opentelemetry/api');
  const warnings = [];
  diag.setLogger({ warn: (m) => warnings.push(m), error() {}, info() {}, debug() {}, verbose() {} }, DiagLogLevel.WARN);
  try {
    const throwing = () => { throw new Error('third-party'); };
    const spans = [
      { resource: { get attributes() { return throwing(); } } },
      { resource: new Proxy({}, { get: throwing, has: throwing }) },
      { resource: { get asyncAttributesPending() { return throwing(); }, attributes: {} } },
      { resource: { asyncAttributesPending: true, waitForAsyncAttributes: throwing, attributes: {} } },
      { resource: { asyncAttributesPending: true, waitForAsyncAttributes: () => 'not a promise', attributes: {} } },
      { resource: { attributes: new Proxy({}, { ownKeys: throwing }) } },
      { get resource() { return throwing(); } },
      new Proxy({}, { get: throwing }),
    ];
    for (const span of spans) {
      const processor = new ProcessContextSpanProcessor();
      assert.doesNotThrow(() => processor.onStart(span), 'onStart');
      assert.doesNotThrow(() => processor.onEnd(span), 'onEnd');
    }
    assert.ok(warnings.length >= 1 && warnings.every((w) => w.includes('third-party')), JSON.stringify(warnings));
  } finally {
    diag.disable();
  }
});
