'use strict';
// Warnings about the application's own configuration (a misspelt option, a
// bad OTEL_THREAD_CTX_MODE, frame mode refused where it was expected): each
// said once per thread, where the user will see it. Through the
// OpenTelemetry diag logger when the application set one; otherwise as a
// Node.js process warning on stderr (`--no-warnings` silences it as any
// other), because diag's default logger prints nothing and a mistake there
// would stay silent.

const { diag } = require('@opentelemetry/api');

const said = new Set();

/** Whether some copy of `@opentelemetry/api` on this thread has a diag logger set. */
function diagLoggerSet() {
  // The API keeps its globals on a `Symbol.for('opentelemetry.js.api.<major>')`
  // key of globalThis, `diag` among them once setLogger() was called.
  for (const key of Object.getOwnPropertySymbols(globalThis)) {
    const description = key.description;
    if (description !== undefined && description.startsWith('opentelemetry.js.api.')) {
      const globals = globalThis[key];
      if (typeof globals === 'object' && globals !== null && globals.diag !== undefined) return true;
    }
  }
  return false;
}

/** Says `message` once, through diag when a logger is set, else on stderr. Cannot throw. */
function warnOnce(message) {
  if (said.has(message)) return;
  said.add(message);
  const text = `otel-thread-ctx: ${message}`;
  try {
    if (diagLoggerSet()) {
      diag.warn(text);
      return;
    }
    process.emitWarning(text, { code: 'OTEL_THREAD_CTX_CONFIG' });
  } catch {
    // A throwing diag logger or warning listener: nothing else to report to.
  }
}

/** The known key closest to `key` in edit distance, when close enough to be a likely typo. */
function closest(key, known) {
  let best = null;
  let bestDistance = Infinity;
  for (const candidate of known) {
    const distance = editDistance(key.toLowerCase(), candidate.toLowerCase());
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return bestDistance <= Math.max(2, Math.floor(key.length / 4)) ? best : null;
}

function editDistance(a, b) {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    previous = current;
  }
  return previous[b.length];
}

/**
 * Warns once about each own key of `options` that `known` does not list:
 * the option is ignored, which a typo would otherwise make silent.
 */
function warnUnknownOptions(options, known, what) {
  let keys;
  try {
    keys = Object.keys(options);
  } catch {
    return;
  }
  for (const key of keys) {
    if (known.includes(key)) continue;
    const guess = closest(key, known);
    warnOnce(`${what}: unknown option "${key}" is ignored${guess === null ? '' : ` (did you mean "${guess}"?)`}; known options: ${known.join(', ')}`);
  }
}

module.exports = { warnOnce, warnUnknownOptions };
