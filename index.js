'use strict';
// otel-thread-ctx: publishes the active OpenTelemetry span of every Node.js
// thread as an OTEP 4947 Thread-Local Context Record for out-of-process
// profilers. Requiring this module registers the calling thread.

const binding = require('./js/binding');
const { ProfilingContextManager } = require('./js/context-manager');
const { setSpanContext, clearSpanContext } = require('./js/direct-api');
const processContext = require('./js/process-context');

module.exports = {
  ProfilingContextManager,
  setSpanContext,
  clearSpanContext,
  threadInfo: binding.threadInfo,
  registryStats: binding.registryStats,
  // Process context (OTEP 4719): resource attributes and the record key map.
  ProcessContextSpanProcessor: processContext.ProcessContextSpanProcessor,
  publishProcessContext: processContext.publishProcessContext,
  registerAttributeKeys: processContext.registerAttributeKeys,
  processContextInfo: processContext.processContextInfo,
};
