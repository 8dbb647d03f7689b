'use strict';
// The traced work that bench/profile-overhead.js and bench/agent-cost.js
// measure a reader against: UNITS units of CPU work, each in a span (with an
// http.route) entered with the ProfilingContextManager and an await inside,
// on the main thread and one worker; UNITS=0 works until killed. Prints
// {ready: pid}, starts at a line on stdin, and ends printing {cpuTicks}: the
// process's user + system time from /proc/self/stat, in USER_HZ ticks.

const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..');

/**
 * The workload's source (workers need a file to run: write it to one).
 * `tracer` names the tracer; `resource`, when given, is published as the
 * process context.
 */
function tracedWorkload({ tracer, resource = null }) {
  const resolve = (name) => JSON.stringify(require.resolve(name, { paths: [ROOT] }));
  return `
const { Worker, isMainThread } = require('node:worker_threads');
const { context, trace } = require(${resolve('@opentelemetry/api')});
const { BasicTracerProvider } = require(${resolve('@opentelemetry/sdk-trace-base')});
const { ProfilingContextManager, publishProcessContext } = require(${JSON.stringify(ROOT)});
context.setGlobalContextManager(new ProfilingContextManager({ attributes: ['http.route'] }).enable());
const tracer = new BasicTracerProvider().getTracer(${JSON.stringify(tracer)});
const units = Number(process.env.UNITS);
async function work() {
  for (let i = 0; units === 0 || i < units; i++) {
    const span = tracer.startSpan('unit', { attributes: { 'http.route': '/unit/' + (i % 8) } });
    await context.with(trace.setSpan(context.active(), span), async () => {
      let x = 0;
      for (let j = 0; j < 200000; j++) x += Math.sqrt(j + x);
      await new Promise((r) => setImmediate(r));
      span.end();
      return x;
    });
  }
}
if (isMainThread) {
  ${resource ? `publishProcessContext({ resource: ${JSON.stringify(resource)} });` : ''}
  console.log(JSON.stringify({ ready: process.pid }));
  process.stdin.once('data', async () => {
    const w = new Worker(__filename);
    await Promise.all([work(), new Promise((r) => w.once('exit', r))]);
    const f = require('node:fs').readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ');
    console.log(JSON.stringify({ cpuTicks: Number(f[11]) + Number(f[12]) }));
    process.exit(0);
  });
} else {
  work();
}
`;
}

module.exports = { tracedWorkload };
