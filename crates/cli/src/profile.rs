//! `profile`: trace-linked CPU and off-CPU profiles sampled in the kernel.
//!
//! The profiler samples the process for the run's duration (the BPF
//! program reads the sampled thread's OTEP 4947 record at that instant,
//! found the way the reader resolved it for the process); this command
//! then has the profile written in the format asked for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use otel_thread_ctx_formats::filter::Filter;
use otel_thread_ctx_formats::{check_writable, count, flame, jsonl, otlp, pprof, top};
use otel_thread_ctx_otlp::{AnyValue, KeyValue, Resource};
use otel_thread_ctx_profiler::loader::{self, AttachError};
use otel_thread_ctx_profiler::plan::{self, current_process_context, target_plan};
use otel_thread_ctx_profiler::process_maps::ProcessMaps;
use otel_thread_ctx_profiler::system::{own_cpu_ns, unix_now_ns};
use otel_thread_ctx_profiler::SamplerError;
use otel_thread_ctx_profiler::{kernel, model, perf_map, symbolize, threadpool, unwind};
use otel_thread_ctx_reader::schema::Schema;
use otel_thread_ctx_reader::target::{Target, TargetError};
use otel_thread_ctx_reader::tasks;
use otel_thread_ctx_reader::thread;

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// gzipped profile.proto, for `go tool pprof`, speedscope, ...
    Pprof,
    /// OTLP Profiles (ProfilesData, protobuf).
    Otlp,
    /// Folded stacks (`a;b;c value`), whole run plus one file per trace.
    Folded,
    /// Flame graph SVGs, whole run plus one per trace.
    Svg,
    /// One JSON line per sample, in time order, with CLOCK_MONOTONIC times
    /// and the record as read (no stacks): for scripts and scoring.
    Jsonl,
    /// Tables on stdout (or in the output file when given): CPU and
    /// off-CPU time by endpoint, by span name, by function.
    Top,
}

/// Which off-CPU time a profile keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OffCpu {
    /// Waits of the application's threads, not their idle waits: off-CPU
    /// time with no span on threads that never published one (V8 platform
    /// workers, idle pool threads) and event loops idle in epoll are left out.
    Spans,
    /// Every wait of every thread.
    All,
}

impl Format {
    pub(crate) fn extension(self) -> &'static str {
        match self {
            Format::Pprof => "pb.gz",
            Format::Otlp => "otlp.pb",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Jsonl => "jsonl",
            Format::Top => "txt",
        }
    }
}

pub struct Options {
    pub pid: i32,
    pub duration: Duration,
    pub hz: u64,
    /// Off-CPU time recorded, and which (None: on CPU only).
    pub off_cpu: Option<OffCpu>,
    pub format: Format,
    /// First level of the whole-run folded stacks and flame graph (the
    /// endpoint when not given); with `top`, functions per group.
    pub group_by: Option<flame::GroupBy>,
    pub output: Option<PathBuf>,
    pub otlp_endpoint: Option<String>,
    /// Per-trace flame graphs or folded files written at most.
    pub max_traces: usize,
    /// Samples a trace needs for its per-trace file.
    pub min_trace_samples: usize,
    /// The samples every output keeps.
    pub filter: Filter,
    /// Attribute libuv threadpool work to the span that queued it.
    pub threadpool: bool,
    /// Follow it with the probes even where a pool thread's running item
    /// could be read at sample time (a target that publishes the Node.js
    /// schema).
    pub threadpool_probes: bool,
    /// OTLP output in the span-profile form, filed under which span.
    pub span_profiles: Option<otlp::SpanProfiles>,
}

/// What the command prints when it is done.
pub struct Report {
    pub lines: Vec<String>,
    /// What goes to stdout (`--format top` without an output file).
    pub stdout: Option<String>,
}

