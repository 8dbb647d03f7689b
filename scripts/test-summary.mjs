// node:test reporter that prints, after every other reporter's output, one
// line per failing test (file and full name) and the totals, so the end of
// `npm test` always says what failed, on every Node version. A test marked
// todo that fails is a known gap, not a failure (node:test does not fail
// the run for it): it is listed apart, with its reason.
import path from 'node:path';

export default async function* summary(source) {
  const failed = [];
  const todos = [];
  let passed = 0;
  let skipped = 0;
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { name, file, details, skip, todo } = event.data;
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
  yield text;
}
