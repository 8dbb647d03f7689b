//! Continuous, host-wide profiling (the `agent` command). One BPF program samples every
//! process that publishes a thread context (or the ones named), found and
//! dropped by a scan of /proc as they start and exit; every interval, one
//! OTLP export holds one ResourceProfiles per process, written to files
//! and/or sent to an OTLP receiver.
//!
//! Four threads, so that nothing waits on anything slower than itself:
//! - sampling (this one): drains the ring buffer, unwinds stacks while the
//!   processes are alive, applies the scan's changes to the program;
//! - scanning: looks through /proc every [`SCAN_EVERY`];
//! - building: names frames and builds each export, writes the file;
//! - exporting: sends, retries, drops the oldest when the receiver is away.
//!
//! At SIGINT/SIGTERM the last interval is cut, and building and sending it
//! (and what still waits) get [`SHUTDOWN_WITHIN`]: whatever the receiver
//! does, the agent exits soon after, counting what it did not send.

pub mod export;
pub mod files;
pub mod processes;
pub mod profiled;
pub mod queue;
pub mod request;
pub mod resource;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use otel_thread_ctx_formats::count;
use otel_thread_ctx_profiler::loader;
use otel_thread_ctx_profiler::SamplerError;

/// How often /proc is scanned for processes that started or exited.
pub const SCAN_EVERY: Duration = Duration::from_secs(2);
/// Exports waiting for the receiver at most (the oldest goes first).
const QUEUE_CAPACITY: usize = 16;
/// Intervals waiting to be built at most.
const JOBS_WAITING: usize = 2;
/// Processes profiled at once at most (the program's `targets` entries).
const MAX_PROCESSES: u32 = 4096;
/// From the arrival of SIGINT/SIGTERM, how long the last export may take to
/// be built and sent: what is not sent by then is counted as unsent, and the
/// agent exits. With the teardown after it, the agent exits within 2 s of
/// the signal.
pub const SHUTDOWN_WITHIN: Duration = Duration::from_millis(1500);

pub struct Options {
    pub interval: Duration,
    pub hz: u64,
    pub off_cpu: bool,
    pub output_dir: Option<PathBuf>,
    pub output_max_bytes: u64,
    pub endpoint: Option<export::Endpoint>,
    /// Exports in the span-profile form, filed under which span.
    pub span_profiles: Option<otel_thread_ctx_formats::otlp::SpanProfiles>,
    pub selection: processes::Selection,
    /// How often the agent logs its own metrics (`None`: never).
    pub metrics_every: Option<Duration>,
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error("agent needs somewhere to export: --otlp-endpoint URL (or OTEL_EXPORTER_OTLP_ENDPOINT) and/or --output-dir DIR")]
    NoDestination,
    #[error("cannot use --output-dir {}: {source}", .path.display())]
    OutputDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the exporter: {0}")]
    Exporter(#[source] std::io::Error),
}

/// Runs until SIGINT/SIGTERM, then exports once more and returns the
/// summary lines.
pub fn run(opts: &Options) -> Result<Vec<String>, AgentError> {
    // A usage error first: it says the same whatever the build and the
    // privileges.
    if opts.output_dir.is_none() && opts.endpoint.is_none() {
        return Err(AgentError::NoDestination);
    }
    otel_thread_ctx_profiler::check()?;
    let files = match &opts.output_dir {
        Some(dir) => Some(
            files::Files::new(dir, opts.output_max_bytes).map_err(|source| {
                AgentError::OutputDir {
                    path: dir.clone(),
                    source,
                }
            })?,
        ),
        None => None,
    };
    let loaded = loader::Loaded::attach(opts.hz, opts.off_cpu, MAX_PROCESSES)
        .map_err(|e| AgentError::Sampler(e.into()))?;
    // Loaded and attached: what is left is reading targets and adding them
    // to the maps. Given up before any other thread starts (capabilities
    // are per thread), so no thread that parses what targets wrote, or
    // talks to the network, holds more.
    if let Err(e) = otel_thread_ctx_profiler::system::keep_only_capabilities(
        &otel_thread_ctx_profiler::system::CAPABILITIES_AFTER_LOAD,
    ) {
        log(&format!(
            "could not give up the capabilities it no longer needs: {e}"
        ));
    }
    let exporter = match &opts.endpoint {
        Some(e) => {
            Some(export::Exporter::start(e.clone(), QUEUE_CAPACITY).map_err(AgentError::Exporter)?)
        }
        None => None,
    };
    sample(opts, loaded, files, exporter)
}

