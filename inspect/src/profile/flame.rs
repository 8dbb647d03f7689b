//! Folded stacks and flame graphs (inferno): one for the whole run, whose
//! levels are thread, span, (with off-CPU profiling) on/off CPU, then the
//! frames root first; and one per trace, whose first level is the span.
//!
//! Values are microseconds: on CPU, samples times the sampling period; off
//! CPU, the time waited.

use std::collections::BTreeMap;

use super::kernel::Kind;
use super::model::{Entry, Profile, Span, State};

/// How a span shows in a flame graph: its id and, when the record carried
/// it, its `http.route`.
pub fn span_label(e: &Entry) -> String {
    match (&e.span, e.state) {
        (Some(span), _) => {
            let mut label = format!("span {}", span.span_hex());
            for (k, v) in &e.attributes {
                label.push_str(&format!(" {k}={v}"));
            }
            label
        }
        (None, State::Idle) => "[idle]".into(),
        (None, _) => "[no span]".into(),
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
pub fn folded(p: &Profile) -> Vec<String> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for e in &p.entries {
        let root = format!("{} ({})", e.thread_name.replace(';', ":"), e.tid);
        *lines.entry(stack(p, e, Some(root))).or_default() += micros(e);
    }
    folded_lines(lines)
}

/// The folded stack of `e`: `root` (if any), the span, `[threadpool]` for
/// a pool thread's work item, the on/off-CPU marker when the profile has
/// both, then the frames, outermost first.
fn stack(p: &Profile, e: &Entry, root: Option<String>) -> String {
    let mut stack: Vec<String> = root.into_iter().collect();
    stack.push(span_label(e).replace(';', ":"));
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
    /// The title of its flame graph: trace id and the routes its spans carried.
    pub title: String,
    pub lines: Vec<String>,
}

/// Per trace, the busiest first, at most `limit`.
pub fn per_trace(p: &Profile, limit: usize) -> Vec<Trace> {
    // Per trace id: folded stack -> samples, and the span ids seen.
    type Folded = BTreeMap<String, u64>;
    let mut traces: BTreeMap<[u8; 16], (Folded, Vec<String>)> = BTreeMap::new();
    for e in &p.entries {
        let Some(Span { trace_id, .. }) = e.span else {
            continue;
        };
        let (lines, routes) = traces.entry(trace_id).or_default();
        *lines.entry(stack(p, e, None)).or_default() += micros(e);
        if let Some(route) = e.attribute("http.route") {
            if !routes.iter().any(|r| r == route) {
                routes.push(route.to_string());
            }
        }
    }
    let mut out: Vec<Trace> = traces
        .into_iter()
        .map(|(id, (lines, routes))| {
            let trace_id = opentelemetry::trace::TraceId::from_bytes(id).to_string();
            let mut title = format!("trace {trace_id}");
            if !routes.is_empty() {
                title.push_str(&format!(" ({})", routes.join(", ")));
            }
            Trace {
                total_us: lines.values().sum(),
                title,
                trace_id,
                lines: folded_lines(lines),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_us
            .cmp(&a.total_us)
            .then(a.trace_id.cmp(&b.trace_id))
    });
    out.truncate(limit);
    out
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
    fn whole_run_levels_are_thread_span_state_then_frames() {
        let p = crate::profile::model::tests::profile();
        let lines = folded(&p);
        assert!(lines.contains(&"main (1);span 0707070707070707 http.route=/a;[on-cpu];main;caller;leaf;schedule_[k] 20000".to_string()), "{lines:#?}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("t2 (2);[idle];[off-cpu];") && l.ends_with(" 9")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("t2 (2);[no span];[on-cpu];main;leaf")),
            "{lines:#?}"
        );
    }

    #[test]
    fn pool_thread_work_is_marked_under_its_span() {
        use crate::profile::kernel::Kind;
        use crate::profile::model::tests::{names, record, sample};
        let mut pooled = sample(Kind::OnCpu, 5, record(7, &[0, 2, b'/', b'a']), &[0x10], 0);
        pooled.threadpool = true;
        let base = Profile {
            hz: 100,
            period_ns: 10_000_000,
            ..Default::default()
        };
        let p = crate::profile::model::build(
            base,
            &[pooled],
            &names(),
            &["http.route".into()],
            &Default::default(),
        );
        assert!(p.entries[0].threadpool);
        assert_eq!(
            folded(&p),
            ["t5 (5);span 0707070707070707 http.route=/a;[threadpool];leaf;schedule_[k] 10000"]
        );
        let traces = per_trace(&p, 10);
        assert_eq!(
            traces[0].lines,
            ["span 0707070707070707 http.route=/a;[threadpool];leaf;schedule_[k] 10000"]
        );
    }

    #[test]
    fn one_graph_per_trace_titled_with_its_route() {
        let p = crate::profile::model::tests::profile();
        let traces = per_trace(&p, 10);
        assert_eq!(traces.len(), 1);
        assert_eq!(
            traces[0].title,
            "trace 07070707070707070707070707070707 (/a)"
        );
        assert_eq!(traces[0].total_us, 20_000 + 5);
        let svg =
            String::from_utf8(svg(&traces[0].lines, &traces[0].title, None).unwrap()).unwrap();
        assert!(svg.contains("<svg") && svg.contains("caller"));
        assert!(per_trace(&p, 0).is_empty());
    }
}