/// Why a profile could not be taken or written.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error("cannot write {what} {}: {source}; nothing was sampled", .path.display())]
    Output {
        /// What the path is for: the profile, or one of its per-trace files.
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Send(#[from] otlp::SendError),
    #[error(transparent)]
    Render(#[from] flame::RenderError),
}

impl From<AttachError> for ProfileError {
    fn from(e: AttachError) -> Self {
        ProfileError::Sampler(e.into())
    }
}

/// Runs the profile and writes its output.
pub fn run(opts: &Options) -> Result<Report, ProfileError> {
    check_outputs(opts)?;
    otel_thread_ctx_profiler::check()?;
    let target = Target::open(opts.pid)?;
    if let Some(note) = no_context_note(opts.pid, &target) {
        // Now rather than in the summary: the run takes its whole duration.
        eprintln!("otel-thread-ctx: {note}");
    }
    let (mut plan, mut lines) = target_plan(opts.pid, &target);
    let pool = if opts.threadpool {
        threadpool::find(opts.pid, &target.maps)
            .map_err(|why| lines.push(format!("threadpool: not attributed: {why}")))
            .ok()
    } else {
        lines.push("threadpool: not attributed (--no-threadpool)".into());
        None
    };
    let pool = match pool {
        Some(p) if !opts.threadpool_probes => {
            read_pool_at_sample_time(&target, &p, &mut plan, &mut lines).then_some(p)
        }
        other => other,
    };
    sample(opts, target, plan, pool, lines)
}

/// The file `opts` writes the profile to, when it writes one (`--format
/// top` without `-o` prints it instead).
fn output_path(opts: &Options) -> Option<PathBuf> {
    match (&opts.output, opts.format) {
        (Some(path), _) => Some(path.clone()),
        (None, Format::Top) => None,
        (None, format) => Some(PathBuf::from(format!(
            "profile-{}.{}",
            opts.pid,
            format.extension()
        ))),
    }
}

/// Checks, before anything is sampled, every file the run will write (the
/// profile, and for folded stacks and SVGs a per-trace file beside it) and
/// the OTLP endpoint's form: otherwise a bad path or URL is found only once
/// the whole duration has been profiled, and the run is lost.
fn check_outputs(opts: &Options) -> Result<(), ProfileError> {
    if let Some(endpoint) = &opts.otlp_endpoint {
        otlp::endpoint_url(endpoint)?;
    }
    let Some(output) = output_path(opts) else {
        return Ok(());
    };
    let check = |what, path: &Path| {
        check_writable(path).map_err(|source| ProfileError::Output {
            what,
            path: path.to_path_buf(),
            source,
        })
    };
    check("the profile to", &output)?;
    if matches!(opts.format, Format::Folded | Format::Svg) && opts.max_traces > 0 {
        // Trace ids are all 32 hex digits: one name stands for every file.
        let per_trace = trace_path(&output, &"0".repeat(32), opts.format.extension());
        check("the per-trace files beside it, e.g.", &per_trace)?;
    }
    Ok(())
}

/// What a profile of a process that publishes no thread context means,
/// said before it starts; `None` when a module defines a schema's variable
/// (whether or not it can be read: the summary says which).
fn no_context_note(pid: i32, target: &Target) -> Option<String> {
    (target.module.is_none() && target.nodejs.is_empty()).then(|| {
        format!(
            "pid {pid} publishes no thread context: no loaded module defines {} (OTEP 4947 record, as otel-thread-ctx writes it) or {} (Node.js schema); profiling it anyway, but no sample will carry a trace or span",
            Schema::Record.symbol(),
            Schema::Nodejs.symbol()
        )
    })
}

/// Where the target publishes the Node.js schema, a pool thread's samples
/// read the span of the request it runs, and no probe is attached: returns
/// whether the probes are still needed (the record schema, or a module
/// that does not show what [`threadpool::running_item_plan`] needs).
fn read_pool_at_sample_time(
    target: &Target,
    probes: &threadpool::Probes,
    plan: &mut kernel::TargetPlan,
    lines: &mut Vec<String>,
) -> bool {
    if !otel_thread_ctx_reader::process_context::lookup(&target.maps, &target.memory)
        .publishes_nodejs_schema()
    {
        return true;
    }
    let Some(running) = threadpool::running_item_plan(probes, &target.maps) else {
        lines.push(format!(
            "threadpool: {} does not show the worker loop's item start, a work function or where a request keeps its context frame; probing instead",
            probes.module
        ));
        return true;
    };
    plan.pool = running;
    lines.push(format!(
        "threadpool: pool threads' samples carry the span of the request they run, read at sample time (no probes; {})",
        probes.module
    ));
    false
}

fn sample(
    opts: &Options,
    target: Target,
    plan: kernel::TargetPlan,
    pool: Option<threadpool::Probes>,
    mut lines: Vec<String>,
) -> Result<Report, ProfileError> {
    let pid = opts.pid;
    let mut loaded = loader::Loaded::attach(opts.hz, opts.off_cpu.is_some(), 1)?;
    // A threadpool probe that cannot be attached does not stop the profile.
    let pool = pool.and_then(|p| match loaded.attach_threadpool(plan.tgid, &p) {
        Ok(()) => Some(p),
        Err(e) => {
            lines.push(format!("threadpool: not attributed: {e}"));
            None
        }
    });
    if let Some(p) = &pool {
        lines.push(format!(
            "threadpool: work queued through libuv's pool follows its span to the pool thread ({} -> {} in {})",
            p.sites.submitters.iter().map(|s| s.function).collect::<Vec<_>>().join(", "),
            match p.sites.item_start {
                Some(_) => format!("the item start in {}", threadpool::WORKER_LOOP),
                None => p.sites.work.iter().map(|&(name, _)| name).collect::<Vec<_>>().join(", "),
            },
            p.module
        ));
    }
    // Sampling begins with the target's entry, after every probe is
    // attached: the run starts just before it, so it holds every sample.
    let start_monotonic_ns = thread::monotonic_ns();
    let start_unix_ns = unix_now_ns();
    let started = Instant::now();
    // What loading and attaching cost (the kernel verifies the programs in
    // this process's time), told apart from the cost per sample.
    let attach_cpu_ns = own_cpu_ns();
    loaded.add_target(&plan)?;
    // Everything is attached: what is left is reading the target's memory
    // and files, the maps, and writing the outputs. This command runs on
    // one thread, so giving them up here covers the whole process.
    if let Err(e) = otel_thread_ctx_profiler::system::keep_only_capabilities(
        &otel_thread_ctx_profiler::system::PROFILE_CAPABILITIES_AFTER_LOAD,
    ) {
        lines.push(format!(
            "could not give up the capabilities it no longer needs: {e}"
        ));
    }
    // Attaching takes seconds (the kernel verifies the programs): say when
    // sampling has begun, so a user (or a script) knows the run is live.
    eprintln!(
        "otel-thread-ctx: sampling pid {pid} at {} Hz for up to {:.0} s; SIGINT (Ctrl-C) ends it early",
        opts.hz,
        opts.duration.as_secs_f64()
    );
    // One snapshot of the target's maps for the unwinder, V8's naming and
    // the symbolizer: an address none covers costs one re-read.
    let mut maps = ProcessMaps::new(pid, target.maps.clone());
    let mut collector = symbolize::Collector::new(pid);
    let mut stacks = unwind::Stacks::new(pid, &maps);
    let mut samples = Vec::new();
    let mut thread_names: HashMap<u32, String> = HashMap::new();
    let mut names_refreshed = Instant::now() - Duration::from_secs(1);
    let mut target_exited = false;
    let mut context = plan::process_context(&target.maps, &target.memory);
    let mut take =
        |mut s: kernel::Sample, maps: &mut ProcessMaps, collector: &mut symbolize::Collector| {
            for named in stacks.take(maps, &mut s) {
                collector.user_named(named);
            }
            for a in model::addresses_to_name(&s) {
                collector.user(maps, a);
            }
            for &a in &s.kernel_stack {
                collector.kernel(a);
            }
            samples.push(s);
        };
    loop {
        if otel_thread_ctx_reader::signals::requested().is_some()
            || started.elapsed() >= opts.duration
        {
            break;
        }
        if names_refreshed.elapsed() >= Duration::from_millis(500) {
            // Names as /proc shows them (the BPF side only has comm, which
            // is the same text; this also catches names set later).
            for tid in tasks::list(pid) {
                let name = tasks::name(pid, tid);
                if !name.is_empty() {
                    thread_names.insert(tid as u32, name);
                }
            }
            names_refreshed = Instant::now();
            // The key map only grows: the latest one names every index seen.
            if let Some(found) = current_process_context(&mut maps, &target.memory) {
                context = found;
            }
            if tasks::process_exited(pid) {
                // Its pid may be reused: sample nothing under it.
                loaded.remove_target(pid as u32);
                target_exited = true;
                break;
            }
        }
        let left = opts
            .duration
            .saturating_sub(started.elapsed())
            .min(Duration::from_millis(100));
        loaded.poll(left, |s| take(s, &mut maps, &mut collector));
    }
    loaded.poll(Duration::ZERO, |s| take(s, &mut maps, &mut collector));
    let item_reads = loaded.take_item_reads();
    let lost = loaded.lost();
    let pool_items = loaded.pool_items();
    drop(loaded);
    let duration_ns = started.elapsed().as_nanos() as u64;
    if !target_exited {
        if let Some(found) = current_process_context(&mut maps, &target.memory) {
            context = found;
        }
    }
    let (resource, key_map) = context;
    let (on_cpu_stacks, off_cpu_stacks) = stacks.wholeness();
    let v8_naming = stacks
        .js_frames()
        .map(|js| (js.binary().to_string(), js.counts().clone()))
        .map_err(str::to_string);
    let inlining_unavailable = stacks
        .js_frames()
        .ok()
        .and_then(|js| js.inlining_unavailable().map(str::to_string));
    let names = collector.finish();
    let unread = samples.iter().filter(|s| s.pool_unread).count();
    let filled = threadpool::fill_from_same_item(&mut samples, &item_reads);
    let between_items = threadpool::clear_between_items(&mut samples, &names);
    let base = model::Profile {
        pid,
        hz: opts.hz,
        off_cpu: opts.off_cpu.is_some(),
        period_ns: 1_000_000_000 / opts.hz.max(1),
        start_monotonic_ns,
        start_unix_ns,
        duration_ns,
        entries: Vec::new(),
    };
    let mut profile = model::build(base, &samples, &names, &key_map, &thread_names);
    let mut notes = Vec::new();
    if opts.off_cpu == Some(OffCpu::Spans) {
        let left_out = profile.keep_off_cpu_in_spans();
        if left_out > 0 {
            notes.push(format!(
                "left out {:.3} s of idle waits (threads without spans, event loops in epoll); --off-cpu=all keeps them",
                left_out as f64 / 1e9
            ));
        }
    }
    // Whether V8's heap named any JavaScript frame of this run.
    let v8_names_frames = match &v8_naming {
        Ok((_, counts)) => {
            names.v8_named > 0
                || counts.interpreted > 0
                || counts.optimized > 0
                || counts.baseline > 0
        }
        Err(_) => false,
    };
    match &v8_naming {
        Ok((binary, counts)) => {
            if v8_names_frames {
                notes.push(format!(
                    "JavaScript frames named from V8's heap (layout from the metadata of {binary}): {} (with {} they inlined), {}, {} of {} other JIT addresses, and {}",
                    count(counts.optimized, "frame of optimized code", "frames of optimized code"),
                    count(counts.inlined, "frame of functions", "frames of functions"),
                    count(counts.baseline, "frame of baseline code", "frames of baseline code"),
                    names.v8_named,
                    names.anonymous_frames,
                    count(counts.interpreted, "interpreted frame", "interpreted frames")
                ));
            }
            if let Some(reason) = &inlining_unavailable {
                notes.push(format!(
                    "V8's metadata does not say what optimized code inlined ({reason}): such a frame is named by its own function only"
                ));
            }
            if let Some(reason) = &counts.first_expand_failure {
                notes.push(format!(
                    "the tables of optimized code could not be read for {} (first: {reason}): named by their own function only",
                    count(counts.not_expanded, "JIT frame", "JIT frames")
                ));
            }
            if counts.interpreted_without_line > 0 {
                let frames = count(
                    counts.interpreted_without_line,
                    "interpreted frame",
                    "interpreted frames",
                );
                notes.push(match &counts.first_line_failure {
                    Some(reason) => format!("{frames} without a line (first: {reason})"),
                    None => format!(
                        "{frames} without a line: V8 had not collected their bytecode's source positions"
                    ),
                });
            }
            if let Some(reason) = &counts.first_baseline_line_failure {
                notes.push(format!(
                    "{} without a line (first: {reason}): named by their function only",
                    count(
                        counts.baseline_without_line,
                        "baseline frame",
                        "baseline frames"
                    )
                ));
            }
            if let Some(reason) = &counts.first_failure {
                notes.push(format!(
                    "V8's heap did not name {} (first: {reason}): the perf map names those",
                    count(counts.unnamed, "JIT frame", "JIT frames")
                ));
            }
        }
        Err(reason) if names.anonymous_frames > 0 => notes.push(format!(
            "V8's heap names no frames ({reason}): JIT frames are named from the perf map only"
        )),
        Err(_) => {}
    }
    let left_to_perf_map = names.anonymous_frames - names.v8_named;
    match &names.perf_map {
        Some(path) if names.v8_named == 0 => {
            notes.push(format!("JavaScript frames named from {path}"))
        }
        Some(path) => notes.push(format!(
            "JavaScript frames named from {path}: {} of {} JIT addresses",
            names.perf_map_named, names.anonymous_frames
        )),
        None if left_to_perf_map == 0 => {}
        // V8's heap names JavaScript frames: the addresses left had no
        // frame to read a function from (a leaf stopped before its frame
        // was set up, or code without a function: stubs, regular
        // expressions), so restarting for JavaScript names is not advice.
        None if v8_names_frames => notes.push(format!(
            "no perf map at {}: {} that V8's heap did not name stay unnamed (a perf map, node --perf-basic-prof, would name them)",
            perf_map::path(pid).display(),
            count(left_to_perf_map as u64, "JIT address", "JIT addresses")
        )),
        None if names.anonymous_frames > 0 => notes.push(format!(
            "no perf map at {}: {} JIT addresses stay unnamed (start node with --perf-basic-prof to name JavaScript frames)",
            perf_map::path(pid).display(),
            left_to_perf_map
        )),
        None => {}
    }
    if lost.ring_full + lost.blocked_table_full > 0 {
        notes.push(format!(
            "the kernel side dropped {} (ring buffer full) and {} (too many blocked threads)",
            count(lost.ring_full, "sample", "samples"),
            count(lost.blocked_table_full, "wait", "waits")
        ));
    }
    let in_span = profile
        .entries
        .iter()
        .filter(|e| e.kind == kernel::Kind::OnCpu && e.span.is_some())
        .map(|e| e.events.len() as u64)
        .sum::<u64>();
    lines.push(format!(
        "profiled pid {pid} for {:.2} s at {} Hz: {} ({in_span} in a span) from {}{}; {}",
        duration_ns as f64 / 1e9,
        opts.hz,
        count(profile.on_cpu_samples(), "on-CPU sample", "on-CPU samples"),
        count(
            profile
                .entries
                .iter()
                .map(|e| e.tid)
                .collect::<std::collections::HashSet<_>>()
                .len() as u64,
            "thread",
            "threads"
        ),
        if opts.off_cpu.is_some() {
            format!(", {:.3} s off CPU", profile.off_cpu_ns() as f64 / 1e9)
        } else {
            String::new()
        },
        truncated_stacks(
            &on_cpu_stacks,
            opts.off_cpu.is_some().then_some(&off_cpu_stacks)
        ),
    ));
    if plan.pool.return_address != 0 {
        lines.push(format!(
            "threadpool: {} of pool threads carry the span of the request they run ({filled} of the {unread} taken while a GC kept it unreadable took it from a read after the GC or another sample of the same item)",
            count(samples.iter().filter(|s| s.threadpool).count() as u64, "sample", "samples")
        ));
    }
    if pool.is_some() {
        let pool_samples = samples.iter().filter(|s| s.threadpool).count();
        lines.push(format!(
            "threadpool: {} queued in a span, {} begun on a pool thread with it; {} of pool threads carry a queued span{}",
            count(pool_items.queued_in_span, "work item", "work items"),
            pool_items.ran_in_span,
            count(pool_samples as u64, "sample", "samples"),
            if between_items > 0 {
                format!(" ({between_items} more, taken between items, were left without it)")
            } else {
                String::new()
            }
        ));
    }
    if target_exited {
        lines.push(format!(
            "pid {pid} exited after {:.2} s; the profile covers the run until then",
            duration_ns as f64 / 1e9
        ));
    }
    if !opts.filter.is_empty() {
        let (before, kept) = opts.filter.apply(&mut profile);
        lines.push(kept_line(&opts.filter, before, kept));
    }
    let resource = with_pid(resource, pid);
    let output = output_path(opts)
        .unwrap_or_else(|| PathBuf::from(format!("profile-{pid}.{}", opts.format.extension())));
    let mut stdout = None;
    if opts.format == Format::Jsonl {
        let mut text = String::new();
        let mut sorted: Vec<&kernel::Sample> = samples
            .iter()
            .filter(|s| {
                let (trace_id, attributes) = match s.record.valid() {
                    Some((h, data)) => (
                        Some(h.trace_id.to_bytes()),
                        model::named_attributes(data, &key_map),
                    ),
                    None => (None, Vec::new()),
                };
                opts.filter.matches(trace_id, |k| {
                    attributes
                        .iter()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.as_str())
                })
            })
            .collect();
        sorted.sort_by_key(|s| s.time_ns);
        for s in sorted {
            text.push_str(&jsonl::line(s, &key_map, &names));
            text.push('\n');
        }
        std::fs::write(&output, text).map_err(|source| ProfileError::Write {
            path: output.clone(),
            source,
        })?;
        lines.push(format!("wrote {}", output.display()));
    } else {
        let out = Outputs {
            format: opts.format,
            group_by: opts.group_by,
            max_traces: opts.max_traces,
            min_trace_samples: opts.min_trace_samples,
            span_profiles: opts.span_profiles,
            filter: &opts.filter,
        };
        let path = if opts.format == Format::Top {
            opts.output.as_deref()
        } else {
            Some(output.as_path())
        };
        stdout = write(
            &out,
            &format!("pid {pid}"),
            &profile,
            Some(&resource),
            &notes,
            path,
            &mut lines,
        )?;
    }
    if let Some(endpoint) = &opts.otlp_endpoint {
        let status = otlp::send(
            endpoint,
            &otlp::request(&profile, resource.clone(), opts.span_profiles),
        )
        .map_err(ProfileError::from)?;
        lines.push(format!("sent OTLP profiles to {endpoint}: {status}"));
    }
    lines.extend(notes);
    let own_cpu_ns = own_cpu_ns();
    lines.push(format!(
        "the profiler used {:.3} s of CPU: {:.3} s to load and attach its programs, then {:.0} µs per sample ({})",
        own_cpu_ns as f64 / 1e9,
        attach_cpu_ns as f64 / 1e9,
        own_cpu_ns.saturating_sub(attach_cpu_ns) as f64 / 1e3 / samples.len().max(1) as f64,
        count(samples.len() as u64, "sample", "samples")
    ));
    if let Some(sig) = otel_thread_ctx_reader::signals::requested() {
        lines.push(format!("ended by signal {sig}"));
    }
    Ok(Report { lines, stdout })
}

/// The summary's account of user stacks that do not reach their thread's
/// entry, with what the frame-pointer walk alone would have given.
fn truncated_stacks(on_cpu: &unwind::Wholeness, off_cpu: Option<&unwind::Wholeness>) -> String {
    match off_cpu {
        None => format!(
            "truncated user stacks: {:.1} % of on-CPU samples (frame pointers alone: {:.1} %)",
            on_cpu.truncated_percent(),
            on_cpu.truncated_frame_pointers_percent()
        ),
        Some(off) => format!(
            "truncated user stacks: {:.1} % of on-CPU samples, {:.1} % of off-CPU time (frame pointers alone: {:.1} %, {:.1} %)",
            on_cpu.truncated_percent(),
            off.truncated_percent(),
            on_cpu.truncated_frame_pointers_percent(),
            off.truncated_frame_pointers_percent()
        ),
    }
}

/// The Resource with `process.pid` added when the process context lacks it.
pub(crate) fn with_pid(resource: Option<Resource>, pid: i32) -> Resource {
    let mut r = resource.unwrap_or(Resource {
        attributes: Vec::new(),
        dropped_attributes_count: 0,
    });
    if !r.attributes.iter().any(|kv| kv.key == "process.pid") {
        r.attributes
            .push(KeyValue::new("process.pid", AnyValue::int(pid as i64)));
    }
    if !r.attributes.iter().any(|kv| kv.key == "service.name") {
        // What an SDK without a configured name reports.
        let name = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .map_or("unknown_service".to_string(), |n| {
                format!("unknown_service:{n}")
            });
        r.attributes
            .push(KeyValue::new("service.name", AnyValue::string(name)));
    }
    r
}

/// `dir/stem.<trace>.ext` beside the whole-run file.
fn trace_path(output: &Path, trace_id: &str, ext: &str) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(&format!(".{ext}")).unwrap_or(&name);
    output.with_file_name(format!("{stem}.{trace_id}.{ext}"))
}

