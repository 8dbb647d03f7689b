'use strict';
// The Rust workspace's crates depend on each other one way: the reader at
// the bottom (above the ABI and the OTLP messages), then the profiler, the
// output formats, the agent, and the CLI on top. Cargo already refuses a
// cycle between crates; these tests keep a crate from depending on one above
// it, and the modules inside each crate from importing each other in a
// circle.
const test = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..');

// Each workspace crate and the workspace crates it may depend on (normal,
// build or dev dependencies alike).
const ALLOWED = {
  'otel-thread-ctx-abi': [],
  'otel-thread-ctx-otlp': ['otel-thread-ctx-abi'],
  'otel-thread-ctx': ['otel-thread-ctx-abi', 'otel-thread-ctx-otlp'],
  'otel-thread-ctx-reader': ['otel-thread-ctx-abi', 'otel-thread-ctx-otlp'],
  'otel-thread-ctx-profiler': ['otel-thread-ctx-abi', 'otel-thread-ctx-otlp', 'otel-thread-ctx-reader'],
  'otel-thread-ctx-formats': ['otel-thread-ctx-abi', 'otel-thread-ctx-otlp', 'otel-thread-ctx-reader', 'otel-thread-ctx-profiler'],
  'otel-thread-ctx-agent': [
    'otel-thread-ctx-abi', 'otel-thread-ctx-otlp', 'otel-thread-ctx-reader', 'otel-thread-ctx-profiler',
    'otel-thread-ctx-formats',
  ],
  'otel-thread-ctx-cli': [
    'otel-thread-ctx-abi', 'otel-thread-ctx-otlp', 'otel-thread-ctx-reader', 'otel-thread-ctx-profiler',
    'otel-thread-ctx-formats', 'otel-thread-ctx-agent',
  ],
  'otel-thread-ctx-flamegraph': [],
};

/** The workspace's packages as `cargo metadata` describes them (no registry access). */
function workspace() {
  const r = spawnSync('cargo', ['metadata', '--format-version', '1', '--no-deps', '--offline'], {
    cwd: ROOT,
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.error || r.status !== 0) return null;
  return JSON.parse(r.stdout).packages;
}

test('each workspace crate depends only on the crates below it', (t) => {
  const packages = workspace();
  if (packages === null) return t.skip('cargo metadata is not available');
  const names = new Set(packages.map((p) => p.name));
  for (const name of Object.keys(ALLOWED)) assert.ok(names.has(name), `${name} is a workspace crate`);
  const wrong = [];
  for (const p of packages) {
    const allowed = ALLOWED[p.name];
    assert.ok(allowed, `${p.name} has a place in the layering (add it to ALLOWED)`);
    for (const dep of p.dependencies) {
      if (names.has(dep.name) && !allowed.includes(dep.name)) wrong.push(`${p.name} -> ${dep.name}`);
    }
  }
  assert.deepStrictEqual(wrong, []);
});

test('the reader crate has no command-line or output dependency', (t) => {
  const packages = workspace();
  if (packages === null) return t.skip('cargo metadata is not available');
  const reader = packages.find((p) => p.name === 'otel-thread-ctx-reader');
  const deps = reader.dependencies.map((d) => d.name);
  for (const outside of ['clap', 'aya', 'blazesym', 'inferno', 'flate2', 'tonic', 'hyper']) {
    assert.ok(!deps.includes(outside), `the reader depends on ${outside}`);
  }
});

/** The .rs files of a crate's src/, each with its module path (`a::b`, '' for the root). */
function rustModules(src) {
  const out = new Map();
  const visit = (dir, prefix) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const file = path.join(dir, entry.name);
      if (entry.isDirectory()) {
        visit(file, [...prefix, entry.name]);
      } else if (entry.name.endsWith('.rs')) {
        const stem = entry.name.slice(0, -3);
        const atRoot = prefix.length === 0 && ['lib', 'main'].includes(stem);
        const mod = atRoot ? prefix : stem === 'mod' ? prefix : [...prefix, stem];
        out.set(mod.join('::'), file);
      }
    }
  };
  visit(src, []);
  return out;
}

