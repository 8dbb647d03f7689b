'use strict';
// deploy/: the systemd unit and the Kubernetes DaemonSet, checked with
// systemd's own verifier and the Kubernetes API's own types (no host
// install, no cluster); the agent arguments of each parsed by the agent
// itself; both granting exactly the capabilities deploy/README.md lists.

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { scratchDir } = require('./helpers');
const { manifestChecker, decodeManifest } = require('../tools/k8s-manifest');

const ROOT = path.resolve(__dirname, '..');
const UNIT = path.join(ROOT, 'deploy', 'systemd', 'otel-thread-ctx-agent.service');
const DAEMONSET = path.join(ROOT, 'deploy', 'kubernetes', 'daemonset.yaml');
const INSTALLED_BINARY = '/usr/local/bin/otel-thread-ctx';

const reader = require('../js/native').readerPath();

/** The capabilities deploy/README.md's table lists, as `CAP_X` names. */
function documentedCapabilities() {
  const text = fs.readFileSync(path.join(ROOT, 'deploy', 'README.md'), 'utf8');
  const section = text.slice(text.indexOf('## Capabilities'), text.indexOf('## Checked by the tests'));
  return [...section.matchAll(/^\| `(CAP_[A-Z_]+)` \|/gm)].map((m) => m[1]).sort();
}

/** The unit's `[Service]` settings: key → list of values (a key may repeat). */
function serviceSettings(text) {
  const settings = new Map();
  let section = null;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const header = /^\[(.+)\]$/.exec(line);
    if (header) {
      section = header[1];
      continue;
    }
    if (section !== 'Service') continue;
    const eq = line.indexOf('=');
    const key = line.slice(0, eq);
    if (!settings.has(key)) settings.set(key, []);
    settings.get(key).push(line.slice(eq + 1));
  }
  return settings;
}

/** Whether the agent's own argument parser takes `args` (after `agent`). */
function agentAccepts(args) {
  const run = spawnSync(reader, [...args, '--help'], { encoding: 'utf8' });
  return { ok: run.status === 0, stderr: run.stderr };
}

test('the systemd unit passes systemd-analyze verify and the agent takes its arguments', (t) => {
  if (reader === null) return t.skip('the reader CLI is not built');
  const analyze = spawnSync('systemd-analyze', ['--version'], { encoding: 'utf8' });
  if (analyze.error) return t.skip(`systemd-analyze is not installed (${analyze.error.code})`);
  const text = fs.readFileSync(UNIT, 'utf8');
  const service = serviceSettings(text);

  // The verifier checks that ExecStart's binary exists: the same unit with
  // the built binary in place of the installed one.
  const dir = scratchDir('deploy-unit-');
  const copy = path.join(dir, path.basename(UNIT));
  fs.writeFileSync(copy, text.replaceAll(INSTALLED_BINARY, reader));
  const verify = spawnSync('systemd-analyze', ['verify', copy], { encoding: 'utf8' });
  const ours = verify.stderr.split('\n').filter((line) => line.includes(path.basename(UNIT)));
  assert.deepStrictEqual(ours, [], `systemd-analyze verify: ${verify.stderr}`);
  assert.strictEqual(verify.status, 0, verify.stderr);

  // ExecStart, with ${VAR} from Environment= as systemd expands it.
  const environment = new Map(service.get('Environment').map((e) => e.split(/=(.*)/s).slice(0, 2)));
  const [binary, ...args] = service.get('ExecStart')[0].split(/\s+/).map((word) => word.replace(/\$\{(\w+)\}/g, (_, name) => {
    assert.ok(environment.has(name), `ExecStart uses \${${name}}, which Environment= does not set`);
    return environment.get(name);
  }));
  assert.strictEqual(binary, INSTALLED_BINARY);
  assert.strictEqual(args[0], 'agent');
  // The Collector comes from the exporter variables the agent reads itself (OTLP/HTTP by default).
  assert.strictEqual(environment.get('OTEL_EXPORTER_OTLP_ENDPOINT'), 'http://127.0.0.1:4318');
  assert.ok(!args.includes('--otlp-endpoint'), `ExecStart ${args.join(' ')} overrides the environment`);
  const accepted = agentAccepts(args);
  assert.ok(accepted.ok, `the agent refuses the unit's arguments ${args.join(' ')}: ${accepted.stderr}`);

  // No root: a dynamic user with exactly the documented capabilities.
  assert.deepStrictEqual(service.get('DynamicUser'), ['yes']);
  const capabilities = documentedCapabilities();
  assert.ok(capabilities.length >= 3, `deploy/README.md lists ${capabilities}`);
  assert.deepStrictEqual(service.get('AmbientCapabilities')[0].split(/\s+/).sort(), capabilities);
  assert.deepStrictEqual(service.get('CapabilityBoundingSet')[0].split(/\s+/).sort(), capabilities);
});

test('the DaemonSet decodes strictly with the Kubernetes API types and the agent takes its arguments', { timeout: 600_000 }, (t) => {
  if (reader === null) return t.skip('the reader CLI is not built');
  const checker = manifestChecker();
  if (checker.reason !== undefined) return t.skip(`the manifest checker cannot be built: ${checker.reason}`);
  const objects = decodeManifest(checker.binary, DAEMONSET);
  assert.deepStrictEqual(objects.map((o) => o.kind), ['DaemonSet']);
  const pod = objects[0].spec.template.spec;
  assert.strictEqual(pod.hostPID, true, 'the agent must see the host\'s processes');
  assert.strictEqual(pod.hostNetwork, undefined);
  assert.strictEqual(pod.containers.length, 1);
  const [container] = pod.containers;
  assert.deepStrictEqual(container.command, [INSTALLED_BINARY]);

  // args, with $(VAR) expanded from the container's env as the kubelet does.
  const env = new Map();
  for (const { name, value, valueFrom } of container.env) {
    env.set(name, valueFrom !== undefined ? '10.0.0.7' : value.replace(/\$\((\w+)\)/g, (_, ref) => env.get(ref)));
  }
  const args = container.args.map((arg) => arg.replace(/\$\((\w+)\)/g, (_, name) => {
    assert.ok(env.has(name), `args use $(${name}), which env does not set`);
    return env.get(name);
  }));
  assert.strictEqual(args[0], 'agent');
  // The Collector comes from the exporter variables the agent reads itself: OTLP/gRPC to the node.
  assert.strictEqual(env.get('OTEL_EXPORTER_OTLP_ENDPOINT'), 'http://10.0.0.7:4317');
  assert.strictEqual(env.get('OTEL_EXPORTER_OTLP_PROTOCOL'), 'grpc');
  assert.ok(!args.includes('--otlp-endpoint'), `args ${args.join(' ')} override the environment`);
  const accepted = agentAccepts(args);
  assert.ok(accepted.ok, `the agent refuses the DaemonSet's arguments ${args.join(' ')}: ${accepted.stderr}`);

  // Not privileged: every capability dropped but the documented ones.
  const security = container.securityContext;
  assert.strictEqual(security.privileged, false);
  assert.strictEqual(security.allowPrivilegeEscalation, false);
  assert.deepStrictEqual(security.capabilities.drop, ['ALL']);
  assert.deepStrictEqual(security.capabilities.add.map((c) => `CAP_${c}`).sort(), documentedCapabilities());
  assert.ok(container.resources.limits.memory, 'a memory limit bounds the agent');
});
