//! Human-readable renderings of the inspect report and the sample summary.
//! (`--json` prints the serde form of the same structures instead.)
//!
//! Much of what is printed comes from the target (thread names, attribute
//! values, resource strings, file names): every such string goes through
//! [`escape`], so a target cannot move the cursor, retitle the window or
//! clear the screen of whoever reads the report, nor forge report lines.

use std::borrow::Cow;
use std::fmt::Write;

use serde_json::Value;

use otel_thread_ctx_formats::count;
use otel_thread_ctx_reader::conformance::{ProcessContextInfo, Report, SymbolInfo};
use otel_thread_ctx_reader::sampler::{Exec, Summary};

/// Whether a terminal could act on `c` rather than print it: C0 controls
/// (including ESC and newline), DEL, C1 controls, and the bidirectional
/// overrides that reorder how the rest of a line is shown.
fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character a terminal could act on written as an escape
/// (`\x1b`, `\u{9b}`), and backslashes doubled so escapes stay unambiguous.
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_in(s, true)
}

/// Like [`escape`], but leaves backslashes alone: for JSON text, whose own
/// escapes must stay readable (JSON escapes C0 controls, not DEL or C1).
fn escape_json_text(s: &str) -> Cow<'_, str> {
    escape_in(s, false)
}

fn escape_in(s: &str, backslashes: bool) -> Cow<'_, str> {
    if !s
        .chars()
        .any(|c| (backslashes && c == '\\') || is_control(c))
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' if backslashes => out.push_str("\\\\"),
            c if is_control(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_control(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => escape(s).into_owned(),
        other => escape_json_text(&other.to_string()).into_owned(),
    }
}

/// One schema's symbol: where, how it is reached, how it resolved.
fn symbol_lines(o: &mut String, s: &SymbolInfo) {
    let _ = writeln!(
        o,
        "symbol:     {} ({}) in {}{} (st_value {:#x}, size {}, load bias {})",
        s.name,
        s.schema,
        escape(&s.module),
        if s.executable { " [executable]" } else { "" },
        s.st_value,
        s.st_size,
        s.load_bias
    );
    let relocs: Vec<String> = s
        .relocations
        .iter()
        .map(|x| format!("{} @ {}", x.kind, x.got_address))
        .collect();
    let _ = writeln!(
        o,
        "access:     {}{}",
        s.access_model,
        if relocs.is_empty() {
            String::new()
        } else {
            format!(" ({})", relocs.join(", "))
        }
    );
    match (&s.resolution, &s.resolution_error) {
        (Some(res), _) => {
            let _ = writeln!(
                o,
                "resolved:   {} TLS, {}: {}",
                res.tls_model,
                res.path,
                escape(&res.evidence)
            );
        }
        (None, Some(e)) => {
            let _ = writeln!(o, "resolved:   FAILED: {}", escape(e));
        }
        _ => {}
    }
}