/// What is written, and how: the options `profile` and `convert` share.
pub(crate) struct Outputs<'a> {
    pub format: Format,
    pub group_by: Option<flame::GroupBy>,
    pub max_traces: usize,
    pub min_trace_samples: usize,
    pub span_profiles: Option<otlp::SpanProfiles>,
    /// The filter the profile went through, said in flame graph subtitles.
    pub filter: &'a Filter,
}

/// The line that says what the filters kept.
pub(crate) fn kept_line(filter: &Filter, before: usize, kept: usize) -> String {
    format!(
        "kept {} of {} {}: the ones matching {}",
        kept,
        before,
        if before == 1 { "sample" } else { "samples" },
        filter.describe()
    )
}

/// Writes `profile` (of `who`: `pid 42`, `3 processes`) to `output` in
/// any format but jsonl; returns what goes to stdout (`top` without a
/// file).
pub(crate) fn write(
    opts: &Outputs,
    who: &str,
    profile: &model::Profile,
    resource: Option<&Resource>,
    notes: &[String],
    output: Option<&Path>,
    lines: &mut Vec<String>,
) -> Result<Option<String>, ProfileError> {
    let save = |path: &Path, bytes: &[u8]| {
        std::fs::write(path, bytes).map_err(|source| ProfileError::Write {
            path: path.to_path_buf(),
            source,
        })
    };
    let Some(output) = output else {
        return Ok(match opts.format {
            Format::Top => Some(top_text(opts, profile)),
            _ => None,
        });
    };
    match opts.format {
        Format::Top => {
            save(output, top_text(opts, profile).as_bytes())?;
            lines.push(format!("wrote {}", output.display()));
        }
        Format::Pprof => {
            save(output, &pprof::write(profile, notes))?;
            lines.push(format!("wrote {}", output.display()));
        }
        Format::Otlp => {
            use otel_thread_ctx_otlp::Message;
            let resource = resource.cloned().unwrap_or(Resource {
                attributes: Vec::new(),
                dropped_attributes_count: 0,
            });
            save(
                output,
                &otlp::data(otlp::request(profile, resource, opts.span_profiles)).encode_to_vec(),
            )?;
            lines.push(format!("wrote {}", output.display()));
        }
        Format::Jsonl => unreachable!("written from the raw samples"),
        Format::Folded | Format::Svg => {
            let ext = opts.format.extension();
            let group_by = opts.group_by.unwrap_or_default();
            let what = if profile.off_cpu {
                "CPU and off-CPU time"
            } else {
                "CPU"
            };
            let title = format!("{who}: {what} {}", group_by.title());
            let whole = flame::folded(profile, group_by);
            let rate = if profile.hz > 0 {
                format!("{} Hz, ", profile.hz)
            } else {
                String::new()
            };
            let only = if opts.filter.is_empty() {
                String::new()
            } else {
                format!("; only {}", opts.filter.describe())
            };
            let subtitle = format!(
                "{rate}{:.1} s{only}; values in microseconds",
                profile.duration_ns as f64 / 1e9
            );
            let render =
                |lines: &[String], title: &str, subtitle: &str| -> Result<Vec<u8>, ProfileError> {
                    if opts.format == Format::Svg {
                        Ok(flame::svg(lines, title, Some(subtitle.to_string()))?)
                    } else {
                        Ok(lines
                            .iter()
                            .map(|l| format!("{l}\n"))
                            .collect::<String>()
                            .into_bytes())
                    }
                };
            save(output, &render(&whole, &title, &subtitle)?)?;
            lines.push(format!("wrote {}", output.display()));
            let traces = flame::per_trace(profile, opts.max_traces, opts.min_trace_samples);
            for t in &traces.traces {
                let title = format!("{who}: {what} of {}", t.title);
                let extent = match t.span_ns() {
                    Some(ns) => format!(" over {:.3} s (first to last sample)", ns as f64 / 1e9),
                    None => String::new(),
                };
                let subtitle = format!(
                    "{rate}{}{extent}{only}; values in microseconds",
                    count(t.samples as u64, "sample", "samples")
                );
                save(
                    &trace_path(output, &t.trace_id, ext),
                    &render(&t.lines, &title, &subtitle)?,
                )?;
            }
            if opts.max_traces > 0 {
                lines.push(per_trace_line(
                    &traces,
                    opts,
                    &trace_path(output, "<trace_id>", ext),
                ));
            }
        }
    }
    Ok(None)
}

