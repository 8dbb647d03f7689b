'use strict';
// setSpanContext / clearSpanContext: the direct API for code that tracks
// spans itself. Written in JavaScript over the record view rather than as
// napi functions: napi-rs's per-call wrapper and the BigInt argument
// conversions cost several times the write itself (BENCHMARKS.md). Every
// argument is validated before the record is touched, so an error leaves
// the published record unchanged.

const view = require('./record-view');

const U64_LIMIT = 1n << 64n;

function invalidType(name, expected) {
  const err = new TypeError(`The "${name}" argument must be of type ${expected}`);
  err.code = 'ERR_INVALID_ARG_TYPE';
  return err;
}

function outOfRange(message) {
  const err = new RangeError(message);
  err.code = 'ERR_OUT_OF_RANGE';
  return err;
}

function checkU64(value, name) {
  if (typeof value !== 'bigint') throw invalidType(name, 'bigint');
  if (value < 0n || value >= U64_LIMIT) throw outOfRange(`The "${name}" argument must be >= 0n and < 2n ** 64n`);
}

/**
 * Publishes a span in the calling thread's record. `traceIdHigh` is the
 * first 8 bytes of the W3C trace id as a big-endian number.
 */
function setSpanContext(traceIdHigh, traceIdLow, spanId, traceFlags) {
  checkU64(traceIdHigh, 'traceIdHigh');
  checkU64(traceIdLow, 'traceIdLow');
  checkU64(spanId, 'spanId');
  let flags = 0;
  if (traceFlags !== undefined) {
    if (typeof traceFlags !== 'number') throw invalidType('traceFlags', 'number');
    if (!Number.isInteger(traceFlags) || traceFlags < 0 || traceFlags > 255) {
      throw outOfRange('The "traceFlags" argument must be an integer in 0..255');
    }
    flags = traceFlags;
  }
  if (traceIdHigh === 0n && traceIdLow === 0n) throw outOfRange('The trace id must not be all zeroes (W3C invalid)');
  if (spanId === 0n) throw outOfRange('The span id must not be all zeroes (W3C invalid)');
  view.publishIds(traceIdHigh, traceIdLow, spanId, flags);
}

/** Marks the calling thread's record as carrying no span. */
function clearSpanContext() {
  view.clear();
}

module.exports = { setSpanContext, clearSpanContext };