/// The inspect report as text: a header, the process context, a thread table.
pub fn inspect(r: &Report) -> String {
    let mut o = String::new();
    let verdict = if r.conformant {
        "conformant thread context"
    } else {
        "NOT conformant"
    };
    let _ = writeln!(o, "pid {}: {verdict}", r.pid);
    if r.symbol.is_none() && r.nodejs_symbol.is_none() {
        let _ = writeln!(
            o,
            "symbol:     neither otel_thread_ctx_v1 nor otel_thread_ctx_nodejs_v1 found in any mapped module"
        );
    }
    for s in [&r.symbol, &r.nodejs_symbol].into_iter().flatten() {
        symbol_lines(&mut o, s);
    }
    for m in r.modules.iter().filter(|m| !m.read) {
        let _ = writeln!(
            o,
            "also:       {} in {} ({}, not read)",
            m.symbol,
            escape(&m.path),
            m.access_model
        );
    }
    match &r.process_context {
        ProcessContextInfo::Absent => {
            let _ = writeln!(o, "process context: none (no OTEL_CTX mapping)");
        }
        ProcessContextInfo::Invalid {
            mapping,
            address,
            error,
        } => {
            let _ = writeln!(
                o,
                "process context: {} at {address}: INVALID: {}",
                escape(mapping),
                escape(error)
            );
        }
        ProcessContextInfo::Ok {
            mapping,
            address,
            version,
            published_at_ns,
            payload_size,
            resource,
            schema_version,
            attribute_key_map,
            ..
        } => {
            let _ = writeln!(
                o,
                "process context: {} at {address}, version {version}, published_at_ns {published_at_ns}, payload {payload_size} B",
                escape(mapping)
            );
            let res: Vec<String> = resource
                .iter()
                .map(|(k, v)| format!("{}={}", escape(k), value_text(v)))
                .collect();
            let _ = writeln!(
                o,
                "  resource:                      {}",
                if res.is_empty() {
                    "(empty)".into()
                } else {
                    res.join(", ")
                }
            );
            let _ = writeln!(
                o,
                "  threadlocal.schema_version:    {}",
                schema_version.as_deref().map_or("(missing)".into(), escape)
            );
            let _ = writeln!(
                o,
                "  threadlocal.attribute_key_map: {}",
                attribute_key_map
                    .as_ref()
                    .map_or("(missing)".to_string(), |m| {
                        let keys: Vec<_> = m.iter().map(|k| escape(k)).collect();
                        format!("[{}]", keys.join(", "))
                    })
            );
        }
    }
    if !r.threads.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<8} {:<16} {:<9} {:<14} {:<32} {:<16} {:<5} {:<18} DETAIL",
            "TID", "NAME", "STATUS", "SCHEMA", "TRACE_ID", "SPAN_ID", "FLAGS", "VARIABLE"
        );
        for t in &r.threads {
            let rec = t.record.as_ref();
            let detail = match rec {
                Some(rec) if !rec.attributes.is_empty() => rec
                    .attributes
                    .iter()
                    .map(|a| {
                        format!(
                            "{}={}",
                            a.key
                                .as_deref()
                                .map_or(format!("#{}", a.key_index), |k| escape(k).into_owned()),
                            escape(&a.value)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => t
                    .reason
                    .as_deref()
                    .map(escape)
                    .unwrap_or_default()
                    .into_owned(),
            };
            let _ = writeln!(
                o,
                "{:<8} {:<16} {:<9} {:<14} {:<32} {:<16} {:<5} {:<18} {}",
                t.tid,
                escape(&t.name),
                t.status,
                t.schema.map_or("-", |s| s.name()),
                rec.and_then(|r| r.trace_id.clone())
                    .unwrap_or_else(|| "-".into()),
                rec.and_then(|r| r.span_id.clone())
                    .unwrap_or_else(|| "-".into()),
                rec.and_then(|r| r.trace_flags)
                    .map_or("-".into(), |f| format!("{f:#04x}")),
                t.tls
                    .as_ref()
                    .and_then(|x| x.variable_address.clone())
                    .unwrap_or_else(|| "-".into()),
                detail
            );
        }
    }
    for p in &r.problems {
        let _ = writeln!(o, "problem: {}", escape(p));
    }
    for w in &r.warnings {
        let _ = writeln!(o, "warning: {}", escape(w));
    }
    o
}

fn micros(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}

/// What became of the reads when the process executed a new program.
pub fn exec_line(e: &Exec) -> String {
    let what = format!(
        "executed {} after {:.2} s",
        escape(&e.executable),
        e.elapsed_s
    );
    match (e.resolution_path, e.resumed_at_s) {
        (Some(path), Some(at)) => format!("{what}: reads resumed after {at:.2} s via {path}"),
        _ => format!(
            "{what}: no thread read since, the new program publishes no readable thread context ({})",
            escape(e.error.as_deref().unwrap_or("not looked at yet"))
        ),
    }
}

/// The sample summary as text: rates, stop times, a line per thread, then
/// samples by endpoint and by span name. With `spans`, each thread's line
/// is followed by every (trace, span) it was read in: a line per span,
/// which on a busy service is most of the output.
pub fn sample(s: &Summary, spans: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "pid {}: {} in {:.2} s = {:.1} Hz achieved (requested {} Hz), {}, {} missed, via {}",
        s.pid,
        count(s.rounds, "round", "rounds"),
        s.elapsed_s,
        s.achieved_hz,
        s.requested_hz,
        count(s.reads, "thread read", "thread reads"),
        count(s.missed_ticks, "tick", "ticks"),
        s.resolution_path
    );
    if let Some(path) = s.nodejs_resolution_path {
        let _ = writeln!(o, "otel_thread_ctx_nodejs_v1 (nodejs_v1_dev) via {path}");
    }
    let st = &s.stop_time;
    let _ = writeln!(
        o,
        "stop time per read: held median {}, p90 {}, max {}; interrupt-to-stop median {}, p90 {}",
        micros(st.held_median_ns),
        micros(st.held_p90_ns),
        micros(st.held_max_ns),
        micros(st.to_stop_median_ns),
        micros(st.to_stop_p90_ns)
    );
    if let Some(sig) = s.interrupted_by_signal {
        let _ = writeln!(o, "stopped early by signal {sig}");
    }
    if s.late_stops > 0 {
        let _ = writeln!(
            o,
            "{} skipped: the thread did not stop within the stop timeout",
            count(s.late_stops, "read", "reads")
        );
    }
    if s.target_exited {
        let _ = writeln!(o, "the target exited");
    }
    for e in &s.execs {
        let _ = writeln!(o, "{}", exec_line(e));
    }
    let _ = writeln!(o);
    if spans {
        span_rows(&mut o, s);
    } else {
        thread_rows(&mut o, s);
    }
    for (title, groups) in [("ENDPOINT", &s.endpoints), ("SPAN_NAME", &s.span_names)] {
        if groups.is_empty() {
            continue;
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "{:<40} {:>8} {:>7}", title, "SAMPLES", "SHARE%");
        for g in groups {
            let name = g.name.as_deref().map_or("[none published]".into(), escape);
            let _ = writeln!(o, "{:<40} {:>8} {:>7.1}", name, g.samples, g.share * 100.0);
        }
    }
    if !spans && s.threads.iter().any(|t| !t.spans.is_empty()) {
        let _ = writeln!(o);
        let _ = writeln!(o, "--spans lists every trace and span of each thread");
    }
    o
}