/// What was written per trace, and what was left out.
fn per_trace_line(traces: &flame::Traces, opts: &Outputs, pattern: &Path) -> String {
    let mut line = if traces.traces.is_empty() {
        "wrote no per-trace file".to_string()
    } else {
        format!(
            "wrote {} beside it ({})",
            count(
                traces.traces.len() as u64,
                "per-trace file",
                "per-trace files"
            ),
            pattern.display()
        )
    };
    line.push_str(&format!(
        ": traces with at least {} (--min-trace-samples)",
        count(opts.min_trace_samples as u64, "sample", "samples")
    ));
    if traces.too_few > 0 {
        line.push_str(&format!(
            "; {} with fewer left out",
            count(traces.too_few as u64, "trace", "traces")
        ));
    }
    if traces.past_limit > 0 {
        line.push_str(&format!(
            "; {} past --max-traces {} left out",
            count(traces.past_limit as u64, "trace", "traces"),
            opts.max_traces
        ));
    }
    line
}

/// The top tables, with functions per group when a grouping is given.
fn top_text(opts: &Outputs, profile: &model::Profile) -> String {
    match opts.group_by {
        Some(g) => top::tables_grouped(profile, g),
        None => top::tables(profile),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_trace_files_sit_beside_the_whole_run_file() {
        assert_eq!(
            trace_path(Path::new("/o/run.svg"), "ab", "svg"),
            PathBuf::from("/o/run.ab.svg")
        );
        assert_eq!(
            trace_path(Path::new("run"), "ab", "folded"),
            PathBuf::from("run.ab.folded")
        );
    }

    fn options(format: Format, output: Option<&Path>) -> Options {
        Options {
            pid: 7,
            duration: Duration::from_secs(30),
            hz: 99,
            off_cpu: None,
            format,
            group_by: None,
            output: output.map(Path::to_path_buf),
            otlp_endpoint: None,
            max_traces: 20,
            min_trace_samples: flame::MIN_TRACE_SAMPLES,
            filter: Filter::default(),
            threadpool: true,
            threadpool_probes: false,
            span_profiles: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("otel-thread-ctx-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_output_that_cannot_be_written_fails_before_sampling() {
        let missing = Path::new("/nonexistent/dir/x.pb.gz");
        let e = check_outputs(&options(Format::Pprof, Some(missing))).unwrap_err();
        assert!(matches!(e, ProfileError::Output { ref path, .. } if path == missing));
        let text = e.to_string();
        assert!(
            text.contains("/nonexistent/dir/x.pb.gz") && text.contains("No such file or directory"),
            "{text}"
        );
        // A directory, and a directory no one can create files in.
        let dir = scratch("outputs-dir");
        assert!(check_outputs(&options(Format::Otlp, Some(&dir))).is_err());
        assert!(check_outputs(&options(Format::Top, Some(Path::new("/proc/x.txt")))).is_err());
        assert!(check_outputs(&options(Format::Jsonl, Some(Path::new("/proc/x.jsonl")))).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn per_trace_files_are_checked_too() {
        let dir = scratch("outputs-trace");
        // The whole-run name fits; with a trace id added it is too long.
        let long = dir.join(format!("{}.svg", "a".repeat(240)));
        for format in [Format::Svg, Format::Folded] {
            let mut opts = options(format, Some(&long));
            match check_outputs(&opts).unwrap_err() {
                ProfileError::Output { path, .. } => {
                    assert!(path.to_string_lossy().contains(&"0".repeat(32)), "{path:?}")
                }
                e => panic!("{e}"),
            }
            // No per-trace file is written: nothing more to check.
            opts.max_traces = 0;
            check_outputs(&opts).unwrap();
        }
        // Other formats write one file.
        check_outputs(&options(Format::Pprof, Some(&long))).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn checking_leaves_the_file_system_as_it_was() {
        let dir = scratch("outputs-kept");
        let new = dir.join("run.svg");
        check_outputs(&options(Format::Svg, Some(&new))).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let old = dir.join("old.pb.gz");
        std::fs::write(&old, b"kept").unwrap();
        check_outputs(&options(Format::Pprof, Some(&old))).unwrap();
        assert_eq!(std::fs::read(&old).unwrap(), b"kept");
        // Top without a file prints to stdout: no path to check.
        check_outputs(&options(Format::Top, None)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_malformed_otlp_endpoint_fails_before_sampling() {
        let dir = scratch("outputs-otlp");
        let mut opts = options(Format::Pprof, Some(&dir.join("run.pb.gz")));
        opts.otlp_endpoint = Some("grpc://localhost:4317".into());
        assert!(matches!(
            check_outputs(&opts),
            Err(ProfileError::Send(otlp::SendError::NotHttp(_)))
        ));
        opts.otlp_endpoint = Some("http://localhost:4318".into());
        check_outputs(&opts).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_process_that_publishes_nothing_is_said_to_at_the_start() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Until it has executed sleep, the child is a copy of this test.
        while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap() != "sleep\n" {
            std::thread::sleep(Duration::from_millis(1));
        }
        let target = Target::open(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let note = no_context_note(pid, &target.unwrap()).expect("a note");
        assert!(
            note.contains(&format!("pid {pid} publishes no thread context")),
            "{note}"
        );
        assert!(note.contains("otel_thread_ctx_v1") && note.contains("otel_thread_ctx_nodejs_v1"));
        assert!(
            note.contains("no sample will carry a trace or span"),
            "{note}"
        );
    }

    #[test]
    fn the_resource_names_the_process() {
        let r = with_pid(None, 7);
        assert_eq!(r.attributes[0].key, "process.pid");
        assert_eq!(r.attributes[1].key, "service.name");
        let given = Resource {
            attributes: vec![
                KeyValue::new("process.pid", AnyValue::int(1)),
                KeyValue::new("service.name", AnyValue::string("checkout")),
            ],
            dropped_attributes_count: 0,
        };
        assert_eq!(with_pid(Some(given), 7).attributes.len(), 2);
        // A process that names no service is named after its executable.
        let own = with_pid(None, std::process::id() as i32);
        let name = format!("{:?}", own.attributes[1].value);
        assert!(name.contains("unknown_service:"), "{name}");
    }
}
