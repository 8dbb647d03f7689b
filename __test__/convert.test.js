'use strict';
// `convert`: OTLP files written by `profile --format otlp` read back and
// written as pprof (read by `go tool pprof`), folded stacks, SVGs and top
// tables; the filters keep exactly the matching samples. Making the OTLP
// files takes root and a kernel sampler: that part skips with the reason
// otherwise, the bad-input checks run wherever the reader is built.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { jsonLines, exited, profileUnavailable, scratchDir, goTool, rawSamples } = require('./helpers');

const READER = require('../js/native').readerPath();
const SERVICE = path.join(__dirname, 'fixtures', 'profiled-service.js');


const convert = (args, cwd) => spawnSync(READER, ['convert', ...args], { encoding: 'utf8', cwd });

const sum = (list, f) => list.reduce((a, s) => a + f(s), 0);

/** Folded lines as [stack, value]. */
const folded = (file) => fs.readFileSync(file, 'utf8').trim().split('\n').filter(Boolean).map((l) => {
  const i = l.lastIndexOf(' ');
  return [l.slice(0, i), Number(l.slice(i + 1))];
});

test('convert: bad input is an error with exit status 2, never a crash', { skip: READER === null ? 'the reader is not built' : false }, () => {
  const tmp = scratchDir('otel-thread-ctx-convert-bad-');
  fs.writeFileSync(path.join(tmp, 'text.pb'), 'hello, not a protobuf\n');
  fs.writeFileSync(path.join(tmp, 'empty.pb'), '');
  // A ProfilesData whose first field claims more bytes than the file has.
  fs.writeFileSync(path.join(tmp, 'cut.pb'), Buffer.from([0x0a, 0x40, 0x0a, 0x02]));
  for (const [args, message] of [
    [['text.pb'], /text\.pb: not an OTLP ProfilesData protobuf/],
    [['cut.pb'], /cut\.pb: not an OTLP ProfilesData protobuf \(or a truncated one\)/],
    [['empty.pb'], /empty\.pb: holds no profiles/],
    [['missing.pb'], /missing\.pb: No such file or directory/],
    [['cut.pb', '--format', 'jsonl'], /invalid value 'jsonl' for '--format <FORMAT>'/],
    [['cut.pb', '--trace-id', 'xyz'], /"xyz" is not a trace id: 32 hex digits/],
    [[], /required arguments were not provided/],
  ]) {
    const r = convert(args, tmp);
    assert.strictEqual(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, message);
    assert.doesNotMatch(r.stderr, /panicked/);
  }
});

const skip = profileUnavailable(READER);

