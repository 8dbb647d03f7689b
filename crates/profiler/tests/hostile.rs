//! The profiler's parsers of what a target writes: its perf map (a file
//! any process may write under its pid) and what the BPF program copies
//! out of its memory into the ring buffer. Each returns a bounded result or
//! nothing, never panics, and costs what the input's size says.
//!
//! `PROPTEST_CASES` sets the number of cases per property.

use std::collections::HashMap;

use proptest::collection::vec;
use proptest::prelude::*;

use otel_thread_ctx_profiler::kernel;
use otel_thread_ctx_profiler::perf_map;

/// One generated perf map entry.
#[derive(Clone, Debug)]
struct Entry {
    start: u64,
    size: u64,
    name: String,
}

/// What the perf map says of `addrs`, entry by entry in file order: the
/// definition `resolve` must match.
fn resolve_in_file_order(entries: &[Entry], addrs: &[u64]) -> HashMap<u64, String> {
    let mut out = HashMap::new();
    for e in entries
        .iter()
        .filter(|e| e.size > 0 && e.size <= perf_map::MAX_ENTRY_BYTES)
    {
        for &a in addrs {
            if a >= e.start && a < e.start.saturating_add(e.size) {
                out.insert(a, e.name.clone());
            }
        }
    }
    out
}

fn text_of(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| format!("{:x} {:x} {}\n", e.start, e.size, e.name))
        .collect()
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        prop_oneof![0u64..0x400, any::<u64>()],
        prop_oneof![0u64..0x80, any::<u64>()],
        "[a-z]{1,4}",
    )
        .prop_map(|(start, size, name)| Entry { start, size, name })
}

proptest! {
    /// Perf map text of any shape: entries with a size, names without
    /// V8's tier marks only where V8 put them.
    #[test]
    fn perf_maps_of_any_text_parse(lines in vec(prop_oneof![
        ".{0,80}",
        "(0x)?[0-9a-f]{1,17} (0x)?[0-9a-f]{1,17} (JS|Eval|LazyCompile):[o~^+*']{0,3}.{0,30}",
    ], 0..30)) {
        let text = lines.join("\n");
        let starts: Vec<u64> = text.lines().filter_map(perf_map::parse_line).map(|e| e.start).collect();
        for e in text.lines().filter_map(perf_map::parse_line) {
            prop_assert!(e.size > 0);
        }
        let resolved = perf_map::resolve(text.as_bytes(), &starts).unwrap();
        prop_assert!(resolved.names.len() <= starts.len());
    }

    /// Overlapping entries (V8 reuses code memory): the newest covering
    /// entry names an address, as reading the file in order says.
    #[test]
    fn the_newest_entry_names_each_address(
        entries in vec(entry(), 0..40),
        addrs in vec(prop_oneof![0u64..0x500, any::<u64>()], 0..60),
    ) {
        let resolved = perf_map::resolve(text_of(&entries).as_bytes(), &addrs).unwrap();
        prop_assert!(!resolved.truncated);
        prop_assert_eq!(resolved.names, resolve_in_file_order(&entries, &addrs));
    }

    /// The same entries appended in pieces cut anywhere (mid-line too),
    /// followed as they arrive: after the last piece, a follower names
    /// every address as reading the file in order says.
    #[test]
    fn a_followed_map_names_each_address_as_the_file_says(
        entries in vec(entry(), 0..40),
        cuts in vec(any::<prop::sample::Index>(), 0..6),
        addrs in vec(prop_oneof![0u64..0x500, any::<u64>()], 0..60),
    ) {
        use std::io::Write;
        let text = text_of(&entries);
        let path = std::env::temp_dir().join(format!("hostile-followed-{}.map", std::process::id()));
        std::fs::write(&path, "").unwrap();
        let mut follower = perf_map::Follower::at(path.clone());
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
        points.push(text.len());
        points.sort_unstable();
        let mut written = 0;
        for point in points {
            let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(&text.as_bytes()[written..point]).unwrap();
            written = point;
            follower.resolve(&addrs).unwrap();
        }
        let resolved = follower.resolve(&addrs).unwrap();
        std::fs::remove_file(&path).unwrap();
        prop_assert_eq!(resolved.names, resolve_in_file_order(&entries, &addrs));
    }

    /// Ring-buffer records of any bytes (they carry the target's record,
    /// attributes and stack words): a sample, a stack copy, an item read,
    /// or nothing.
    #[test]
    fn ring_buffer_records_of_any_bytes_decode_or_are_dropped(
        b in prop_oneof![
            vec(any::<u8>(), 0..64),
            vec(any::<u8>(), kernel::SAMPLE_SIZE - 8..kernel::SAMPLE_SIZE + 8),
            vec(any::<u8>(), 0..kernel::SAMPLE_SIZE * 2),
        ],
        kind in prop_oneof![0u32..8, any::<u32>()],
    ) {
        // As drawn, and with the first word naming each kind of record.
        let mut kinded = b.clone();
        if kinded.len() >= 4 {
            kinded[..4].copy_from_slice(&kind.to_ne_bytes());
        }
        for bytes in [&b, &kinded] {
            if let Some(kernel::Item::Sample(s, _)) = kernel::decode_item(bytes) {
                prop_assert!(s.user_stack.len() <= bytes.len() / 8);
                prop_assert!(s.kernel_stack.len() <= bytes.len() / 8);
            }
        }
    }
}

/// A map whose entries each cover every sampled address: resolution stops
/// after a bounded number of matches and says so (the file is the
/// target's).
#[test]
fn a_perf_map_of_overlapping_entries_stops_at_the_match_bound() {
    let line = "0 100000 f\n";
    let lines = (perf_map::MAX_MATCHES / 100_000 + 10) as usize;
    let text = line.repeat(lines);
    let addrs: Vec<u64> = (0..100_000).collect();
    let resolved = perf_map::resolve(text.as_bytes(), &addrs).unwrap();
    assert!(resolved.truncated);
    assert!(resolved.names.values().all(|n| n == "f"));
}
