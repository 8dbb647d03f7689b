//! V8's perf map (`/tmp/perf-<pid>.map`, written with `--perf-basic-prof`):
//! lines `START SIZE name`, in hexadecimal, appended as code is created.
//!
//! V8 reuses code space, so one address can fall into several entries; the
//! newest (last in the file) describes the code that lives there now.

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
            let name = parts.next()?.trim().to_string();
            (size > 0).then_some(Entry { start, size, name })
        })
        .collect()
}

/// Names each address in `addrs` by the newest entry covering it. Addresses
/// no entry covers are left out.
pub fn resolve<'e>(entries: &'e [Entry], addrs: &[u64]) -> HashMap<u64, &'e str> {
    let mut sorted: Vec<u64> = addrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = HashMap::new();
    // In file order: a later entry overwrites what an earlier one said.
    for e in entries {
        let end = e.start.saturating_add(e.size);
        let first = sorted.partition_point(|&a| a < e.start);
        for &a in sorted[first..].iter().take_while(|&&a| a < end) {
            out.insert(a, e.name.as_str());
        }
    }
    out
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
                name: "JS:~startup /app/boot.js:1:1".into()
            }
        );
        assert_eq!(e[3].name, "JS:^lazy /app/x.js:2:2");
    }

    #[test]
    fn the_newest_covering_entry_wins() {
        let e = parse(MAP);
        let r = resolve(&e, &[0x1004, 0x1085, 0x10f0, 0x2010, 0x2040, 0x10]);
        // 0x1004: covered by startup (oldest) and lazy (newest).
        assert_eq!(r[&0x1004], "JS:^lazy /app/x.js:2:2");
        // 0x1085: startup, then handler reused that space.
        assert_eq!(r[&0x1085], "JS:*handler /app/server.js:10:3");
        assert_eq!(r[&0x10f0], "JS:~startup /app/boot.js:1:1");
        assert_eq!(r[&0x2010], "Builtin:ArgumentsAdaptorTrampoline");
        // One past the end, and below every entry: unnamed.
        assert!(!r.contains_key(&0x2040));
        assert!(!r.contains_key(&0x10));
    }
}
