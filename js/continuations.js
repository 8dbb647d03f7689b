'use strict';
// Republishes the active span at the start of every callback that runs in a
// stored context, with the cheapest hooks that see every such callback on
// the running Node.js:
//
// - AsyncLocalStorage built on async_hooks (Node 20 and 22 by default): one
//   async_hooks `before` hook. It fires for promise continuations, timers,
//   immediates, nextTick, queueMicrotask and native I/O callbacks, and
//   inside it the store is already the callback's. AsyncLocalStorage keeps
//   Node's promise hooks on anyway, so this adds little.
// - AsyncLocalStorage built on AsyncContextFrame (Node 24+): V8 restores the
//   store on `await` without running JS. A `v8.promiseHooks` before hook sees
//   the continuation's store and costs far less than async_hooks' promise
//   tracking; an async_hooks `before` hook with `trackPromises: false`
//   covers every other callback without turning promise tracking on. Where
//   `trackPromises` is not supported, the async_hooks hook alone covers
//   everything (correct, slower on promises).
//
// One set of hooks per thread serves the most recently enabled manager.

const asyncHooks = require('node:async_hooks');
const v8 = require('node:v8');

let activeManager = null;
let storage = null;
let publish = null;

// The store is read from the manager's AsyncLocalStorage rather than
// through manager.active(): that adds a call and a ROOT_CONTEXT fallback at
// every callback start, and an undefined store publishes no span anyway.
function onCallback() {
  // A hook already under way when the last manager was disabled still runs.
  if (storage !== null) publish(storage.getStore());
}

/** True when AsyncLocalStorage is implemented with AsyncContextFrame. */
function usesAsyncContextFrame() {
  // The async_hooks-based implementation keeps its store under a per-instance
  // `kResourceStore` key; the AsyncContextFrame one has no own keys.
  return !Object.prototype.hasOwnProperty.call(new asyncHooks.AsyncLocalStorage(), 'kResourceStore');
}

/** An async_hooks hook that skips promises, or null where Node cannot. */
function createCallbackOnlyHook() {
  const hook = asyncHooks.createHook({ before: onCallback, trackPromises: false });
  const skipsPromises = Object.getOwnPropertySymbols(hook).some(
    (s) => s.description === 'kNoPromiseHook' && hook[s] === true,
  );
  return skipsPromises ? hook : null;
}

function selectStrategy() {
  if (usesAsyncContextFrame()) {
    const callbackHook = createCallbackOnlyHook();
    if (callbackHook !== null && typeof v8.promiseHooks?.onBefore === 'function') {
      let stopPromiseHook = null;
      return {
        name: 'async-context-frame',
        enable() {
          callbackHook.enable();
          stopPromiseHook = v8.promiseHooks.onBefore(onCallback);
        },
        disable() {
          callbackHook.disable();
          stopPromiseHook();
        },
      };
    }
  }
  const hook = asyncHooks.createHook({ before: onCallback });
  return { name: 'async-hooks', enable: () => hook.enable(), disable: () => hook.disable() };
}

const strategy = selectStrategy();

/**
 * Makes `manager` the publisher: `publishFn(store)` runs at every callback
 * start. Returns the manager it replaces, or null.
 */
function activate(manager, publishFn) {
  const previous = activeManager;
  if (previous === null) strategy.enable();
  activeManager = manager;
  storage = manager._asyncLocalStorage;
  publish = publishFn;
  return previous;
}

/** Returns true when `manager` was the one publishing (and now none is). */
function deactivate(manager) {
  if (activeManager !== manager) return false;
  activeManager = null;
  strategy.disable();
  storage = null;
  publish = null;
  return true;
}

module.exports = { activate, deactivate, strategy: strategy.name };
