'use strict';
// The floor: exactly the hooks ProfilingContextManager installs on the
// running Node.js (js/continuations.js picks them per line), with empty
// bodies, on top of the stock manager, whose with() has our override's
// shape with empty publishing (FloorContextManager). What the floor costs
// over stock is the price of being called at every callback start at all
// and of restoring the record when with() returns or throws; what ours
// costs over the floor is ours to cut.
//
// Two references between the floor and ours, the same manager with other
// hook bodies:
// - the store reference: the body only reads the stock manager's store,
//   the least any hook that publishes the active span must do;
// - the write reference: the body reads the store and copies the store's
//   span's record words (worked out once per context, cached on it) into a
//   record-sized buffer of its own, with no checks at all: the least a hook
//   that keeps an OTEP 4947 record equal to the active span must do. Its
//   with() writes the context's words on entry and the outer ones on exit
//   (RecordWriteContextManager).

const asyncHooks = require('node:async_hooks');
const path = require('node:path');
const v8 = require('node:v8');

const { trace } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');

const ROOT = path.resolve(__dirname, '..', '..');

function nothing() {}

let sink;

/** A hook body reading `storage`'s store (and keeping it, so it is not optimized away). */
function storeReader(storage) {
  return function readStore() {
    sink = storage.getStore();
  };
}

/**
 * The write reference's record: seven 32-bit words, as many stores as the
 * OTEP 4947 header takes (ids, then valid/flags/size last). Nothing reads
 * it, so it follows no layout, and the reference runs without the package
 * (js/abi.js has the layout from the addon, which these processes never
 * load).
 */
const scratchRecord = new Uint32Array(7);
const kWords = Symbol('bench.recordWords');
const NO_WORDS = Object.freeze({ index: 0, w0: 0, w1: 0, w2: 0, w3: 0, w4: 0, w5: 0, tail: 0 });

/**
 * Every context's words by index (0: NO_WORDS). What the record holds is
 * kept as an index, a small integer: storing the words object itself into
 * module state would cost a write barrier per write (as ours keeps a slot
 * number, js/record-view.js).
 */
const allWords = [NO_WORDS];

/** The record words of `ctx`'s span (valid, the span's flags, no attributes), or NO_WORDS. */
function recordWords(ctx) {
  const sc = typeof ctx?.getValue === 'function' ? trace.getSpan(ctx)?.spanContext() : undefined;
  if (sc === undefined) return NO_WORDS;
  const hex = sc.traceId + sc.spanId;
  const word = (i) => Buffer.from(hex.slice(i * 8, i * 8 + 8), 'hex').readUInt32LE(0);
  const words = { index: allWords.length, w0: word(0), w1: word(1), w2: word(2), w3: word(3), w4: word(4), w5: word(5), tail: 1 | (sc.traceFlags << 8) };
  allWords.push(words);
  return words;
}

/** The words of `ctx`'s span, worked out on first sight and cached on `ctx`. */
function wordsOf(ctx) {
  return ctx === undefined || ctx === null ? NO_WORDS : (ctx[kWords] ?? (ctx[kWords] = recordWords(ctx)));
}

/** The index of the words scratchRecord holds. */
let writtenIndex = 0;

/**
 * Copies `words` into scratchRecord: valid = 0, the ids, then the tail
 * word; the stores js/record-view.js publish() makes, written out again
 * here because the reference must not run the package's code.
 */
function writeWords(words) {
  const record = scratchRecord;
  record[6] = 0;
  writtenIndex = words.index;
  if (words === NO_WORDS) return;
  record[0] = words.w0;
  record[1] = words.w1;
  record[2] = words.w2;
  record[3] = words.w3;
  record[4] = words.w4;
  record[5] = words.w5;
  record[6] = words.tail;
}

/** A hook body writing the words of `storage`'s store's span into scratchRecord. */
function recordWriter(storage) {
  return function writeRecord() {
    writeWords(wordsOf(storage.getStore()));
  };
}

const HOOK_BODIES = { none: () => nothing, store: storeReader, write: recordWriter };

/**
 * The hooks of the strategy js/continuations.js selected here, with `body`,
 * as { strategy, enable, disable }.
 */
