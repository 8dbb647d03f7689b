'use strict';
// The floor: exactly the hooks ProfilingContextManager installs on the
// running Node.js (js/continuations.js picks them per line), with empty
// bodies, on top of the stock manager. What the floor costs over stock is
// the price of being called at every callback start at all; what ours
// costs over the floor is ours to cut.
//
// The store reference: the same hooks whose body only reads the stock
// manager's store, the least any hook that publishes the active span must
// do.

const asyncHooks = require('node:async_hooks');
const path = require('node:path');
const v8 = require('node:v8');

const ROOT = path.resolve(__dirname, '..', '..');

function nothing() {}

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

module.exports = { installFloorHooks, storeReader, lastRead };
