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
use std::io::{self, BufRead};
use std::path::PathBuf;
use std::rc::Rc;

/// The perf map path of a process.
pub fn path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// One line's entry: `[start, start + size)` holds code named `name` (as
/// written, with V8's marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    pub start: u64,
    pub size: u64,
    pub name: &'a str,
}

/// Parses one line of a perf map; `None` for a malformed line or an entry
/// of no size.
pub fn parse_line(line: &str) -> Option<Line<'_>> {
    let mut parts = line.splitn(3, ' ');
    let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let name = parts.next()?.trim();
    (size > 0).then_some(Line { start, size, name })
}

/// Larger than any code object V8 makes: an entry this large is not V8's,
/// and would name every sampled address at once.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// How many (entry, address) matches one resolution follows at most: a
/// map written to make every entry cover every sampled address stops
/// there instead of costing their product.
pub const MAX_MATCHES: u64 = 5_000_000;

/// What a perf map says of some addresses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Each address some entry covers, named by the newest such entry.
    pub names: HashMap<u64, String>,
    /// The map held more matches than [`MAX_MATCHES`]: lines past them
    /// were not read.
    pub truncated: bool,
}

/// Names each address in `addrs` by the newest entry of the perf map read
/// from `map` that covers it. The map is read line by line and never held:
/// it grows for the life of the process (every code creation appends a
/// line), so memory follows the addresses asked about, not the file.
/// Lines that are not UTF-8 or not entries are skipped.
pub fn resolve(map: impl BufRead, addrs: &[u64]) -> io::Result<Resolved> {
    let mut sorted: Vec<u64> = addrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Shared names: a match costs a count, not a copy of the name.
    let mut names: HashMap<u64, Rc<str>> = HashMap::new();
    let mut truncated = false;
    let mut budget = MAX_MATCHES;
    let mut map = map;
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        if map.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        let Some(entry) = parse_line(text.trim_end_matches(['\n', '\r'])) else {
            continue;
        };
        if entry.size > MAX_ENTRY_BYTES {
            continue;
        }
        let end = entry.start.saturating_add(entry.size);
        let first = sorted.partition_point(|&a| a < entry.start);
        let mut name: Option<Rc<str>> = None;
        // A later entry overwrites what an earlier one said: V8 reuses code
        // memory.
        for &a in sorted[first..].iter().take_while(|&&a| a < end) {
            if budget == 0 {
                truncated = true;
                break;
            }
            budget -= 1;
            let name = name.get_or_insert_with(|| Rc::from(function_name(entry.name)));
            names.insert(a, name.clone());
        }
        if truncated {
            break;
        }
    }
    Ok(Resolved {
        names: names.into_iter().map(|(a, n)| (a, n.to_string())).collect(),
        truncated,
    })
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
        let e: Vec<Line> = MAP.lines().filter_map(parse_line).collect();
        assert_eq!(e.len(), 4);
        assert_eq!(
            e[0],
            Line {
                start: 0x1000,
                size: 0x100,
                name: "JS:~startup /app/boot.js:1:1"
            }
        );
        assert_eq!(e[3].name, "JS:^lazy /app/x.js:2:2");
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
        let starts: Vec<u64> = text
            .lines()
            .filter_map(parse_line)
            .map(|e| e.start)
            .collect();
        let r = resolve(text.as_bytes(), &starts).unwrap();
        let names: std::collections::HashSet<&String> = r.names.values().collect();
        assert_eq!(
            names,
            [&"JS:burnCpuHot /app/hot.js:1:20".to_string()].into()
        );
    }

    #[test]
    fn the_newest_covering_entry_wins() {
        let resolved = resolve(
            MAP.as_bytes(),
            &[0x1004, 0x1085, 0x10f0, 0x2010, 0x2040, 0x10],
        )
        .unwrap();
        assert!(!resolved.truncated);
        let r = resolved.names;
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

    #[test]
    fn lines_that_are_not_utf8_or_entries_are_skipped_and_entries_past_a_code_object_ignored() {
        let mut map = b"1000 100 JS:~a /a.js:1:1\n".to_vec();
        map.extend_from_slice(b"1000 10 JS:~\xff\xfe /b.js:1:1\n");
        map.extend_from_slice(b"0 ffffffffffff Builtin:everything\r\n");
        map.extend_from_slice(b"1000 8 JS:~c /c.js:1:1");
        let r = resolve(&map[..], &[0x1004, 0x1010, 0x9000]).unwrap().names;
        assert_eq!(r[&0x1004], "JS:c /c.js:1:1");
        assert_eq!(r[&0x1010], "JS:a /a.js:1:1");
        assert!(!r.contains_key(&0x9000));
    }
}
