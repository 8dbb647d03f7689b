//! `--format top`: the first view of a profile, as text tables. CPU (and,
//! with off-CPU profiling, off-CPU time) by endpoint, by span name, and by
//! function (self and total on-CPU time), the largest first; with
//! `--group-by`, the functions of each endpoint, span name or thread.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::flame::{endpoint_label, span_name_label, GroupBy};
use otel_thread_ctx_profiler::kernel::Kind;
use otel_thread_ctx_profiler::model::{Entry, Profile};

/// Rows per table.
pub const ROWS: usize = 15;

/// CPU and off-CPU nanoseconds of one row.
#[derive(Clone, Copy, Default)]
struct Time {
    cpu_ns: u64,
    off_cpu_ns: u64,
}

fn add(rows: &mut HashMap<String, Time>, key: String, e: &Entry) {
    let t = rows.entry(key).or_default();
    match e.kind {
        Kind::OnCpu => t.cpu_ns += e.total_ns(),
        Kind::OffCpu => t.off_cpu_ns += e.total_ns(),
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Shortens `s` to `width` characters (an ellipsis marks the cut).
fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn table(o: &mut String, title: &str, rows: HashMap<String, Time>, p: &Profile) {
    let cpu_total: u64 = rows.values().map(|t| t.cpu_ns).sum();
    let mut rows: Vec<(String, Time)> = rows.into_iter().collect();
    rows.sort_by(|a, b| {
        (b.1.cpu_ns + b.1.off_cpu_ns)
            .cmp(&(a.1.cpu_ns + a.1.off_cpu_ns))
            .then(a.0.cmp(&b.0))
    });
    let _ = write!(o, "{:<48} {:>10} {:>6}", title, "CPU ms", "CPU%");
    if p.off_cpu {
        let _ = write!(o, " {:>12}", "off-CPU ms");
    }
    o.push('\n');
    for (name, t) in rows.iter().take(ROWS) {
        let _ = write!(
            o,
            "{:<48} {:>10.1} {:>6.1}",
            fit(name, 48),
            ms(t.cpu_ns),
            percent(t.cpu_ns, cpu_total)
        );
        if p.off_cpu {
            let _ = write!(o, " {:>12.1}", ms(t.off_cpu_ns));
        }
        o.push('\n');
    }
    if rows.len() > ROWS {
        let _ = writeln!(o, "({} more)", rows.len() - ROWS);
    }
    o.push('\n');
}

/// The tables, as printed.
pub fn tables(p: &Profile) -> String {
    let mut o = String::new();
    let mut by_endpoint = HashMap::new();
    let mut by_span = HashMap::new();
    for e in &p.entries {
        add(&mut by_endpoint, endpoint_label(e), e);
        add(&mut by_span, span_name_label(e), e);
    }
    table(&mut o, "ENDPOINT", by_endpoint, p);
    table(&mut o, "SPAN NAME", by_span, p);

    functions(&mut o, "FUNCTION (on CPU)", p.entries.iter());
    o
}

/// The tables, then with a grouping, the functions of each group (the
/// most CPU first, at most [`ROWS`] groups): what runs under each endpoint,
/// span name or thread. `GroupBy::None` adds nothing.
pub fn tables_grouped(p: &Profile, group_by: GroupBy) -> String {
    let mut o = tables(p);
    let label = |e: &Entry| match group_by {
        GroupBy::Endpoint => Some(endpoint_label(e)),
        GroupBy::Span => Some(span_name_label(e)),
        GroupBy::Thread => Some(format!("{} ({})", e.thread_name, e.tid)),
        GroupBy::None => None,
    };
    let (what, name) = match group_by {
        GroupBy::Endpoint => ("endpoints", "ENDPOINT"),
        GroupBy::Span => ("span names", "SPAN NAME"),
        GroupBy::Thread => ("threads", "THREAD"),
        GroupBy::None => return o,
    };
    let mut groups: HashMap<String, (u64, Vec<&Entry>)> = HashMap::new();
    for e in p.entries.iter().filter(|e| e.kind == Kind::OnCpu) {
        if let Some(l) = label(e) {
            let g = groups.entry(l).or_default();
            g.0 += e.total_ns();
            g.1.push(e);
        }
    }
    let mut groups: Vec<(String, (u64, Vec<&Entry>))> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    for (group, (_, entries)) in groups.iter().take(ROWS) {
        o.push('\n');
        let _ = writeln!(o, "{name} {group}");
        functions(&mut o, "FUNCTION (on CPU)", entries.iter().copied());
    }
    if groups.len() > ROWS {
        let _ = writeln!(o, "\n({} more {what})", groups.len() - ROWS);
    }
    o
}

/// A function table of the on-CPU `entries`: self time (the innermost user
/// frame: what the application ran, not the kernel entry it was in) and
/// total time (every sample whose stack holds the function, once per
/// sample), as shares of their CPU time.
fn functions<'a>(o: &mut String, title: &str, entries: impl Iterator<Item = &'a Entry>) {
    let entries: Vec<&Entry> = entries.filter(|e| e.kind == Kind::OnCpu).collect();
    let cpu_total: u64 = entries.iter().map(|e| e.total_ns()).sum();
    let mut self_ns: HashMap<String, u64> = HashMap::new();
    let mut total_ns: HashMap<String, u64> = HashMap::new();
    for e in entries {
        let user_leaf = e.frames.iter().find(|f| f.module != "[kernel]");
        if let Some(leaf) = user_leaf.or(e.frames.first()) {
            *self_ns.entry(leaf.name.clone()).or_default() += e.total_ns();
        }
        let mut seen = HashSet::new();
        for f in &e.frames {
            let name = f.name.clone();
            if seen.insert(name.clone()) {
                *total_ns.entry(name).or_default() += e.total_ns();
            }
        }
    }
    let mut functions: Vec<(String, u64)> = self_ns.into_iter().collect();
    functions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let _ = writeln!(
        o,
        "{:<48} {:>10} {:>6} {:>10} {:>6}",
        title, "self ms", "self%", "total ms", "total%"
    );
    for (name, ns) in functions.iter().take(ROWS) {
        let total = total_ns.get(name.as_str()).copied().unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<48} {:>10.1} {:>6.1} {:>10.1} {:>6.1}",
            fit(name, 48),
            ms(*ns),
            percent(*ns, cpu_total),
            ms(total),
            percent(total, cpu_total)
        );
    }
    if functions.len() > ROWS {
        let _ = writeln!(o, "({} more)", functions.len() - ROWS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_by_endpoint_span_name_and_function() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let text = tables(&p);
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} row in\n{text}"))
                .to_string()
        };
        // Two of the three on-CPU samples (10 ms each) served /a.
        let a = line("/a ");
        assert!(a.contains(" 20.0 ") && a.contains(" 66.7 "), "{a}");
        assert!(a.ends_with(" 0.0"), "off-CPU column: {a}");
        assert!(line("sort ").contains(" 20.0 "));
        assert!(line("[no span] ").contains(" 10.0 "));
        // `leaf` is the innermost user frame of every on-CPU stack (under
        // the kernel's `schedule`), `main` the outermost.
        let leaf = line("leaf ");
        assert!(leaf.contains(" 30.0  100.0 "), "{leaf}");
        assert!(!text.contains("\nmain "), "main is never self: {text}");
        assert!(
            text.contains("ENDPOINT")
                && text.contains("SPAN NAME")
                && text.contains("FUNCTION (on CPU)")
        );
    }

    #[test]
    fn functions_per_endpoint_with_a_grouping() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        assert_eq!(tables_grouped(&p, GroupBy::None), tables(&p));
        let text = tables_grouped(&p, GroupBy::Endpoint);
        assert!(text.starts_with(&tables(&p)));
        let rest = &text[tables(&p).len()..];
        // /a (20 ms) before the samples outside any span (10 ms).
        let a = rest.find("\nENDPOINT /a\nFUNCTION (on CPU)").expect(rest);
        let none = rest.find("\nENDPOINT [no span]\n").expect(rest);
        assert!(a < none, "{rest}");
        // Every on-CPU sample of /a has `leaf` innermost: all of its CPU.
        assert!(
            rest[a..none].contains("\nleaf ") && rest[a..none].contains(" 20.0  100.0 "),
            "{rest}"
        );
        assert!(tables_grouped(&p, GroupBy::Thread).contains("\nTHREAD main (1)\n"));
    }
}
