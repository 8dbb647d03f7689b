//! Folded stacks and flame graphs (inferno): one for the whole run, whose
//! first level is what `--group-by` says (the endpoint by default; the span
//! name; the thread, then the span; or nothing), then, with off-CPU
//! profiling, on/off CPU, then the frames root first; and one per trace,
//! whose first level is the span, by name.
//!
//! Values are microseconds: on CPU, samples times the sampling period; off
//! CPU, the time waited.

use std::collections::BTreeMap;

use otel_thread_ctx_profiler::kernel::Kind;
use otel_thread_ctx_profiler::model::{Entry, Profile, Span, State};

/// The first level of the whole-run flame graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// The endpoint the sample served (`http.route`, after the method when
    /// published), inherited from the local root span.
    #[default]
    Endpoint,
    /// The span's name.
    Span,
    /// The thread, then the span.
    Thread,
    /// No grouping: the frames only.
    None,
}

impl GroupBy {
    /// How the whole-run graph's title says it.
    pub fn title(self) -> &'static str {
        match self {
            GroupBy::Endpoint => "by endpoint",
            GroupBy::Span => "by span name",
            GroupBy::Thread => "by thread and span",
            GroupBy::None => "all samples",
        }
    }
}

/// What a sample outside any span shows as.
fn no_span(e: &Entry) -> &'static str {
    if e.state == State::Idle {
        "[idle]"
    } else {
        "[no span]"
    }
}

/// How a span shows in a flame graph: its name and id (`[span <id>]`
/// when the record carried no name).
pub fn span_label(e: &Entry) -> String {
    match &e.span {
        Some(span) => match e.span_name() {
            Some(name) => format!("{name} ({})", span.span_hex()),
            None => format!("[span {}]", span.span_hex()),
        },
        None => no_span(e).into(),
    }
}

/// The endpoint level: the endpoint, or why there is none.
pub fn endpoint_label(e: &Entry) -> String {
    match (&e.span, e.endpoint()) {
        (Some(_), Some(endpoint)) => endpoint,
        (Some(_), None) => "[no endpoint]".into(),
        (None, _) => no_span(e).into(),
    }
}

/// The span-name level: the name, or why there is none.
pub fn span_name_label(e: &Entry) -> String {
    match (&e.span, e.span_name()) {
        (Some(_), Some(name)) => name.to_string(),
        (Some(_), None) => "[unnamed span]".into(),
        (None, _) => no_span(e).into(),
    }
}

/// Frame names root first; kernel frames get inferno's `_[k]` suffix.
fn frames(e: &Entry) -> impl Iterator<Item = String> + '_ {
    e.frames.iter().rev().map(|f| {
        let name = f.name.replace(';', ":");
        if f.module == "[kernel]" {
            format!("{name}_[k]")
        } else {
            name
        }
    })
}

fn micros(e: &Entry) -> u64 {
    e.total_ns().div_ceil(1_000)
}

/// Folded lines (`a;b;c value`), sorted, for the whole run.
pub fn folded(p: &Profile, group_by: GroupBy) -> Vec<String> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for e in &p.entries {
        let levels = match group_by {
            GroupBy::Endpoint => vec![endpoint_label(e)],
            GroupBy::Span => vec![span_name_label(e)],
            GroupBy::Thread => vec![format!("{} ({})", e.thread_name, e.tid), span_label(e)],
            GroupBy::None => Vec::new(),
        };
        *lines.entry(stack(p, e, levels)).or_default() += micros(e);
    }
    folded_lines(lines)
}

/// The folded stack of `e`: `levels`, `[threadpool]` for a pool thread's
/// work item, the on/off-CPU marker when the profile has both, then the
/// frames, outermost first.
fn stack(p: &Profile, e: &Entry, levels: Vec<String>) -> String {
    let mut stack: Vec<String> = levels.into_iter().map(|l| l.replace(';', ":")).collect();
    if e.threadpool {
        stack.push("[threadpool]".into());
    }
    if p.off_cpu {
        stack.push(if e.kind == Kind::OnCpu {
            "[on-cpu]".into()
        } else {
            "[off-cpu]".into()
        });
    }
    stack.extend(frames(e));
    stack.join(";")
}

/// `stack value` lines, sorted by stack, without the empty ones.
fn folded_lines(lines: BTreeMap<String, u64>) -> Vec<String> {
    lines
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect()
}

