//! `otel-thread-ctx sample`: stops and reads every thread F times a second
//! and reports which span each thread was in, and how often.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceId};
use serde::Serialize;

use crate::process_context;
use crate::ptrace::Tracer;
use crate::record::decode_attributes;
use crate::schema::nodejs::{self, Reason};
use crate::schema::Schema;
use crate::signals;
use crate::target::Target;
use crate::tasks;
use crate::thread::{self, Outcome, Plans};
use crate::tls::{self, TlsError};
use crate::Error;
use otel_thread_ctx_abi::attrs;

/// Layout version of the JSON summary.
pub const SCHEMA: &str = "otel-thread-ctx.sample/v1";

/// What to do.
pub struct Options {
    pub pid: i32,
    pub hz: f64,
    pub duration: Duration,
    pub stop_timeout: Duration,
}

/// One `--raw` line: a single read of a single thread.
#[derive(Serialize)]
pub struct RawSample<'a> {
    pub tid: i32,
    /// CLOCK_MONOTONIC nanoseconds at which the thread was stopped.
    pub t_ns: u64,
    pub valid: bool,
    /// The schema the read comes from (`tlsdesc_v1_dev`, `nodejs_v1_dev`).
    pub schema: Option<Schema>,
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub trace_flags: Option<u8>,
    /// The span's attributes, by key name (key map from the process
    /// context; `#<index>` for an index it does not name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
    /// Present only when the Node.js walk found no span: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_span_reason: Option<&'static str>,
    /// Present only when the read failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
    /// Present only when a record marked valid names no span (all-zero ids).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<&'a str>,
}

/// The summary (`--json` prints exactly this).
#[derive(Serialize, Debug)]
pub struct Summary {
    pub schema: &'static str,
    pub pid: i32,
    /// Resolution path of the reads (see the inspect report): the record
    /// schema's, else the Node.js schema's; after an exec, the new
    /// program's is in `execs`.
    pub resolution_path: &'static str,
    /// Resolution path of `otel_thread_ctx_nodejs_v1`, when the process
    /// publishes the Node.js schema.
    pub nodejs_resolution_path: Option<&'static str>,
    pub requested_hz: f64,
    pub requested_duration_s: f64,
    pub elapsed_s: f64,
    /// Completed rounds (each round reads every thread once).
    pub rounds: u64,
    /// rounds / elapsed_s.
    pub achieved_hz: f64,
    /// Ticks skipped because a round overran its period.
    pub missed_ticks: u64,
    /// Thread reads that stopped a thread.
    pub reads: u64,
    /// Reads skipped because the thread did not stop within the stop
    /// timeout (a loaded machine): no sample, no error, the thread is
    /// released as soon as it stops and read again in a later round.
    pub late_stops: u64,
    pub stop_time: StopStats,
    /// Set when SIGINT/SIGTERM/SIGHUP/SIGQUIT ended the run early.
    pub interrupted_by_signal: Option<i32>,
    /// The process exited before the requested duration was over; the
    /// summary covers the rounds read until then.
    pub target_exited: bool,
    /// Every time the process executed a new program during the run.
    pub execs: Vec<Exec>,
    pub threads: Vec<ThreadSummary>,
    /// Samples in a span per endpoint (`http.route`, after the method when
    /// published; `null` for spans that published none), all threads,
    /// most frequent first.
    pub endpoints: Vec<GroupShare>,
    /// Samples in a span per span name (`null`: no name published).
    pub span_names: Vec<GroupShare>,
}

/// Samples of all threads that share an endpoint or a span name.
#[derive(Serialize, Debug)]
pub struct GroupShare {
    pub name: Option<String>,
    pub samples: u64,
    /// samples / all samples in a span.
    pub share: f64,
}

/// The process executed a new program: reads stopped, and resumed once (and
/// if) its thread context was found.
#[derive(Serialize, Debug)]
pub struct Exec {
    /// When the exec was noticed, in seconds since the start of the run.
    pub elapsed_s: f64,
    /// The program executed (`/proc/<pid>/exe`).
    pub executable: String,
    /// How the new program's records are found; null while none is found.
    pub resolution_path: Option<&'static str>,
    /// When reads resumed; null if they never did.
    pub resumed_at_s: Option<f64>,
    /// Why the new program's thread context was not (yet) found, at the
    /// last look.
    pub error: Option<String>,
}

