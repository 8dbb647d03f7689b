'use strict';
// Republishes the active span at the start of every callback that runs in a
// stored context. An async_hooks `before` hook fires for promise
// continuations, timers, immediates, nextTick, queueMicrotask and native I/O
// callbacks alike, and inside it AsyncLocalStorage already returns the
// callback's store on both the async_hooks-based (Node 20) and the
// AsyncContextFrame-based (Node 24) implementation.
//
// One hook per thread serves the most recently enabled manager.

const asyncHooks = require('node:async_hooks');

let activeManager = null;

const hook = asyncHooks.createHook({
  before() {
    activeManager._publishActive();
  },
});

function activate(manager) {
  if (activeManager === null) hook.enable();
  activeManager = manager;
}

/** Returns true when `manager` was the one publishing (and now none is). */
function deactivate(manager) {
  if (activeManager !== manager) return false;
  activeManager = null;
  hook.disable();
  return true;
}

module.exports = { activate, deactivate };