/// What the building thread is handed at each export.
struct Job {
    intervals: Vec<profiled::Interval>,
    window: request::Window,
}

/// What the building thread has done, shared with the sampling thread so
/// that a build still running at the shutdown deadline is given up whole.
#[derive(Default)]
struct Built {
    /// Jobs taken and done (built and handed on, or found empty).
    done: u64,
    /// Set at the shutdown deadline: a build that ends later is dropped.
    given_up: bool,
}

fn sample(
    opts: &Options,
    mut loaded: loader::Loaded,
    mut files: Option<files::Files>,
    exporter: Option<export::Exporter>,
) -> Result<Vec<String>, AgentError> {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    use otel_thread_ctx_reader::thread::monotonic_ns;

    log(&format!(
        "sampling at {} Hz{}, exporting every {:.1} s{}{}",
        opts.hz,
        if opts.off_cpu {
            " with off-CPU time"
        } else {
            ""
        },
        opts.interval.as_secs_f64(),
        opts.endpoint.as_ref().map_or(String::new(), |e| format!(
            " to {} ({:?})",
            e.url, e.protocol
        )),
        opts.output_dir
            .as_ref()
            .map_or(String::new(), |d| format!(" into {}", d.display())),
    ));

    // Scanning thread.
    let stop = Arc::new(AtomicBool::new(false));
    let (changes_tx, changes) = mpsc::channel::<processes::Change>();
    let scanner = {
        let stop = stop.clone();
        let mut watcher = processes::Watcher::new(opts.selection.clone());
        std::thread::Builder::new()
            .name("scan".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for change in watcher.scan() {
                        if changes_tx.send(change).is_err() {
                            return;
                        }
                    }
                    let until = Instant::now() + SCAN_EVERY;
                    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
            .map_err(AgentError::Exporter)?
    };

    // Building thread.
    // Bounded: when naming falls behind, exports are skipped rather than
    // piling up in memory.
    let (jobs_tx, jobs) = mpsc::sync_channel::<Job>(JOBS_WAITING);
    let exports = Arc::new(AtomicU64::new(0));
    let settings = request::Settings {
        hz: opts.hz,
        off_cpu: opts.off_cpu,
        span_profiles: opts.span_profiles,
    };
    let queue = exporter.as_ref().map(|e| e.queue.clone());
    let built = Arc::new(std::sync::Mutex::new(Built::default()));
    let builder = {
        let exports = exports.clone();
        let built = built.clone();
        std::thread::Builder::new()
            .name("build".into())
            .spawn(move || {
                let host_name = resource::host_name();
                // Kept across exports: it caches the symbol tables it read.
                let symbolizer = blazesym::symbolize::Symbolizer::new();
                for job in jobs {
                    let processes = job.intervals.len();
                    let req = request::build(
                        job.intervals,
                        job.window,
                        settings,
                        &host_name,
                        &symbolizer,
                    );
                    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
                    if built.given_up {
                        return;
                    }
                    built.done += 1;
                    let Some(req) = req else {
                        continue;
                    };
                    exports.fetch_add(1, Ordering::Relaxed);
                    if let Some(files) = files.as_mut() {
                        use otel_thread_ctx_otlp::Message;
                        let data = otel_thread_ctx_formats::otlp::data(req.clone());
                        match files.write(
                            job.window.start_unix_ns + job.window.duration_ns,
                            &data.encode_to_vec(),
                        ) {
                            Ok(path) => log(&format!(
                                "wrote {} ({})",
                                path.display(),
                                count(processes as u64, "process", "processes")
                            )),
                            Err(e) => log(&format!("cannot write the export: {e}")),
                        }
                    }
                    if let Some(queue) = &queue {
                        queue.push(req);
                    }
                }
            })
            .map_err(AgentError::Exporter)?
    };

    let mut profiled: HashMap<i32, profiled::Profiled> = HashMap::new();
    let mut window_start = (
        monotonic_ns(),
        otel_thread_ctx_profiler::system::unix_now_ns(),
    );
    let mut last_export = Instant::now();
    let mut names_refreshed = Instant::now();
    let mut samples_total: u64 = 0;
    let mut unattributed: u64 = 0;
    let mut seen_processes: u64 = 0;
    let mut skipped_exports: u64 = 0;
    let mut jobs_sent: u64 = 0;
    let mut deadline: Option<Instant> = None;
    let mut metrics_logged = Instant::now();
    loop {
        let ending = otel_thread_ctx_reader::signals::requested().is_some();
        if ending {
            // Counted from the signal's arrival: an iteration that was busy
            // when it came takes from the budget.
            let since_signal = otel_thread_ctx_reader::signals::requested_at_monotonic_ns()
                .map_or(Duration::ZERO, |at| {
                    Duration::from_nanos(monotonic_ns().saturating_sub(at))
                });
            deadline = Some(Instant::now() + SHUTDOWN_WITHIN.saturating_sub(since_signal));
        }
        for change in changes.try_iter() {
            match change {
                processes::Change::Added(found) => {
                    if let Err(e) = loaded.add_target(&found.plan) {
                        log(&format!("cannot profile pid {}: {e}", found.pid));
                        continue;
                    }
                    log(&format!(
                        "profiling pid {} ({}): {}",
                        found.pid,
                        found.executable,
                        found.notes.join("; ")
                    ));
                    seen_processes += 1;
                    let p = profiled::Profiled::new(&found);
                    log(&format!("pid {}: {}", found.pid, p.js_naming()));
                    profiled.insert(found.pid, p);
                }
                processes::Change::Updated(plan) => {
                    if let Err(e) = loaded.add_target(&plan) {
                        log(&format!("cannot update pid {}: {e}", plan.tgid));
                    }
                }
                processes::Change::Gone(pid) => {
                    loaded.remove_target(pid as u32);
                    if let Some(p) = profiled.get_mut(&pid) {
                        log(&format!("pid {pid} exited"));
                        p.exited = true;
                    }
                }
            }
        }
        loaded.poll(Duration::from_millis(if ending { 0 } else { 100 }), |s| {
            samples_total += 1;
            match profiled.get_mut(&(s.tgid as i32)) {
                Some(p) => p.take(s),
                None => unattributed += 1,
            }
        });
        for read in loaded.take_item_reads() {
            if let Some(p) = profiled.get_mut(&(read.tgid as i32)) {
                p.take_item_read(read);
            }
        }
        if names_refreshed.elapsed() >= Duration::from_secs(1) {
            for p in profiled.values_mut() {
                p.refresh();
            }
            names_refreshed = Instant::now();
        }
        if ending || last_export.elapsed() >= opts.interval {
            let now = (
                monotonic_ns(),
                otel_thread_ctx_profiler::system::unix_now_ns(),
            );
            let intervals: Vec<profiled::Interval> =
                profiled.values_mut().filter_map(|p| p.cut()).collect();
            profiled.retain(|_, p| !p.exited);
            let window = request::Window {
                start_monotonic_ns: window_start.0,
                start_unix_ns: window_start.1,
                duration_ns: now.0.saturating_sub(window_start.0),
            };
            window_start = now;
            last_export = Instant::now();
            if !intervals.is_empty() {
                let job = Job { intervals, window };
                match jobs_tx.try_send(job) {
                    Ok(()) => jobs_sent += 1,
                    Err(_) => {
                        skipped_exports += 1;
                        log("building exports is behind: this interval's samples are dropped");
                    }
                }
            }
            if let Some(e) = &exporter {
                report_exporter(e);
            }
        }
        if let Some(every) = opts.metrics_every {
            if metrics_logged.elapsed() >= every && !ending {
                metrics_logged = Instant::now();
                let lost = loaded.lost();
                log(&metrics_line(&Metrics {
                    processes: profiled.values().filter(|p| !p.exited).count() as u64,
                    processes_seen: seen_processes,
                    samples: samples_total,
                    samples_unattributed: unattributed,
                    kernel_lost_samples: lost.ring_full,
                    kernel_lost_waits: lost.blocked_table_full,
                    exports: exports.load(Ordering::Relaxed),
                    exports_skipped: skipped_exports,
                    exporter: exporter.as_ref(),
                    cpu_ns: otel_thread_ctx_profiler::system::own_cpu_ns(),
                }));
            }
        }
        if ending {
            break;
        }
    }
    let deadline = deadline.unwrap_or_else(|| Instant::now() + SHUTDOWN_WITHIN);
    let lost = loaded.lost();
    drop(loaded);
    stop.store(true, Ordering::Relaxed);
    drop(jobs_tx);
    // The builder ends once the jobs sent are done, or is given up at the
    // deadline (left to the process's exit).
    while !builder.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let unbuilt = {
        let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
        built.given_up = true;
        jobs_sent - built.done
    };
    if builder.is_finished() {
        let _ = builder.join();
    }
    drop(changes);
    let _ = scanner.join();
    let mut lines = vec![format!(
        "profiled {}: {} ({unattributed} from processes no longer tracked), {} ({skipped_exports} skipped: building was behind; {unbuilt} not built by the shutdown deadline)",
        count(seen_processes, "process", "processes"),
        count(samples_total, "sample", "samples"),
        count(exports.load(Ordering::Relaxed), "export", "exports")
    )];
    if lost.ring_full + lost.blocked_table_full > 0 {
        lines.push(format!(
            "the kernel side dropped {} (ring buffer full) and {} (too many blocked threads)",
            count(lost.ring_full, "sample", "samples"),
            count(lost.blocked_table_full, "wait", "waits")
        ));
    }
    if let Some(e) = exporter {
        let stats = e.stats.clone();
        let queue = e.queue.clone();
        let stopped = e.finish(deadline);
        lines.push(format!(
            "exporter: {} sent, {}, {} given up, {} dropped from a full queue, {} unsent at the shutdown deadline",
            stats.sent.load(Ordering::Relaxed),
            count(
                stats.failed_attempts.load(Ordering::Relaxed),
                "failed attempt",
                "failed attempts"
            ),
            stats.abandoned.load(Ordering::Relaxed),
            queue.dropped(),
            stats.unsent.load(Ordering::Relaxed)
        ));
        if !stopped {
            lines.push(
                "the exporter had not stopped at the shutdown deadline: the exports it held are not counted"
                    .into(),
            );
        }
    }
    lines.push(format!(
        "the agent used {:.3} s of CPU",
        otel_thread_ctx_profiler::system::own_cpu_ns() as f64 / 1e9
    ));
    if let Some(sig) = otel_thread_ctx_reader::signals::requested() {
        lines.push(format!("ended by signal {sig}"));
    }
    Ok(lines)
}

/// What the periodic metrics line reports: counts since the start, but
/// `processes`.
struct Metrics<'a> {
    /// Processes profiled now.
    processes: u64,
    processes_seen: u64,
    samples: u64,
    samples_unattributed: u64,
    kernel_lost_samples: u64,
    kernel_lost_waits: u64,
    /// Exports built (written and/or queued for sending).
    exports: u64,
    /// Intervals dropped because building was behind.
    exports_skipped: u64,
    exporter: Option<&'a export::Exporter>,
    cpu_ns: u64,
}