/// How long threads were held, over all reads (nanoseconds).
#[derive(Serialize, Debug, Default)]
pub struct StopStats {
    /// From observing the stop to the end of PTRACE_DETACH.
    pub held_median_ns: u64,
    pub held_p90_ns: u64,
    pub held_max_ns: u64,
    /// From PTRACE_INTERRUPT to observing the stop.
    pub to_stop_median_ns: u64,
    pub to_stop_p90_ns: u64,
}

#[derive(Serialize, Debug)]
pub struct ThreadSummary {
    pub tid: i32,
    pub name: String,
    /// The schema of the thread's latest read.
    pub schema: Option<Schema>,
    pub samples: u64,
    /// Samples of the Node.js walk without a span, per reason (in `idle`).
    pub no_span: BTreeMap<&'static str, u64>,
    /// Samples with no record or an invalid one (including `zero_ids`).
    pub idle: u64,
    pub idle_share: f64,
    /// Samples of a record marked valid whose trace or span id is all zero,
    /// which names no span.
    pub zero_ids: u64,
    pub errors: u64,
    /// Reads of this thread skipped because it stopped late (not in `samples`).
    pub late_stops: u64,
    /// Valid samples per span, most frequent first.
    pub spans: Vec<SpanShare>,
}

#[derive(Serialize, Debug)]
pub struct SpanShare {
    pub trace_id: String,
    pub span_id: String,
    /// As the span's records published them (the latest read).
    pub span_name: Option<String>,
    pub endpoint: Option<String>,
    pub local_root_span_id: Option<String>,
    pub samples: u64,
    /// samples / thread samples.
    pub share: f64,
}

#[derive(Default)]
struct Tally {
    schema: Option<Schema>,
    no_span: BTreeMap<Reason, u64>,
    samples: u64,
    idle: u64,
    zero_ids: u64,
    errors: u64,
    late_stops: u64,
    spans: HashMap<(TraceId, SpanId), SpanTally>,
}

/// A span's samples and what its records said about it.
#[derive(Default)]
struct SpanTally {
    samples: u64,
    name: Option<String>,
    endpoint: Option<String>,
    local_root_span_id: Option<String>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Sleeps until `t`, returning early if a termination signal arrives.
fn sleep_until(t: Instant) {
    while signals::requested().is_none() {
        let now = Instant::now();
        if now >= t {
            return;
        }
        let d = t - now;
        let ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        };
        // SAFETY: valid timespec; EINTR just loops back to the checks.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

/// Why the process publishes no readable thread context (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum Unpublished {
    #[error("no module defines otel_thread_ctx_v1 or otel_thread_ctx_nodejs_v1")]
    NoModule,
    #[error("cannot resolve {symbol} in {module}: {source}")]
    Unresolvable {
        symbol: &'static str,
        module: String,
        #[source]
        source: TlsError,
    },
}

/// How the reads of one program find its threads' context.
struct Reading {
    plans: Plans,
    /// The key map of the process context, for attributes.
    key_map: Option<Vec<String>>,
    /// The record schema's resolution path, else the Node.js schema's.
    path: &'static str,
    nodejs_path: Option<&'static str>,
}

/// The thread context of the program the process runs, or why it has none:
/// every schema it publishes whose variable resolves.
fn resolve(target: &Target) -> Result<Reading, Unpublished> {
    let mut paths = Vec::new();
    let mut failure = None;
    for schema in Schema::ALL {
        match target.schema(schema) {
            Some((_, Ok(r))) => paths.push((schema, r.path)),
            Some((module, Err(source))) => {
                failure.get_or_insert(Unpublished::Unresolvable {
                    symbol: schema.symbol(),
                    module: module.path.clone(),
                    source: source.clone(),
                });
            }
            None => {}
        }
    }
    let Some(&(_, path)) = paths.first() else {
        return Err(failure.unwrap_or(Unpublished::NoModule));
    };
    let pc = process_context::lookup(&target.maps, &target.memory);
    let key_map = match &pc {
        process_context::Lookup::Found(d) => d.attribute_key_map.clone(),
        _ => None,
    };
    Ok(Reading {
        plans: Plans {
            record: target.plan(Schema::Record),
            nodejs: target.nodejs_plans(),
            layout: pc.v8_layout(),
        },
        key_map,
        path,
        nodejs_path: paths
            .iter()
            .find(|(s, _)| *s == Schema::Nodejs)
            .map(|&(_, p)| p),
    })
}

/// Sample counts per group, most frequent first, with their share of all.
fn group_shares(groups: HashMap<Option<String>, u64>) -> Vec<GroupShare> {
    let total: u64 = groups.values().sum();
    let mut out: Vec<GroupShare> = groups
        .into_iter()
        .map(|(name, samples)| GroupShare {
            name,
            samples,
            share: samples as f64 / total.max(1) as f64,
        })
        .collect();
    out.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.name.cmp(&b.name)));
    out
}

