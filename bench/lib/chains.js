'use strict';
// Request-like async chains: each runs in the context of its own span and
// awaits 20 times; among those awaits one is a setTimeout(0) hop, two are
// setImmediate hops and one a process.nextTick hop, the rest continue after
// an async function. Many chains are in flight at once, so their contexts
// interleave on every turn of the event loop.

const { context, trace } = require('@opentelemetry/api');
const { spanContext } = require('./common');

const AWAITS_PER_CHAIN = 20;

async function step(k) {
  return k + 1;
}

function timeoutHop(resolve) {
  setTimeout(resolve, 0);
}
function immediateHop(resolve) {
  setImmediate(resolve);
}
function tickHop(resolve) {
  process.nextTick(resolve);
}

async function body() {
  let acc = 0;
  for (let k = 0; k < AWAITS_PER_CHAIN; k++) {
    switch (k) {
      case 4:
        await new Promise(timeoutHop);
        break;
      case 8:
      case 14:
        await new Promise(immediateHop);
        break;
      case 11:
        await new Promise(tickHop);
        break;
      default:
        acc += await step(k);
    }
  }
  return acc;
}

/** One chain: a fresh span context made active for the whole body. */
function chain(n, salt) {
  const ctx = trace.setSpanContext(context.active(), spanContext(n, salt));
  return context.with(ctx, body);
}

/**
 * Runs `total` chains keeping `concurrency` in flight; resolves when all are
 * done. `first` numbers the chains so each gets fresh ids.
 */
function runChains(total, concurrency, first = 0, salt = 0) {
  return new Promise((resolve, reject) => {
    let started = 0;
    let done = 0;
    const onDone = () => {
      done++;
      if (done === total) resolve();
      else if (started < total) next();
    };
    const next = () => {
      started++;
      chain(first + started, salt).then(onDone, reject);
    };
    for (let i = 0; i < Math.min(concurrency, total); i++) next();
  });
}

module.exports = { runChains, AWAITS_PER_CHAIN };
