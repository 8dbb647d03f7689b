'use strict';
// otel-thread-ctx: publishes the active OpenTelemetry span of every Node.js
// thread as an OTEP 4947 Thread-Local Context Record for out-of-process
// profilers. Requiring this module registers the calling thread.

const binding = require('./js/binding');
const { ProfilingContextManager } = require('./js/context-manager');

module.exports = {
  ProfilingContextManager,
  setSpanContext: binding.setSpanContext,
  clearSpanContext: binding.clearSpanContext,
  threadInfo: binding.threadInfo,
  registryStats: binding.registryStats,
};
