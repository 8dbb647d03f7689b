'use strict';
// Helpers shared by the benchmark cases (the scripts run in child processes).
//
// A case is started as `node <case.js> '<json params>'`, measures, and
// prints exactly one JSON line on stdout as its result.

const path = require('node:path');
const { median } = require('./stats');

const ROOT = path.resolve(__dirname, '..', '..');

/** Parameters passed by bench/run.js as the first argument (JSON). */
function params() {
  return process.argv[2] ? JSON.parse(process.argv[2]) : {};
}

/** Prints the result of a case (the parent reads the last JSON line). */
function report(result) {
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

/**
 * Creates, enables and installs as global the context manager of `kind`:
 * 'ours' (ProfilingContextManager in its default mode: frame where
 * AsyncLocalStorage runs on AsyncContextFrame, else record), 'record' (ours
 * in record mode), 'stock' (AsyncLocalStorageContextManager),
 * 'floor' (stock plus our continuation hooks with empty bodies and our
 * with() shape with empty publishing, bench/lib/floor.js), 'store' (the
 * same with hooks only reading the stock store), 'write' (the same, with
 * hooks and a with() copying the span's record words into a buffer of
 * their own), 'bare' (ours without the identity attributes), 'name',
 * 'rootid', 'route' (ours with only the span name, only the local root id,
 * only the root's http.route), 'stamps' (stock plus a private field on each
 * context and span, bench/lib/floor.js) or 'none' (no context manager at all). The stock, floor, store and
 * write processes never load the addon, so nothing of ours runs there.
 */
function installManager(kind) {
  const manager = createManager(kind);
  if (manager !== null) {
    manager.enable();
    require('@opentelemetry/api').context.setGlobalContextManager(manager);
  }
  return manager;
}

/**
 * Creates (not enabled) the context manager of `kind`, or null for 'none'.
 * The floor's hooks are on while it is enabled. 'datadog' is the stock
 * manager driving Datadog's writer (bench/lib/datadog.js); it throws where
 * that writer cannot publish (unavailable()). Its `spanProcessor` belongs
 * on the tracer provider (traceService adds it).
 */
function createManager(kind) {
  switch (kind) {
    case 'datadog':
      return new (require('./datadog').DatadogContextManager)();
    case 'ours':
      return new (require(ROOT).ProfilingContextManager)();
    case 'record':
      return new (require(ROOT).ProfilingContextManager)({ mode: 'record' });
    case 'bare':
      // The line's default mode without the identity attributes.
      return new (require(ROOT).ProfilingContextManager)({ spanName: false, localRootSpanId: false, localRootAttributes: [] });
    // One identity attribute each, for what each one costs alone.
    case 'name':
      return new (require(ROOT).ProfilingContextManager)({ localRootSpanId: false, localRootAttributes: [] });
    case 'rootid':
      return new (require(ROOT).ProfilingContextManager)({ spanName: false, localRootAttributes: [] });
    case 'route':
      return new (require(ROOT).ProfilingContextManager)({ spanName: false, localRootSpanId: false });
    case 'stamps':
      return new (require('./floor').StampingContextManager)();
    case 'floor':
      return new (require('./floor').FloorContextManager)();
    case 'store':
      return new (require('./floor').FloorContextManager)({ hookBody: 'store' });
    case 'write':
      return new (require('./floor').RecordWriteContextManager)();
    case 'stock':
      return new (require('@opentelemetry/context-async-hooks').AsyncLocalStorageContextManager)();
    case 'none':
      return null;
    default:
      throw new Error(`unknown manager kind: ${kind}`);
  }
}

/** Why the manager of `kind` cannot run in this process, or null when it can. */
function unavailable(kind) {
  return kind === 'datadog' ? require('./datadog').datadogUnavailable() : null;
}

/** Whether the manager of `kind` can run here; if not, says why on stderr. */
function runsHere(kind) {
  const reason = unavailable(kind);
  if (reason !== null) process.stderr.write(`bench: leaving out ${kind}: ${reason}\n`);
  return reason === null;
}

let sharedStorage = null;

/**
 * Gives `manager` (created, not yet enabled) the AsyncLocalStorage every
 * manager passed here shares, for a process whose managers take turns. On
 * Node 20 each instance keeps its store under a key of its own on every
 * async resource; with one instance per manager, Node's propagation and
 * `run()` see several keys and slow down for every manager (stock `with()`
 * about twice as slow), which no process with one manager pays. Ours and
 * the floor read the storage when first enabled.
 */
function shareStorage(manager) {
  sharedStorage ??= new (require('node:async_hooks').AsyncLocalStorage)();
  manager._asyncLocalStorage = sharedStorage;
  return manager;
}

const ID_BYTES = Buffer.alloc(16);

/** A 32-bit mix of `n` (an integer hash), so ids have random-looking bytes. */
function mix(n, k) {
  let h = Math.imul((n + Math.imul(k, 0x632be5ab)) | 0, 0x9e3779b1);
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  return (h ^ (h >>> 13)) >>> 0;
}

/**
 * A valid, unique W3C span context for `n` (an integer in 0..2^32) and
 * `salt`. Its ids are flat lowercase hex strings of random-looking bytes,
 * made as the SDK's id generator makes them (a buffer's `toString('hex')`),
 * and cheap, so making ids costs both managers the same small constant.
 */
function spanContext(n, salt = 0) {
  ID_BYTES.writeUInt32BE((mix(n, 1) | 1) >>> 0, 0);
  ID_BYTES.writeUInt32BE(mix(n, 2), 4);
  ID_BYTES.writeUInt32BE(mix(salt, 3), 8);
  ID_BYTES.writeUInt32BE(n >>> 0, 12);
  const traceId = ID_BYTES.toString('hex', 0, 16);
  ID_BYTES.writeUInt32BE((mix(n, 4) | 1) >>> 0, 8);
  return { traceId, spanId: ID_BYTES.toString('hex', 8, 16), traceFlags: 1, isRemote: false };
}

/** Nanoseconds elapsed since `start` (a process.hrtime.bigint() value). */
function since(start) {
  return Number(process.hrtime.bigint() - start);
}

/** CPU time (user + system) of this process in nanoseconds. */
function cpuNs() {
  const u = process.cpuUsage();
  return (u.user + u.system) * 1000;
}

/**
 * Traces with the OpenTelemetry Node SDK as a service does: a
 * NodeTracerProvider with `manager` as its context manager, a
 * BatchSpanProcessor whose exporter counts and drops the spans, and the
 * instrumentations `instrumentations()` returns (called after registration
 * is set up, so the caller requires them lazily). With manager 'none',
 * nothing is traced. `shutdown()` flushes and returns the spans exported.
 *
 * `manager` may also be a list of kinds: all of them are created, sharing
 * one AsyncLocalStorage (shareStorage), the first is registered, and
 * `use(kind)` makes another one the global context manager (disabling the
 * current one first, so only one set of hooks is ever on). Switch only
 * while no request is in flight, so that no request runs under two
 * managers. Kinds of the list that cannot run here (unavailable()) are
 * left out, with a line on stderr; `kinds` lists the ones kept.
 */
function traceService(manager, instrumentations) {
  let exported = 0;
  if (manager === 'none') return { kinds: ['none'], shutdown: async () => exported };
  const { NodeTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-node');
  const { registerInstrumentations } = require('@opentelemetry/instrumentation');
  const { context } = require('@opentelemetry/api');
  const exporter = {
    export(spans, done) {
      exported += spans.length;
      if (serialize !== null && serialize(spans).length === 0) throw new Error('the OTLP serializer wrote nothing');
      done({ code: 0 });
    },
    shutdown: () => Promise.resolve(),
    forceFlush: () => Promise.resolve(),
  };
  // OTEL_BENCH_EXPORT=otlp: each batch is serialized as an OTLP exporter
  // does before sending (every span's name, attributes and ids read and
  // encoded), and the bytes dropped; otherwise the spans are only counted.
  const serialize =
    process.env.OTEL_BENCH_EXPORT === 'otlp'
      ? (spans) => require('@opentelemetry/otlp-transformer').ProtobufTraceSerializer.serializeRequest(spans) ?? []
      : null;
  const kinds = Array.isArray(manager) ? manager.filter(runsHere) : [manager];
  const created = (kind) => (kinds.length > 1 ? shareStorage(createManager(kind)) : createManager(kind));
  const managers = new Map(kinds.map((kind) => [kind, created(kind)]));
  // A manager's own span processor (the Datadog peer's, ending its records) runs first.
  const own = [...managers.values()].flatMap((m) => (m.spanProcessor ? [m.spanProcessor] : []));
  const provider = new NodeTracerProvider({ spanProcessors: [...own, new BatchSpanProcessor(exporter)] });
  provider.register({ contextManager: managers.get(kinds[0]) });
  registerInstrumentations({ tracerProvider: provider, instrumentations: instrumentations() });
  return {
    kinds,
    use(kind) {
      const next = managers.get(kind);
      if (next === undefined) throw new Error(`not one of this service's managers: ${kind}`);
      context.disable();
      context.setGlobalContextManager(next.enable());
    },
    async shutdown() {
      await provider.shutdown();
      return exported;
    },
  };
}

/** Calls `onLine(line)` for every line that `stream` delivers, without its newline. */
function onLines(stream, onLine) {
  let pending = '';
  stream.setEncoding('utf8');
  stream.on('data', (chunk) => {
    pending += chunk;
    for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n')) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      onLine(line);
    }
  });
}

/**
 * For a server whose `tracing` switches managers: answers the parent's
 * stdin lines `use <kind>` (switches, then prints {"using", "manager"}, the
 * global manager's class name) and `mark`
 * (prints {"cpuNs", "heap", "monotonicNs"}: this process's CPU time so far, to the
 * microsecond, the heap since the previous mark, bench/lib/heap.js, and
 * CLOCK_MONOTONIC in ns as a decimal string, the clock `perf record -k
 * CLOCK_MONOTONIC` stamps its samples with),
 * each with one JSON line on stdout. Calls `stop()` when stdin ends.
 */
function answerSwitches(tracing, stop) {
  const heap = require('./heap').heapWindows();
  onLines(process.stdin, (line) => {
    const [command, kind] = line.trim().split(' ');
    if (command === 'use') {
      tracing.use(kind);
      report({ using: kind, manager: require('@opentelemetry/api').context._getContextManager().constructor.name });
    } else if (command === 'mark') {
      // CPU first: of the heap read's few µs, only a burst's first falls in its CPU window.
      const cpu = cpuNs();
      report({ cpuNs: cpu, heap: heap(), monotonicNs: String(process.hrtime.bigint()) });
    }
  });
  process.stdin.on('end', stop);
}

module.exports = { ROOT, params, report, installManager, createManager, unavailable, shareStorage, traceService, answerSwitches, onLines, spanContext, since, cpuNs, median };