/// The metrics as one line of `key=value` words.
fn metrics_line(m: &Metrics) -> String {
    use std::sync::atomic::Ordering;
    let mut line = format!(
        "metrics: processes={} processes_seen={} samples={} samples_unattributed={} kernel_lost_samples={} kernel_lost_waits={} exports={} exports_skipped={}",
        m.processes,
        m.processes_seen,
        m.samples,
        m.samples_unattributed,
        m.kernel_lost_samples,
        m.kernel_lost_waits,
        m.exports,
        m.exports_skipped
    );
    if let Some(e) = m.exporter {
        line.push_str(&format!(
            " sent={} failed_attempts={} given_up={} dropped={} waiting={}",
            e.stats.sent.load(Ordering::Relaxed),
            e.stats.failed_attempts.load(Ordering::Relaxed),
            e.stats.abandoned.load(Ordering::Relaxed),
            e.queue.dropped(),
            e.queue.len()
        ));
    }
    line.push_str(&format!(" cpu_s={:.3}", m.cpu_ns as f64 / 1e9));
    line
}

/// One line about the exporter when something went wrong since the start.
fn report_exporter(e: &export::Exporter) {
    use std::sync::atomic::Ordering;
    let failed = e.stats.failed_attempts.load(Ordering::Relaxed);
    if failed == 0 {
        return;
    }
    let last = e
        .stats
        .last_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default();
    log(&format!(
        "exporter: {} sent, {}, {} given up, {} dropped from a full queue, {} waiting; last error: {last}",
        e.stats.sent.load(Ordering::Relaxed),
        count(failed, "failed attempt", "failed attempts"),
        e.stats.abandoned.load(Ordering::Relaxed),
        e.queue.dropped(),
        e.queue.len()
    ));
}

/// The agent's log: one line on stderr.
fn log(line: &str) {
    eprintln!("otel-thread-ctx agent: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_line_is_key_value_words() {
        let m = Metrics {
            processes: 2,
            processes_seen: 3,
            samples: 1000,
            samples_unattributed: 4,
            kernel_lost_samples: 5,
            kernel_lost_waits: 6,
            exports: 7,
            exports_skipped: 1,
            exporter: None,
            cpu_ns: 1_500_000_000,
        };
        assert_eq!(
            metrics_line(&m),
            "metrics: processes=2 processes_seen=3 samples=1000 samples_unattributed=4 kernel_lost_samples=5 kernel_lost_waits=6 exports=7 exports_skipped=1 cpu_s=1.500"
        );
    }
}
