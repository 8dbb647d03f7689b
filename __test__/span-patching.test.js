'use strict';
// Frame mode observes `end()`, `setAttribute()` and `setAttributes()` of
// span classes (js/publish/frame.js), so a frame resumed without any with()
// stops publishing an ended span. The application must not be able to tell:
// every span implementation behaves as with the stock manager (same return
// values, same errors, same prototype keys and attributes), nothing throws
// into the application, and a prototype is wrapped once per copy of the
// package.
const test = require('node:test');
const assert = require('node:assert');
const path = require('node:path');
const { context, trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { ProfilingContextManager } = require('..');
const { usesAsyncContextFrame } = require('../js/publish/frame');
const { ROOT, readOwnRecord } = require('./helpers');

const frameOnly = { skip: !usesAsyncContextFrame() && 'AsyncLocalStorage does not run on AsyncContextFrame on this Node' };

let counter = 0;
const ids = () => {
  counter++;
  return { traceId: counter.toString(16).padStart(32, 'a'), spanId: counter.toString(16).padStart(16, 'b'), traceFlags: 1 };
};

/** A span class of the application's own: counts calls, can throw, says `ended`. */
function userSpanClass() {
  return class UserSpan {
    constructor() {
      this.sc = ids();
      this.ended = false;
      this.calls = [];
    }
    spanContext() {
      return this.sc;
    }
    end(endTime) {
      this.calls.push(['end', this, endTime]);
      if (endTime === 'throw') throw new Error('end failed');
      this.ended = true;
      return 'ended-return';
    }
    setAttribute(key, value) {
      this.calls.push(['setAttribute', key, value]);
      return this;
    }
    setAttributes(attributes) {
      this.calls.push(['setAttributes', attributes]);
      return this;
    }
  };
}

/** Every own key of `object` with its descriptor, with function values replaced by their name and length. */
function shape(object) {
  return Reflect.ownKeys(object).map((key) => {
    const d = Object.getOwnPropertyDescriptor(object, key);
    const value = typeof d.value === 'function' ? `${d.value.name}/${d.value.length}` : d.value;
    return [String(key), { ...d, value }];
  });
}

function withManager(t, options = { mode: 'frame' }) {
  const manager = new ProfilingContextManager(options);
  context.setGlobalContextManager(manager.enable());
  t.after(() => {
    manager.disable();
    context.disable();
  });
  return manager;
}

/** Runs `fn` in a context holding `span`; returns what the walk read inside, before and after `fn`. */
function inSpan(span, fn) {
  return context.with(trace.setSpan(ROOT_CONTEXT, span), () => {
    const before = readOwnRecord();
    const result = fn();
    return { before, after: readOwnRecord(), result };
  });
}

test("the SDK's Span: end() stops the record at once, prototype keys and attributes unchanged, double end harmless", frameOnly, (t) => {
  withManager(t);
  const tracer = new BasicTracerProvider().getTracer('patching');
  const first = tracer.startSpan('first');
  const proto = Object.getPrototypeOf(first);
  const before = shape(proto);
  const { before: published, after, result } = inSpan(first, () => first.end());
  assert.strictEqual(published.spanId, first.spanContext().spanId);
  assert.strictEqual(result, undefined, "end() returns what the SDK's end() returns");
  assert.strictEqual(after.valid, 0, 'the record stops publishing the span at end()');
  assert.deepStrictEqual(shape(proto), before, 'the prototype keeps its keys, attributes, method names and lengths');
  assert.doesNotThrow(() => first.end(), 'a second end() behaves as stock (a diag warning, no throw)');
  const second = tracer.startSpan('second');
  const r = inSpan(second, () => {
    second.setAttribute('k', 'v');
    second.setAttributes({ a: 1 });
    second.end();
    second.end();
  });
  assert.strictEqual(r.after.valid, 0);
});

test('NonRecordingSpan and spans without `ended` stay published after end(), as in record mode; end() stays a no-op', frameOnly, (t) => {
  withManager(t);
  const sc = ids();
  const span = trace.wrapSpanContext(sc);
  const { before, after, result } = inSpan(span, () => span.end());
  assert.strictEqual(result, undefined);
  assert.strictEqual(before.spanId, sc.spanId);
  assert.strictEqual(after.spanId, sc.spanId, 'a span that never says it ended is published while a context holds it');
});

test("a user span class: arguments, `this`, return values and errors pass through; the record ends when the span says it ended", frameOnly, (t) => {
  withManager(t);
  const UserSpan = userSpanClass();
  const before = shape(UserSpan.prototype);
  const span = new UserSpan();
  const r = inSpan(span, () => {
    assert.strictEqual(span.setAttribute('k', 1), span);
    assert.strictEqual(span.setAttributes({ a: 1 }), span);
    assert.throws(() => span.end('throw'), { message: 'end failed' });
    const mid = readOwnRecord();
    assert.strictEqual(mid.spanId, span.sc.spanId, 'an end() that threw before ending leaves the span published');
    return span.end(42);
  });
  assert.strictEqual(r.result, 'ended-return');
  assert.strictEqual(r.after.valid, 0);
  assert.deepStrictEqual(span.calls.map((c) => c[0]), ['setAttribute', 'setAttributes', 'end', 'end']);
  assert.strictEqual(span.calls[3][1], span, '`this` is the span');
  assert.strictEqual(span.calls[3][2], 42, 'arguments pass through');
  assert.deepStrictEqual(shape(UserSpan.prototype), before);
});

test('a wrapped method sees exactly the arguments it was given, however many, undefined ones included', frameOnly, (t) => {
  withManager(t);
  class CountingSpan extends userSpanClass() {
    setAttribute(...args) {
      this.calls.push(['setAttribute', args]);
      return this;
    }
    updateName(...args) {
      this.calls.push(['updateName', args]);
      return this;
    }
  }
  const originals = [CountingSpan.prototype.setAttribute, CountingSpan.prototype.updateName];
  const span = new CountingSpan();
  const lists = [[], ['k'], ['k', undefined], ['k', 'v'], ['k', 'v', 3], [undefined, undefined, undefined, 4, 5]];
  inSpan(span, () => {
    for (const args of lists) {
      assert.strictEqual(span.setAttribute(...args), span);
      assert.strictEqual(span.updateName(...args), span);
    }
  });
  const seen = span.calls.filter((c) => c[0] === 'setAttribute').map((c) => c[1]);
  assert.deepStrictEqual(seen, lists, 'setAttribute: the count and the values of its arguments');
  assert.deepStrictEqual(span.calls.filter((c) => c[0] === 'updateName').map((c) => c[1]), lists, 'updateName, the same');
  assert.notStrictEqual(CountingSpan.prototype.setAttribute, originals[0], 'setAttribute is wrapped');
  assert.notStrictEqual(CountingSpan.prototype.updateName, originals[1], 'updateName is wrapped');
});

test('frozen spans and frozen prototypes: nothing throws, methods untouched where they cannot be redefined', frameOnly, (t) => {
  withManager(t);
  // A frozen span of a patchable class: its record is found without a property on it.
  const UserSpan = userSpanClass();
  const frozenSpan = Object.freeze(new UserSpan());
  // end() of a frozen span cannot set `ended`; a subclass keeps the flag elsewhere.
  const flags = new WeakMap();
  class FrozenEnding extends UserSpan {
    get ended() {
      return flags.get(this) === true;
    }
    set ended(value) {}
    end() {
      flags.set(this, true);
    }
  }
  const ending = Object.freeze(new FrozenEnding());
  const r1 = inSpan(ending, () => ending.end());
  assert.strictEqual(r1.before.spanId, ending.sc.spanId);
  assert.strictEqual(r1.after.valid, 0, 'a frozen span that ended stops publishing at end()');
  assert.strictEqual(inSpan(frozenSpan, () => 1).before.spanId, frozenSpan.sc.spanId);

  // A frozen prototype: left as it is, the span still published, end() works.
  const Frozen = userSpanClass();
  Object.freeze(Frozen.prototype);
  const end = Frozen.prototype.end;
  const span = new Frozen();
  const r2 = inSpan(span, () => span.end());
  assert.strictEqual(r2.result, 'ended-return');
  assert.strictEqual(Frozen.prototype.end, end, 'a frozen prototype is not changed');
  assert.strictEqual(r2.before.spanId, span.sc.spanId);
  assert.strictEqual(inSpan(span, () => 0).before.valid, 0, 'the ended span is not published by the next with()');
});

test('sealed and shared prototypes, subclasses: wrapped once, attributes kept, sealed stays sealed', frameOnly, (t) => {
  withManager(t);
  const Sealed = userSpanClass();
  Object.seal(Sealed.prototype);
  const before = shape(Sealed.prototype);
  const s = new Sealed();
  assert.strictEqual(inSpan(s, () => s.end()).after.valid, 0, 'own writable methods of a sealed prototype are observed');
  assert.ok(Object.isSealed(Sealed.prototype));
  assert.deepStrictEqual(shape(Sealed.prototype), before);

  // Two "classes" sharing one prototype object: one wrapper, one call per end().
  const Base = userSpanClass();
  const shared = Object.create(Base.prototype);
  const a = Object.setPrototypeOf(new Base(), shared);
  const b = Object.setPrototypeOf(new Base(), shared);
  inSpan(a, () => a.end());
  inSpan(b, () => b.end());
  assert.strictEqual(a.calls.length, 1);
  assert.strictEqual(b.calls.length, 1);
  assert.deepStrictEqual(Reflect.ownKeys(shared).sort(), ['end', 'setAttribute', 'setAttributes'], 'inherited methods are observed on the shared prototype');
  for (const key of ['end', 'setAttribute', 'setAttributes']) {
    const d = Object.getOwnPropertyDescriptor(shared, key);
    assert.strictEqual(d.enumerable, false, `${key} stays non-enumerable, as on the class`);
  }

  // A subclass of an already observed class inherits the wrapper: no second one.
  const Parent = userSpanClass();
  const parent = new Parent();
  inSpan(parent, () => 0);
  class Sub extends Parent {}
  const sub = new Sub();
  assert.strictEqual(inSpan(sub, () => sub.end()).after.valid, 0);
  // Another observer of the package (endpoint attributes) may wrap on the
  // subclass; what it adds keeps the original's attributes, name and length.
  const parentShape = new Map(shape(Parent.prototype));
  for (const [key, d] of shape(Sub.prototype)) {
    if (key === 'constructor') continue;
    assert.deepStrictEqual(d, parentShape.get(key), `${key} on the subclass is the base method's shape`);
  }
  assert.strictEqual(sub.calls.length, 1, 'the original runs once under the wrappers');
});

test('end() after disable(), and under several managers in turn: one call of the original per end(), nothing thrown', frameOnly, (t) => {
  const first = withManager(t);
  const UserSpan = userSpanClass();
  const early = new UserSpan();
  inSpan(early, () => 0);
  const second = new ProfilingContextManager({ mode: 'frame' }).enable();
  const late = new UserSpan();
  const r = inSpan(late, () => late.end());
  assert.strictEqual(r.after.valid, 0);
  assert.strictEqual(late.calls.length, 1, 'the prototype is wrapped once whatever the number of managers');
  second.disable();
  first.disable();
  assert.strictEqual(early.end(), 'ended-return', 'end() after disable() behaves as the original');
  assert.strictEqual(early.calls.length, 1);
});

test('nothing thrown into the application: throwing getters, Proxy spans and prototypes', frameOnly, (t) => {
  withManager(t);
  const UserSpan = userSpanClass();
  class Throwing extends UserSpan {
    get ended() {
      throw new Error('ended getter');
    }
    set ended(value) {}
  }
  const throwing = new Throwing();
  assert.strictEqual(inSpan(throwing, () => throwing.end()).result, 'ended-return');

  const target = new UserSpan();
  const proxy = new Proxy(target, {
    getPrototypeOf() {
      throw new Error('getPrototypeOf trap');
    },
  });
  const r = inSpan(proxy, () => 'ran');
  assert.strictEqual(r.result, 'ran');
  assert.strictEqual(r.before.spanId, target.sc.spanId, 'a span whose prototype cannot be read is still published');

  const protoProxy = Object.create(
    new Proxy(UserSpan.prototype, {
      getOwnPropertyDescriptor() {
        throw new Error('descriptor trap');
      },
    }),
  );
  const odd = Object.setPrototypeOf(new UserSpan(), protoProxy);
  assert.strictEqual(inSpan(odd, () => odd.end()).result, 'ended-return');
});

test('two copies of the package wrap a prototype once each; each ends its own records and the original runs once', frameOnly, (t) => {
  const copyA = withManager(t);
  const UserSpan = userSpanClass();
  const spanA = new UserSpan();
  inSpan(spanA, () => 0);
  copyA.disable();

  // A second copy of the package's JavaScript (the addon is shared).
  const jsFiles = Object.keys(require.cache).filter((f) => f.startsWith(ROOT) && f.endsWith('.js') && !f.includes(`${path.sep}node_modules${path.sep}`) && !f.includes(`${path.sep}__test__${path.sep}`));
  const saved = Object.fromEntries(jsFiles.map((f) => [f, require.cache[f]]));
  for (const f of jsFiles) delete require.cache[f];
  let copyB;
  try {
    copyB = require('..');
  } finally {
    Object.assign(require.cache, saved);
  }
  assert.notStrictEqual(copyB.ProfilingContextManager, ProfilingContextManager);
  const managerB = new copyB.ProfilingContextManager({ mode: 'frame' });
  context.disable();
  context.setGlobalContextManager(managerB.enable());
  t.after(() => managerB.disable());
  // The reader's walk through the shared addon (the helpers ask the first copy).
  const abi = require('../js/abi');
  const walk = () => {
    const { header } = require('../js/binding').frameWalk();
    if (header == null) return { valid: 0, spanId: null };
    const bytes = Buffer.from(header);
    const { spanId, valid } = abi.record.offsets;
    return { valid: bytes[valid], spanId: bytes.subarray(spanId, spanId + 8).toString('hex') };
  };
  const spanB = new UserSpan();
  const r = context.with(trace.setSpan(ROOT_CONTEXT, spanB), () => {
    const before = walk();
    spanB.end();
    return { before, after: walk() };
  });
  assert.strictEqual(r.before.spanId, spanB.sc.spanId);
  assert.strictEqual(r.after.valid, 0, "the second copy's record ends at end()");
  assert.strictEqual(spanB.calls.length, 1, 'the original end() runs once under two wrappers');
  assert.strictEqual(spanA.end(), 'ended-return');
  assert.strictEqual(spanA.calls.length, 1);
});