/// The attributes of a record's attrs_data, by key name.
fn attributes(data: &[u8], key_map: Option<&[String]>) -> BTreeMap<String, String> {
    decode_attributes(data)
        .entries
        .into_iter()
        .map(|a| {
            let key = key_map
                .and_then(|m| m.get(a.key_index as usize))
                .cloned()
                .unwrap_or_else(|| format!("#{}", a.key_index));
            (key, String::from_utf8_lossy(&a.value).into_owned())
        })
        .collect()
}

/// The executable the process runs now (`/proc/<pid>/exe`).
fn executable(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// First wait before looking for the thread context of a program the
/// process has just executed (it may still be loading), and the longest.
const REDISCOVERY_FIRST: Duration = Duration::from_millis(5);
const REDISCOVERY_MAX: Duration = Duration::from_millis(500);

/// Moves `next` one period on; when the round overran, skips the ticks it
/// missed instead of bursting. Returns how many were skipped.
fn advance(next: &mut Instant, period: Duration) -> u64 {
    *next += period;
    let now = Instant::now();
    if *next >= now {
        return 0;
    }
    let behind = (now - *next).as_nanos() / period.as_nanos().max(1);
    *next += period * behind as u32;
    behind as u64
}

/// Runs the sampler. With `raw`, writes one JSON line per read to `raw`
/// (flushed per line). Returns the summary, or `Ok(Err(reason))` when the
/// process publishes no readable thread context (exit 1).
///
/// Every read goes through the memory of the address space the resolution
/// was made in. When the process executes a new program, those reads fail
/// as a whole (nothing of the new program is ever read at the old
/// addresses); the reader then looks for the new program's thread context,
/// reads no thread until it finds one, and resumes with it.
pub fn run(
    opts: &Options,
    mut raw: Option<&mut dyn Write>,
) -> Result<Result<Summary, Unpublished>, Error> {
    let target = Target::open(opts.pid)?;
    let resolution = match resolve(&target) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let first_path = resolution.path;
    let nodejs_path = resolution.nodejs_path;
    // What is read now; `None` after an exec until the new program's
    // thread context is found.
    let mut current = Some((target, resolution));
    let mut execs: Vec<Exec> = Vec::new();
    let mut rediscovery_wait = REDISCOVERY_FIRST;
    let mut rediscover_at = Instant::now();
    let period = Duration::from_secs_f64(1.0 / opts.hz);
    let mut tracer = Tracer::new(opts.pid, opts.stop_timeout);
    let mut tallies: BTreeMap<i32, Tally> = BTreeMap::new();
    let mut held = Vec::new();
    let mut to_stop = Vec::new();
    let (mut rounds, mut missed, mut reads, mut late_stops) = (0u64, 0u64, 0u64, 0u64);
    let mut target_exited = false;
    let start = Instant::now();
    let end = start + opts.duration;
    let mut next = start;
    'run: while signals::requested().is_none() {
        sleep_until(next.min(end));
        if signals::requested().is_some() || Instant::now() >= end {
            break;
        }
        if current.is_none() {
            if tasks::process_exited(opts.pid) {
                target_exited = true;
                break;
            }
            if Instant::now() >= rediscover_at {
                let exec = execs.last_mut().expect("an exec started the search");
                exec.executable = executable(opts.pid);
                match Target::open(opts.pid)
                    .map_err(|e| e.to_string())
                    .and_then(|t| resolve(&t).map(|r| (t, r)).map_err(|e| e.to_string()))
                {
                    Ok((t, r)) => {
                        exec.resolution_path = Some(r.path);
                        exec.resumed_at_s = Some(start.elapsed().as_secs_f64());
                        exec.error = None;
                        current = Some((t, r));
                    }
                    Err(e) => {
                        exec.error = Some(e);
                        rediscover_at = Instant::now() + rediscovery_wait;
                        rediscovery_wait = (rediscovery_wait * 2).min(REDISCOVERY_MAX);
                    }
                }
            }
            if current.is_none() {
                advance(&mut next, period);
                continue;
            }
        }
        let (target, resolution) = current.as_ref().expect("checked above");
        let tids = tasks::list(opts.pid);
        if tids.is_empty() {
            target_exited = true;
            break;
        }
        // Threads read this round; none means every listed thread is gone.
        let mut read_any = false;
        for tid in tids {
            if signals::requested().is_some() {
                break 'run;
            }
            let read = match thread::read(
                &mut tracer,
                tid,
                &resolution.plans,
                &target.memory,
                &tls::HOST,
                // The summary names spans and endpoints from the attributes.
                true,
            ) {
                Ok(read) => read,
                // The process died under the read: end with what was gathered.
                Err(_) if tasks::process_exited(opts.pid) => {
                    target_exited = true;
                    break 'run;
                }
                Err(e) => return Err(Error::Denied(e)),
            };
            match read.outcome {
                Outcome::Gone => continue,
                Outcome::AddressSpaceGone if tasks::process_exited(opts.pid) => {
                    target_exited = true;
                    break 'run;
                }
                Outcome::AddressSpaceGone => {
                    // A new program: the round so far stands, the rest of it
                    // would read nothing.
                    execs.push(Exec {
                        elapsed_s: start.elapsed().as_secs_f64(),
                        executable: executable(opts.pid),
                        resolution_path: None,
                        resumed_at_s: None,
                        error: None,
                    });
                    current = None;
                    rediscovery_wait = REDISCOVERY_FIRST;
                    rediscover_at = Instant::now() + rediscovery_wait;
                    advance(&mut next, period);
                    continue 'run;
                }
                _ => {}
            }
            read_any = true;
            if read.late_stop {
                // A profiler on a loaded machine misses that sample and goes
                // on; so does the sampler.
                late_stops += 1;
                tallies.entry(tid).or_default().late_stops += 1;
                continue;
            }
            reads += 1;
            if let Some(t) = read.times {
                held.push(t.held.as_nanos() as u64);
                to_stop.push(t.to_stop.as_nanos() as u64);
            }
            let tally = tallies.entry(tid).or_default();
            tally.samples += 1;
            tally.schema = read.schema.or(tally.schema);
            let mut line = RawSample {
                tid,
                t_ns: read.t_ns,
                valid: false,
                schema: read.schema,
                attributes: None,
                no_span_reason: None,
                trace_id: None,
                span_id: None,
                trace_flags: None,
                error: None,
                problem: None,
            };
            let zero_ids;
            let error;
            match &read.outcome {
                Outcome::Record(r) if r.header.names_a_span() => {
                    let attrs = attributes(&r.attrs_data, resolution.key_map.as_deref());
                    let span = tally
                        .spans
                        .entry((r.header.trace_id, r.header.span_id))
                        .or_default();
                    span.samples += 1;
                    let get = |k: &str| attrs.get(k).map(String::as_str);
                    // The latest read wins: an endpoint may arrive late.
                    if let Some(name) = get(attrs::SPAN_NAME_KEY) {
                        span.name = Some(name.to_string());
                    }
                    if let Some(endpoint) = crate::record::endpoint(get) {
                        span.endpoint = Some(endpoint);
                    }
                    if let Some(id) = get(attrs::LOCAL_ROOT_SPAN_ID_KEY) {
                        span.local_root_span_id = Some(id.to_string());
                    }
                    line.valid = true;
                    line.trace_id = Some(r.header.trace_id.to_string());
                    line.span_id = Some(r.header.span_id.to_string());
                    line.trace_flags = Some(r.header.trace_flags.to_u8());
                    if raw.is_some() {
                        line.attributes = Some(attrs);
                    }
                }
                Outcome::Record(r) if r.header.is_valid() => {
                    // Marked valid, but an all-zero id names no span.
                    tally.idle += 1;
                    tally.zero_ids += 1;
                    zero_ids = r.header.zero_ids().map(|z| z.to_string());
                    line.problem = zero_ids.as_deref();
                }
                Outcome::Record(_) | Outcome::NoRecord(_) => tally.idle += 1,
                Outcome::NoSpan(nodejs::NoSpan { reason, .. }) => {
                    tally.idle += 1;
                    *tally.no_span.entry(*reason).or_default() += 1;
                    line.no_span_reason = Some(reason.as_str());
                }
                Outcome::Error(e) => {
                    tally.errors += 1;
                    error = e.to_string();
                    line.error = Some(&error);
                }
                Outcome::Gone | Outcome::AddressSpaceGone => unreachable!(),
            }
            if let Some(w) = raw.as_mut() {
                let ok = serde_json::to_writer(&mut **w, &line).is_ok()
                    && w.write_all(b"\n").is_ok()
                    && w.flush().is_ok();
                if !ok {
                    // The consumer went away (e.g. a closed pipe): stop sampling.
                    break 'run;
                }
            }
        }
        if !read_any && tasks::process_exited(opts.pid) {
            // Exited, possibly still a zombie its parent has not reaped.
            target_exited = true;
            break;
        }
        rounds += 1;
        missed += advance(&mut next, period);
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(tracer);
    held.sort_unstable();
    to_stop.sort_unstable();
    let mut endpoints: HashMap<Option<String>, u64> = HashMap::new();
    let mut span_names: HashMap<Option<String>, u64> = HashMap::new();
    let threads = tallies
        .into_iter()
        .map(|(tid, t)| {
            let mut spans: Vec<SpanShare> = t
                .spans
                .into_iter()
                .map(|((trace, span), n)| {
                    *endpoints.entry(n.endpoint.clone()).or_default() += n.samples;
                    *span_names.entry(n.name.clone()).or_default() += n.samples;
                    SpanShare {
                        trace_id: trace.to_string(),
                        span_id: span.to_string(),
                        span_name: n.name,
                        endpoint: n.endpoint,
                        local_root_span_id: n.local_root_span_id,
                        samples: n.samples,
                        share: n.samples as f64 / t.samples as f64,
                    }
                })
                .collect();
            spans.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.span_id.cmp(&b.span_id)));
            ThreadSummary {
                tid,
                name: tasks::name(opts.pid, tid),
                schema: t.schema,
                samples: t.samples,
                no_span: t
                    .no_span
                    .into_iter()
                    .map(|(r, n)| (r.as_str(), n))
                    .collect(),
                idle: t.idle,
                // A thread whose every read was skipped has no samples.
                idle_share: if t.samples == 0 {
                    0.0
                } else {
                    t.idle as f64 / t.samples as f64
                },
                zero_ids: t.zero_ids,
                errors: t.errors,
                late_stops: t.late_stops,
                spans,
            }
        })
        .collect();
    Ok(Ok(Summary {
        schema: SCHEMA,
        pid: opts.pid,
        resolution_path: first_path,
        nodejs_resolution_path: nodejs_path,
        requested_hz: opts.hz,
        requested_duration_s: opts.duration.as_secs_f64(),
        elapsed_s: elapsed,
        rounds,
        achieved_hz: if elapsed > 0.0 {
            rounds as f64 / elapsed
        } else {
            0.0
        },
        missed_ticks: missed,
        reads,
        late_stops,
        stop_time: StopStats {
            held_median_ns: percentile(&held, 0.5),
            held_p90_ns: percentile(&held, 0.9),
            held_max_ns: held.last().copied().unwrap_or(0),
            to_stop_median_ns: percentile(&to_stop, 0.5),
            to_stop_p90_ns: percentile(&to_stop, 0.9),
        },
        interrupted_by_signal: signals::requested(),
        target_exited,
        execs,
        threads,
        endpoints: group_shares(endpoints),
        span_names: group_shares(span_names),
    }))
}
