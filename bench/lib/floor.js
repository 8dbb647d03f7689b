'use strict';
// The floor: exactly the hooks ProfilingContextManager installs on the
// running Node.js (js/continuations.js picks them per line), with empty
// bodies, on top of the stock manager, whose with() has our override's
// shape with empty publishing (FloorContextManager). What the floor costs
// over stock is the price of being called at every callback start at all
// and of restoring the record when with() returns or throws; what ours
// costs over the floor is ours to cut.
//
// The store reference: the same, with hooks whose body only reads the
// stock manager's store, the least any hook that publishes the active span
// must do.

const asyncHooks = require('node:async_hooks');
const path = require('node:path');
const v8 = require('node:v8');

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
 * `readsStore`: the store reference's hooks (they read the store) instead
 * of empty ones.
 */
class FloorContextManager extends AsyncLocalStorageContextManager {
  constructor({ readsStore = false } = {}) {
    super();
    this._readsStore = readsStore;
    // Made on the first enable(), so a store reader reads the storage the
    // manager has then (bench/lib/turns.js gives its managers one).
    this._hooks = null;
    this._hooksOn = false;
  }

  enable() {
    super.enable();
    this._hooks ??= floorHooks(this._readsStore ? storeReader(this._asyncLocalStorage) : nothing);
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

/** The value last read by a store reader (so it stays observable). */
const lastRead = () => sink;

module.exports = { FloorContextManager, lastRead };
