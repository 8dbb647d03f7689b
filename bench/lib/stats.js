'use strict';
// Summaries of per-round values: median with the spread (min, max).

function median(values) {
  const s = [...values].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** { median, min, max, n } of finite values, or null when there are none. */
function summarize(values) {
  const v = values.filter((x) => Number.isFinite(x));
  if (v.length === 0) return null;
  return { median: median(v), min: Math.min(...v), max: Math.max(...v), n: v.length };
}

/**
 * The median over cycles of `a[i] / b[i]` (or `a[i] - b[i]` with
 * `difference`): two variants' turns in the same cycle compared, for
 * turns taken in one process (bench/lib/turns.js).
 */
function pairedMedian(a, b, { difference = false } = {}) {
  const n = Math.min(a.length, b.length);
  const values = [];
  for (let i = 0; i < n; i++) values.push(difference ? a[i] - b[i] : a[i] / b[i]);
  return median(values);
}

module.exports = { median, summarize, pairedMedian };
