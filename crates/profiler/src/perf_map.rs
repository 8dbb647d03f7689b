//! V8's perf map (`/tmp/perf-<pid>.map`, written with `--perf-basic-prof`):
//! lines `START SIZE name`, in hexadecimal, appended as code is created.
//!
//! V8 reuses code space, so one address can fall into several entries; the
//! newest (last in the file) describes the code that lives there now.
//!
//! Names are read without V8's tier marker (see [`function_name`]), so that
//! every output names one function the same way.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;

/// The perf map path of a process.
pub fn path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// One entry: `[start, start + size)` is named `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// Parses the text of a perf map, skipping malformed lines.
pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            let name = function_name(parts.next()?.trim()).into_owned();
            (size > 0).then_some(Entry { start, size, name })
        })
        .collect()
}

/// A JavaScript function's name without the marker V8 puts before it, which
/// says how that copy of its code was compiled, not which function it is:
/// the same function shows under several markers as V8 recompiles it during
/// the run, and would otherwise split one call path into several frames.
/// The `JS:` (or `Eval:`) tag stays: it tells JavaScript from native frames.
///
/// The forms each Node.js line writes with `--perf-basic-prof`:
/// - 20 and 22: `~` (Ignition bytecode), `^` (Sparkplug), `*` (TurboFan);
/// - 24: those, `+` (Maglev), and `*'`, `+'` (code specialized to one
///   function context);
/// - 26: `~`, `^`, `*'`, `+'`, and `o*`, `o+` (on-stack replacement code,
///   entered in the middle of a running loop).
///
/// `Eval:~` names eval'd code on every line; a function V8 will not optimize
/// is written with no marker at all.
pub fn function_name(name: &str) -> Cow<'_, str> {
    const TIERS: [char; 4] = ['~', '^', '+', '*'];
    let Some((tag, rest)) = ["JS:", "Eval:"]
        .iter()
        .find_map(|tag| name.strip_prefix(tag).map(|rest| (*tag, rest)))
    else {
        return name.into();
    };
    // `o` counts only before a tier: it also starts function names.
    let osr = rest.strip_prefix('o').filter(|r| r.starts_with(TIERS));
    let rest = osr.unwrap_or(rest);
    let Some(tier) = rest.chars().next().filter(|c| TIERS.contains(c)) else {
        return name.into();
    };
    let rest = &rest[1..];
    let rest = match tier {
        '+' | '*' => rest.strip_prefix('\'').unwrap_or(rest),
        _ => rest,
    };
    format!("{tag}{rest}").into()
}

/// Names each address in `addrs` by the newest entry covering it. Addresses
/// no entry covers are left out.
pub fn resolve<'e>(entries: &'e [Entry], addrs: &[u64]) -> HashMap<u64, &'e str> {
    let mut sorted: Vec<u64> = addrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = HashMap::new();
    // A later entry overwrites what an earlier one said (V8 reuses code
    // memory), so entries are taken from the last, and each address is
    // named once: `next` skips the addresses already named, so a map of
    // many overlapping entries (the target writes it) costs entries plus
    // addresses, not their product.
    let mut next: Vec<usize> = (0..=sorted.len()).collect();
    for e in entries.iter().rev() {
        let end = e.start.saturating_add(e.size);
        let mut i = first_unnamed(&mut next, sorted.partition_point(|&a| a < e.start));
        while i < sorted.len() && sorted[i] < end {
            out.insert(sorted[i], e.name.as_str());
            next[i] = i + 1;
            i = first_unnamed(&mut next, i + 1);
        }
    }
    out
}

