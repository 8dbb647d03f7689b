'use strict';
// ProfilingContextManager: the stock AsyncLocalStorageContextManager, plus
// publishing this thread's active span for out-of-process profilers, in one
// of two modes. Each mode is one module with the same interface:
// storeFor(context) (what the AsyncLocalStorage stores for a context, whose
// `context` active() returns), activate(manager) and deactivate(manager);
// record mode adds the pointer's swap around a switch (enter, republish,
// publishStore). The manager decides which context is active; the modes
// publish it:
// - frame (./publish/frame.js): the Node.js schema `nodejs_v1_dev`; the
//   AsyncLocalStorage stores a wrapper over the span's native record and a
//   profiler walks V8's AsyncContextFrame to it: nothing runs per async
//   switch. Only where AsyncLocalStorage runs on AsyncContextFrame and the
//   reader's walk verified on the running Node.
// - record (./publish/record.js): the OTEP 4947 record behind
//   `otel_thread_ctx_v1`, pointed at the active span's record on every
//   switch (hooks).
// Both publish the span's own native record (./span-records.js), written
// once per span and kept current in place.
// Default: frame where it verifies, else record; the `mode` option or
// OTEL_THREAD_CTX_MODE chooses explicitly.

const { context: contextApi, diag, ROOT_CONTEXT } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const binding = require('./binding');
const recordMode = require('./publish/record');
const frameMode = require('./publish/frame');
const spanRecords = require('./span-records');
const sdkResource = require('./sdk-resource');
const { schemaFromOptions } = require('./span-attributes');
const { warnOnce, warnUnknownOptions } = require('./warnings');

const MODES = ['record', 'frame'];
/** The options ProfilingContextManager takes; any other key is a mistake worth a warning. */
const MANAGER_OPTIONS = ['attributes', 'localRootAttributes', 'spanName', 'localRootSpanId', 'mode'];
const MODE_VARIABLE = 'OTEL_THREAD_CTX_MODE';

/** The mode a manager asks for: the option, else the environment, else null (default). */
function requestedMode(option) {
  if (option !== undefined) {
    if (typeof option !== 'string') throw new TypeError('The "mode" option must be "record" or "frame"');
    if (!MODES.includes(option)) throw new RangeError(`The "mode" option must be "record" or "frame", not "${option}"`);
    return option;
  }
  const fromEnvironment = process.env[MODE_VARIABLE];
  if (fromEnvironment === undefined || fromEnvironment === '') return null;
  if (MODES.includes(fromEnvironment)) return fromEnvironment;
  warnOnce(`${MODE_VARIABLE}=${fromEnvironment} is not "record" or "frame"; it is ignored`);
  return null;
}

/** Why frame mode is not in force on this thread (null while it is, or before any manager chose). */
let frameUnavailableReason = null;

/**
 * `{ mode, reason }` for a new manager whose AsyncLocalStorage is
 * `storage`: frame unless record was asked for or frame does not verify.
 */
function chooseMode(requested, storage) {
  if (requested === 'record') return { mode: 'record', reason: 'record mode was chosen' };
  const frame = frameMode.availability(storage);
  if (frame.reason === undefined) return { mode: 'frame', reason: null };
  // Expected on Node lines without AsyncContextFrame; a failed verification
  // on a line that has it, or frame asked for explicitly, is worth a warning.
  if (requested === 'frame' || frameMode.usesAsyncContextFrame()) {
    warnOnce(`frame mode is unavailable, publishing in record mode: ${frame.reason}`);
  }
  return { mode: 'record', reason: frame.reason };
}

/**
 * Readers need `threadlocal.schema_version` to interpret the records, so an
 * enabled manager makes sure a process context exists. One published by the
 * application (or ProcessContextSpanProcessor) is left as it is.
 */
function publishMinimalProcessContext() {
  try {
    if (binding.processContextInfo() === null) binding.publishProcessContext({});
  } catch (err) {
    diag.warn(`otel-thread-ctx: cannot publish the process context: ${err.message}`);
  }
}

/**
 * This thread's enabled managers; the last one publishes. Disabling the
 * publisher hands publishing back to the most recently enabled one still
 * enabled.
 */
const enabledManagers = [];
let publisher = null;

/** The API's global context manager, or null where the API does not say. */
function registeredManager() {
  try {
    return typeof contextApi._getContextManager === 'function' ? contextApi._getContextManager() : null;
  } catch {
    return null;
  }
}

/**
 * Puts `manager` on the stack: on top, unless another enabled manager is the
 * API's global context manager. Then it goes just below that one, which
 * keeps publishing: the API refuses a second registration (a second
 * `provider.register()`), and the callbacks that run are the registered
 * manager's.
 */
function pushEnabled(manager) {
  const index = enabledManagers.indexOf(manager);
  if (index >= 0) enabledManagers.splice(index, 1);
  const registered = registeredManager();
  const below = registered !== manager && registered instanceof ProfilingContextManager ? enabledManagers.indexOf(registered) : -1;
  if (below >= 0) enabledManagers.splice(below, 0, manager);
  else enabledManagers.push(manager);
}

function modeOf(manager) {
  return manager._frame ? frameMode : recordMode;
}