/// One trace's folded lines.
pub struct Trace {
    pub trace_id: String,
    pub total_us: u64,
    /// The title of its flame graph: the local root span's name and the
    /// endpoint, then the trace id.
    pub title: String,
    pub lines: Vec<String>,
    /// Its samples (on-CPU samples and waits).
    pub samples: usize,
    /// Its first and last sample's times (0 when the samples carry none).
    pub first_ns: u64,
    pub last_ns: u64,
}

impl Trace {
    /// How long the trace ran in the profile, first to last sample, when
    /// its samples carry times.
    pub fn span_ns(&self) -> Option<u64> {
        (self.first_ns > 0).then(|| self.last_ns - self.first_ns)
    }
}

/// Per-trace files need this many samples by default: a graph of fewer
/// says little.
pub const MIN_TRACE_SAMPLES: usize = 10;

/// The traces [`per_trace`] picked, and how many it left out.
#[derive(Default)]
pub struct Traces {
    pub traces: Vec<Trace>,
    /// Traces with fewer samples than asked for.
    pub too_few: usize,
    /// Traces with enough samples, past the limit.
    pub past_limit: usize,
}

/// What a trace's title says: its local root span's name (when a sample
/// fell in that span: records name their own span only) and its endpoints.
#[derive(Default)]
struct TraceNames {
    root_name: Option<String>,
    endpoints: Vec<String>,
}

/// Per trace with at least `min_samples` samples, the busiest first, at
/// most `limit`.
pub fn per_trace(p: &Profile, limit: usize, min_samples: usize) -> Traces {
    type Folded = BTreeMap<String, u64>;
    let mut traces: BTreeMap<[u8; 16], (Folded, TraceNames, Times)> = BTreeMap::new();
    for e in &p.entries {
        let Some(span @ Span { trace_id, .. }) = e.span else {
            continue;
        };
        let (lines, names, times) = traces.entry(trace_id).or_default();
        *lines.entry(stack(p, e, vec![span_label(e)])).or_default() += micros(e);
        times.samples += e.events.len();
        for &(t, _) in &e.events {
            let t = p.unix_ns(t);
            if t > 0 {
                times.first = Some(times.first.map_or(t, |f: u64| f.min(t)));
                times.last = times.last.max(t);
            }
        }
        if let Some(name) = e.span_name() {
            if e.local_root_span_id() == Some(span.span_hex().as_str()) {
                names.root_name.get_or_insert_with(|| name.to_string());
            }
        }
        if let Some(endpoint) = e.endpoint() {
            if !names.endpoints.contains(&endpoint) {
                names.endpoints.push(endpoint);
            }
        }
    }
    let mut out = Traces::default();
    let mut kept: Vec<Trace> = Vec::new();
    for (id, (lines, names, times)) in traces {
        if times.samples < min_samples {
            out.too_few += 1;
            continue;
        }
        let trace_id = opentelemetry::trace::TraceId::from_bytes(id).to_string();
        let mut parts: Vec<String> = names.root_name.into_iter().collect();
        if !names.endpoints.is_empty() {
            parts.push(names.endpoints.join(", "));
        }
        parts.push(format!("(trace {trace_id})"));
        kept.push(Trace {
            total_us: lines.values().sum(),
            title: parts.join(" "),
            trace_id,
            lines: folded_lines(lines),
            samples: times.samples,
            first_ns: times.first.unwrap_or(0),
            last_ns: times.last,
        });
    }
    kept.sort_by(|a, b| {
        b.total_us
            .cmp(&a.total_us)
            .then(a.trace_id.cmp(&b.trace_id))
    });
    out.past_limit = kept.len().saturating_sub(limit);
    kept.truncate(limit);
    out.traces = kept;
    out
}

/// A trace's sample count and wall-clock extent.
#[derive(Default)]
struct Times {
    samples: usize,
    first: Option<u64>,
    last: u64,
}

