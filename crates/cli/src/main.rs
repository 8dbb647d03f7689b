//! `otel-thread-ctx`: reads OTEP 4947 thread context and OTEP 4719 process
//! context from a running process, from the outside, as a profiler would.
//!
//! Exit status: 0 = the process publishes conformant thread context (or the
//! sample run completed, including one the process ended by exiting), 1 = it does not (the reason is printed),
//! 2 = usage or permission error (including a nonexistent pid),
//! 128 + N = stopped early by signal N (every thread already released).

mod convert;
mod output;
mod profile;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use otel_thread_ctx_agent as agent;
use otel_thread_ctx_reader::{conformance, sampler, signals};

#[derive(Parser)]
#[command(
    name = "otel-thread-ctx",
    version,
    about = "Reads OpenTelemetry thread context (OTEP 4947) from a running process"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Exit 0 right after parsing the arguments, doing nothing: lets the examples in the
    /// documentation be checked against the current flags.
    #[arg(long, global = true, hide = true)]
    check_args: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Conformance report: symbol, access model, process context, every thread's record.
    Inspect {
        /// Process to read.
        #[arg(long)]
        pid: i32,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Longest wait for one thread to stop, in milliseconds.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=60_000))]
        stop_timeout_ms: u64,
    },
    /// Stops and reads every thread F times a second and reports span shares:
    /// a line per thread, then samples by endpoint and by span name.
    Sample {
        /// Process to read.
        #[arg(long)]
        pid: i32,
        /// Sampling rounds per second (each round reads every thread once).
        #[arg(long, default_value_t = 99, value_parser = parse_profile_hz)]
        hz: u64,
        /// How long to sample, in seconds (SIGINT/SIGTERM end it earlier, summary printed).
        #[arg(long, default_value_t = 30.0, value_parser = parse_duration)]
        duration: f64,
        /// Print the summary as JSON (it lists every span of every thread).
        #[arg(long)]
        json: bool,
        /// List every trace and span each thread was read in, with its share
        /// of the thread's samples (a line per span, under the thread's line).
        #[arg(long, conflicts_with = "json")]
        spans: bool,
        /// Print one JSON line per read on stdout (the summary goes to stderr).
        #[arg(long)]
        raw: bool,
        /// Longest wait for one thread to stop, in milliseconds.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
        stop_timeout_ms: u64,
    },
    /// CPU (and off-CPU) profile sampled in the kernel with eBPF, each sample
    /// tagged with the trace and span its thread was running.
    Profile {
        /// Process to profile.
        #[arg(long)]
        pid: i32,
        /// How long to profile, in seconds (SIGINT/SIGTERM end it earlier, output written).
        #[arg(long, default_value_t = 30.0, value_parser = parse_duration)]
        duration: f64,
        /// On-CPU samples per second per CPU.
        #[arg(long, default_value_t = 99, value_parser = parse_profile_hz)]
        hz: u64,
        /// Also record off-CPU time: the stack and span of every wait, and how
        /// long it lasted. `--off-cpu` keeps the application's waits (idle
        /// helper threads and event loops waiting for I/O are left out);
        /// `--off-cpu=all` keeps every wait.
        #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "spans")]
        off_cpu: Option<profile::OffCpu>,
        /// First level of the whole-run folded stacks and flame graph (default: endpoint);
        /// with `--format top`, also a function table per endpoint, span name or thread.
        #[arg(long, value_enum)]
        group_by: Option<otel_thread_ctx_formats::flame::GroupBy>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = profile::Format::Pprof)]
        format: profile::Format,
        /// Output file (default profile-<pid>.<ext>); per-trace files go beside it.
        #[arg(short = 'o', long)]
        output: Option<std::path::PathBuf>,
        /// Also send the profile as OTLP/HTTP protobuf to this receiver (http://host:port).
        #[arg(long)]
        otlp_endpoint: Option<String>,
        #[command(flatten)]
        trace_files: TraceFileArgs,
        #[command(flatten)]
        filter: FilterArgs,
        /// Do not attribute libuv threadpool work (fs, crypto, zlib, dns, N-API async
        /// work) to the span that queued it (on by default when node's libuv symbols are found).
        #[arg(long)]
        no_threadpool: bool,
        /// Follow threadpool work with probes where the queued work is submitted and
        /// started, even where the target publishes the Node.js schema (whose pool
        /// samples are otherwise read at sample time, with no probes: the span of the
        /// request each runs, the context it was made in).
        #[arg(long, conflicts_with = "no_threadpool")]
        threadpool_probes: bool,
        /// The default now; accepted for the scripts that named it.
        #[arg(long, hide = true, conflicts_with_all = ["no_threadpool", "threadpool_probes"])]
        threadpool_at_sample_time: bool,
        /// Span profiles for Grafana Pyroscope (or another backend that files samples by span id):
        /// each sample of the OTLP output is filed under its local root span (`root`: a `span_id`
        /// attribute holding the root's id; matches ProfileIdSpanProcessor's default) or under the
        /// innermost span it ran in (`span`: the link's span id), with one value each and ids only
        /// in the link and `span_id`.
        #[arg(long, value_enum)]
        span_profiles: Option<otel_thread_ctx_formats::otlp::SpanProfiles>,
    },
    /// Continuous profiling of every process on the host that publishes a
    /// thread context (or the ones named): one OTLP export every interval,
    /// one ResourceProfiles per process, until SIGINT/SIGTERM.
    Agent {
        /// Seconds between exports.
        #[arg(long, default_value_t = 10.0, value_parser = parse_interval)]
        interval: f64,
        /// On-CPU samples per second per CPU.
        #[arg(long, default_value_t = 99, value_parser = parse_profile_hz)]
        hz: u64,
        /// Also record off-CPU time: the stack and span of every wait, and how long it lasted.
        #[arg(long)]
        off_cpu: bool,
        /// Send every export to this OTLP receiver: grpc://host:port (OTLP/gRPC, default port 4317)
        /// or http://host:port[/path] (OTLP/HTTP protobuf, default port 4318 and path /v1development/profiles).
        /// Default: OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT, with
        /// OTEL_EXPORTER_OTLP_[PROFILES_]PROTOCOL (grpc, http/protobuf), as OpenTelemetry exporters read them.
        #[arg(long)]
        otlp_endpoint: Option<String>,
        /// Protocol to use whatever the endpoint's scheme says.
        #[arg(long, value_enum)]
        otlp_protocol: Option<agent::export::Protocol>,
        /// Write every export to this directory, one OTLP ProfilesData protobuf file each.
        #[arg(long)]
        output_dir: Option<std::path::PathBuf>,
        /// Size bound of --output-dir's profiles in MiB: the oldest files are removed past it.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
        output_max_mib: u64,
        /// Profile this process (repeatable), whether or not it publishes a thread context.
        /// Default: every process that publishes one.
        #[arg(long = "pid")]
        pids: Vec<i32>,
        /// Profile processes whose command name or executable file name contains NAME (repeatable),
        /// whether or not they publish a thread context.
        #[arg(long = "process-name", value_name = "NAME")]
        process_names: Vec<String>,
        /// Profile only processes whose published process context has `service.name` equal to NAME
        /// (repeatable: any of them); narrows the processes selected otherwise.
        #[arg(long = "service-name", value_name = "NAME", value_parser = parse_service_name)]
        service_names: Vec<String>,
        /// Seconds between the agent's own metrics lines on stderr (processes, samples, exports
        /// sent, retried and dropped); 0: none.
        #[arg(long, default_value_t = 60.0, value_parser = parse_metrics_interval)]
        metrics_interval: f64,
        /// Span profiles for Grafana Pyroscope (or another backend that files samples by span id):
        /// each OTLP sample is filed under its local root span (`root`: a `span_id` attribute holding
        /// the root's id; matches ProfileIdSpanProcessor's default) or under the innermost span it ran
        /// in (`span`: the link's span id), with one value each and ids only in the link and `span_id`.
        #[arg(long, value_enum)]
        span_profiles: Option<otel_thread_ctx_formats::otlp::SpanProfiles>,
    },
    /// Converts OTLP ProfilesData protobuf files (as `profile --format otlp` and
    /// `agent --output-dir` write them), merged, to pprof, folded stacks, flame graph SVGs
    /// or top tables.
    Convert {
        /// Files to read.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = convert::Format::Pprof)]
        format: convert::Format,
        /// Output file (default: the first file's name with the format's extension, in the
        /// current directory; `top` prints to stdout); per-trace files go beside it.
        #[arg(short = 'o', long)]
        output: Option<std::path::PathBuf>,
        /// First level of the whole-run folded stacks and flame graph (default: endpoint);
        /// with `--format top`, also a function table per endpoint, span name or thread.
        #[arg(long, value_enum)]
        group_by: Option<otel_thread_ctx_formats::flame::GroupBy>,
        #[command(flatten)]
        trace_files: TraceFileArgs,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Checks OTLP ProfilesData protobuf files (as `profile --format otlp` and `agent --output-dir`
    /// write them) against the profiling SIG's conformance rules; exit status 1 when one breaks a rule.
    CheckOtlp {
        /// Files to check.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
}

/// Which traces get a flame graph (or folded file) of their own.
#[derive(clap::Args, Clone, Copy, Debug)]
struct TraceFileArgs {
    /// Most per-trace flame graphs (or folded files) written, busiest first.
    #[arg(long, default_value_t = 20)]
    max_traces: usize,
    /// Samples a trace needs for its own flame graph (or folded file).
    #[arg(long, default_value_t = otel_thread_ctx_formats::flame::MIN_TRACE_SAMPLES)]
    min_trace_samples: usize,
}

/// The samples an output keeps: each option is repeatable (a sample matches
/// one of its values), and a sample is kept when it matches every option given.
#[derive(clap::Args, Clone, Debug, Default)]
struct FilterArgs {
    /// Keep the samples of this endpoint: `GET /users/:id`, or the route alone (`/users/:id`).
    #[arg(long = "endpoint", value_name = "ROUTE")]
    endpoints: Vec<String>,
    /// Keep the samples of spans with this name.
    #[arg(long = "span-name", value_name = "NAME")]
    span_names: Vec<String>,
    /// Keep the samples of this trace (32 hex digits).
    #[arg(long = "trace-id", value_name = "HEX", value_parser = otel_thread_ctx_formats::filter::parse_trace_id)]
    trace_ids: Vec<[u8; 16]>,
}

impl FilterArgs {
    fn filter(self) -> otel_thread_ctx_formats::filter::Filter {
        otel_thread_ctx_formats::filter::Filter {
            endpoints: self.endpoints,
            span_names: self.span_names,
            trace_ids: self.trace_ids,
        }
    }
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3_600.0).contains(&v) => Ok(v),
        _ => Err("must be a number of seconds in [0.1, 3600]".into()),
    }
}

