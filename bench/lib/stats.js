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

module.exports = { median, summarize };
