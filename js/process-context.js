'use strict';
// The OTEP 4719 process context from JavaScript: the native publisher
// (src/process_context.rs) and an SDK SpanProcessor that feeds it the tracer
// provider's Resource.
//
// Publishing is rare (once per Resource, once per new record key), so these
// paths favour simplicity; the span processor's per-span cost is one
// identity comparison.

const { diag } = require('@opentelemetry/api');
const binding = require('./binding');
const { spanStarted } = require('./local-root');
const { spanEnded } = require('./span-records');
const { warnUnknownOptions } = require('./warnings');

/** Deepest nesting the native side accepts (src/process_context/js.rs). */
const MAX_DEPTH = 8;

/** Whether this thread published a Resource itself (not the manager's zero-config one). */
let explicitResource = false;

/** Whether a Resource was published by the application or the span processor. */
function resourcePublishedExplicitly() {
  return explicitResource;
}

/**
 * True for an OpenTelemetry SDK `Resource` (1.x class or 2.x
 * `resourceFromAttributes()`): its attributes are behind a getter, its own
 * fields are private state.
 */
function isSdkResource(value) {
  return typeof value === 'object' && value !== null && typeof value.merge === 'function' && 'attributes' in value;
}

function resourceAttributes(resource) {
  if (resource.asyncAttributesPending) {
    // Reading them now would publish a partial set (and log an SDK error).
    const err = new RangeError(
      'The "options.resource" Resource has async attributes pending: await resource.waitForAsyncAttributes() first',
    );
    err.code = 'ERR_OUT_OF_RANGE';
    throw err;
  }
  return resource.attributes;
}

/**
 * Publishes or updates the process context. `options.resource` is a plain
 * object of attributes or an SDK Resource (its attributes are published).
 * Validation is native: bad input throws TypeError/RangeError and changes
 * nothing.
 */
function publishProcessContext(options) {
  if (typeof options === 'object' && options !== null && !Array.isArray(options)) {
    // Each option is read once, here; the native side reads this copy.
    const resource = options.resource;
    options = {
      resource: isSdkResource(resource) ? resourceAttributes(resource) : resource,
      attributes: options.attributes,
      schemaVersion: options.schemaVersion,
    };
  }
  binding.publishProcessContext(options);
  if (options?.resource !== undefined) explicitResource = true;
}

/** Appends keys to `threadlocal.attribute_key_map`; returns their indexes. */
function registerAttributeKeys(keys) {
  return binding.registerAttributeKeys(keys);
}

/** The published process context (addresses, sizes), or null. */
function processContextInfo() {
  return binding.processContextInfo();
}

/** Object literals and null-prototype objects: what the native side publishes as key/value lists. */
function isPlainObject(value) {
  if (typeof value !== 'object' || value === null) return false;
  const prototype = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

/**
 * `value` as the native side accepts it, or undefined to leave it out.
 * Resource detectors are third-party code: one value of an unexpected type
 * must cost that attribute, not the whole publication.
 */
function publishable(value, depth) {
  switch (typeof value) {
    case 'string':
    case 'number':
    case 'boolean':
    case 'bigint':
      return value;
    case 'object':
      if (value === null || depth > MAX_DEPTH) return undefined;
      if (Array.isArray(value)) {
        // Elements that cannot be published become null, which the native
        // side turns into the array's zero value: indexes stay meaningful.
        return value.map((element) => (element == null ? null : (publishable(element, depth + 1) ?? null)));
      }
      if (isPlainObject(value)) return publishableAttributes(value, depth + 1);
      return undefined;
    default:
      return undefined;
  }
}

function publishableAttributes(attributes, depth = 1) {
  const result = {};
  for (const key of Object.keys(attributes)) {
    if (key === '') continue;
    const value = publishable(attributes[key], depth);
    if (value !== undefined) result[key] = value;
  }
  return result;
}

/** A stable text form of published attributes, to skip identical republications. */
function fingerprint(attributes) {
  return JSON.stringify(attributes, (_key, value) => (typeof value === 'bigint' ? `${value}n` : value));
}

/**
 * An OpenTelemetry SDK `SpanProcessor` that publishes the tracer provider's
 * Resource as the process context: on the first span, and again only when a
 * span carries a different Resource with different attributes. It never
 * throws into the SDK: a failed publication is reported once through
 * `diag.warn`.
 *
 *     new NodeSDK({ contextManager, spanProcessors: [new ProcessContextSpanProcessor(), exporterProcessor] })
 */
class ProcessContextSpanProcessor {
  /**
   * @param {{ schemaVersion?: string, attributes?: Record<string, unknown> }} [options]
   *   passed to `publishProcessContext` with every publication.
   */
  constructor(options = {}) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('The "options" argument must be an object');
    }
    warnUnknownOptions(options, ['schemaVersion', 'attributes'], 'ProcessContextSpanProcessor');
    this._options = {};
    if (options.schemaVersion !== undefined) this._options.schemaVersion = options.schemaVersion;
    if (options.attributes !== undefined) this._options.attributes = options.attributes;
    this._resource = undefined;
    this._published = undefined;
    this._warned = false;
    // The manager's zero-config publication uses an instance of its own.
    this._explicit = true;
  }

  onStart(span, parentContext) {
    // The span's local root, from the context it starts in (exact, where
    // the manager would otherwise guess it from the active span).
    spanStarted(span, parentContext);
    // Resources, their getters and detectors are third-party code: whatever
    // they throw is reported, never thrown into the SDK.
    try {
      const resource = span.resource;
      if (resource === this._resource || resource == null) return;
      this._resource = resource;
      if (resource.asyncAttributesPending && typeof resource.waitForAsyncAttributes === 'function') {
        // Reading `attributes` before async detectors settle yields a partial
        // set (and an SDK error log): publish once they are final.
        Promise.resolve(resource.waitForAsyncAttributes()).then(
          () => this._resource === resource && this._publish(resource),
          (error) => this._warn(error),
        );
        return;
      }
      this._publish(resource);
    } catch (error) {
      this._warn(error);
    }
  }

  _publish(resource) {
    try {
      const attributes = publishableAttributes(resource.attributes ?? {});
      const print = fingerprint(attributes);
      if (print === this._published) return;
      binding.publishProcessContext({ ...this._options, resource: attributes });
      this._published = print;
      if (this._explicit) explicitResource = true;
    } catch (error) {
      this._warn(error);
    }
  }

  /** Reports the first failure through diag; cannot throw. */
  _warn(error) {
    if (this._warned) return;
    this._warned = true;
    try {
      diag.warn(`otel-thread-ctx: cannot publish the process context: ${error?.message ?? error}`);
    } catch {
      // A throwing logger or error: nothing else to report to.
    }
  }

  onEnd(span) {
    // The record stops carrying an ended span at once, not at the next
    // context switch.
    spanEnded(span);
  }

  forceFlush() {
    return Promise.resolve();
  }

  shutdown() {
    return Promise.resolve();
  }
}

module.exports = {
  resourcePublishedExplicitly,
  publishProcessContext,
  registerAttributeKeys,
  processContextInfo,
  ProcessContextSpanProcessor,
};
