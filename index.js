'use strict';
// otel-thread-ctx: publishes the active OpenTelemetry span of every Node.js
// thread as an OTEP 4947 Thread-Local Context Record for out-of-process
// profilers. Requiring this module registers the calling thread.

const binding = require('./js/binding');
const { ProfilingContextManager, publishingMode } = require('./js/context-manager');
const { setSpanContext, clearSpanContext } = require('./js/direct-api');
const processContext = require('./js/process-context');
const { ProfileIdSpanProcessor } = require('./js/profile-id-processor');

/**
 * Diagnostics for the calling thread: its registration, the mode its
 * publishing manager uses (and why not frame), and its frame-mode block.
 */
function threadInfo() {
  const { mode, frameUnavailableReason } = publishingMode();
  return { ...binding.threadInfo(), mode, frameUnavailableReason, frame: binding.frameInfo() ?? null };
}

module.exports = {
  ProfilingContextManager,
  setSpanContext,
  clearSpanContext,
  threadInfo,
  registryStats: binding.registryStats,
  // Process context (OTEP 4719): resource attributes and the record key map.
  ProcessContextSpanProcessor: processContext.ProcessContextSpanProcessor,
  publishProcessContext: processContext.publishProcessContext,
  registerAttributeKeys: processContext.registerAttributeKeys,
  processContextInfo: processContext.processContextInfo,
  // Trace-to-profile links for Grafana (`pyroscope.profile.id`).
  ProfileIdSpanProcessor,
};