/// The flame graph could not be rendered.
#[derive(Debug, thiserror::Error)]
#[error("rendering the flame graph: {0}")]
pub struct RenderError(#[source] std::io::Error);

/// Renders folded lines as an SVG flame graph.
pub fn svg(
    lines: &[String],
    title: &str,
    subtitle: Option<String>,
) -> Result<Vec<u8>, RenderError> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.subtitle = subtitle;
    opts.count_name = "us".into();
    let mut out = Vec::new();
    if lines.is_empty() {
        // inferno refuses empty input; an empty graph still says what ran.
        let none = ["[no samples] 1".to_string()];
        inferno::flamegraph::from_lines(&mut opts, none.iter().map(String::as_str), &mut out)
    } else {
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out)
    }
    .map_err(RenderError)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_run_is_rooted_at_the_endpoint_by_default() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let lines = folded(&p, GroupBy::default());
        assert!(
            lines.contains(&"/a;[on-cpu];main;caller;leaf;schedule_[k] 20000".to_string()),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("[idle];[off-cpu];") && l.ends_with(" 9")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("[no span];[on-cpu];main;leaf")),
            "{lines:#?}"
        );
    }

    #[test]
    fn pool_thread_work_is_marked_under_its_span() {
        use otel_thread_ctx_profiler::kernel::Kind;
        use otel_thread_ctx_profiler::model::fixtures::{names, record, sample};
        let mut pooled = sample(Kind::OnCpu, 5, record(7, &[0, 2, b'/', b'a']), &[0x10], 0);
        pooled.threadpool = true;
        let base = Profile {
            hz: 100,
            period_ns: 10_000_000,
            ..Default::default()
        };
        let p = otel_thread_ctx_profiler::model::build(
            base,
            &[pooled],
            &names(),
            &["http.route".into()],
            &Default::default(),
        );
        assert!(p.entries[0].threadpool);
        assert_eq!(
            folded(&p, GroupBy::Thread),
            ["t5 (5);[span 0707070707070707];[threadpool];leaf;schedule_[k] 10000"]
        );
        assert_eq!(
            folded(&p, GroupBy::Endpoint),
            ["/a;[threadpool];leaf;schedule_[k] 10000"]
        );
        let traces = per_trace(&p, 10, 1).traces;
        assert_eq!(
            traces[0].lines,
            ["[span 0707070707070707];[threadpool];leaf;schedule_[k] 10000"]
        );
    }

    #[test]
    fn other_groupings_name_the_span_the_thread_or_nothing() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let by_span = folded(&p, GroupBy::Span);
        assert!(
            by_span.iter().any(|l| l.starts_with("sort;[on-cpu];main")),
            "{by_span:#?}"
        );
        let by_thread = folded(&p, GroupBy::Thread);
        assert!(
            by_thread
                .iter()
                .any(|l| l.starts_with("main (1);sort (0707070707070707);[on-cpu];main")),
            "{by_thread:#?}"
        );
        let flat = folded(&p, GroupBy::None);
        assert!(
            flat.iter()
                .all(|l| l.starts_with("[on-cpu];") || l.starts_with("[off-cpu];")),
            "{flat:#?}"
        );
    }

    #[test]
    fn one_graph_per_trace_titled_with_its_root_span_and_endpoint() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let traces = per_trace(&p, 10, 1).traces;
        assert_eq!(traces.len(), 1);
        assert_eq!(
            traces[0].title,
            "sort /a (trace 07070707070707070707070707070707)"
        );
        assert!(traces[0]
            .lines
            .iter()
            .any(|l| l.starts_with("sort (0707070707070707);")));
        assert_eq!(traces[0].total_us, 20_000 + 5);
        let svg =
            String::from_utf8(svg(&traces[0].lines, &traces[0].title, None).unwrap()).unwrap();
        assert!(svg.contains("<svg") && svg.contains("caller"));
        assert!(per_trace(&p, 0, 1).traces.is_empty());
        assert_eq!(traces[0].samples, 3);
    }

    #[test]
    fn traces_with_few_samples_are_left_out_and_counted() {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        p.start_unix_ns = 5_000_000_000;
        p.start_monotonic_ns = 0;
        // Trace 7 has 3 samples: 2 on CPU at 1 µs, one wait; spread them.
        p.entries[0].events[1].0 = 1_500_000_000;
        let few = per_trace(&p, 10, 4);
        assert!(few.traces.is_empty());
        assert_eq!((few.too_few, few.past_limit), (1, 0));
        let enough = per_trace(&p, 10, 3);
        assert_eq!(enough.traces.len(), 1);
        assert_eq!(enough.traces[0].span_ns(), Some(1_500_000_000 - 1_000));
        let limited = per_trace(&p, 0, 3);
        assert_eq!((limited.too_few, limited.past_limit), (0, 1));
    }
}
