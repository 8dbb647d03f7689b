//! `convert`: OTLP ProfilesData files (the agent's `--output-dir`, `profile
//! --format otlp`) read back into the profile model, merged, filtered, and
//! written the way `profile` writes its outputs.

use std::path::{Path, PathBuf};

use otel_thread_ctx_formats::decode::{self, DecodeError};
use otel_thread_ctx_formats::filter::Filter;
use otel_thread_ctx_formats::{count, flame};

use crate::profile::{self, kept_line, Outputs, ProfileError, Report};

/// What `convert` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// gzipped profile.proto, for `go tool pprof`, speedscope, ...
    Pprof,
    /// Folded stacks (`a;b;c value`), whole profile plus one file per trace.
    Folded,
    /// Flame graph SVGs, whole profile plus one per trace.
    Svg,
    /// Tables on stdout (or in the output file when given): CPU and
    /// off-CPU time by endpoint, by span name, by function.
    Top,
}

impl Format {
    fn profile_format(self) -> profile::Format {
        match self {
            Format::Pprof => profile::Format::Pprof,
            Format::Folded => profile::Format::Folded,
            Format::Svg => profile::Format::Svg,
            Format::Top => profile::Format::Top,
        }
    }
}

pub struct Options {
    pub files: Vec<PathBuf>,
    pub format: Format,
    pub output: Option<PathBuf>,
    pub group_by: Option<flame::GroupBy>,
    pub max_traces: usize,
    pub min_trace_samples: usize,
    pub filter: Filter,
}

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Write(#[from] ProfileError),
}

/// The default output: the first file's name, its `.otlp.pb` (or `.pb`)
/// swapped for the format's extension, in the current directory.
fn default_output(first: &Path, format: profile::Format) -> PathBuf {
    let name = first
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "profile".into());
    let stem = [".otlp.pb", ".pb"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .unwrap_or(&name);
    PathBuf::from(format!("{stem}.{}", format.extension()))
}

pub fn run(opts: &Options) -> Result<Report, ConvertError> {
    let decoded = decode::read_files(&opts.files)?;
    let mut profile = decoded.profile;
    let mut lines = Vec::new();
    let distinct: std::collections::BTreeSet<i64> = decoded.pids.iter().copied().collect();
    let who = match distinct.len() {
        1 => format!("pid {}", profile.pid),
        0 => "profile".to_string(),
        n => count(n as u64, "process", "processes"),
    };
    lines.push(format!(
        "read {} ({}): {} on CPU{}",
        count(opts.files.len() as u64, "file", "files"),
        who,
        count(profile.on_cpu_samples(), "sample", "samples"),
        if profile.off_cpu {
            format!(", {:.3} s off CPU", profile.off_cpu_ns() as f64 / 1e9)
        } else {
            String::new()
        }
    ));
    for skipped in &decoded.skipped {
        lines.push(format!(
            "left out a profile of sample type {skipped}: neither CPU time nor off-CPU time"
        ));
    }
    if !opts.filter.is_empty() {
        let endpoints = endpoints(&profile);
        let (before, kept) = opts.filter.apply(&mut profile);
        lines.push(kept_line(&opts.filter, before, kept));
        if kept == 0 && !endpoints.is_empty() {
            lines.push(format!(
                "the endpoints in the input: {}",
                endpoints.join(", ")
            ));
        }
    }
    let format = opts.format.profile_format();
    let output = match (&opts.output, format) {
        (Some(path), _) => Some(path.clone()),
        (None, profile::Format::Top) => None,
        (None, format) => Some(default_output(&opts.files[0], format)),
    };
    let out = Outputs {
        format,
        group_by: opts.group_by,
        max_traces: opts.max_traces,
        min_trace_samples: opts.min_trace_samples,
        span_profiles: None,
        filter: &opts.filter,
    };
    let notes = vec![format!(
        "converted from {}",
        opts.files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )];
    let stdout = profile::write(
        &out,
        &who,
        &profile,
        None,
        &notes,
        output.as_deref(),
        &mut lines,
    )?;
    Ok(Report { lines, stdout })
}

/// The endpoints of the profile's samples, the most sampled first (at
/// most ten), for a filter that matched nothing.
fn endpoints(p: &otel_thread_ctx_profiler::model::Profile) -> Vec<String> {
    let mut by: std::collections::HashMap<String, usize> = Default::default();
    for e in p.entries.iter().filter(|e| e.span.is_some()) {
        if let Some(endpoint) = e.endpoint() {
            *by.entry(endpoint).or_default() += e.events.len();
        }
    }
    let mut list: Vec<(String, usize)> = by.into_iter().collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    list.into_iter().take(10).map(|(e, _)| e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_formats::otlp;
    use otel_thread_ctx_otlp::{AnyValue, KeyValue, Message, Resource};

    #[test]
    fn the_default_output_swaps_the_extension() {
        assert_eq!(
            default_output(
                Path::new("/d/profiles-1-000000.otlp.pb"),
                profile::Format::Svg
            ),
            PathBuf::from("profiles-1-000000.svg")
        );
        assert_eq!(
            default_output(Path::new("x.pb"), profile::Format::Pprof),
            PathBuf::from("x.pb.gz")
        );
        assert_eq!(
            default_output(Path::new("x"), profile::Format::Folded),
            PathBuf::from("x.folded")
        );
    }

    #[test]
    fn converts_filters_and_says_what_it_kept() {
        let dir =
            std::env::temp_dir().join(format!("otel-thread-ctx-convert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let resource = Resource {
            attributes: vec![KeyValue::new("process.pid", AnyValue::int(42))],
            dropped_attributes_count: 0,
        };
        let input = dir.join("run.otlp.pb");
        std::fs::write(
            &input,
            otlp::data(otlp::request(&p, resource, None)).encode_to_vec(),
        )
        .unwrap();
        let output = dir.join("run.folded");
        let mut opts = Options {
            files: vec![input.clone()],
            format: Format::Folded,
            output: Some(output.clone()),
            group_by: None,
            max_traces: 20,
            min_trace_samples: 1,
            filter: Filter {
                endpoints: vec!["/a".into()],
                ..Default::default()
            },
        };
        let report = run(&opts).unwrap();
        let text = report.lines.join("\n");
        assert!(
            text.contains("read 1 file (pid 42): 3 samples on CPU"),
            "{text}"
        );
        assert!(text.contains("kept 3 of 5 samples"), "{text}");
        assert!(text.contains("wrote 1 per-trace file beside it"), "{text}");
        let folded = std::fs::read_to_string(&output).unwrap();
        assert!(folded.lines().all(|l| l.starts_with("/a;")), "{folded}");
        // Nothing matches: the input's endpoints are listed.
        opts.filter.endpoints = vec!["/nope".into()];
        opts.format = Format::Top;
        opts.output = None;
        let report = run(&opts).unwrap();
        assert!(report
            .lines
            .iter()
            .any(|l| l == "the endpoints in the input: /a"));
        assert!(report.stdout.unwrap().contains("FUNCTION (on CPU)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
