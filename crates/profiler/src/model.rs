//! The profile a run produced: samples with the same thread, span,
//! attributes, state and stack merged, their frames named.

use std::collections::HashMap;

use crate::kernel::{Kind, Sample};
use crate::symbolize::{Frame, Names};
use opentelemetry::trace::{SpanId, TraceId};

use otel_thread_ctx_abi::attrs;
use otel_thread_ctx_reader::record;

/// The span a sample's record named, as the W3C bytes of its ids (byte
/// order is what orders the profile's output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl Span {
    pub fn trace_hex(&self) -> String {
        TraceId::from_bytes(self.trace_id).to_string()
    }
    pub fn span_hex(&self) -> String {
        SpanId::from_bytes(self.span_id).to_string()
    }
}

/// The attributes of `attrs_data` as (key, value) pairs: the key map's name
/// for each key index (`attr.<index>` when it has none), values as UTF-8
/// (invalid bytes replaced).
pub fn named_attributes(attrs_data: &[u8], key_map: &[String]) -> Vec<(String, String)> {
    record::decode_attributes(attrs_data)
        .entries
        .into_iter()
        .map(|a| {
            let key = key_map
                .get(a.key_index as usize)
                .cloned()
                .unwrap_or_else(|| format!("attr.{}", a.key_index));
            (key, String::from_utf8_lossy(&a.value).into_owned())
        })
        .collect()
}

/// What the thread was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// On CPU.
    Running,
    /// Off CPU while its record named a span: waiting inside that span.
    Blocked,
    /// Off CPU with no span published: idle (e.g. in the event loop).
    Idle,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Blocked => "blocked",
            State::Idle => "idle",
        }
    }
}

/// Samples that share everything but their time and value.
#[derive(Clone, Debug)]
pub struct Entry {
    pub kind: Kind,
    pub state: State,
    pub tid: u32,
    pub thread_name: String,
    pub span: Option<Span>,
    /// A pool thread running a work item: the span is the one that queued it.
    pub threadpool: bool,
    /// Record attributes named through the process context's key map (an
    /// index the map does not name is called `attr.<index>`).
    pub attributes: Vec<(String, String)>,
    /// Leaf first: kernel frames, then user frames.
    pub frames: Vec<Frame>,
    /// One per sample: CLOCK_MONOTONIC nanoseconds and the sample's value
    /// in nanoseconds (the sampling period on CPU, the wait off CPU).
    pub events: Vec<(u64, u64)>,
}

impl Entry {
    pub fn total_ns(&self) -> u64 {
        self.events.iter().map(|&(_, v)| v).sum()
    }

    /// The record attribute `key`, if the span carried it.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The span's name, when the record carried it.
    pub fn span_name(&self) -> Option<&str> {
        self.attribute(attrs::SPAN_NAME_KEY)
    }

    /// The local root span's id (hex), when the record carried it.
    pub fn local_root_span_id(&self) -> Option<&str> {
        self.attribute(attrs::LOCAL_ROOT_SPAN_ID_KEY)
    }

    /// The endpoint the sample served: see [`endpoint`].
    pub fn endpoint(&self) -> Option<String> {
        endpoint(|k| self.attribute(k))
    }

    /// Whether the wait, with no span published, is in `epoll_wait`: an
    /// event loop waiting for I/O.
    fn waits_in_epoll(&self) -> bool {
        self.frames
            .iter()
            .any(|f| f.module == "[kernel]" && f.name.contains("epoll"))
    }
}

pub use otel_thread_ctx_reader::record::endpoint;

/// A finished profile.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub pid: i32,
    pub hz: u64,
    pub off_cpu: bool,
    /// Nanoseconds per on-CPU sample.
    pub period_ns: u64,
    /// Start of the run: CLOCK_MONOTONIC and wall clock, nanoseconds.
    pub start_monotonic_ns: u64,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub entries: Vec<Entry>,
}

impl Profile {
    /// Leaves out off-CPU time that is not waiting inside the application's
    /// work: waits with no span published on threads that never published
    /// one of their own in the run (V8 platform workers, pool threads
    /// waiting for work) and the idle waits of the others (an event loop
    /// waiting for I/O). Returns the nanoseconds left out.
    pub fn keep_off_cpu_in_spans(&mut self) -> u64 {
        // Threads that published a span of their own: a pool thread's work
        // items carry the queuing thread's span, which does not make its
        // waits for work the application's.
        let with_spans: std::collections::HashSet<u32> = self
            .entries
            .iter()
            .filter(|e| e.span.is_some() && !e.threadpool)
            .map(|e| e.tid)
            .collect();
        let mut dropped = 0;
        self.entries.retain(|e| {
            let idle = e.kind == Kind::OffCpu
                && e.state == State::Idle
                && (!with_spans.contains(&e.tid) || e.waits_in_epoll());
            let keep = !idle;
            if !keep {
                dropped += e.total_ns();
            }
            keep
        });
        dropped
    }

