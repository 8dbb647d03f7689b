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

/**
 * The stock manager with ProfilingContextManager's with() around the base
 * class's body: save, publish, run, and restore in a `finally`, with the
 * publishing calls empty. Any publisher has to restore the record when the
 * callback returns or throws; this is the cost of that shape alone.
 */
class FloorContextManager extends AsyncLocalStorageContextManager {
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

let sink;

/** Hooks whose body reads `storage`'s store (and keeps it, so it is not optimized away). */
function storeReader(storage) {
  return function readStore() {
    sink = storage.getStore();
  };
}

/**
 * Enables the hooks of the strategy js/continuations.js selected here, with
 * `body` (default: empty); returns the strategy's name.
 */
function installFloorHooks(body = nothing) {
  // continuations.js only creates hooks when loaded (enabling them is the
  // manager's job) and does not load the addon.
  const { strategy } = require(path.join(ROOT, 'js', 'continuations.js'));
  switch (strategy) {
    case 'async-hooks':
      asyncHooks.createHook({ before: body }).enable();
      break;
    case 'async-context-frame':
      asyncHooks.createHook({ before: body, trackPromises: false }).enable();
      v8.promiseHooks.onBefore(body);
      break;
    default:
      throw new Error(`the floor does not know strategy ${strategy}`);
  }
  return strategy;
}

/** The value last read by a store reader (so it stays observable). */
const lastRead = () => sink;

module.exports = { FloorContextManager, installFloorHooks, storeReader, lastRead };
