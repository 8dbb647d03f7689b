'use strict';
// CPU by endpoint in every output. An Express service whose /sort route
// does its work in a child span (fixtures/express-service.js) runs under
// load from here; the work of /sort (samples in traces that have its child
// span, or stacks that hold its function) must carry the endpoint /sort in
// at least 95 % of the samples: in `sample`, and with `profile` (root, BPF)
// in pprof as `go tool pprof` reads it, in OTLP decoded with the official
// proto, and in the whole-run flame graph; `--format top` prints the tables.
// Runs in the Node line's default mode: record on 20, frame on 24+.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const protobuf = require('protobufjs');
const { jsonLines, exited, profileUnavailable, scratchDir, goTool } = require('./helpers');

const READER = require('../js/native').readerPath();
const SERVICE = path.join(__dirname, 'fixtures', 'express-service.js');
const ROUTE = '/sort';
const SHARE = 0.95;


/** Runs the reader to its end: { code, stdout, stderr }. */
function reader(args) {
  return new Promise((resolve) => {
    const child = spawn(READER, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Requests `route` (3 of 4) and /ping over two keep-alive connections until stopped. */
function load(port, route = ROUTE) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 2 });
  const state = { running: true, served: 0 };
  const get = (route) =>
    new Promise((resolve) => {
      http
        .get({ host: '127.0.0.1', port, path: route, agent }, (res) => {
          res.resume();
          res.on('end', resolve);
        })
        .on('error', resolve);
    });
  const loop = async () => {
    for (let i = 0; state.running; i++) {
      await get(i % 4 === 3 ? '/ping' : route);
      state.served++;
    }
  };
  const loops = [loop(), loop()];
  return {
    served: () => state.served,
    stop: async () => {
      state.running = false;
      await Promise.all(loops);
      agent.destroy();
    },
  };
}

/** `part / whole`, asserting there is something to divide. */
function share(part, whole, what) {
  assert.ok(whole >= 20, `too few samples of ${what}: ${whole}`);
  return part / whole;
}

const tmp = scratchDir('otel-thread-ctx-endpoints-');
const ARTIFACTS = process.env.OTEL_THREAD_CTX_ARTIFACTS;

test('endpoints', { skip: READER === null ? 'the reader is not built' : false }, async (t) => {
  const service = spawn(process.execPath, ['--perf-basic-prof', SERVICE], { stdio: ['ignore', 'pipe', 'inherit'] });
  const started = await jsonLines(service.stdout).next('the service line');
  const pid = String(started.pid);
  const traffic = load(started.port);
  t.after(async () => {
    await traffic.stop();
    service.kill('SIGKILL');
    await exited(service);
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.rmSync(`/tmp/perf-${pid}.map`, { force: true });
  });
  // Requests are being served, then the JIT settles and the perf map fills.
  for (let i = 0; i < 600 && traffic.served() === 0; i++) await new Promise((resolve) => setTimeout(resolve, 100));
  assert.ok(traffic.served() > 0, 'the service answers');
  await new Promise((resolve) => setTimeout(resolve, 1000));
  assert.strictEqual(started.mode, Number(process.versions.node.split('.')[0]) >= 24 ? 'frame' : 'record');

  await t.test('sample: reads name the span, its local root and the endpoint', async () => {
    const r = await reader(['sample', '--pid', pid, '--hz', '199', '--duration', '3', '--raw', '--json']);
    assert.strictEqual(r.code, 0, r.stderr);
    const reads = r.stdout.trim().split('\n').map((l) => JSON.parse(l)).filter((x) => x.valid);
    const sortTraces = new Set(reads.filter((x) => x.attributes?.['span.name'] === 'sortBigArray').map((x) => x.trace_id));
    const ofRoute = reads.filter((x) => sortTraces.has(x.trace_id));
    const tagged = ofRoute.filter((x) => x.attributes['http.route'] === ROUTE);
    assert.ok(share(tagged.length, ofRoute.length, ROUTE) >= SHARE, `${tagged.length} of ${ofRoute.length} /sort reads carry the endpoint`);
    // Every read of a span names its local root: one per request.
    assert.ok(ofRoute.every((x) => /^[0-9a-f]{16}$/.test(x.attributes['local_root.span_id'])));
    const summary = JSON.parse(r.stderr);
    assert.strictEqual(summary.endpoints[0].name, ROUTE, JSON.stringify(summary.endpoints));
    assert.ok(summary.span_names.some((g) => g.name === 'sortBigArray'));
    const span = summary.threads.flatMap((th) => th.spans).find((s) => s.span_name === 'sortBigArray');
    assert.strictEqual(span.endpoint, ROUTE);
    assert.match(span.local_root_span_id, /^[0-9a-f]{16}$/);

    // Text: the tables by default, a line per thread and span with --spans.
    const text = await reader(['sample', '--pid', pid, '--hz', '99', '--duration', '1']);
    assert.strictEqual(text.code, 0, text.stderr);
    assert.match(text.stdout, /\nTID\s+NAME\s+SAMPLES\s+IDLE%\s+ERRORS\s+IN_SPAN%\s+SPANS\n/);
    assert.doesNotMatch(text.stdout, /SPAN_NAME\s+ENDPOINT/);
    assert.match(text.stdout, /\nENDPOINT\s+SAMPLES\s+SHARE%\n\/sort\s+\d+/);
    const rows = await reader(['sample', '--pid', pid, '--hz', '99', '--duration', '1', '--spans']);
    assert.strictEqual(rows.code, 0, rows.stderr);
    assert.match(rows.stdout, /SPAN_NAME\s+ENDPOINT/);
    assert.match(rows.stdout, /\nENDPOINT\s+SAMPLES\s+SHARE%\n\/sort\s+\d+/);
  });

  const skipProfile = profileUnavailable(READER);
  const go = goTool();

  await t.test('pprof: go tool pprof -tags shows the endpoint of the route\'s stacks', { skip: skipProfile ?? (go ? false : 'no Go toolchain') }, async () => {
    const out = path.join(tmp, 'run.pb.gz');
    const r = await reader(['profile', '--pid', pid, '--duration', '3', '--hz', '199', '-o', out]);
    assert.strictEqual(r.code, 0, r.stderr);
    // The stacks that hold the route's function, whatever their labels say.
    const tags = spawnSync(go, ['tool', 'pprof', '-tags', '-focus=sortNumbers', out], { encoding: 'utf8' });
    assert.strictEqual(tags.status, 0, tags.stderr);
    // Per label key, each value's time; percentages are of the whole profile,
    // so shares are taken against `state`, a label every sample has.
    const seconds = (text) => Number.parseFloat(text) * { s: 1, ms: 1e-3, us: 1e-6, µs: 1e-6, ns: 1e-9 }[text.replace(/^[\d.]+/, '')];
    const section = (key) => {
      const m = tags.stdout.match(new RegExp(`^ *${key}: Total .*\\n((?:\\s+\\S+ \\( *[\\d.]+%\\): .*\\n)+)`, 'm'));
      assert.ok(m, `no ${key} in:\n${tags.stdout}`);
      return Object.fromEntries([...m[1].matchAll(/(\S+) \( *[\d.]+%\): (.*)/g)].map(([, time, value]) => [value.trim(), seconds(time)]));
    };
    const all = Object.values(section('state')).reduce((a, b) => a + b, 0);
    assert.ok(all > 0.05, `too little CPU in sortNumbers: ${all} s`);
    const endpoint = section('trace_endpoint');
    assert.ok((endpoint[ROUTE] ?? 0) / all >= SHARE, `trace_endpoint of sortNumbers stacks (${all} s): ${JSON.stringify(endpoint)}`);
    assert.ok((section('span_name').sortBigArray ?? 0) / all >= SHARE);
    assert.ok(Object.keys(section('local_root_span_id')).every((id) => /^[0-9a-f]{16}$/.test(id)));

    // What docs/profile-outputs.md shows: only the labels asked for, and one endpoint's functions.
    const shown = spawnSync(go, ['tool', 'pprof', '-tags', '-tagshow=trace_endpoint|span_name', out], { encoding: 'utf8' });
    assert.strictEqual(shown.status, 0, shown.stderr);
    assert.deepStrictEqual([...shown.stdout.matchAll(/^ *(\S+): Total/gm)].map((m) => m[1]).sort(), ['span_name', 'trace_endpoint']);
    const focused = spawnSync(go, ['tool', 'pprof', '-top', `-tagfocus=trace_endpoint=${ROUTE}`, out], { encoding: 'utf8' });
    assert.strictEqual(focused.status, 0, focused.stderr);
    assert.match(focused.stdout, /sortNumbers/);
  });

  await t.test('otlp: samples of the route\'s stacks carry http.route, span.name and the local root', { skip: skipProfile ?? false }, async () => {
    const out = path.join(tmp, 'run.otlp.pb');
    const r = await reader(['profile', '--pid', pid, '--duration', '3', '--hz', '199', '--format', 'otlp', '-o', out]);
    assert.strictEqual(r.code, 0, r.stderr);
    const root = protobuf.loadSync(path.join(__dirname, 'fixtures', 'profiles.proto'));
    const Data = root.lookupType('otlp.profiles.test.ExportProfilesServiceRequest');
    const msg = Data.toObject(Data.decode(fs.readFileSync(out)), { longs: Number, bytes: Buffer });
    const dict = msg.dictionary;
    const str = (i) => dict.stringTable[i ?? 0];
    const [cpu] = msg.resourceProfiles[0].scopeProfiles[0].profiles;
    const functions = (s) =>
      (dict.stackTable[s.stackIndex ?? 0].locationIndices ?? []).map((l) => str(dict.functionTable[dict.locationTable[l].lines[0].functionIndex ?? 0].nameStrindex));
    const attrs = (s) => Object.fromEntries((s.attributeIndices ?? []).map((i) => [str(dict.attributeTable[i].keyStrindex), dict.attributeTable[i].value.stringValue]));
    const ofRoute = cpu.samples.filter((s) => functions(s).some((f) => f.includes('sortNumbers')));
    const weight = (list) => list.reduce((a, s) => a + (s.values?.length ?? 1), 0);
    const tagged = ofRoute.filter((s) => attrs(s)['http.route'] === ROUTE && attrs(s)['span.name'] === 'sortBigArray');
    assert.ok(share(weight(tagged), weight(ofRoute), 'sortNumbers') >= SHARE, `${weight(tagged)} of ${weight(ofRoute)}`);
    assert.ok(tagged.every((s) => /^[0-9a-f]{16}$/.test(attrs(s)['local_root.span_id'])));
  });

  await t.test('svg: the whole run is rooted at the endpoint, the route\'s function under /sort', { skip: skipProfile ?? false }, async () => {
    const out = path.join(tmp, 'run.svg');
    const r = await reader(['profile', '--pid', pid, '--duration', '3', '--hz', '199', '--format', 'svg', '--max-traces', '2', '--min-trace-samples', '1', '-o', out]);
    assert.strictEqual(r.code, 0, r.stderr);
    const svg = fs.readFileSync(out, 'utf8');
    assert.match(svg, new RegExp(`pid ${pid}: CPU by endpoint`));
    // inferno's boxes: title, then x and width in samples (fg:x, fg:w), and y.
    const boxes = [...svg.matchAll(/<g><title>(.*?) \([\d,]+ us, [\d.]+%\)<\/title><rect x="[^"]*" y="([\d.]+)" [^>]*fg:x="(\d+)" fg:w="(\d+)"/g)].map(
      ([, title, y, x, w]) => ({ title, y: Number(y), x: Number(x), w: Number(w) }),
    );
    assert.ok(boxes.length > 0, 'no boxes in the SVG');
    // The level above inferno's `all` box.
    const rootY = [...new Set(boxes.map((b) => b.y))].sort((a, b) => b - a)[1];
    const route = boxes.find((b) => b.y === rootY && b.title === ROUTE);
    assert.ok(route, `no ${ROUTE} root box among ${boxes.filter((b) => b.y === rootY).map((b) => b.title)}`);
    const hot = boxes.filter((b) => b.title.includes('sortNumbers'));
    const under = hot.filter((b) => b.x >= route.x && b.x + b.w <= route.x + route.w);
    const sum = (list) => list.reduce((a, b) => a + b.w, 0);
    assert.ok(share(sum(under), sum(hot), 'sortNumbers boxes') >= SHARE, `${sum(under)} of ${sum(hot)}`);
    // Per-trace graphs (a request's trace has few samples: every one asked
    // for): titled like the whole run, then the root span's name (when a
    // sample fell in it) and the route; span boxes by name.
    const perTrace = fs.readdirSync(tmp).filter((f) => /^run\.[0-9a-f]{32}\.svg$/.test(f));
    assert.ok(perTrace.length > 0);
    for (const file of perTrace) {
      const one = fs.readFileSync(path.join(tmp, file), 'utf8');
      assert.match(one, new RegExp(`>pid ${pid}: CPU of (.* )?(GET )?/sort \\(trace ${file.slice(4, 36)}\\)<`));
      assert.match(one, /<title>sortBigArray \([0-9a-f]{16}\) /);
    }
    if (ARTIFACTS) fs.copyFileSync(out, path.join(ARTIFACTS, 'endpoints-whole-run.svg'));
  });

  await t.test('top: CPU by endpoint, span name and function', { skip: skipProfile ?? false }, async () => {
    const r = await reader(['profile', '--pid', pid, '--duration', '2', '--hz', '199', '--format', 'top', '--off-cpu']);
    assert.strictEqual(r.code, 0, r.stderr);
    const rows = (title) => {
      const block = r.stdout.split('\n\n').find((b) => b.startsWith(title));
      assert.ok(block, `no ${title} table in:\n${r.stdout}`);
      return block.split('\n').slice(1);
    };
    assert.match(rows('ENDPOINT')[0], /^\/sort\s+[\d.]+\s+[\d.]+\s+[\d.]+$/);
    assert.ok(rows('SPAN NAME').some((l) => l.startsWith('sortBigArray ')));
    assert.ok(rows('FUNCTION').some((l) => /sort/i.test(l)), r.stdout);
  });
});

const WORKER_SERVICE = path.join(__dirname, 'fixtures', 'express-worker-service.js');
const FRAME_LINE = Number(process.versions.node.split('.')[0]) >= 24;

// A request whose work runs in a worker: the worker's span has a remote
// parent (the trace context came by message), and still publishes the
// request's endpoint and local root, found in the process's trace-root
// table. In the line's default mode and, where that is frame, in record mode.
for (const mode of FRAME_LINE ? ['frame', 'record'] : ['record']) {
  test(`endpoints across threads (${mode} mode): the worker's span carries the request's route and local root`, { skip: READER === null ? 'the reader is not built' : false }, async (t) => {
    const env = { ...process.env, OTEL_THREAD_CTX_MODE: mode };
    const service = spawn(process.execPath, ['--perf-basic-prof', WORKER_SERVICE], { stdio: ['ignore', 'pipe', 'inherit'], env });
    const started = await jsonLines(service.stdout).next('the service line');
    const pid = String(started.pid);
    const traffic = load(started.port, '/offload');
    t.after(async () => {
      await traffic.stop();
      service.kill('SIGKILL');
      await exited(service);
      fs.rmSync(`/tmp/perf-${pid}.map`, { force: true });
    });
    assert.strictEqual(started.mode, mode);
    for (let i = 0; i < 600 && traffic.served() === 0; i++) await new Promise((resolve) => setTimeout(resolve, 100));
    assert.ok(traffic.served() > 0, 'the service answers');
    // The main thread starts sharing its roots within a second of a second thread loading the addon.
    await new Promise((resolve) => setTimeout(resolve, 1500));

    // The main thread is inside a request's span only briefly (the worker
    // does the work): rounds of 3 s until some trace was read on both
    // threads (one round on a quiet machine, more on a loaded one).
    const reads = [];
    const readOnBoth = () => {
      const workerTraces = new Set(reads.filter((x) => x.attributes?.['span.name'] === 'offloadedSort').map((x) => x.trace_id));
      return reads.some((x) => x.tid !== started.workerTid && workerTraces.has(x.trace_id));
    };
    for (let round = 0; round < 5 && (round === 0 || !readOnBoth()); round++) {
      const r = await reader(['sample', '--pid', pid, '--hz', '199', '--duration', '3', '--raw', '--json']);
      assert.strictEqual(r.code, 0, r.stderr);
      reads.push(...r.stdout.trim().split('\n').map((l) => JSON.parse(l)).filter((x) => x.valid));
    }
    const inWorker = reads.filter((x) => x.attributes?.['span.name'] === 'offloadedSort');
    assert.ok(inWorker.every((x) => x.tid === started.workerTid), 'the worker span is read in the worker thread');
    const tagged = inWorker.filter((x) => x.attributes['http.route'] === '/offload');
    assert.ok(share(tagged.length, inWorker.length, 'the worker span') >= SHARE, `${tagged.length} of ${inWorker.length} worker reads carry the endpoint`);
    // Where the main thread was read in the same trace, both name the same local root.
    const mainRoots = new Map(reads.filter((x) => x.tid !== started.workerTid).map((x) => [x.trace_id, x.attributes?.['local_root.span_id']]));
    const compared = inWorker.filter((x) => mainRoots.has(x.trace_id));
    assert.ok(compared.length > 0, 'some traces were read on both threads');
    for (const x of compared) assert.strictEqual(x.attributes['local_root.span_id'], mainRoots.get(x.trace_id), `trace ${x.trace_id}`);

    await t.test('profile: the worker\'s CPU is under the route', { skip: profileUnavailable(READER) ?? false }, async () => {
      const dir = scratchDir('otel-thread-ctx-endpoints-worker-');
      t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
      const out = path.join(dir, 'run.jsonl');
      const p = await reader(['profile', '--pid', pid, '--duration', '3', '--hz', '199', '--format', 'jsonl', '-o', out]);
      assert.strictEqual(p.code, 0, p.stderr);
      const samples = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
      // The worker runs only the offloaded work: its on-CPU samples are that work's.
      const workerCpu = samples.filter((s) => s.tid === started.workerTid && s.kind === 'cpu');
      const underRoute = workerCpu.filter((s) => s.attributes?.['http.route'] === '/offload');
      assert.ok(share(underRoute.length, workerCpu.length, 'the worker thread') >= SHARE, `${underRoute.length} of ${workerCpu.length} worker CPU samples under /offload`);
    });
  });
}