fn parse_metrics_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 || (1.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err("must be 0 (no metrics lines) or a number of seconds in [1, 86400]".into()),
    }
}

fn parse_service_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err(
            "must be a service name (the process context's service.name), not empty".into(),
        );
    }
    Ok(s.to_string())
}

fn parse_profile_hz(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if (1..=10_000).contains(&v) => Ok(v),
        _ => Err("must be a whole number of samples per second in [1, 10000]".into()),
    }
}

fn parse_duration(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err("must be a number of seconds in (0, 86400]".into()),
    }
}

/// Prints to stdout; a closed stdout is not worth a panic.
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.check_args {
        return ExitCode::SUCCESS;
    }
    signals::install_handlers();
    match cli.command {
        Command::Agent {
            interval,
            hz,
            off_cpu,
            otlp_endpoint,
            otlp_protocol,
            output_dir,
            output_max_mib,
            pids,
            process_names,
            service_names,
            metrics_interval,
            span_profiles,
        } => {
            let endpoint = match otlp_endpoint {
                Some(url) => agent::export::parse_endpoint(&url, otlp_protocol).map(Some),
                None => agent::export::endpoint_from_env(|n| std::env::var(n).ok(), otlp_protocol),
            };
            let endpoint = match endpoint {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("otel-thread-ctx: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Some(bad) = pids.iter().find(|&&p| p <= 0) {
                eprintln!("otel-thread-ctx: invalid pid {bad}");
                return ExitCode::from(2);
            }
            let opts = agent::Options {
                interval: Duration::from_secs_f64(interval),
                hz,
                off_cpu,
                output_dir,
                output_max_bytes: output_max_mib * 1024 * 1024,
                endpoint,
                span_profiles,
                selection: agent::processes::Selection {
                    pids,
                    names: process_names,
                    service_names,
                },
                metrics_every: (metrics_interval > 0.0)
                    .then(|| Duration::from_secs_f64(metrics_interval)),
            };
            match agent::run(&opts) {
                Err(e) => {
                    eprintln!("otel-thread-ctx: {e}");
                    ExitCode::from(2)
                }
                Ok(lines) => {
                    for line in &lines {
                        eprintln!("{line}");
                    }
                    ExitCode::SUCCESS
                }
            }
        }
        Command::CheckOtlp { files } => {
            let mut conformant = true;
            for path in &files {
                match otel_thread_ctx_formats::conformance::check_file(path) {
                    Err(e) => {
                        eprintln!("otel-thread-ctx: {}: {e}", path.display());
                        return ExitCode::from(2);
                    }
                    Ok(violations) if violations.is_empty() => {
                        emit(&format!("{}: conformant\n", path.display()))
                    }
                    Ok(violations) => {
                        conformant = false;
                        let mut text = format!(
                            "{}: {}\n",
                            path.display(),
                            otel_thread_ctx_formats::count(
                                violations.len() as u64,
                                "violation",
                                "violations"
                            )
                        );
                        for v in violations {
                            text.push_str(&format!("  {v}\n"));
                        }
                        emit(&text);
                    }
                }
            }
            ExitCode::from(if conformant { 0 } else { 1 })
        }
        Command::Convert {
            files,
            format,
            output,
            group_by,
            trace_files,
            filter,
        } => {
            let opts = convert::Options {
                files,
                format,
                output,
                group_by,
                max_traces: trace_files.max_traces,
                min_trace_samples: trace_files.min_trace_samples,
                filter: filter.filter(),
            };
            match convert::run(&opts) {
                Err(e) => {
                    eprintln!("otel-thread-ctx: {}", output::escape(&e.to_string()));
                    ExitCode::from(2)
                }
                Ok(report) => {
                    for line in &report.lines {
                        eprintln!("{}", output::escape(line));
                    }
                    if let Some(text) = &report.stdout {
                        emit(text);
                    }
                    ExitCode::SUCCESS
                }
            }
        }
        Command::Profile {
            pid,
            duration,
            hz,
            off_cpu,
            group_by,
            format,
            output,
            otlp_endpoint,
            trace_files,
            filter,
            no_threadpool,
            threadpool_probes,
            threadpool_at_sample_time: _,
            span_profiles,
        } => {
            let opts = profile::Options {
                pid,
                duration: Duration::from_secs_f64(duration),
                hz,
                off_cpu,
                format,
                group_by,
                output,
                otlp_endpoint,
                max_traces: trace_files.max_traces,
                min_trace_samples: trace_files.min_trace_samples,
                filter: filter.filter(),
                threadpool: !no_threadpool,
                threadpool_probes,
                span_profiles,
            };
            match profile::run(&opts) {
                Err(e) => {
                    eprintln!("otel-thread-ctx: {e}");
                    ExitCode::from(2)
                }
                Ok(report) => {
                    for line in &report.lines {
                        eprintln!("{line}");
                    }
                    if let Some(text) = &report.stdout {
                        emit(text);
                    }
                    ExitCode::SUCCESS
                }
            }
        }
        Command::Inspect {
            pid,
            json,
            stop_timeout_ms,
        } => match conformance::run(pid, Duration::from_millis(stop_timeout_ms)) {
            Err(e) => {
                eprintln!("otel-thread-ctx: {}", output::escape(&e.to_string()));
                // Interrupted runs exit like the signal's default action would.
                ExitCode::from(signals::requested().map_or(2, |sig| 128u8.wrapping_add(sig as u8)))
            }
            Ok(report) => {
                if json {
                    emit(
                        &(serde_json::to_string_pretty(&report).expect("report serializes") + "\n"),
                    );
                } else {
                    emit(&output::inspect(&report));
                }
                ExitCode::from(if report.conformant { 0 } else { 1 })
            }
        },
        Command::Sample {
            pid,
            hz,
            duration,
            json,
            spans,
            raw,
            stop_timeout_ms,
        } => {
            let opts = sampler::Options {
                pid,
                hz: hz as f64,
                duration: Duration::from_secs_f64(duration),
                stop_timeout: Duration::from_millis(stop_timeout_ms),
            };
            let mut stdout = std::io::stdout().lock();
            let result = sampler::run(
                &opts,
                if raw {
                    Some(&mut stdout as &mut dyn Write)
                } else {
                    None
                },
            );
            drop(stdout);
            match result {
                Err(e) => {
                    eprintln!("otel-thread-ctx: {}", output::escape(&e.to_string()));
                    ExitCode::from(2)
                }
                Ok(Err(reason)) => {
                    eprintln!(
                        "otel-thread-ctx: pid {pid} publishes no readable thread context: {}",
                        output::escape(&reason.to_string())
                    );
                    ExitCode::from(1)
                }
                Ok(Ok(summary)) => {
                    let text = if json {
                        serde_json::to_string_pretty(&summary).expect("summary serializes") + "\n"
                    } else {
                        output::sample(&summary, spans)
                    };
                    if raw {
                        eprint!("{text}");
                    } else {
                        emit(&text);
                    }
                    for e in &summary.execs {
                        eprintln!("otel-thread-ctx: pid {pid} {}", output::exec_line(e));
                    }
                    if summary.target_exited {
                        eprintln!(
                            "otel-thread-ctx: pid {pid} exited after {:.2} s; the summary covers the {} read until then",
                            summary.elapsed_s,
                            otel_thread_ctx_formats::count(summary.rounds, "round", "rounds")
                        );
                    }
                    match summary.interrupted_by_signal {
                        Some(sig) => ExitCode::from(128u8.wrapping_add(sig as u8)),
                        None => ExitCode::SUCCESS,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn check_args_parses_anywhere_and_stays_out_of_help() {
        Cli::command().debug_assert();
        for args in [
            &["otel-thread-ctx", "--check-args", "inspect", "--pid", "1"][..],
            &["otel-thread-ctx", "inspect", "--pid", "1", "--check-args"][..],
        ] {
            assert!(Cli::try_parse_from(args).expect("parses").check_args);
        }
        assert!(
            !Cli::try_parse_from(["otel-thread-ctx", "inspect", "--pid", "1"])
                .expect("parses")
                .check_args
        );
        // Bad arguments still fail: the flag checks them, it does not excuse them.
        assert!(Cli::try_parse_from(["otel-thread-ctx", "inspect", "--check-args"]).is_err());
        let help = Cli::command().render_long_help().to_string();
        assert!(!help.contains("check-args"), "{help}");
    }

    /// `--hz` and `--duration` of `command --pid 1 args...`, or the error.
    fn rate(command: &str, args: &[&str]) -> Result<(f64, f64), clap::Error> {
        let argv = ["otel-thread-ctx", command, "--pid", "1"]
            .into_iter()
            .chain(args.iter().copied());
        Ok(match Cli::try_parse_from(argv)?.command {
            Command::Sample { hz, duration, .. } | Command::Profile { hz, duration, .. } => {
                (hz as f64, duration)
            }
            _ => unreachable!(),
        })
    }

    #[test]
    fn sample_takes_the_rate_and_duration_profile_takes() {
        for command in ["sample", "profile"] {
            assert_eq!(rate(command, &[]).unwrap(), (99.0, 30.0), "{command}");
            assert_eq!(
                rate(command, &["--hz", "10000", "--duration", "86400"]).unwrap(),
                (10_000.0, 86_400.0),
                "{command}"
            );
            for bad in [
                &["--hz", "0"][..],
                &["--hz", "10001"],
                &["--hz", "0.5"],
                &["--duration", "0"],
                &["--duration", "86401"],
            ] {
                assert!(rate(command, bad).is_err(), "{command} {bad:?}");
            }
        }
    }

    #[test]
    fn sample_lists_spans_only_when_asked() {
        let parse = |args: &[&str]| {
            let argv = ["otel-thread-ctx", "sample", "--pid", "1"]
                .into_iter()
                .chain(args.iter().copied());
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Sample { spans, .. } => spans,
                _ => unreachable!(),
            })
        };
        assert!(!parse(&[]).unwrap());
        assert!(parse(&["--spans"]).unwrap());
        // JSON always lists them: the flag would change nothing.
        assert!(parse(&["--spans", "--json"]).is_err());
        let help = Cli::command()
            .find_subcommand_mut("sample")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("--spans"), "{help}");
    }

    #[test]
    fn filters_repeat_and_trace_ids_are_checked() {
        let parse = |args: &[&str]| {
            let argv = ["otel-thread-ctx", "convert", "a.otlp.pb"]
                .into_iter()
                .chain(args.iter().copied());
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Convert {
                    filter, group_by, ..
                } => (filter.filter(), group_by),
                _ => unreachable!(),
            })
        };
        let (f, group_by) = parse(&[
            "--endpoint",
            "/a",
            "--endpoint",
            "GET /b",
            "--span-name",
            "sort",
            "--trace-id",
            "0102030405060708090A0B0C0D0E0F10",
        ])
        .unwrap();
        assert_eq!(f.endpoints, ["/a", "GET /b"]);
        assert_eq!(f.span_names, ["sort"]);
        assert_eq!(
            f.trace_ids,
            [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
        );
        assert_eq!(group_by, None);
        assert!(parse(&[]).unwrap().0.is_empty());
        for bad in [
            &["--trace-id", "abc"][..],
            &["--trace-id", "00000000000000000000000000000000"],
            &["--format", "jsonl"],
            &["--format", "otlp"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(Cli::try_parse_from(["otel-thread-ctx", "convert"]).is_err());
        // profile takes the same filters.
        assert!(Cli::try_parse_from([
            "otel-thread-ctx",
            "profile",
            "--pid",
            "1",
            "--span-name",
            "x",
            "--trace-id",
            "zz"
        ])
        .is_err());
    }
}