    /// Wall-clock nanoseconds of a CLOCK_MONOTONIC time of this run.
    pub fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        (self.start_unix_ns as i128 + monotonic_ns as i128 - self.start_monotonic_ns as i128).max(0)
            as u64
    }

    pub fn on_cpu_samples(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.kind == Kind::OnCpu)
            .map(|e| e.events.len() as u64)
            .sum()
    }

    pub fn off_cpu_ns(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.kind == Kind::OffCpu)
            .map(Entry::total_ns)
            .sum()
    }
}

/// A user return address points after its call: looking up the byte before
/// names the calling function even when the call ends it.
pub fn lookup_address(index: usize, addr: u64) -> u64 {
    if index == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

/// Where no module names an address: `0x...` in `[unknown]`.
fn unknown_frame(addr: u64) -> Frame {
    Frame {
        name: format!("{addr:#x}"),
        module: "[unknown]".into(),
        line: None,
    }
}

/// The kernel frames of sample `s`, leaf first, without the profiler's own
/// program and the tracepoint's dispatch.
pub fn kernel_frames(s: &Sample, names: &Names) -> Vec<Frame> {
    let mut frames: Vec<Frame> = s
        .kernel_stack
        .iter()
        .map(|a| {
            names
                .kernel
                .get(a)
                .cloned()
                .unwrap_or_else(|| unknown_frame(*a))
        })
        .collect();
    // A stack taken inside the sched_switch tracepoint starts with the
    // profiler's own program and the tracepoint's dispatch: not the target's.
    if let Some(i) = frames
        .iter()
        .position(|f| f.name.starts_with("bpf_trace_run"))
    {
        frames.drain(..=i);
    }
    frames
}

/// The lookup addresses of the user frames of `s` that its own frame
/// names do not name, for the names collected by address.
pub fn addresses_to_name(s: &Sample) -> impl Iterator<Item = u64> + '_ {
    s.user_stack
        .iter()
        .enumerate()
        .filter(|(i, _)| !s.frame_names.iter().any(|(named, _)| named == i))
        .map(|(i, &a)| lookup_address(i, a))
}

/// The user frames of sample `s`, leaf first.
pub fn user_frames(s: &Sample, names: &Names) -> Vec<Frame> {
    let mut frames: Vec<Frame> = s
        .user_stack
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            let a = lookup_address(i, a);
            names
                .user
                .get(&a)
                .cloned()
                .unwrap_or_else(|| unknown_frame(a))
        })
        .collect();
    // What ran in a frame names it before its address does, and a frame
    // of optimized code stands for the functions it inlined there too.
    // Replaced from the outermost index in, so the indexes still to come
    // are not moved.
    let mut named: Vec<_> = s.frame_names.iter().collect();
    named.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
    for (i, names) in named {
        if *i < frames.len() && !names.is_empty() {
            frames.splice(*i..*i + 1, names.iter().cloned());
        }
    }
    frames
}

#[derive(PartialEq, Eq, Hash)]
struct Key {
    kind: u8,
    state: State,
    tid: u32,
    span: Option<Span>,
    threadpool: bool,
    attributes: Vec<(String, String)>,
    frames: Vec<Frame>,
}

