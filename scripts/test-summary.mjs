// node:test reporter that prints, after every other reporter's output, one
// line per failing test (file and full name) and the totals, so the end of
// `npm test` always says what failed, on every Node version. A test marked
// todo that fails is a known gap, not a failure (node:test does not fail
// the run for it): it is listed apart, with its reason. Then the slowest
// suites, by the time their top-level tests took: what to look at when the
// run grows long.
import path from 'node:path';

const SLOWEST_SHOWN = 10;

export default async function* summary(source) {
  const failed = [];
  const todos = [];
  let passed = 0;
  let skipped = 0;
  /** Per suite file: seconds its top-level tests took. */
  const suiteSeconds = new Map();
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { name, file, details, skip, todo, nesting } = event.data;
    if (nesting === 0 && file && typeof details?.duration_ms === 'number') {
      const suite = path.relative(process.cwd(), file);
      suiteSeconds.set(suite, (suiteSeconds.get(suite) ?? 0) + details.duration_ms / 1000);
    }
    if (details?.type === 'suite') continue;
    if (event.type === 'test:pass') {
      if (skip || todo) skipped++;
      else passed++;
      continue;
    }
    // A parent that failed only because a subtest did is not a failure of its own.
    if (details?.error?.failureType === 'subtestsFailed') continue;
    const where = file ? `${path.relative(process.cwd(), file)}: ` : '';
    if (todo) todos.push(`${where}${name}${typeof todo === 'string' ? ` (${todo})` : ''}`);
    else failed.push(`${where}${name}`);
  }
  let text = `\n== node ${process.version}: ${passed} passed, ${failed.length} failed, ${skipped} skipped, ${todos.length} todo failing\n`;
  if (failed.length > 0) text += `failing tests:\n${failed.map((f) => `  ✖ ${f}\n`).join('')}`;
  if (todos.length > 0) text += `todo (known gaps, failing as expected):\n${todos.map((f) => `  ⚠ ${f}\n`).join('')}`;
  const slowest = [...suiteSeconds].sort((a, b) => b[1] - a[1]).slice(0, SLOWEST_SHOWN);
  if (slowest.length > 0) {
    const total = [...suiteSeconds.values()].reduce((sum, seconds) => sum + seconds, 0);
    text += `slowest suites (of ${Math.round(total)} s in all):\n${slowest.map(([suite, seconds]) => `  ${seconds.toFixed(1).padStart(6)} s  ${suite}\n`).join('')}`;
  }
  yield text;
}
