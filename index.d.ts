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
 * A context without a valid span publishes `valid = 0`. Each thread
 * (main thread, every `worker_threads` worker) needs its own enabled
 * manager, as with any OpenTelemetry setup.
 */
export declare class ProfilingContextManager extends AsyncLocalStorageContextManager implements ContextManager {
  /**
   * @param options.attributes span attribute keys (at most 256, e.g.
   *   `['http.route', 'http.request.method']`) to publish in the record's
   *   `attrs_data` when the active span has them. Values are published as
   *   UTF-8 text (numbers and booleans converted, arrays left out), cut to
   *   255 bytes at a character boundary; entries that would make the record
   *   exceed 640 bytes are left out whole. Each key is appended to the
   *   process context's `threadlocal.attribute_key_map` the first time a span
   *   carries it. An attribute set on a span after it became active is
   *   published the next time a context holding the span is entered
   *   (`with()`) or resumed (a callback starts in it) on the thread.
   * @throws {TypeError} when `options` is not an object or `attributes` is not an array of strings.
   * @throws {RangeError} when `attributes` has an empty or repeated key, or more than 256 keys.
   */
  constructor(options?: { attributes?: string[] });
  /** Starts publishing on the calling thread. */
  enable(): this;
  /** Stops publishing and leaves the calling thread's record invalid. */
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

/** Marks the calling thread's record as carrying no span (`valid = 0`). */
export declare function clearSpanContext(): void;

/** Diagnostics about the calling thread's registration. */
export interface ThreadInfo {
  /** Kernel thread id. */
  tid: number;
  /** Address of this thread's record, what `otel_thread_ctx_v1` points at. */
  recordAddress: bigint;
  /** Address of this thread's `otel_thread_ctx_v1` TLS variable. */
  tlsAddress: bigint;
  /** Current value of this thread's `otel_thread_ctx_v1`. */
  tlsValue: bigint;
  /** Index of the record slot in the process-wide registry. */
  slot: number;
  /** Size of the record in bytes (640). */
  recordSize: number;
  /** Whether the record is cleared while the event loop is idle. */
  clearsOnIdle: boolean;
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