test('convert', { skip: skip ?? false }, async (t) => {
  const tmp = scratchDir('otel-thread-ctx-convert-');
  const service = spawn(process.execPath, ['--perf-basic-prof', SERVICE], { cwd: tmp, stdio: ['ignore', 'pipe', 'inherit'] });
  const ids = JSON.parse(JSON.stringify(await jsonLines(service.stdout).next('the service line')));
  t.after(async () => {
    service.kill('SIGKILL');
    await exited(service);
    fs.rmSync(`/tmp/perf-${ids.pid}.map`, { force: true });
  });
  const { main, worker } = ids;
  // Two runs, as an agent writes one file per export.
  const inputs = [];
  for (const name of ['a.otlp.pb', 'b.otlp.pb']) {
    const r = spawnSync(READER, ['profile', '--pid', String(ids.pid), '--duration', '2', '--off-cpu=all', '--format', 'otlp', '-o', name], { cwd: tmp, encoding: 'utf8' });
    assert.strictEqual(r.status, 0, r.stderr);
    inputs.push(name);
  }
  const go = goTool();

  await t.test('pprof: the merged files, with the labels profile gives', (t) => {
    const one = convert([inputs[0], '-o', 'one.pb.gz'], tmp);
    assert.strictEqual(one.status, 0, one.stderr);
    const both = convert([...inputs, '-o', 'both.pb.gz'], tmp);
    assert.strictEqual(both.status, 0, both.stderr);
    const read = (r) => Number(r.stderr.match(new RegExp(`\\(pid ${ids.pid}\\): (\\d+) samples? on CPU`))[1]);
    assert.match(one.stderr, /^read 1 file \(pid \d+\)/m);
    assert.match(both.stderr, /^read 2 files \(pid \d+\)/m);
    assert.ok(read(both) > read(one), both.stderr);
    if (!go) return t.skip('no Go toolchain: go tool pprof cannot read the profile');
    const raw = spawnSync(go, ['tool', 'pprof', '-raw', path.join(tmp, 'both.pb.gz')], { encoding: 'utf8' });
    assert.strictEqual(raw.status, 0, raw.stderr);
    const samples = rawSamples(raw.stdout).samples;
    assert.strictEqual(sum(samples, (s) => s.values.samples), read(both));
    for (const [span, tid] of [[main.cpu, main.tid], [worker.span, worker.tid]]) {
      const own = samples.filter((s) => s.values.samples > 0 && s.labels.span_id === span.spanId);
      assert.ok(own.length > 0, `no samples of ${span.name}`);
      for (const s of own) {
        assert.strictEqual(s.labels.trace_id, span.traceId);
        assert.strictEqual(s.labels['thread.id'], String(tid));
        assert.strictEqual(s.labels.trace_endpoint, span.route);
        assert.strictEqual(s.labels.span_name, span.name);
        assert.strictEqual(s.labels.state, 'running');
      }
    }
    assert.ok(samples.some((s) => s.values.off_cpu > 0 && s.labels.state === 'blocked' && s.labels.span_id === main.wait.spanId));
    assert.ok(samples.some((s) => s.labels['thread.name']));
  });

  await t.test('filters keep exactly the matching samples', (t) => {
    if (!go) return t.skip('no Go toolchain: go tool pprof cannot read the profile');
    const all = rawSamples(spawnSync(go, ['tool', 'pprof', '-raw', path.join(tmp, 'both.pb.gz')], { encoding: 'utf8' }).stdout).samples;
    const totals = (list) => [sum(list, (s) => s.values.samples), sum(list, (s) => s.values.off_cpu)];
    for (const [args, keep] of [
      [['--endpoint', '/main/cpu'], (s) => s.labels['http.route'] === '/main/cpu'],
      [['--span-name', 'worker'], (s) => s.labels.span_name === 'worker'],
      [['--trace-id', main.wait.traceId.toUpperCase()], (s) => s.labels.trace_id === main.wait.traceId],
      [['--endpoint', '/main/cpu', '--endpoint', '/worker/cpu'], (s) => ['/main/cpu', '/worker/cpu'].includes(s.labels['http.route'])],
      [['--endpoint', '/main/cpu', '--span-name', 'worker'], () => false],
    ]) {
      const out = `filtered-${args.join('').replace(/\W/g, '')}.pb.gz`;
      const r = convert([...inputs, ...args, '-o', out], tmp);
      assert.strictEqual(r.status, 0, r.stderr);
      const expected = all.filter(keep);
      assert.match(r.stderr, /^kept \d+ of \d+ samples: the ones matching --/m);
      const raw = spawnSync(go, ['tool', 'pprof', '-raw', path.join(tmp, out)], { encoding: 'utf8' });
      assert.strictEqual(raw.status, 0, raw.stderr);
      const kept = rawSamples(raw.stdout).samples;
      assert.deepStrictEqual(totals(kept), totals(expected), args.join(' '));
      assert.ok(kept.every(keep), args.join(' '));
    }
    const none = convert([...inputs, '--endpoint', '/nope', '--format', 'top'], tmp);
    assert.strictEqual(none.status, 0, none.stderr);
    assert.match(none.stderr, /^kept 0 of \d+ samples: the ones matching --endpoint "\/nope"$/m);
    assert.match(none.stderr, /^the endpoints in the input: .*\/main\/cpu/m);
  });

  await t.test('folded: the whole run by endpoint, filtered to one endpoint', () => {
    const all = convert([...inputs, '--format', 'folded', '-o', 'all.folded', '--max-traces', '0'], tmp);
    assert.strictEqual(all.status, 0, all.stderr);
    const r = convert([...inputs, '--format', 'folded', '-o', 'cpu.folded', '--endpoint', '/main/cpu', '--max-traces', '0'], tmp);
    assert.strictEqual(r.status, 0, r.stderr);
    const whole = folded(path.join(tmp, 'all.folded'));
    const only = folded(path.join(tmp, 'cpu.folded'));
    assert.ok(only.length > 0 && only.every(([stack]) => stack.startsWith('/main/cpu;')), JSON.stringify(only.slice(0, 3)));
    const ofEndpoint = whole.filter(([stack]) => stack.startsWith('/main/cpu;'));
    assert.deepStrictEqual(only, ofEndpoint);
    assert.ok(whole.some(([stack]) => stack.startsWith('/worker/cpu;[on-cpu];')));
  });

  await t.test('top: tables, and functions per endpoint with --group-by', () => {
    const r = convert([...inputs, '--format', 'top'], tmp);
    assert.strictEqual(r.status, 0, r.stderr);
    assert.match(r.stdout, /^ENDPOINT +CPU ms +CPU% +off-CPU ms$/m, r.stdout);
    assert.match(r.stdout, /^\/worker\/cpu /m, r.stdout);
    assert.match(r.stdout, /^FUNCTION \(on CPU\) /m, r.stdout);
    assert.doesNotMatch(r.stdout, /^ENDPOINT \/worker\/cpu$/m, r.stdout);
    const grouped = convert([...inputs, '--format', 'top', '--group-by', 'endpoint'], tmp);
    assert.strictEqual(grouped.status, 0, grouped.stderr);
    assert.match(grouped.stdout, /^ENDPOINT \/worker\/cpu\nFUNCTION \(on CPU\) /m, grouped.stdout);
    assert.match(grouped.stdout, /^ENDPOINT \/main\/cpu\nFUNCTION \(on CPU\) /m, grouped.stdout);
    // Each endpoint's table lists functions of that endpoint's samples only
    // (the table keeps the functions with the most self time: which ones,
    // with so few samples, varies from run to run).
    for (const endpoint of ['/worker/cpu', '/main/cpu']) {
      const out = `only-${endpoint.replace(/\W/g, '')}.folded`;
      const f = convert([...inputs, '--format', 'folded', '--endpoint', endpoint, '-o', out], tmp);
      assert.strictEqual(f.status, 0, f.stderr);
      const stacks = fs.readFileSync(path.join(tmp, out), 'utf8');
      const rows = grouped.stdout.split(`ENDPOINT ${endpoint}\n`)[1].split('\n\n')[0].split('\n').slice(1);
      const names = rows.filter((l) => !/^\(\d+ more\)$/.test(l)).map((l) => l.split(/\s{2,}/)[0].replace(/…$/, ''));
      assert.ok(names.length > 0, grouped.stdout);
      for (const name of names) assert.ok(stacks.includes(name), `${endpoint}: ${name} is in none of its stacks:\n${stacks}`);
    }
  });

  await t.test('svg: per-trace graphs only for traces with enough samples, titled alike', () => {
    const r = convert([...inputs, '--format', 'svg', '-o', 'run.svg'], tmp);
    assert.strictEqual(r.status, 0, r.stderr);
    const line = r.stderr.match(/^wrote (\d+) per-trace files? beside it \(.*run\.<trace_id>\.svg\): traces with at least 10 samples \(--min-trace-samples\)/m);
    assert.ok(line, r.stderr);
    const files = fs.readdirSync(tmp).filter((f) => /^run\.[0-9a-f]{32}\.svg$/.test(f));
    assert.strictEqual(files.length, Number(line[1]));
    const title = (f) => fs.readFileSync(path.join(tmp, f), 'utf8').match(/id="title"[^>]*>([^<]*)</)[1];
    const subtitle = (f) => fs.readFileSync(path.join(tmp, f), 'utf8').match(/id="subtitle"[^>]*>([^<]*)</)[1];
    const prefix = `pid ${ids.pid}: CPU and off-CPU time `;
    assert.strictEqual(title('run.svg'), `${prefix}by endpoint`);
    const worker = files.find((f) => f.includes(ids.worker.span.traceId));
    assert.ok(worker, `no graph of the worker's trace in ${files}`);
    assert.strictEqual(title(worker), `${prefix}of worker /worker/cpu (trace ${ids.worker.span.traceId})`);
    const m = subtitle(worker).match(/^99 Hz, (\d+) samples over ([\d.]+) s \(first to last sample\); values in microseconds$/);
    assert.ok(m && Number(m[1]) >= 10 && Number(m[2]) > 1, subtitle(worker));
    // A minimum no trace reaches: no per-trace graph, and the line says why.
    const few = convert([...inputs, '--format', 'svg', '-o', 'few.svg', '--min-trace-samples', '1000000'], tmp);
    assert.strictEqual(few.status, 0, few.stderr);
    assert.match(few.stderr, /^wrote no per-trace file: traces with at least 1000000 samples \(--min-trace-samples\); \d+ traces? with fewer left out$/m);
    assert.deepStrictEqual(fs.readdirSync(tmp).filter((f) => /^few\..+\.svg$/.test(f)), []);
  });
  await t.test('the agent\'s --output-dir files, merged', async (t) => {
    const dir = path.join(tmp, 'agent');
    const agent = spawn(READER, ['agent', '--interval', '1', '--pid', String(ids.pid), '--output-dir', dir], { cwd: tmp, stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    agent.stderr.on('data', (d) => { log += d; });
    t.after(() => agent.kill('SIGKILL'));
    // Three exports, then SIGINT.
    const deadline = Date.now() + 120000;
    while ((log.match(/^otel-thread-ctx agent: wrote .*\.otlp\.pb \(1 process\)$/gm) ?? []).length < 3) {
      assert.ok(Date.now() < deadline && agent.exitCode === null, `the agent wrote no 3 exports:\n${log}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    agent.kill('SIGINT');
    await exited(agent);
    assert.match(log, /profiled 1 process: /);
    const files = fs.readdirSync(dir).filter((f) => f.endsWith('.otlp.pb')).sort().map((f) => path.join(dir, f));
    assert.ok(files.length >= 3, files.join(' '));
    const r = convert([...files, '--format', 'folded', '-o', 'agent.folded', '--span-name', 'worker', '--min-trace-samples', '1'], tmp);
    assert.strictEqual(r.status, 0, r.stderr);
    assert.match(r.stderr, new RegExp(`^read ${files.length} files \\(pid ${ids.pid}\\): \\d+ samples on CPU$`, 'm'));
    const lines = folded(path.join(tmp, 'agent.folded'));
    assert.ok(lines.length > 0 && lines.every(([stack]) => stack.startsWith('/worker/cpu;')), JSON.stringify(lines.slice(0, 3)));
    // The worker's one trace spans the exports: one per-trace file.
    assert.match(r.stderr, /^wrote 1 per-trace file beside it /m);
    assert.ok(fs.existsSync(path.join(tmp, `agent.${worker.span.traceId}.folded`)));
  });

  await t.test('profile keeps the matching samples too, in folded stacks and JSON lines', () => {
    const run = (args) => spawnSync(READER, ['profile', '--pid', String(ids.pid), '--duration', '2', ...args], { cwd: tmp, encoding: 'utf8' });
    const f = run(['--format', 'folded', '-o', 'p.folded', '--endpoint', '/main/cpu', '--max-traces', '0']);
    assert.strictEqual(f.status, 0, f.stderr);
    assert.match(f.stderr, /^kept \d+ of \d+ samples: the ones matching --endpoint "\/main\/cpu"$/m);
    const lines = folded(path.join(tmp, 'p.folded'));
    assert.ok(lines.length > 0 && lines.every(([stack]) => stack.startsWith('/main/cpu;')), JSON.stringify(lines.slice(0, 3)));
    const j = run(['--format', 'jsonl', '-o', 'p.jsonl', '--trace-id', worker.span.traceId]);
    assert.strictEqual(j.status, 0, j.stderr);
    const samples = fs.readFileSync(path.join(tmp, 'p.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    assert.ok(samples.length > 0);
    assert.ok(samples.every((x) => x.trace_id === worker.span.traceId && x.tid === worker.tid), JSON.stringify(samples.slice(0, 2)));
  });
});
