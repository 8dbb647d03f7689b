//! The local roots of this process's traces, shared between its JS threads.
//!
//! A span whose parent lives in another thread of the same process (a
//! worker doing a request's work, given the trace context by message) has a
//! remote parent, so on its own thread it would be its own local root and
//! publish neither the request's local root id nor its endpoint. Each thread
//! that publishes a local root also puts it here, keyed by trace id; a thread
//! that meets a remote parent asks here first, and the span joins the
//! request's local root: its id and its endpoint attributes as they were
//! when asked.
//!
//! Bounded: at most [`CAPACITY`] traces; past that, the oldest entry gives
//! way (a root that never ends cannot fill the table for good). An entry goes
//! when its root ends, or when the thread that put it there is torn down.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// Most traces held at once.
pub const CAPACITY: usize = 4096;

/// A trace's local root, as a thread of this process published it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRoot {
    /// The local root span's id, 16 lowercase hex digits.
    pub root_span_id: String,
    /// Its endpoint attributes (`http.route`, ...), as key and value texts.
    pub values: Vec<(String, String)>,
}

struct Entry {
    root: TraceRoot,
    /// Registry slot of the thread that published it.
    owner: usize,
    /// Insertion order, for eviction.
    sequence: u64,
}

#[derive(Default)]
struct Table {
    by_trace: HashMap<String, Entry>,
    /// Trace ids by insertion sequence, oldest first.
    order: BTreeMap<u64, String>,
    next_sequence: u64,
    /// Entries that gave way to newer ones while the table was full.
    evicted: u64,
}

impl Table {
    fn remove(&mut self, trace_id: &str) {
        if let Some(entry) = self.by_trace.remove(trace_id) {
            self.order.remove(&entry.sequence);
        }
    }

    fn publish(&mut self, trace_id: String, root: TraceRoot, owner: usize) {
        self.remove(&trace_id);
        while self.by_trace.len() >= CAPACITY {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.by_trace.remove(&oldest);
            self.evicted += 1;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.order.insert(sequence, trace_id.clone());
        self.by_trace.insert(
            trace_id,
            Entry {
                root,
                owner,
                sequence,
            },
        );
    }
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<Table>> {
    // A panic while holding the lock leaves a consistent table (every
    // update is a few map operations that cannot panic midway).
    TABLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Puts (or replaces) `trace_id`'s local root, published by the thread of
/// registry slot `owner`.
pub fn publish(trace_id: String, root: TraceRoot, owner: usize) {
    table()
        .get_or_insert_with(Table::default)
        .publish(trace_id, root, owner);
}

/// Takes `trace_id`'s entry away if it is still the root `root_span_id`
/// (another root of the same trace may have replaced it since).
pub fn withdraw(trace_id: &str, root_span_id: &str) {
    let mut guard = table();
    let Some(table) = guard.as_mut() else { return };
    if table
        .by_trace
        .get(trace_id)
        .is_some_and(|e| e.root.root_span_id == root_span_id)
    {
        table.remove(trace_id);
    }
}

/// `trace_id`'s local root, if a thread of this process published one.
pub fn find(trace_id: &str) -> Option<TraceRoot> {
    table()
        .as_ref()?
        .by_trace
        .get(trace_id)
        .map(|e| e.root.clone())
}

/// Drops every entry the thread of registry slot `owner` published: its
/// spans cannot end any more.
pub fn forget_thread(owner: usize) {
    let mut guard = table();
    let Some(table) = guard.as_mut() else { return };
    let gone: Vec<String> = table
        .by_trace
        .iter()
        .filter(|(_, e)| e.owner == owner)
        .map(|(k, _)| k.clone())
        .collect();
    for trace_id in gone {
        table.remove(&trace_id);
    }
}

/// `(entries, evicted)` now, for diagnostics and tests.
pub fn stats() -> (usize, u64) {
    table()
        .as_ref()
        .map_or((0, 0), |t| (t.by_trace.len(), t.evicted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(id: &str, route: &str) -> TraceRoot {
        TraceRoot {
            root_span_id: id.to_owned(),
            values: vec![("http.route".to_owned(), route.to_owned())],
        }
    }

    #[test]
    fn a_table_finds_withdraws_only_its_root_and_evicts_the_oldest_when_full() {
        let mut t = Table::default();
        t.publish("a".into(), root("1111111111111111", "/a"), 0);
        t.publish("a".into(), root("2222222222222222", "/b"), 0);
        assert_eq!(t.by_trace.len(), 1);
        assert_eq!(t.order.len(), 1, "a replaced entry leaves no stale order");
        assert_eq!(t.by_trace["a"].root, root("2222222222222222", "/b"));
        for i in 0..CAPACITY + 3 {
            t.publish(format!("t{i}"), root("3333333333333333", "/c"), 1);
        }
        assert_eq!(t.by_trace.len(), CAPACITY);
        assert_eq!(t.order.len(), CAPACITY);
        assert_eq!(
            t.evicted, 4,
            "the first entry and the three oldest gave way"
        );
        assert!(!t.by_trace.contains_key("a") && !t.by_trace.contains_key("t2"));
        assert!(t.by_trace.contains_key("t3"));
    }

    #[test]
    fn the_shared_table_withdraws_by_root_and_forgets_a_thread() {
        publish(
            "feed0000000000000000000000000001".into(),
            root("1111111111111111", "/x"),
            900,
        );
        publish(
            "feed0000000000000000000000000002".into(),
            root("2222222222222222", "/y"),
            901,
        );
        withdraw("feed0000000000000000000000000001", "9999999999999999");
        assert_eq!(
            find("feed0000000000000000000000000001"),
            Some(root("1111111111111111", "/x")),
            "another root's end leaves it"
        );
        withdraw("feed0000000000000000000000000001", "1111111111111111");
        assert_eq!(find("feed0000000000000000000000000001"), None);
        forget_thread(901);
        assert_eq!(find("feed0000000000000000000000000002"), None);
    }
}