/// The first index at or after `i` whose address is not named yet,
/// shortening the links walked on the way.
fn first_unnamed(next: &mut [usize], i: usize) -> usize {
    let mut root = i;
    while next[root] != root {
        root = next[root];
    }
    let mut at = i;
    while next[at] != root {
        let following = next[at];
        next[at] = root;
        at = following;
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
1000 100 JS:~startup /app/boot.js:1:1
2000 40 Builtin:ArgumentsAdaptorTrampoline
garbage line
1080 20 JS:*handler /app/server.js:10:3
3000 0 empty
1000 10 JS:^lazy /app/x.js:2:2
";

    #[test]
    fn parses_entries_and_skips_garbage() {
        let e = parse(MAP);
        assert_eq!(e.len(), 4);
        assert_eq!(
            e[0],
            Entry {
                start: 0x1000,
                size: 0x100,
                name: "JS:startup /app/boot.js:1:1".into()
            }
        );
        assert_eq!(e[3].name, "JS:lazy /app/x.js:2:2");
    }

    /// Every marker form a Node.js line wrote for one function names it the
    /// same way.
    fn one_name(forms: &[&str]) {
        for form in forms {
            assert_eq!(
                function_name(&format!("{form}burnCpuHot /app/hot.js:1:20")),
                format!(
                    "{}burnCpuHot /app/hot.js:1:20",
                    &form[..form.find(':').unwrap() + 1]
                ),
                "{form}"
            );
        }
    }

    #[test]
    fn node_20_and_22_tiers() {
        one_name(&["JS:~", "JS:^", "JS:*", "Eval:~"]);
    }

    #[test]
    fn node_24_tiers_and_context_specialized_code() {
        one_name(&["JS:~", "JS:^", "JS:+", "JS:*", "JS:+'", "JS:*'", "Eval:~"]);
    }

    #[test]
    fn node_26_on_stack_replacement_code() {
        one_name(&["JS:~", "JS:^", "JS:+'", "JS:*'", "JS:o+", "JS:o*", "Eval:~"]);
    }

    #[test]
    fn only_the_marker_is_removed() {
        for name in [
            "JS:~once node:events:657:44",
            "JS:once node:events:657:44",
            "JS:o /a.js:1:1",
            "JS:~ node:internal/main/run_main_module:1:1",
            "Builtin:ArgumentsAdaptorTrampoline",
            "BytecodeHandler:Star0",
            "uv_run",
        ] {
            let want = name.replacen(":~", ":", 1);
            assert_eq!(function_name(name), want.as_str(), "{name}");
        }
        // A quote is a marker only after the optimizing tiers.
        assert_eq!(function_name("JS:~'q /a.js:1:1"), "JS:'q /a.js:1:1");
    }

    #[test]
    fn a_real_map_names_each_function_once() {
        // One function's entries, in the forms Node.js 24 and 26 write.
        let text = "\
7f1b0c004040 11c JS:~burnCpuHot /app/hot.js:1:20
7f1b0c00c280 148 JS:^burnCpuHot /app/hot.js:1:20
7f1b0c044e00 4cc JS:+burnCpuHot /app/hot.js:1:20
7f1b0c045400 2a8 JS:+'burnCpuHot /app/hot.js:1:20
7f1b0c046000 2a8 JS:*burnCpuHot /app/hot.js:1:20
7f1b0c047000 2a8 JS:*'burnCpuHot /app/hot.js:1:20
7faf4a840040 4cc JS:o+burnCpuHot /app/hot.js:1:20
7faf4a803ac0 2a8 JS:o*burnCpuHot /app/hot.js:1:20
";
        let names: std::collections::HashSet<String> =
            parse(text).into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["JS:burnCpuHot /app/hot.js:1:20".to_string()].into());
    }

    #[test]
    fn the_newest_covering_entry_wins() {
        let e = parse(MAP);
        let r = resolve(&e, &[0x1004, 0x1085, 0x10f0, 0x2010, 0x2040, 0x10]);
        // 0x1004: covered by startup (oldest) and lazy (newest).
        assert_eq!(r[&0x1004], "JS:lazy /app/x.js:2:2");
        // 0x1085: startup, then handler reused that space.
        assert_eq!(r[&0x1085], "JS:handler /app/server.js:10:3");
        assert_eq!(r[&0x10f0], "JS:startup /app/boot.js:1:1");
        assert_eq!(r[&0x2010], "Builtin:ArgumentsAdaptorTrampoline");
        // One past the end, and below every entry: unnamed.
        assert!(!r.contains_key(&0x2040));
        assert!(!r.contains_key(&0x10));
    }
}
