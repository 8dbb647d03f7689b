import type { Context, ContextManager } from '@opentelemetry/api';
import type { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';

/**
 * An OpenTelemetry `ContextManager` that keeps the calling thread's
 * OTEP 4947 Thread-Local Context Record equal to the span of the active
 * context whenever JavaScript runs on the thread:
 *
 * - on `with()` entry and exit (exit by throw included), `bind()`-wrapped
 *   functions and EventEmitter listeners, and `attach()`/`dispose()`;
 * - at the start of every callback that runs in a stored context
 *   (`await` continuations, `.then`, timers, immediates, `process.nextTick`,
 *   `queueMicrotask`, I/O callbacks);
 * - while the event loop is idle, no span is published (`valid = 0`);
 *   during a blocking call inside a span, that span stays published.
 *
 * A context without a valid span publishes `valid = 0`. Any value may be
 * used as a context, exactly as with the stock manager; only OpenTelemetry
 * contexts holding a valid span that has not ended publish one, and a
 * context whose span cannot be read (throwing getters, Proxy traps)
 * publishes `valid = 0` and is reported once through `diag`. Trace flags
 * other than `undefined` (0) or an integer in 0..255 make the span context
 * invalid. Each thread (main thread, every `worker_threads` worker) needs
 * its own enabled manager, as with any OpenTelemetry setup; of several
 * enabled managers on a thread, the most recently enabled one publishes
 * (see docs/drop-in.md, "Drop-in rules", for the rule with a registered
 * global manager).
 */
export declare class ProfilingContextManager extends AsyncLocalStorageContextManager implements ContextManager {
  /**
   * @param options.attributes span attribute keys (at most 256, e.g.
   *   `['http.route', 'http.request.method']`) to publish in the record's
   *   `attrs_data` when the active span has them. Values are published as
   *   UTF-8 text (numbers and booleans converted, arrays left out), cut to
   *   255 bytes at a character boundary; entries that would make the record
   *   exceed 640 bytes are left out whole. `enable()` appends every key to
   *   the process context's `threadlocal.attribute_key_map`, before any span
   *   (a key that cannot be added then is tried again when a span first
   *   carries it). An attribute set on a span after it became active is
   *   published the next time a context holding the span is entered
   *   (`with()`) or resumed (a callback starts in it) on the thread.
   *   By default every record also says where its sample belongs: the span's
   *   name (`span.name`), its local root span's id (`local_root.span_id`)
   *   and the local root's `localRootAttributes`, inherited by every span
   *   under it (docs/record-and-process-context.md, "Where a sample belongs").
   * @throws {TypeError} when `options` is not an object, `attributes` or `localRootAttributes`
   *   is not an array of strings, or `spanName`/`localRootSpanId` is not a boolean.
   * @throws {RangeError} when `attributes` or `localRootAttributes` has an empty or repeated key,
   *   more than 256 keys are published in all, or `mode` is a string other than `'record'` and
   *   `'frame'` (TypeError when not a string).
   */
  constructor(options?: {
    attributes?: string[];
    /**
     * Attributes of the local root span (the first span of the trace in this
     * process) that every span under it publishes, so a sample in a child
     * span says which endpoint it serves. A value set on the local root wins;
     * until it has one, the latest value a span under it carried (Express's
     * handler spans carry `http.route`). Default `['http.route']`; `[]` for none.
     */
    localRootAttributes?: string[];
    /** Publish the span's name under `span.name`. Default true. */
    spanName?: boolean;
    /** Publish the local root span's id (16 hex digits) under `local_root.span_id`. Default true. */
    localRootSpanId?: boolean;
    /**
     * How this manager publishes (README, "Publishing modes"): `'frame'`
     * (the Node.js schema `nodejs_v1_dev`, no work per async switch; only
     * where AsyncLocalStorage runs on AsyncContextFrame and the reader's walk
     * verifies on the running Node, else record mode with the reason) or
     * `'record'` (the OTEP 4947 record). Default: `OTEL_THREAD_CTX_MODE`
     * when set to one of these, else frame where it verifies, else record.
     */
    mode?: 'record' | 'frame';
  });
  /** The mode this manager publishes in: `'frame'` or `'record'`. */
  readonly mode: 'record' | 'frame';
  /**
   * Starts publishing on the calling thread, unless another enabled manager
   * is the API's global context manager (that one keeps publishing). The
   * first call publishes the configured attribute keys in the key map and,
   * if none exists, a minimal process context.
   */
  enable(): this;
  /**
   * Stops this manager publishing. The most recently enabled manager still
   * enabled takes over; with none left, the record is left invalid.
   */
  disable(): this;
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(
    context: Context,
    fn: F,
    thisArg?: ThisParameterType<F>,
    ...args: A
  ): ReturnType<F>;
}

/**
 * Publishes a span in the calling thread's record, without the context
 * manager. `traceIdHigh` is the first 8 bytes of the W3C trace id read as a
 * big-endian number, `traceIdLow` the last 8; `spanId` the 8-byte span id.
 * Allocates nothing and makes no syscall.
 *
 * @throws {TypeError} when an id is not a bigint or `traceFlags` is not a number.
 * @throws {RangeError} when an id is negative or >= 2n ** 64n, the trace id or
 *   span id is all zeroes, or `traceFlags` is not an integer in 0..255.
 *   On any error the published record is unchanged.
 */
export declare function setSpanContext(
  traceIdHigh: bigint,
  traceIdLow: bigint,
  spanId: bigint,
  traceFlags?: number,
): void;

/**
 * Marks the calling thread's record as carrying no span (`valid = 0`). In a
 * thread whose manager publishes in frame mode, readers then find the active
 * span through the frame walk again (they read the record first).
 */
export declare function clearSpanContext(): void;

/** Diagnostics about the calling thread's registration. */
export interface ThreadInfo {
  /** Kernel thread id. */
  tid: number;
  /**
   * Address of this thread's own record: the one the direct API writes and
   * `otel_thread_ctx_v1` points at with no span (and while the event loop
   * is idle). In record mode the variable points at the active span's own
   * record instead (see `tlsValue`).
   */
  recordAddress: bigint;
  /** Address of this thread's `otel_thread_ctx_v1` TLS variable. */
  tlsAddress: bigint;
  /** Current value of this thread's `otel_thread_ctx_v1`: the record a reader reads now. */
  tlsValue: bigint;
  /** Index of the record slot in the process-wide registry. */
  slot: number;
  /** Size of the record in bytes (640). */
  recordSize: number;
  /** Whether the record is cleared while the event loop is idle. */
  clearsOnIdle: boolean;
  /**
   * Where glibc placed this thread's `otel_thread_ctx_v1`, read from the
   * variable's TLSDESC descriptor as the dynamic linker filled it: `'static'`
   * (the static TLS area, one offset from the thread pointer, what every
   * TLS-reading profiler handles) or `'dynamic'` (a block reached through
   * the thread's DTV, after a late `dlopen` found the static TLS surplus
   * used up; some profilers cannot read it: load the package early with
   * `node --require otel-thread-ctx/register`). `'unknown'` where it cannot
   * be told (not glibc, not x86-64).
   */
  tlsModel: 'static' | 'dynamic' | 'unknown';
  /** The mode of the manager publishing on this thread; `null` while none is enabled. */
  mode: 'record' | 'frame' | null;
  /** Why the publishing manager is not in frame mode (`null` in frame mode or before any manager published). */
  frameUnavailableReason: string | null;
  /** This thread's `otel_thread_ctx_nodejs_v1` block while it publishes in frame mode, else `null`. */
  frame: FrameInfo | null;
}

/** A thread's frame-mode discovery block (the Node.js schema `nodejs_v1_dev`). */
export interface FrameInfo {
  /** Address of this thread's `otel_thread_ctx_nodejs_v1` TLS variable. */
  tlsAddress: bigint;
  /** Address of the isolate's slot holding the current AsyncContextFrame. */
  cpedSlot: bigint;
  /** Address of the global handle slot holding the manager's AsyncLocalStorage. */
  alsHandle: bigint;
  /** That AsyncLocalStorage's identity hash. */
  alsIdentityHash: number;
  /** This isolate's tagged `undefined`. */
  undefinedAddr: bigint;
  /** Where a wrapper object holds its record's address (published as `threadlocal.js_object_record_offset`). */
  jsObjectRecordOffset: number;
  /** Moving GCs (scavenges, compactions) this thread went through while publishing frames; each closes the gate for its pause. */
  movingGcs: number;
  /** Of those, the ones whose block read closed at the end of the pause (objects moved, gate not yet reopened). */
  movingGcsGateClosed: number;
  /** Of those, the ones during which the thread's OTEP 4947 variable carried the span current at the pause's start, so readers still found it. */
  movingGcsSpanPinned: number;
}

/** Diagnostics for the calling thread. */
export declare function threadInfo(): ThreadInfo;

/** Process-wide counters of the record registry. */
export interface RegistryStats {
  /** Record slots mapped so far (never unmapped). */
  capacity: number;
  /** Slots whose thread is registered. */
  attached: number;
  /** Slots whose thread exited but whose JS view V8 has not finalized yet. */
  awaitingViewRelease: number;
  /** Slots ready for reuse. */
  free: number;
}

/** Counters of the process-wide record registry. */
export declare function registryStats(): RegistryStats;

// ---------------------------------------------------------------------------
// Process context (OTEP 4719)
//
// One `OTEL_CTX` mapping per process (`/memfd:OTEL_CTX` or `[anon:OTEL_CTX]`
// in /proc/<pid>/maps) whose header points at a protobuf `ProcessContext`:
// the resource attributes, plus `threadlocal.schema_version` and
// `threadlocal.attribute_key_map` for readers of the thread records.

/**
 * A value the process context can publish. Strings, integers (numbers that
 * are integral and fit int64, and bigints that fit int64), arrays and plain
 * objects (published as key/value lists) keep their kind. Booleans and all
 * other numbers (fractions, NaN, ±Infinity, integers beyond int64) are
 * published as strings with their JavaScript spelling, because some readers
 * accept only string, int, array and kvlist values. `null`/`undefined`
 * attribute values are left out; inside arrays they become the array's zero
 * value (`0` in an array of integers, `""` otherwise). At most 8 levels of
 * nesting.
 */
export type ProcessContextValue =
  | string
  | number
  | boolean
  | bigint
  | null
  | undefined
  | readonly ProcessContextValue[]
  | { readonly [key: string]: ProcessContextValue };

/** Attributes by key (own enumerable string keys; keys must not be empty). */
export type ProcessContextAttributes = { readonly [key: string]: ProcessContextValue };

/** What `publishProcessContext` changes; an omitted (or null) option keeps its published value. */
export interface ProcessContextOptions {
  /**
   * The resource attributes (`ProcessContext.resource`), replacing the
   * published ones: a plain object, or an SDK `Resource` (its `attributes`).
   */
  resource?: ProcessContextAttributes | { readonly attributes: ProcessContextAttributes; merge(other: unknown): unknown } | null;
  /**
   * Extra `ProcessContext.attributes`, replacing the published extras. Keys
   * starting with `threadlocal.` are reserved (RangeError).
   */
  attributes?: ProcessContextAttributes | null;
  /** `threadlocal.schema_version`; `"tlsdesc_v1_dev"` until set. Kept once set. */
  schemaVersion?: string | null;
}

/**
 * Publishes the process context, or updates it. The first call creates the
 * process's single `OTEL_CTX` mapping; later calls (from any thread) swap
 * in a new payload under the OTEP update protocol, so concurrent readers
 * never accept a torn one. Each given option replaces the published value,
 * omitted options stay as they were.
 *
 * `options.resource` may also be an SDK `Resource`: its `attributes` are
 * published. Sizes are checked before the input is walked (each array
 * element counts for at least 4 payload bytes, each key for at least 3), so
 * oversized input fails fast.
 *
 * @throws {TypeError} when `options` is not an object, an attribute set or
 *   nested object is not a plain object (object literal or null prototype:
 *   a `Map`, `Set`, class instance, typed array, buffer, date or promise is
 *   refused), a value is a function or symbol, or `schemaVersion` is not a
 *   string.
 * @throws {RangeError} for an empty attribute key or schemaVersion, a
 *   reserved `threadlocal.*` attribute, nesting deeper than 8 levels (cyclic
 *   objects), a payload over 64 KiB (the most the OpenTelemetry eBPF
 *   profiler accepts; the message names the largest part to trim), or a
 *   Resource whose async attributes are still pending.
 * @throws {Error} when the kernel refuses the mapping.
 *   On any error the published context is unchanged.
 */
export declare function publishProcessContext(options?: ProcessContextOptions): void;

/**
 * Appends keys to `threadlocal.attribute_key_map` and returns the index of
 * every key given (the `key_index` thread records use). The map is
 * append-only: a key keeps its index for the life of the process, a key
 * already present returns its index, and the context is republished only
 * when a key was added (creating the mapping if nothing was published yet).
 *
 * @throws {TypeError} when `keys` is not an array of strings.
 * @throws {RangeError} for an empty key, more than 256 elements, or when the
 *   map would exceed 256 keys or the payload 64 KiB; then none of the given
 *   keys is added.
 */
export declare function registerAttributeKeys(keys: readonly string[]): number[];

/** Diagnostics about the published process context. */
export interface ProcessContextInfo {
  /** Address of the `OTEL_CTX` mapping; the 32-byte header is at its start. */
  mappingAddress: bigint;
  /** Size of the mapping in bytes (one page). */
  mappingSize: number;
  /** How the mapping was made: `"memfd"` or `"anonymous"`. */
  backing: 'memfd' | 'anonymous';
  /** `monotonic_published_at_ns` (CLOCK_BOOTTIME) of the current publication. */
  publishedAtNs: bigint;
  /** Address of the current protobuf payload. */
  payloadAddress: bigint;
  /** Size of the current payload in bytes. */
  payloadSize: number;
  /** Keys in `threadlocal.attribute_key_map`. */
  keyCount: number;
  /** Attributes of the published Resource; 0 while no thread has published one. */
  resourceAttributes: number;
  /** Publications in this process so far. */
  publications: number;
  /** Superseded payloads still kept allocated for readers that were copying them. */
  retainedPayloads: number;
}

/** The published process context, or `null` before the first publication. */
export declare function processContextInfo(): ProcessContextInfo | null;

/** The parts of an SDK span the processor reads (SDK 2.x `Span`). */
export interface SpanWithResource {
  readonly resource?: {
    readonly attributes: { readonly [key: string]: unknown };
    readonly asyncAttributesPending?: boolean;
    waitForAsyncAttributes?(): Promise<void>;
  };
}

/** Options of `ProcessContextSpanProcessor`, sent with each of its publications. */
export interface ProcessContextSpanProcessorOptions {
  schemaVersion?: string;
  attributes?: ProcessContextAttributes;
}

/**
 * An OpenTelemetry SDK `SpanProcessor` that publishes the tracer provider's
 * Resource as the process context: when the first span starts, and again
 * only when a span carries a Resource with different attributes. Resources
 * with pending async attributes are published once they settle. Values the
 * context cannot carry are left out; a failed publication, or anything a
 * Resource's getters or detectors throw, is reported once through
 * `diag.warn` and never thrown into the SDK. `onEnd` makes the thread's
 * record stop carrying the ending span at once. Costs one comparison per
 * span otherwise; `forceFlush` and `shutdown` do nothing.
 *
 * @example
 * new NodeSDK({
 *   contextManager: new ProfilingContextManager(),
 *   spanProcessors: [new ProcessContextSpanProcessor(), new BatchSpanProcessor(exporter)],
 * }).start();
 */
export declare class ProcessContextSpanProcessor {
  constructor(options?: ProcessContextSpanProcessorOptions);
  onStart(span: SpanWithResource, parentContext?: import('@opentelemetry/api').Context): void;
  onEnd(span: unknown): void;
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}

/** Options of `ProfileIdSpanProcessor`. */
export interface ProfileIdSpanProcessorOptions {
  /**
   * Which spans get `pyroscope.profile.id`: `'local-roots'` (default:
   * spans without a parent in this process, e.g. the HTTP server span;
   * Grafana's convention, their flame graph holds their children's work)
   * or `'all'` (for profiles labelled with the innermost span).
   */
  spans?: 'local-roots' | 'all';
}

/**
 * An OpenTelemetry SDK `SpanProcessor` that sets the attribute
 * `pyroscope.profile.id` (the span's own id) on the spans whose profiles
 * Grafana should offer from a trace ("Profiles for this span"), when they
 * start. Spans of unsampled traces are left alone. Never throws into the
 * SDK. Register it before the exporting processor; pair it with the
 * profiler's matching span-profile setting (docs/grafana.md).
 *
 * @example
 * new NodeSDK({
 *   contextManager: new ProfilingContextManager(),
 *   spanProcessors: [new ProfileIdSpanProcessor(), new BatchSpanProcessor(exporter)],
 * }).start();
 */
export declare class ProfileIdSpanProcessor {
  /** @throws {TypeError | RangeError} on a bad `spans` option. */
  constructor(options?: ProfileIdSpanProcessorOptions);
  /** Which spans it marks. */
  readonly spans: 'local-roots' | 'all';
  onStart(span: import('@opentelemetry/api').Span, parentContext?: import('@opentelemetry/api').Context): void;
  onEnd(span: unknown): void;
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}
