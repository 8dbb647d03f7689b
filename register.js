'use strict';
// Early-load entry point: `node --require otel-thread-ctx/register app.js`.
//
// glibc places the TLS block of a dlopen'ed module in static TLS only while
// the static TLS surplus it reserved at startup lasts; addons loaded before
// this one may use it up, and then `otel_thread_ctx_v1` lands in dynamic TLS,
// which some profilers cannot read. Preloading the addon before the
// application's own code runs (and so before it loads other addons) keeps it
// in static TLS. Registering the thread is all that loading does: enable a
// ProfilingContextManager as usual. Preload modules run in worker threads
// too, which registers them as they start.
require('./index.js');