/**
 * The modules each module of a crate imports: every `crate::`, `super::` or
 * `self::` path, and the child modules it names, resolved to the deepest
 * module of the crate they lead to. Unit tests (`#[cfg(test)] mod tests`,
 * last in a file by this code's convention) are left out: they may use
 * what the code they test uses.
 */
function moduleGraph(src) {
  const modules = rustModules(src);
  const edges = new Map();
  for (const [mod, file] of modules) {
    let source = fs.readFileSync(file, 'utf8');
    const tests = source.search(/#\[cfg\(test\)\]\s*(pub(\(crate\))? )?mod tests\b/);
    if (tests >= 0) source = source.slice(0, tests);
    source = source.replace(/\/\/.*$/gm, '');
    const here = mod === '' ? [] : mod.split('::');
    // A file module's `super` is its parent; a directory's mod.rs is the module itself.
    const isDirModule = path.basename(file) === 'mod.rs' || here.length === 0;
    const targets = new Set();
    const resolve = (segments) => {
      for (let n = segments.length; n > 0; n--) {
        const key = segments.slice(0, n).join('::');
        if (modules.has(key)) return key;
      }
      return '';
    };
    const paths = [];
    for (const [, head, tail] of source.matchAll(/\b(crate|super|self)((?:::\w+)+)/g)) paths.push([head, tail.slice(2).split('::')]);
    for (const [, head, list] of source.matchAll(/\b(crate|super|self)::\{([^}]*)\}/g)) {
      for (const item of list.split(',')) {
        const name = item.trim().split(/\s|::/)[0];
        if (/^\w+$/.test(name) && name !== 'self') paths.push([head, [name]]);
      }
    }
    for (const [head, rest] of paths) {
      let base;
      if (head === 'crate') base = [];
      else if (head === 'self') base = here;
      else base = isDirModule ? here.slice(0, -1) : here.slice(0, -2);
      const target = resolve([...base, ...rest]);
      // The crate root only declares the modules and re-exports their items.
      if (target !== mod && target !== '') targets.add(target);
    }
    // Child modules named by their own name (`kernel::Kind` in the parent).
    const childBase = isDirModule ? here : here.slice(0, -1);
    for (const key of modules.keys()) {
      const segments = key.split('::');
      if (key === '' || segments.length !== childBase.length + 1) continue;
      if (segments.slice(0, -1).join('::') !== childBase.join('::') || key === mod) continue;
      const name = segments[segments.length - 1];
      if (new RegExp(`(?<![:\\w])${name}::`).test(source) && isDirModule) targets.add(key);
    }
    targets.delete(mod);
    edges.set(mod, [...targets]);
  }
  return edges;
}

function cycles(edges) {
  const state = new Map();
  const found = [];
  const visit = (mod, trail) => {
    if (state.get(mod) === 'done') return;
    if (state.get(mod) === 'open') {
      found.push([...trail.slice(trail.indexOf(mod)), mod].map((m) => m || 'crate').join(' -> '));
      return;
    }
    state.set(mod, 'open');
    for (const next of edges.get(mod) ?? []) visit(next, [...trail, mod]);
    state.set(mod, 'done');
  };
  for (const mod of edges.keys()) visit(mod, []);
  return found;
}

for (const crate of ['reader', 'profiler', 'formats', 'agent', 'cli']) {
  test(`no module of crates/${crate} imports, directly or not, a module that imports it`, () => {
    const src = path.join(ROOT, 'crates', crate, 'src');
    const edges = moduleGraph(src);
    assert.ok(edges.size >= 2, `only ${edges.size} modules found in ${src}`);
    assert.deepStrictEqual(cycles(edges), []);
  });
}