/// A line per thread: how often it was read in a span, in how many spans.
fn thread_rows(o: &mut String, s: &Summary) {
    let _ = writeln!(
        o,
        "{:<8} {:<16} {:>8} {:>7} {:>6} {:>8} {:>6}",
        "TID", "NAME", "SAMPLES", "IDLE%", "ERRORS", "IN_SPAN%", "SPANS",
    );
    for t in &s.threads {
        let in_span: u64 = t.spans.iter().map(|x| x.samples).sum();
        let _ = writeln!(
            o,
            "{:<8} {:<16} {:>8} {:>7.1} {:>6} {:>8.1} {:>6}",
            t.tid,
            escape(&t.name),
            t.samples,
            t.idle_share * 100.0,
            t.errors,
            in_span as f64 * 100.0 / t.samples.max(1) as f64,
            t.spans.len(),
        );
        no_span_row(o, t);
    }
}

/// A line per thread and span (`--spans`): the thread's most sampled span
/// on its own line, the others below it.
fn span_rows(o: &mut String, s: &Summary) {
    let _ = writeln!(
        o,
        "{:<8} {:<16} {:>8} {:>7} {:>6}  {:<32} {:<16} {:>7}  {:<24} ENDPOINT",
        "TID", "NAME", "SAMPLES", "IDLE%", "ERRORS", "TRACE_ID", "SPAN_ID", "SHARE%", "SPAN_NAME",
    );
    let label = |v: &Option<String>| v.as_deref().map_or("-".into(), escape).into_owned();
    for t in &s.threads {
        let first = t.spans.first();
        let _ = writeln!(
            o,
            "{:<8} {:<16} {:>8} {:>7.1} {:>6}  {:<32} {:<16} {:>7}  {:<24} {}",
            t.tid,
            escape(&t.name),
            t.samples,
            t.idle_share * 100.0,
            t.errors,
            first.map_or("-", |x| x.trace_id.as_str()),
            first.map_or("-", |x| x.span_id.as_str()),
            first.map_or("-".into(), |x| format!("{:.1}", x.share * 100.0)),
            first.map_or("-".into(), |x| label(&x.span_name)),
            first.map_or("-".into(), |x| label(&x.endpoint)),
        );
        for sp in t.spans.iter().skip(1) {
            let _ = writeln!(
                o,
                "{:<8} {:<16} {:>8} {:>7} {:>6}  {:<32} {:<16} {:>7.1}  {:<24} {}",
                "",
                "",
                "",
                "",
                "",
                sp.trace_id,
                sp.span_id,
                sp.share * 100.0,
                label(&sp.span_name),
                label(&sp.endpoint),
            );
        }
        no_span_row(o, t);
    }
}

