'use strict';
// Bytes allocated on the V8 heap and GCs between two reads, for a server
// measuring its bursts (bench/lib/common.js, answerSwitches). The method of
// bench/cases/memory.js: one v8.GCProfiler session spans each window, and
//   allocated = used_heap_size(end) - used_heap_size(start)
//             + sum over the window's GCs of (used before GC - used after GC).
// (total_allocated_bytes in v8.getHeapStatistics() would do, but only
// Node 26 has it.) A read ends the window and starts the next one in the
// same synchronous step: a window counts what was allocated between its
// two reads, the reads' own few objects aside.

const v8 = require('node:v8');

/** Young-generation GCs (V8 names them by its collector). */
const MINOR = new Set(['Scavenge', 'MinorMarkSweep', 'MinorMarkCompact']);

function heapWindows() {
  let profiler = null;
  let start = 0;
  /**
   * Ends the current window and starts the next: { bytes, scavenges, gcs }
   * of the window just ended (null for the first read, which only starts one).
   */
  return function read() {
    let window = null;
    if (profiler !== null) {
      const end = v8.getHeapStatistics().used_heap_size;
      const { statistics } = profiler.stop();
      let freed = 0;
      let scavenges = 0;
      for (const gc of statistics) {
        freed += gc.beforeGC.heapStatistics.usedHeapSize - gc.afterGC.heapStatistics.usedHeapSize;
        if (MINOR.has(gc.gcType)) scavenges++;
      }
      window = { bytes: end - start + freed, scavenges, gcs: statistics.length };
    }
    profiler = new v8.GCProfiler();
    profiler.start();
    start = v8.getHeapStatistics().used_heap_size;
    return window;
  };
}

module.exports = { heapWindows };
