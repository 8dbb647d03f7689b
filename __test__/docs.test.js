'use strict';
// The documents stay true to the package: every JavaScript block in
// README.md and docs/*.md runs against this checkout, every reader command
// shown in a shell block parses with the current reader, and every relative
// link (and its #anchor) leads somewhere.
//
// A block that cannot run on its own says so just before it, with
// `<!-- not run: why -->`; those are counted and listed, never run.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const native = require('../js/native');
const { scratchDir } = require('./helpers');

const ROOT = path.resolve(__dirname, '..');
const DOCS = path.join(ROOT, 'docs');
const docsFiles = fs.readdirSync(DOCS).filter((f) => f.endsWith('.md')).sort().map((f) => path.join('docs', f));
/** Documents whose JavaScript runs. */
const RUN_JS = ['README.md', ...docsFiles];
/** Documents whose reader commands are checked (the CLI's README too). */
const CHECK_CLI = [...RUN_JS, 'crates/cli/README.md', 'demo/README.md'];
/** Documents whose links are checked. */
const CHECK_LINKS = [...CHECK_CLI, 'BENCHMARKS.md'];

const JS_LANGS = new Set(['js', 'javascript']);
const SHELL_LANGS = new Set(['sh', 'bash', 'shell', 'console']);
const NOT_RUN = /^<!--\s*not run:\s*(.+?)\s*-->$/;

/**
 * The fenced code blocks of a Markdown file: {lang, line (1-based, of the
 * opening fence), lines, notRun (the reason, or null)}.
 */
function codeBlocks(file) {
  const lines = fs.readFileSync(path.join(ROOT, file), 'utf8').split('\n');
  const blocks = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([^\s`]*)/.exec(lines[i]);
    if (!open) continue;
    const [, indent, fence, lang] = open;
    let before = i - 1;
    while (before >= 0 && lines[before].trim() === '') before--;
    const marker = before >= 0 ? NOT_RUN.exec(lines[before].trim()) : null;
    const body = [];
    let j = i + 1;
    for (; j < lines.length; j++) {
      const line = lines[j];
      if (line.trim().startsWith(fence[0].repeat(fence.length)) && line.trim().replace(/[`~]/g, '') === '') break;
      body.push(line.startsWith(indent) ? line.slice(indent.length) : line.trimStart());
    }
    assert.ok(j < lines.length, `${file}:${i + 1}: a code block that is never closed`);
    blocks.push({ lang: lang.toLowerCase(), line: i + 1, lines: body, notRun: marker ? marker[1] : null });
    i = j;
  }
  return blocks;
}

/** A scratch application: `otel-thread-ctx` is this checkout, `@opentelemetry/*` its dependencies. */
function scratchApp() {
  const dir = scratchDir('otel-thread-ctx-docs-');
  fs.mkdirSync(path.join(dir, 'node_modules'));
  fs.symlinkSync(ROOT, path.join(dir, 'node_modules', 'otel-thread-ctx'), 'dir');
  fs.symlinkSync(path.join(ROOT, 'node_modules', '@opentelemetry'), path.join(dir, 'node_modules', '@opentelemetry'), 'dir');
  fs.writeFileSync(path.join(dir, 'package.json'), '{"private":true}\n');
  return dir;
}

/** The environment a snippet runs in: the caller's, without the test runner's own variables. */
function snippetEnv() {
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  delete env.NODE_OPTIONS;
  delete env.OTEL_THREAD_CTX_MODE;
  return env;
}

