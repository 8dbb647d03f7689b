//! Human-readable renderings of the inspect report and the sample summary.
//! (`--json` prints the serde form of the same structures instead.)

use std::fmt::Write;

use serde_json::Value;

use crate::inspect::{ProcessContextInfo, Report};
use crate::sample::Summary;

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
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
    match &r.symbol {
        None => {
            let _ = writeln!(
                o,
                "symbol:     otel_thread_ctx_v1 not found in any mapped module"
            );
        }
        Some(s) => {
            let _ = writeln!(
                o,
                "symbol:     otel_thread_ctx_v1 in {}{} (st_value {:#x}, size {}, load bias {})",
                s.module,
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
                    let _ = writeln!(o, "resolved:   {}: {}", res.path, res.evidence);
                }
                (None, Some(e)) => {
                    let _ = writeln!(o, "resolved:   FAILED: {e}");
                }
                _ => {}
            }
        }
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
                "process context: {mapping} at {address}: INVALID: {error}"
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
                "process context: {mapping} at {address}, version {version}, published_at_ns {published_at_ns}, payload {payload_size} B"
            );
            let res: Vec<String> = resource
                .iter()
                .map(|(k, v)| format!("{k}={}", value_text(v)))
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
                schema_version.as_deref().unwrap_or("(missing)")
            );
            let _ = writeln!(
                o,
                "  threadlocal.attribute_key_map: {}",
                attribute_key_map
                    .as_ref()
                    .map_or("(missing)".to_string(), |m| format!("[{}]", m.join(", ")))
            );
        }
    }
    if !r.threads.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<8} {:<16} {:<9} {:<32} {:<16} {:<5} {:<18} DETAIL",
            "TID", "NAME", "STATUS", "TRACE_ID", "SPAN_ID", "FLAGS", "VARIABLE"
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
                            a.key.clone().unwrap_or_else(|| format!("#{}", a.key_index)),
                            a.value
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => t.reason.clone().unwrap_or_default(),
            };
            let _ = writeln!(
                o,
                "{:<8} {:<16} {:<9} {:<32} {:<16} {:<5} {:<18} {}",
                t.tid,
                t.name,
                t.status,
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
        let _ = writeln!(o, "problem: {p}");
    }
    for w in &r.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    o
}

fn micros(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}

/// The sample summary as text: rates, stop times, per-thread span shares.
pub fn sample(s: &Summary) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "pid {}: {} rounds in {:.2} s = {:.1} Hz achieved (requested {} Hz), {} thread reads, {} ticks missed, via {}",
        s.pid, s.rounds, s.elapsed_s, s.achieved_hz, s.requested_hz, s.reads, s.missed_ticks, s.resolution_path
    );
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
            "{} reads skipped: the thread did not stop within the stop timeout",
            s.late_stops
        );
    }
    if s.target_exited {
        let _ = writeln!(o, "the target exited");
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<8} {:<16} {:>8} {:>7} {:>6}  {:<32} {:<16} {:>7}",
        "TID", "NAME", "SAMPLES", "IDLE%", "ERRORS", "TRACE_ID", "SPAN_ID", "SHARE%"
    );
    for t in &s.threads {
        let first = t.spans.first();
        let _ = writeln!(
            o,
            "{:<8} {:<16} {:>8} {:>7.1} {:>6}  {:<32} {:<16} {:>7}",
            t.tid,
            t.name,
            t.samples,
            t.idle_share * 100.0,
            t.errors,
            first.map_or("-", |x| x.trace_id.as_str()),
            first.map_or("-", |x| x.span_id.as_str()),
            first.map_or("-".into(), |x| format!("{:.1}", x.share * 100.0))
        );
        for sp in t.spans.iter().skip(1) {
            let _ = writeln!(
                o,
                "{:<8} {:<16} {:>8} {:>7} {:>6}  {:<32} {:<16} {:>7.1}",
                "",
                "",
                "",
                "",
                "",
                sp.trace_id,
                sp.span_id,
                sp.share * 100.0
            );
        }
    }
    o
}
