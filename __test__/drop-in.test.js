'use strict';
// ProfilingContextManager behaves exactly like the stock
// AsyncLocalStorageContextManager for every value used as a context, and
// nothing it adds can throw into the application or kill the process.
const test = require('node:test');
const assert = require('node:assert');
const { EventEmitter } = require('node:events');
const { ROOT_CONTEXT, trace, diag, DiagLogLevel } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { ProfilingContextManager } = require('..');
const { readOwnRecord, spanContextFor, spawnNode, exited } = require('./helpers');

const warnings = [];
diag.setLogger(
  { warn: (m) => warnings.push(m), error: () => {}, info: () => {}, debug: () => {}, verbose: () => {} },
  DiagLogLevel.WARN,
);

const valid = spanContextFor('valid');
const throwingSpan = { spanContext() { throw new Error('spanContext throws'); } };
const span = (sc) => ({ spanContext: () => sc });

/** Every kind of value a context can be: [name, value, span context it publishes or null]. */
const KINDS = [
  ['a real context with a valid span', valid.ctx, valid.spanContext],
  ['ROOT_CONTEXT', ROOT_CONTEXT, null],
  ['a string', 'a string', null],
  ['an empty string', '', null],
  ['a number', 42, null],
  ['a bigint', 7n, null],
  ['a symbol', Symbol('ctx'), null],
  ['true', true, null],
  ['null', null, null],
  ['undefined', undefined, null],
  ['a function', function notAContext() {}, null],
  ['an empty object', {}, null],
  ['a frozen object', Object.freeze({}), null],
  ['a sealed object', Object.seal({ a: 1 }), null],
  ['a null-prototype object', Object.create(null), null],
  ['an array', [1, 2], null],
  ['a frozen real context', Object.freeze(spanContextFor('frozen').ctx), 'frozen'],
  ['a Proxy of a real context', new Proxy(spanContextFor('proxied').ctx, {}), 'proxied'],
  ['a Proxy whose every trap throws', new Proxy({}, {
    get() { throw new Error('get trap'); },
    has() { throw new Error('has trap'); },
    set() { throw new Error('set trap'); },
    isExtensible() { throw new Error('isExtensible trap'); },
    getPrototypeOf() { throw new Error('getPrototypeOf trap'); },
  }), null],
  ['an object whose getValue throws', { getValue() { throw new Error('getValue throws'); } }, null],
  ['an object whose getValue is a throwing getter', { get getValue() { throw new Error('getter'); } }, null],
  ['getValue returning a string', { getValue: () => 'not a span' }, null],
  ['a span whose spanContext() throws', trace.setSpan(ROOT_CONTEXT, throwingSpan), null],
  ['a span whose spanContext() returns null', trace.setSpan(ROOT_CONTEXT, span(null)), null],
  ['a span whose spanContext() returns a string', trace.setSpan(ROOT_CONTEXT, span('x')), null],
  ['a span with numeric ids', trace.setSpan(ROOT_CONTEXT, span({ traceId: 1, spanId: 2, traceFlags: 1 })), null],
  ['a span with flags 257', trace.setSpan(ROOT_CONTEXT, span({ ...valid.spanContext, traceFlags: 257 })), null],
  ['a span with flags -1', trace.setSpan(ROOT_CONTEXT, span({ ...valid.spanContext, traceFlags: -1 })), null],
  ['a span with flags "x"', trace.setSpan(ROOT_CONTEXT, span({ ...valid.spanContext, traceFlags: 'x' })), null],
  ['a span with throwing flags', trace.setSpan(ROOT_CONTEXT, span({
    ...valid.spanContext,
    get traceFlags() { throw new Error('flags'); },
  })), null],
];
// Labels of the span contexts created above, resolved to the span context.
for (const kind of KINDS) {
  if (typeof kind[2] === 'string') kind[2] = trace.getSpanContext(kind[1]);
}

/** A comparable name for a value seen by the scenarios (identity, never a property read). */
function describe(value) {
  const index = KINDS.findIndex((kind) => kind[1] === value);
  if (index >= 0) return `kind ${index}`;
  if (value === ROOT_CONTEXT) return 'ROOT_CONTEXT';
  if (typeof value === 'object' || typeof value === 'function') return `other ${typeof value}`;
  return `${typeof value} ${String(value)}`;
}

function outcome(fn) {
  try {
    return { returned: describe(fn()) };
  } catch (error) {
    return { threw: `${error?.constructor?.name}: ${error?.message}` };
  }
}

