'use strict';
// The built addon exports otel_thread_ctx_v1 the way profilers look for it.
const test = require('node:test');
const assert = require('node:assert');
const { execFileSync } = require('node:child_process');

const addon = require('../js/native').addonPath();
const readelf = (flags) => execFileSync('readelf', [...flags, addon], { encoding: 'utf8' });

test('otel_thread_ctx_v1 is an 8-byte global TLS symbol in .dynsym', () => {
  const line = readelf(['--dyn-syms', '-W']).split('\n').find((l) => / otel_thread_ctx_v1$/.test(l));
  assert.ok(line, 'symbol missing from .dynsym');
  const [, value, size, type, bind, vis, ndx] = line.trim().split(/\s+/);
  assert.strictEqual(Number(size), 8);
  assert.strictEqual(type, 'TLS');
  assert.strictEqual(bind, 'GLOBAL');
  assert.strictEqual(vis, 'DEFAULT');
  assert.notStrictEqual(ndx, 'UND', 'symbol must be defined by the addon');
  assert.match(value, /^[0-9a-f]+$/);
});

test('otel_thread_ctx_v1 is accessed through a TLSDESC relocation', () => {
  const relocs = readelf(['-r', '-W']).split('\n').filter((l) => /otel_thread_ctx_v1/.test(l));
  assert.ok(relocs.length >= 1, 'no relocation against otel_thread_ctx_v1');
  for (const r of relocs) assert.match(r, /R_X86_64_TLSDESC|R_AARCH64_TLSDESC/, r);
});

test('the addon keeps frame pointers for eBPF unwinders', () => {
  // Every function of the addon's own crate must set up a frame pointer:
  // look for the canonical prologue in each one's object code.
  const asm = execFileSync('objdump', ['-d', '--no-show-raw-insn', addon], { encoding: 'utf8', maxBuffer: 1 << 28 });
  const functions = asm.split('\n\n').filter((block) => /^[0-9a-f]+ <_ZN15otel_thread_ctx[^>]*>:/.test(block));
  assert.ok(functions.length >= 10, `only ${functions.length} functions of the crate found`);
  const names = functions.map((f) => f.split('\n')[0]);
  assert.ok(names.some((n) => /on_prepare/.test(n)), 'the idle callback libuv calls is among them');
  for (const fn of functions) {
    assert.match(fn, /push\s+%rbp\s*\n.*mov\s+%rsp,%rbp/, `no frame pointer in ${fn.split('\n')[0]}`);
  }
});