/// Merges raw samples into entries, naming frames and attributes.
pub fn build(
    mut profile: Profile,
    samples: &[Sample],
    names: &Names,
    key_map: &[String],
    thread_names: &HashMap<u32, String>,
) -> Profile {
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut entries: Vec<Entry> = Vec::new();
    for s in samples {
        let (span, attributes) = match s.record.valid() {
            Some((h, attrs_data)) => {
                let attrs = named_attributes(attrs_data, key_map);
                (
                    Some(Span {
                        trace_id: h.trace_id.to_bytes(),
                        span_id: h.span_id.to_bytes(),
                    }),
                    attrs,
                )
            }
            None => (None, Vec::new()),
        };
        let state = match (s.kind, span.is_some()) {
            (Kind::OnCpu, _) => State::Running,
            (Kind::OffCpu, true) => State::Blocked,
            (Kind::OffCpu, false) => State::Idle,
        };
        let mut frames = kernel_frames(s, names);
        frames.extend(user_frames(s, names));
        let value = match s.kind {
            Kind::OnCpu => profile.period_ns,
            Kind::OffCpu => s.off_cpu_ns,
        };
        let key = Key {
            kind: s.kind as u8,
            state,
            tid: s.tid,
            span,
            threadpool: s.threadpool,
            attributes,
            frames,
        };
        let i = *index.entry(key).or_insert_with_key(|k| {
            entries.push(Entry {
                kind: s.kind,
                state,
                tid: s.tid,
                thread_name: thread_names
                    .get(&s.tid)
                    .cloned()
                    .unwrap_or_else(|| s.comm.clone()),
                span,
                threadpool: k.threadpool,
                attributes: k.attributes.clone(),
                frames: k.frames.clone(),
                events: Vec::new(),
            });
            entries.len() - 1
        });
        entries[i].events.push((s.time_ns, value));
    }
    profile.entries = entries;
    profile
}