/// Why a thread's reads found no span, when some did not.
fn no_span_row(o: &mut String, t: &otel_thread_ctx_reader::sampler::ThreadSummary) {
    if t.no_span.is_empty() {
        return;
    }
    let reasons: Vec<String> = t
        .no_span
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    let _ = writeln!(
        o,
        "{:<8} {:<16} no span ({}): {}",
        "",
        "",
        t.schema.map_or("-", |s| s.name()),
        reasons.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_reader::sampler::{GroupShare, SpanShare, StopStats, ThreadSummary};

    /// A summary of two threads, the first read in 300 spans.
    fn summary() -> Summary {
        let span = |i: u64| SpanShare {
            trace_id: format!("{i:032x}"),
            span_id: format!("{i:016x}"),
            span_name: Some("GET /users/:id".into()),
            endpoint: Some("GET /users/:id".into()),
            local_root_span_id: None,
            samples: 1,
            share: 1.0 / 400.0,
        };
        let thread = |tid: i32, spans: Vec<SpanShare>| ThreadSummary {
            tid,
            name: format!("t{tid}"),
            schema: None,
            samples: 400,
            no_span: Default::default(),
            idle: 100,
            idle_share: 0.25,
            zero_ids: 0,
            errors: 0,
            late_stops: 0,
            spans,
        };
        Summary {
            schema: "tlsdesc_v1_dev",
            pid: 7,
            resolution_path: "static-tls",
            nodejs_resolution_path: None,
            requested_hz: 99.0,
            requested_duration_s: 30.0,
            elapsed_s: 30.0,
            rounds: 400,
            achieved_hz: 13.3,
            missed_ticks: 0,
            reads: 800,
            late_stops: 0,
            stop_time: StopStats::default(),
            interrupted_by_signal: None,
            target_exited: false,
            execs: Vec::new(),
            threads: vec![
                thread(1, (1..=300).map(span).collect()),
                thread(2, Vec::new()),
            ],
            endpoints: vec![GroupShare {
                name: Some("GET /users/:id".into()),
                samples: 300,
                share: 1.0,
            }],
            span_names: vec![GroupShare {
                name: Some("GET /users/:id".into()),
                samples: 300,
                share: 1.0,
            }],
        }
    }

    #[test]
    fn sample_text_is_a_summary_by_default() {
        let text = sample(&summary(), false);
        assert!(text.lines().count() < 20, "{text}");
        assert!(
            text.contains("\nTID      NAME              SAMPLES   IDLE% ERRORS IN_SPAN%  SPANS\n"),
            "{text}"
        );
        assert!(
            text.contains("\n1        t1                    400    25.0      0     75.0    300\n"),
            "{text}"
        );
        assert!(
            text.contains("\n2        t2                    400    25.0      0      0.0      0\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\nENDPOINT                                  SAMPLES  SHARE%\nGET /users/:id"
            ),
            "{text}"
        );
        assert!(text.contains("\nSPAN_NAME "), "{text}");
        assert!(!text.contains(&format!("{:032x}", 1)), "{text}");
        assert!(
            text.ends_with("--spans lists every trace and span of each thread\n"),
            "{text}"
        );
    }

    #[test]
    fn sample_text_lists_every_span_with_the_flag() {
        let text = sample(&summary(), true);
        assert!(text.contains("TRACE_ID"), "{text}");
        for i in [1u64, 150, 300] {
            assert!(text.contains(&format!("{i:032x} {i:016x}")), "{text}");
        }
        assert!(text.contains("\nENDPOINT "), "{text}");
        assert!(!text.contains("--spans"), "{text}");
    }
}