test('every JavaScript block in README.md and docs/ runs against the built package', async (t) => {
  const app = scratchApp();
  t.after(() => fs.rmSync(app, { recursive: true, force: true }));
  let ran = 0;
  const skipped = [];
  for (const file of RUN_JS) {
    for (const block of codeBlocks(file).filter((b) => JS_LANGS.has(b.lang))) {
      const where = `${file}:${block.line}`;
      if (block.notRun !== null) {
        skipped.push(`${where} (${block.notRun})`);
        continue;
      }
      await t.test(where, () => {
        const script = path.join(app, `${file.replace(/[/.]/g, '_')}_${block.line}.js`);
        fs.writeFileSync(script, `${block.lines.join('\n')}\n`);
        // A guard against a block that never ends, not a measurement.
        const r = spawnSync(process.execPath, [script], { cwd: app, env: snippetEnv(), encoding: 'utf8', timeout: 120000 });
        const output = `\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;
        assert.strictEqual(r.error, undefined, `${where}: ${r.error?.message}${output}`);
        assert.strictEqual(r.signal, null, `${where}: ended by ${r.signal}${output}`);
        assert.strictEqual(r.status, 0, `${where}: exit ${r.status}${output}`);
        assert.strictEqual(r.stderr, '', `${where}: wrote to stderr${output}`);
      });
      ran++;
    }
  }
  t.diagnostic(`${ran} blocks run; ${skipped.length} not run${skipped.length ? `: ${skipped.join('; ')}` : ''}`);
  assert.ok(ran >= 4, `only ${ran} JavaScript blocks found: the quick start has at least four`);
});

/**
 * The reader commands of a shell block: each logical line (continuations
 * joined) that runs `otel-thread-ctx`, as its arguments, with placeholders
 * (`<pid>`, `$(pidof node)`, `$PID`) replaced by a number.
 */
function readerCommands(block) {
  const logical = [];
  let pending = null;
  for (const [i, line] of block.lines.entries()) {
    pending ??= { line: block.line + 1 + i, text: '' };
    if (line.endsWith('\\')) {
      pending.text += `${line.slice(0, -1)} `;
      continue;
    }
    pending.text += line;
    logical.push(pending);
    pending = null;
  }
  const commands = [];
  for (const { line: at, text } of logical) {
    const line = text
      .trim()
      .replace(/^\$\s+/, '')
      .replace(/^sudo\s+(-E\s+)?/, '')
      .replace(/^([A-Z_][A-Z0-9_]*=\S*\s+)+/, '');
    const head = /^(?:npx\s+(?:--no-install\s+)?)?(?:\S*\/)?otel-thread-ctx(?=\s|$)/.exec(line);
    if (!head) continue;
    const args = shellWords(line.slice(head[0].length).replace(/<[^>]+>|\$\([^)]*\)|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/g, '1'));
    commands.push({ line: at, text: text.trim().replace(/\s+/g, ' '), args });
  }
  return commands;
}

/** Splits a shell command line into words (quotes, backslashes), up to an unquoted `#` comment. */
function shellWords(line) {
  const words = [];
  let word = null;
  let quote = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote !== null) {
      if (c === quote) quote = null;
      else if (c === '\\' && quote === '"' && i + 1 < line.length) word += line[++i];
      else word += c;
    } else if (c === '"' || c === "'") {
      quote = c;
      word ??= '';
    } else if (c === '\\' && i + 1 < line.length) {
      word = (word ?? '') + line[++i];
    } else if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else if (c === '#' && word === null) {
      break;
    } else {
      word = (word ?? '') + c;
    }
  }
  assert.strictEqual(quote, null, `unterminated quote in: ${line}`);
  if (word !== null) words.push(word);
  return words;
}

test('every reader command in the documents parses with the current reader', async (t) => {
  const reader = native.readerPath();
  assert.ok(reader !== null, 'the reader is built (npm install)');
  let checked = 0;
  for (const file of CHECK_CLI) {
    for (const block of codeBlocks(file).filter((b) => SHELL_LANGS.has(b.lang))) {
      for (const command of readerCommands(block)) {
        const where = `${file}:${command.line}`;
        await t.test(`${where}: ${command.text}`, () => {
          const r = spawnSync(reader, ['--check-args', ...command.args], { encoding: 'utf8', timeout: 60000 });
          assert.strictEqual(r.status, 0, `${where}: \`${command.text}\` does not parse (exit ${r.status}):\n${r.stderr}`);
        });
        checked++;
      }
    }
  }
  t.diagnostic(`${checked} reader commands checked`);
  assert.ok(checked >= 10, `only ${checked} reader commands found`);
});

test('the parse-only check rejects what the reader rejects, and commands are found in shell blocks', () => {
  const reader = native.readerPath();
  assert.ok(reader !== null, 'the reader is built (npm install)');
  const bad = spawnSync(reader, ['--check-args', 'profile', '--pid', '1', '--format', 'gif'], { encoding: 'utf8' });
  assert.strictEqual(bad.status, 2, bad.stderr);
  const good = spawnSync(reader, ['--check-args', 'profile', '--pid', '1', '--format', 'svg'], { encoding: 'utf8' });
  assert.strictEqual(good.status, 0, good.stderr);
  assert.strictEqual(good.stdout + good.stderr, '', 'parse-only prints nothing');
  assert.deepStrictEqual(
    readerCommands({ line: 10, lines: ['node --require otel-thread-ctx/register app.js', 'sudo npx otel-thread-ctx profile --pid <pid> \\', '  --format "top"   # a comment'] }),
    [{ line: 12, text: 'sudo npx otel-thread-ctx profile --pid <pid> --format "top" # a comment', args: ['profile', '--pid', '1', '--format', 'top'] }],
  );
});

/** GitHub's anchors for the headings of a Markdown file. */
function anchors(file) {
  const seen = new Map();
  const out = new Set();
  let inFence = false;
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (/^\s*(`{3,}|~{3,})/.test(line)) inFence = !inFence;
    const heading = inFence ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!heading) continue;
    const base = heading[1]
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

test('every relative link in the documents leads to a file (and heading) that exists', () => {
  const broken = [];
  let checked = 0;
  for (const file of CHECK_LINKS) {
    const lines = fs.readFileSync(path.join(ROOT, file), 'utf8').split('\n');
    let inFence = false;
    for (const [i, line] of lines.entries()) {
      if (/^\s*(`{3,}|~{3,})/.test(line)) inFence = !inFence;
      if (inFence) continue;
      const prose = line.replace(/`[^`]*`/g, '');
      for (const [, target] of prose.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
        checked++;
        const [ref, anchor] = target.split('#');
        const resolved = ref === '' ? path.join(ROOT, file) : path.resolve(path.dirname(path.join(ROOT, file)), decodeURIComponent(ref));
        const where = `${file}:${i + 1}: ${target}`;
        if (!fs.existsSync(resolved)) broken.push(`${where} (no such file)`);
        else if (anchor !== undefined && resolved.endsWith('.md') && !anchors(resolved).has(anchor)) broken.push(`${where} (no such heading)`);
      }
    }
  }
  assert.deepStrictEqual(broken, []);
  assert.ok(checked > 10, `only ${checked} links found`);
});