/// Samples, names and a profile built from them, for the unit tests of
/// this crate and of the crates that turn a profile into an output.
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures {
    use super::*;
    use crate::kernel::RecordRead;
    use otel_thread_ctx_reader::record::Header;

    pub fn record(span: u8, attrs: &[u8]) -> RecordRead {
        RecordRead::Record {
            header: Header {
                trace_id: TraceId::from_bytes([span; 16]),
                span_id: SpanId::from_bytes([span; 8]),
                valid: 1,
                trace_flags: opentelemetry::trace::TraceFlags::SAMPLED,
                attrs_data_size: attrs.len() as u16,
            },
            attrs_data: attrs.to_vec(),
        }
    }

    pub fn sample(
        kind: Kind,
        tid: u32,
        record: RecordRead,
        user: &[u64],
        off_cpu_ns: u64,
    ) -> Sample {
        Sample {
            kind,
            tgid: 1,
            tid,
            comm: format!("t{tid}"),
            time_ns: 1_000,
            off_cpu_ns,
            schema: otel_thread_ctx_reader::schema::Schema::Record,
            record,
            threadpool: false,
            pool_item: None,
            pool_unread: false,
            user_stack: user.to_vec(),
            kernel_stack: if kind == Kind::OffCpu {
                vec![
                    0xffff_ffff_a000_0000,
                    0xffff_ffff_a000_0010,
                    0xffff_ffff_8100_0000,
                ]
            } else {
                vec![0xffff_ffff_8100_0000]
            },
            user_stack_copy: None,
            frame_names: Vec::new(),
        }
    }

    pub fn names() -> Names {
        let mut n = Names::default();
        let f = |name: &str, module: &str| Frame {
            name: name.into(),
            module: module.into(),
            line: None,
        };
        n.user.insert(0x10, f("leaf", "/bin/app"));
        n.user.insert(0x1f, f("caller", "/bin/app"));
        n.user.insert(0x2f, f("main", "/bin/app"));
        n.kernel
            .insert(0xffff_ffff_8100_0000, f("schedule", "[kernel]"));
        n.kernel.insert(
            0xffff_ffff_a000_0000,
            f("bpf_prog_1234_off_cpu", "[kernel]"),
        );
        n.kernel
            .insert(0xffff_ffff_a000_0010, f("bpf_trace_run4", "[kernel]"));
        n
    }

    /// `http.route=/a`, `span.name=sort`, `local_root.span_id=0707070707070707`
    /// (span 7 is its own local root).
    pub fn named_span_attrs() -> Vec<u8> {
        let mut a = vec![0, 2, b'/', b'a', 1, 4];
        a.extend_from_slice(b"sort");
        a.extend_from_slice(&[2, 16]);
        a.extend_from_slice(b"0707070707070707");
        a
    }

    pub fn key_map() -> Vec<String> {
        vec![
            "http.route".into(),
            "span.name".into(),
            "local_root.span_id".into(),
        ]
    }

    pub fn profile() -> Profile {
        let samples = vec![
            sample(
                Kind::OnCpu,
                1,
                record(7, &named_span_attrs()),
                &[0x10, 0x20, 0x30],
                0,
            ),
            sample(
                Kind::OnCpu,
                1,
                record(7, &named_span_attrs()),
                &[0x10, 0x20, 0x30],
                0,
            ),
            sample(Kind::OnCpu, 2, RecordRead::Null, &[0x10, 0x30], 0),
            sample(
                Kind::OffCpu,
                1,
                record(7, &[0, 2, b'/', b'a', 5, 1, b'x']),
                &[0x10, 0x30],
                5_000,
            ),
            sample(Kind::OffCpu, 2, RecordRead::Null, &[0x10], 9_000),
        ];
        let base = Profile {
            pid: 42,
            hz: 100,
            off_cpu: true,
            period_ns: 10_000_000,
            ..Default::default()
        };
        build(
            base,
            &samples,
            &names(),
            &key_map(),
            &HashMap::from([(1, "main".to_string())]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::kernel::RecordRead;

    #[test]
    fn frames_named_in_their_sample_replace_theirs_and_may_stand_for_several() {
        let f = |name: &str| Frame {
            name: name.into(),
            module: "[jit]".into(),
            line: None,
        };
        let mut s = sample(Kind::OnCpu, 1, RecordRead::Null, &[0x10, 0x20, 0x30], 0);
        s.frame_names = vec![
            (
                0,
                std::sync::Arc::from([f("JS:leaf"), f("JS:middle"), f("JS:outer")]),
            ),
            (2, std::sync::Arc::from([f("JS:interpreted")])),
        ];
        let names: Vec<String> = user_frames(&s, &names())
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(
            names,
            [
                "JS:leaf",
                "JS:middle",
                "JS:outer",
                "caller",
                "JS:interpreted"
            ]
        );
        // Only the frame named by address is left to name by address.
        assert_eq!(addresses_to_name(&s).collect::<Vec<_>>(), [0x1f]);
    }

    #[test]
    fn merges_identical_samples_and_names_everything() {
        let p = profile();
        assert_eq!(p.entries.len(), 4);
        let first = &p.entries[0];
        assert_eq!(first.events.len(), 2);
        assert_eq!(first.state, State::Running);
        assert_eq!(first.thread_name, "main");
        assert_eq!(first.attribute("http.route"), Some("/a"));
        assert_eq!(first.span_name(), Some("sort"));
        assert_eq!(first.local_root_span_id(), Some("0707070707070707"));
        assert_eq!(first.endpoint().as_deref(), Some("/a"));
        let names: Vec<&str> = first.frames.iter().map(|f| f.name.as_str()).collect();
        // Return addresses are looked up one byte back.
        assert_eq!(names, ["schedule", "leaf", "caller", "main"]);
        assert_eq!(p.on_cpu_samples(), 3);
        assert_eq!(p.off_cpu_ns(), 14_000);
    }

    #[test]
    fn off_cpu_without_a_span_is_idle_and_unknown_keys_keep_their_index() {
        let p = profile();
        let blocked = p
            .entries
            .iter()
            .find(|e| e.state == State::Blocked)
            .unwrap();
        assert_eq!(blocked.attribute("attr.5"), Some("x"));
        assert_eq!(blocked.total_ns(), 5_000);
        // The profiler's own frames are cut from the switch-out stack.
        assert_eq!(blocked.frames[0].name, "schedule");
        let idle = p.entries.iter().find(|e| e.state == State::Idle).unwrap();
        assert!(idle.span.is_none());
        assert_eq!(idle.thread_name, "t2");
    }

    #[test]
    fn the_endpoint_is_the_route_after_its_method() {
        let attrs = [("http.route", "/sort"), ("http.request.method", "GET")];
        let get = |k: &str| attrs.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        assert_eq!(endpoint(get).as_deref(), Some("GET /sort"));
        assert_eq!(endpoint(|_| None), None);
    }

    #[test]
    fn a_pool_thread_waiting_for_work_is_idle_even_after_work_items() {
        let mut item = sample(Kind::OnCpu, 3, record(7, &[]), &[0x10], 0);
        item.threadpool = true;
        let wait = sample(Kind::OffCpu, 3, RecordRead::Null, &[0x10], 4_000);
        let base = Profile {
            off_cpu: true,
            period_ns: 10_000_000,
            ..Default::default()
        };
        let mut p = build(base, &[item, wait], &names(), &[], &HashMap::new());
        assert_eq!(p.keep_off_cpu_in_spans(), 4_000);
        assert_eq!(p.entries.len(), 1);
    }

    #[test]
    fn idle_waits_are_left_out_and_waits_in_spans_kept() {
        let mut p = profile();
        // Thread 2 never had a span: its wait is a helper thread idling.
        let dropped = p.keep_off_cpu_in_spans();
        assert_eq!(dropped, 9_000);
        assert!(p
            .entries
            .iter()
            .all(|e| e.kind == Kind::OnCpu || e.state == State::Blocked));
        assert_eq!(p.off_cpu_ns(), 5_000);
    }
}