/** Makes the top of the stack the publisher (or stops publishing when it is empty). */
function updatePublisher() {
  const next = enabledManagers.length === 0 ? null : enabledManagers[enabledManagers.length - 1];
  if (next === publisher) return;
  const previous = publisher;
  if (previous !== null) {
    previous._publishing = false;
    if (next === null || modeOf(next) !== modeOf(previous)) modeOf(previous).deactivate(previous);
  }
  publisher = next;
  if (next === null) return;
  next._publishing = true;
  if (next._frame) {
    try {
      frameMode.activate(next);
      frameUnavailableReason = null;
    } catch (error) {
      // Verified at construction, so only a refused global handle or
      // process context gets here: nothing is published on this thread.
      frameUnavailableReason = error.message;
      warnOnce(`frame mode could not publish: ${error.message}`);
    }
  } else {
    frameUnavailableReason = next._modeReason;
    recordMode.activate(next);
  }
}

/** The mode the calling thread publishes in (`null` while no manager is enabled), and why not frame. */
function publishingMode() {
  return { mode: publisher === null ? null : publisher._frame ? 'frame' : 'record', frameUnavailableReason };
}

class ProfilingContextManager extends AsyncLocalStorageContextManager {
  /**
   * @param {{ attributes?: string[], localRootAttributes?: string[], spanName?: boolean,
   *   localRootSpanId?: boolean, mode?: 'record' | 'frame' }} [options]
   *   `attributes`: span attribute keys to publish in the record (e.g.
   *   'db.system') when present. `localRootAttributes` (default
   *   ['http.route']): attributes of the local root span that every span
   *   under it publishes. `spanName`, `localRootSpanId` (default true): publish
   *   the span's name and its local root span's id. `mode`: how to publish
   *   (default: frame where it verifies, else record; OTEL_THREAD_CTX_MODE
   *   when omitted).
   */
  constructor(options = {}) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('The "options" argument must be an object');
    }
    const schema = schemaFromOptions(options);
    const requested = requestedMode(options.mode);
    warnUnknownOptions(options, MANAGER_OPTIONS, 'ProfilingContextManager');
    super();
    const { mode, reason } = chooseMode(requested, this._asyncLocalStorage);
    /** Frame mode: the AsyncLocalStorage stores wrappers (js/publish/frame.js). */
    this._frame = mode === 'frame';
    /** Why this manager publishes in record mode (null in frame mode). */
    this._modeReason = reason;
    /** On this thread's stack of enabled managers. */
    this._enabled = false;
    /** The top of the stack: the manager whose contexts are published. */
    this._publishing = false;
    this._attributeSchema = schema;
  }

  enable() {
    super.enable();
    if (!this._publishing) {
      if (!this._enabled) {
        // Keys first: registering them publishes the context if it is absent.
        this._attributeSchema?.registerAll();
        publishMinimalProcessContext();
        // The SDK's Resource, from the first span published (zero-config
        // process context): the span records say when a span is new.
        spanRecords.observeNewSpans(sdkResource.onNewSpan);
      }
      this._enabled = true;
      pushEnabled(this);
      updatePublisher();
    }
    return this;
  }

  disable() {
    if (this._enabled) {
      this._enabled = false;
      enabledManagers.splice(enabledManagers.indexOf(this), 1);
      updatePublisher();
    }
    return super.disable();
  }

  /** The mode this manager publishes in when it publishes: 'frame' or 'record'. */
  get mode() {
    return this._frame ? 'frame' : 'record';
  }

  active() {
    // Both modes store an object per context (frame: a wrapper; record: a
    // store) whose `context` is what with() was given.
    const store = this._asyncLocalStorage.getStore();
    return (store === undefined ? undefined : store.context) ?? ROOT_CONTEXT;
  }

  with(context, fn, thisArg, ...args) {
    // The base class's body, with the publishing around it: super.with()
    // would add a call frame and repeat the bind check on the hottest path
    // (BENCHMARKS.md, "The upstream manager's surface").
    const cb = thisArg == null ? fn : fn.bind(thisArg);
    // Frame mode: one run() with the context's wrapper, nothing else.
    if (this._frame) return this._asyncLocalStorage.run(frameMode.storeFor(context), cb, ...args);
    const store = recordMode.storeFor(context);
    if (!this._publishing) return this._asyncLocalStorage.run(store, cb, ...args);
    const outer = recordMode.publishedRecord();
    recordMode.enter(store);
    try {
      return this._asyncLocalStorage.run(store, cb, ...args);
    } finally {
      recordMode.republish(outer);
    }
  }

  attach(context) {
    const storage = this._asyncLocalStorage;
    if (this._frame) return attachWrapper(storage, frameMode.storeFor(context));
    const store = recordMode.storeFor(context);
    const token = attachWrapper(storage, store);
    if (!this._publishing) return token;
    recordMode.enter(store);
    const manager = this;
    const dispose = () => {
      token.dispose();
      if (manager._publishing) recordMode.publishStore(storage.getStore());
    };
    const wrapped = { dispose };
    if (typeof Symbol.dispose === 'symbol') wrapped[Symbol.dispose] = dispose;
    return wrapped;
  }
}

/**
 * The stock attach() for a store that wraps the context (a frame wrapper,
 * a record store): the base class's fallback would restore `active()` (a
 * context, not its store).
 */
function attachWrapper(storage, wrapper) {
  if (typeof storage.withScope === 'function') return storage.withScope(wrapper);
  const previous = storage.getStore();
  storage.enterWith(wrapper);
  let disposed = false;
  const dispose = () => {
    if (disposed) return;
    disposed = true;
    storage.enterWith(previous);
  };
  const token = { dispose };
  if (typeof Symbol.dispose === 'symbol') token[Symbol.dispose] = dispose;
  return token;
}

module.exports = { ProfilingContextManager, publishingMode };