function floorHooks(body) {
  // continuations.js only creates hooks when loaded (enabling them is the
  // manager's job) and does not load the addon.
  const { strategy } = require(path.join(ROOT, 'js', 'continuations.js'));
  switch (strategy) {
    case 'async-hooks': {
      const hook = asyncHooks.createHook({ before: body });
      return { strategy, enable: () => hook.enable(), disable: () => hook.disable() };
    }
    case 'async-context-frame': {
      const hook = asyncHooks.createHook({ before: body, trackPromises: false });
      let stopPromiseHook = null;
      return {
        strategy,
        enable() {
          hook.enable();
          stopPromiseHook = v8.promiseHooks.onBefore(body);
        },
        disable() {
          hook.disable();
          stopPromiseHook();
        },
      };
    }
    default:
      throw new Error(`the floor does not know strategy ${strategy}`);
  }
}

/**
 * The stock manager with ProfilingContextManager's with() around the base
 * class's body: save, publish, run, and restore in a `finally`, with the
 * publishing calls empty. Any publisher has to restore the record when the
 * callback returns or throws; this is the cost of that shape alone. Its
 * hooks are on while it is enabled, as ours are.
 *
 * `hookBody`: 'none' (the floor), 'store' (the store reference) or
 * 'write' (the write reference).
 */
class FloorContextManager extends AsyncLocalStorageContextManager {
  constructor({ hookBody = 'none' } = {}) {
    super();
    if (!Object.hasOwn(HOOK_BODIES, hookBody)) throw new Error(`unknown hook body: ${hookBody}`);
    this._hookBody = hookBody;
    // Made on the first enable(), so a store reader reads the storage the
    // manager has then (bench/lib/turns.js gives its managers one).
    this._hooks = null;
    this._hooksOn = false;
  }

  enable() {
    super.enable();
    this._hooks ??= floorHooks(HOOK_BODIES[this._hookBody](this._asyncLocalStorage));
    if (!this._hooksOn) this._hooks.enable();
    this._hooksOn = true;
    return this;
  }

  disable() {
    if (this._hooksOn) this._hooks.disable();
    this._hooksOn = false;
    return super.disable();
  }

  with(context, fn, thisArg, ...args) {
    const cb = thisArg == null ? fn : fn.bind(thisArg);
    const outer = nothing(); // what a publisher saves to restore on exit
    nothing(context);
    try {
      return this._asyncLocalStorage.run(context, cb, ...args);
    } finally {
      nothing(outer);
    }
  }
}

/**
 * The write reference: the floor with the write reference's hooks, and a
 * with() that writes the context's words on entry and the outer ones back
 * on exit (the tail word only when that is no span).
 */
class RecordWriteContextManager extends FloorContextManager {
  constructor() {
    super({ hookBody: 'write' });
  }

  with(context, fn, thisArg, ...args) {
    const cb = thisArg == null ? fn : fn.bind(thisArg);
    const outer = writtenIndex;
    writeWords(wordsOf(context));
    try {
      return this._asyncLocalStorage.run(context, cb, ...args);
    } finally {
      if (outer === 0) {
        scratchRecord[6] = 0;
        writtenIndex = 0;
      } else {
        writeWords(allWords[outer]);
      }
    }
  }
}

/** Returns its argument from a constructor, so a subclass's private field lands on that object. */
class Stamp {
  constructor(target) {
    // eslint-disable-next-line no-constructor-return
    return target;
  }
}

class ContextStamp extends Stamp {
  #stamp;

  constructor(context) {
    super(context);
    this.#stamp = true;
  }

  static has(context) {
    return #stamp in context;
  }
}

class SpanStamp extends Stamp {
  #stamp;

  constructor(span) {
    super(span);
    this.#stamp = true;
  }

  static has(span) {
    return #stamp in span;
  }
}

/**
 * The stamps reference: the stock manager, plus one private field added
 * to each context at its first with() and one to its span, as ours keeps
 * its state (js/hidden-state.js), and nothing else: what the hidden-class
 * changes on objects of the SDK cost alone.
 */
class StampingContextManager extends AsyncLocalStorageContextManager {
  with(context, fn, thisArg, ...args) {
    if (typeof context === 'object' && context !== null && !ContextStamp.has(context)) {
      new ContextStamp(context);
      const span = trace.getSpan(context);
      if (typeof span === 'object' && span !== null && !SpanStamp.has(span)) new SpanStamp(span);
    }
    return super.with(context, fn, thisArg, ...args);
  }
}

/** The value last read by a store reader, and the write reference's record (so both stay observable). */
const lastRead = () => sink;
const lastWritten = () => scratchRecord;

module.exports = { FloorContextManager, RecordWriteContextManager, StampingContextManager, lastRead, lastWritten };
