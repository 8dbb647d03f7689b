'use strict';
// The JavaScript side's modules depend on each other one way: the manager
// (context-manager.js) on the publishers, the publishers on what a span
// carries (span-records.js), and so on down; no module requires one that
// requires it back, and only the package's entry points require the manager.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..');
const JS = path.join(ROOT, 'js');

function modules(dir) {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const file = path.join(dir, entry.name);
    if (entry.isDirectory()) return modules(file);
    return entry.name.endsWith('.js') ? [file] : [];
  });
}

/** Each module of js/ and the js/ modules it requires (anywhere in its body). */
function graph() {
  const edges = new Map();
  for (const file of modules(JS)) {
    const source = fs.readFileSync(file, 'utf8');
    const targets = [...source.matchAll(/require\('(\.{1,2}\/[^']+)'\)/g)].map(([, spec]) => {
      const resolved = path.resolve(path.dirname(file), spec);
      return resolved.endsWith('.js') ? resolved : `${resolved}.js`;
    });
    edges.set(file, targets.filter((target) => target.startsWith(JS + path.sep)));
  }
  return edges;
}

const rel = (file) => path.relative(ROOT, file);

test('no module of js/ requires, directly or not, a module that requires it', () => {
  const edges = graph();
  assert.ok(edges.size >= 10, `only ${edges.size} modules found`);
  const state = new Map();
  const cycles = [];
  const visit = (file, trail) => {
    if (state.get(file) === 'done') return;
    if (state.get(file) === 'open') {
      cycles.push([...trail.slice(trail.indexOf(file)), file].map(rel).join(' -> '));
      return;
    }
    state.set(file, 'open');
    for (const next of edges.get(file) ?? []) visit(next, [...trail, file]);
    state.set(file, 'done');
  };
  for (const file of edges.keys()) visit(file, []);
  assert.deepStrictEqual(cycles, []);
});

test('only the entry points require the manager', () => {
  const manager = path.join(JS, 'context-manager.js');
  const requirers = [...graph()].filter(([, targets]) => targets.includes(manager)).map(([file]) => rel(file));
  assert.deepStrictEqual(requirers, []);
});