/** Runs every public method with `value` and records what the caller sees. */
async function scenario(manager, value) {
  const seen = [];
  const note = (what, result) => seen.push([what, result]);
  note('active() outside', describe(manager.active()));
  note('with() returns', outcome(() => manager.with(value, () => manager.active())));
  note('with() with thisArg and args', outcome(() => manager.with(value, function (a, b) { return this[a + b]; }, { ab: value }, 'a', 'b')));
  note('with() fn throws', outcome(() => manager.with(value, () => { throw new RangeError('from fn'); })));
  note('active() after a throw', describe(manager.active()));
  note('with() fn not a function', outcome(() => manager.with(value, 'nope')));
  note('with() fn not a function, thisArg', outcome(() => manager.with(value, 'nope', {})));
  note('nested with() restores', outcome(() => manager.with(value, () => manager.with(ROOT_CONTEXT, () => 0) + describe(manager.active()))));
  note('bind(fn)()', outcome(() => manager.bind(value, function (x) { return x === 1 ? manager.active() : undefined; })(1)));
  note('bind(fn).length', manager.bind(value, (a, b, c) => c).length);
  note('bind(non-function)', describe(manager.bind(value, 'target')));
  const emitter = new EventEmitter();
  manager.bind(value, emitter);
  emitter.on('e', () => note('bound listener active()', describe(manager.active())));
  emitter.emit('e');
  note('continuations', await manager.with(value, async () => {
    const seenInside = [describe(manager.active())];
    await null;
    seenInside.push(describe(manager.active()));
    await new Promise((resolve) => setTimeout(resolve, 1));
    seenInside.push(describe(manager.active()));
    await new Promise((resolve) => setImmediate(resolve));
    seenInside.push(describe(manager.active()));
    await new Promise((resolve) => process.nextTick(resolve));
    seenInside.push(describe(manager.active()));
    return seenInside;
  }));
  note('active() after continuations', describe(manager.active()));
  const token = manager.attach(value);
  note('attach() token', typeof token?.dispose);
  note('active() after attach()', describe(manager.active()));
  note('inside a timer after attach()', await new Promise((resolve) => setTimeout(() => resolve(describe(manager.active())), 1)));
  token.dispose();
  note('active() after dispose()', describe(manager.active()));
  token.dispose();
  note('active() after a second dispose()', describe(manager.active()));
  return seen;
}

/** What the record shows inside with(value) and in a callback resumed in it. */
async function published(manager, value) {
  const read = () => {
    const r = readOwnRecord();
    return r.valid === 1 ? `${r.traceId}/${r.spanId}/${r.traceFlags}` : 'no span';
  };
  return manager.with(value, async () => {
    const inWith = read();
    await new Promise((resolve) => setTimeout(resolve, 1));
    return [inWith, read()];
  });
}

test('every public method, with every kind of value, behaves as the stock manager', async () => {
  const stock = new AsyncLocalStorageContextManager().enable();
  const ours = new ProfilingContextManager().enable();
  try {
    for (const [name, value, expected] of KINDS) {
      const ourResult = await scenario(ours, value);
      const stockResult = await scenario(stock, value);
      assert.deepStrictEqual(ourResult, stockResult, `${name}: differs from the stock manager`);
      const spanText = expected === null ? 'no span' : `${expected.traceId}/${expected.spanId}/${expected.traceFlags}`;
      assert.deepStrictEqual(await published(ours, value), [spanText, spanText], `${name}: published`);
    }
    // A value that failed earlier does not poison the thread.
    const after = spanContextFor('after');
    assert.strictEqual(ours.with(after.ctx, () => 'result'), 'result');
    assert.deepStrictEqual(await published(ours, after.ctx), Array(2).fill(`${after.spanContext.traceId}/${after.spanContext.spanId}/1`));
    assert.strictEqual(readOwnRecord().valid, 0, 'nothing published outside every context');
  } finally {
    ours.disable();
    stock.disable();
  }
  const reports = warnings.filter((w) => w.includes('could not be read'));
  assert.strictEqual(reports.length, 1, `one failure report through diag: ${JSON.stringify(warnings)}`);
});

// Every kind of value reaching a continuation, a timer, an immediate and an
// I/O callback, and stored before enable(): the process survives and every
// callback runs.
const CHILD = `
  const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
  const { ProfilingContextManager } = require('.');
  const values = [
    'a string', 42, Symbol('s'), Object.freeze({}), Object.create(null),
    new Proxy({}, { get() { throw new Error('trap'); }, isExtensible() { throw new Error('trap'); } }),
    { getValue() { throw new Error('getValue'); } },
    trace.setSpan(ROOT_CONTEXT, { spanContext() { throw new Error('spanContext'); } }),
  ];
  const manager = new ProfilingContextManager();
  // Stored before enable(), as with a manager enabled late.
  manager.attach(values[0]);
  context.setGlobalContextManager(manager.enable());
  let ran = 0;
  process.on('exit', (code) => { if (code === 0 && ran !== values.length * 5 + 1) process.exitCode = 3; });
  setTimeout(() => ran++, 1);
  for (const value of values) {
    context.with(value, async () => {
      await null; ran++;
      await new Promise((r) => setTimeout(r, 1)); ran++;
      await new Promise((r) => setImmediate(r)); ran++;
      await require('node:fs/promises').stat('.'); ran++;
    });
    manager.attach(value);
    setTimeout(() => ran++, 2);
  }
  console.log(JSON.stringify({ started: true }));
`;

test('bad values reaching callbacks never kill the process', async () => {
  const { child } = await spawnNode(CHILD);
  assert.strictEqual(await exited(child), 0);
});

test('attach() with a non-context value, then a timer: the timer runs, exit 0', async () => {
  const { child, next } = await spawnNode(`
    const { context } = require('@opentelemetry/api');
    const { ProfilingContextManager } = require('.');
    const manager = new ProfilingContextManager();
    context.setGlobalContextManager(manager.enable());
    const token = manager.attach('a string');
    console.log(JSON.stringify({ token: typeof token.dispose }));
    setTimeout(() => console.log(JSON.stringify({ timer: context.active() })), 1);
  `);
  const timer = await next('the timer line');
  assert.deepStrictEqual(timer, { timer: 'a string' });
  assert.strictEqual(await exited(child), 0);
});
