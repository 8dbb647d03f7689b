'use strict';
// On-CPU stacks of the demo service collected by bpftrace (when the
// reader's `profile` command is not available), tagged with each sampled
// thread's record.

const bpftrace = require('../../tools/bpftrace');
const { stackProgram, parseStacks } = require('../../tools/record-sampler');
const reader = require('../../bench/accuracy/reader');
const { track } = require('./processes');

/**
 * Where otel_thread_ctx_v1 sits from the thread pointer: the reader's
 * `inspect --json` when it is available, else fs_base read by bpftrace while
 * `warm()` gives the threads work (fs_base is read at a system call).
 */
async function findTlsOffset(pid, threads, { useReader, warm }) {
  const registered = threads.filter((t) => t.tlsAddress);
  const offset = useReader ? reader.tlsOffset(pid, registered) : null;
  if (offset !== null) return offset;
  const warming = warm();
  const found = await bpftrace.discoverTlsOffset(pid, registered);
  await warming;
  return found.offset;
}

/**
 * Starts counting user stacks of `pid` at `hz`; `stop()` resolves with
 * the parsed stacks (tools/record-sampler.js parseStacks) and how many lines
 * bpftrace printed.
 */
async function startStacks(pid, offset, { hz, maxSeconds }) {
  let text = '';
  // One target process: caching its symbols is safe, and naming every
  // frame without the cache is far slower.
  const bt = await bpftrace.startBpftrace(stackProgram({ pid, offset, hz, maxSeconds }), {
    onLine: (l) => (text += `${l}\n`),
    env: { BPFTRACE_CACHE_USER_SYMBOLS: '1' },
  });
  track(bt.child);
  return {
    async stop() {
      await bt.stop(30000);
      return { entries: parseStacks(text), lines: text.split('\n').length };
    },
  };
}

module.exports = { findTlsOffset, startStacks };
