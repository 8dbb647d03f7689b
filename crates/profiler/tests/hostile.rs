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
use otel_thread_ctx_profiler::perf_map::{self, Entry};

/// What the perf map says of `addrs`, entry by entry in file order: the
/// definition `resolve` must match.
fn resolve_in_file_order<'e>(entries: &'e [Entry], addrs: &[u64]) -> HashMap<u64, &'e str> {
    let mut out = HashMap::new();
    for e in entries {
        for &a in addrs {
            if a >= e.start && a < e.start.saturating_add(e.size) {
                out.insert(a, e.name.as_str());
            }
        }
    }
    out
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        prop_oneof![0u64..0x400, any::<u64>()],
        prop_oneof![1u64..0x80, any::<u64>()],
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
        for e in perf_map::parse(&lines.join("\n")) {
            prop_assert!(e.size > 0);
        }
    }

    /// Overlapping entries (V8 reuses code memory): the newest covering
    /// entry names an address, as reading the file in order says.
    #[test]
    fn the_newest_entry_names_each_address(
        entries in vec(entry(), 0..40),
        addrs in vec(prop_oneof![0u64..0x500, any::<u64>()], 0..60),
    ) {
        prop_assert_eq!(perf_map::resolve(&entries, &addrs), resolve_in_file_order(&entries, &addrs));
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

/// A map of many entries that each cover every address: named in time
/// proportional to entries plus addresses (the file is the target's).
#[test]
fn a_perf_map_of_overlapping_entries_resolves_in_linear_time() {
    let entries: Vec<Entry> = (0..200_000)
        .map(|i| Entry {
            start: 0,
            size: u64::MAX,
            name: format!("f{i}"),
        })
        .collect();
    let addrs: Vec<u64> = (0..200_000).map(|a| a * 16).collect();
    let named = perf_map::resolve(&entries, &addrs);
    assert_eq!(named.len(), addrs.len());
    assert!(named.values().all(|n| *n == "f199999"));
}
