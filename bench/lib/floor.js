'use strict';
// The floor: exactly the hooks ProfilingContextManager installs on the
// running Node.js (js/continuations.js picks them per line), with empty
// bodies, on top of the stock manager. What the floor costs over stock is
// the price of being called at every callback start at all; what ours
// costs over the floor is ours to cut.

const asyncHooks = require('node:async_hooks');
const path = require('node:path');
const v8 = require('node:v8');

const ROOT = path.resolve(__dirname, '..', '..');

function nothing() {}

/** Enables the empty hooks of the strategy js/continuations.js selected here; returns its name. */
function installFloorHooks() {
  // continuations.js only creates hooks when loaded (enabling them is the
  // manager's job) and does not load the addon.
  const { strategy } = require(path.join(ROOT, 'js', 'continuations.js'));
  switch (strategy) {
    case 'async-hooks':
      asyncHooks.createHook({ before: nothing }).enable();
      break;
    case 'async-context-frame':
      asyncHooks.createHook({ before: nothing, trackPromises: false }).enable();
      v8.promiseHooks.onBefore(nothing);
      break;
    default:
      throw new Error(`the floor does not know strategy ${strategy}`);
  }
  return strategy;
}

module.exports = { installFloorHooks };
