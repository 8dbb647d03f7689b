//! pprof output: a gzipped `perftools.profiles.Profile` (profile.proto).
//!
//! Sample types: `cpu`/`nanoseconds` (first, and the default a viewer
//! opens on) and `samples`/`count`, plus `off_cpu`/`nanoseconds` with
//! off-CPU profiling. Labels: `trace_id`, `span_id`, `span_name`,
//! `local_root_span_id`, `trace_endpoint` (the names Datadog's profilers
//! use; Pyroscope builds span profiles from `span_id`), `thread.id`
//! (numeric), `thread.name`, `state`, and each other record attribute under
//! its key-map name.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use prost::Message;

use otel_thread_ctx_abi::attrs;
use otel_thread_ctx_profiler::kernel::Kind;
use otel_thread_ctx_profiler::model::Profile;
use otel_thread_ctx_profiler::symbolize::Frame;

mod proto {
    //! The profile.proto messages, field numbers as in google/pprof.
    use prost::Message;

    #[derive(Clone, PartialEq, Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The string table: index 0 is "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Encodes the profile (not yet gzipped).
fn encode(p: &Profile, comments: &[String]) -> proto::Profile {
    let mut strings = Strings::new();
    let value_type = |t: &str, u: &str, s: &mut Strings| proto::ValueType {
        r#type: s.get(t),
        unit: s.get(u),
    };
    let mut sample_type = vec![
        value_type("cpu", "nanoseconds", &mut strings),
        value_type("samples", "count", &mut strings),
    ];
    if p.off_cpu {
        sample_type.push(value_type("off_cpu", "nanoseconds", &mut strings));
    }
    let mut locations: HashMap<&Frame, u64> = HashMap::new();
    // One function per name and module, one location per frame: the
    // frames of one function at different lines share their function.
    let mut functions: HashMap<(&str, &str), u64> = HashMap::new();
    let mut out = proto::Profile {
        period_type: Some(value_type("cpu", "nanoseconds", &mut strings)),
        period: p.period_ns as i64,
        time_nanos: p.start_unix_ns as i64,
        duration_nanos: p.duration_ns as i64,
        sample_type,
        ..Default::default()
    };
    for e in &p.entries {
        let location_id = e
            .frames
            .iter()
            .map(|f| {
                *locations.entry(f).or_insert_with(|| {
                    let function_id = *functions
                        .entry((f.name.as_str(), f.module.as_str()))
                        .or_insert_with(|| {
                            let id = out.function.len() as u64 + 1;
                            let name = strings.get(&f.name);
                            out.function.push(proto::Function {
                                id,
                                name,
                                system_name: name,
                                filename: strings.get(&f.module),
                            });
                            id
                        });
                    let id = out.location.len() as u64 + 1;
                    out.location.push(proto::Location {
                        id,
                        line: vec![proto::Line {
                            function_id,
                            line: f.line.map_or(0, i64::from),
                        }],
                    });
                    id
                })
            })
            .collect();
        let mut value = match e.kind {
            Kind::OnCpu => vec![e.total_ns() as i64, e.events.len() as i64],
            Kind::OffCpu => vec![0, 0],
        };
        if p.off_cpu {
            value.push(if e.kind == Kind::OffCpu {
                e.total_ns() as i64
            } else {
                0
            });
        }
        let text = |k: &str, v: &str, s: &mut Strings| proto::Label {
            key: s.get(k),
            str: s.get(v),
            ..Default::default()
        };
        let mut label = Vec::new();
        if let Some(span) = &e.span {
            label.push(text("trace_id", &span.trace_hex(), &mut strings));
            label.push(text("span_id", &span.span_hex(), &mut strings));
        }
        label.push(proto::Label {
            key: strings.get("thread.id"),
            num: e.tid as i64,
            ..Default::default()
        });
        label.push(text("thread.name", &e.thread_name, &mut strings));
        label.push(text("state", e.state.name(), &mut strings));
        if e.threadpool {
            label.push(text("thread.pool", "true", &mut strings));
        }
        if let Some(name) = e.span_name() {
            label.push(text("span_name", name, &mut strings));
        }
        if let Some(id) = e.local_root_span_id() {
            label.push(text("local_root_span_id", id, &mut strings));
        }
        if let Some(endpoint) = e.endpoint() {
            label.push(text("trace_endpoint", &endpoint, &mut strings));
        }
        for (k, v) in &e.attributes {
            // Already labelled under the names profilers share.
            if k != attrs::SPAN_NAME_KEY && k != attrs::LOCAL_ROOT_SPAN_ID_KEY {
                label.push(text(k, v, &mut strings));
            }
        }
        out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
    // CPU first: a viewer opens on it, not on the off-CPU time.
    out.default_sample_type = out.sample_type[0].r#type;
    out.comment = comments.iter().map(|c| strings.get(c)).collect();
    out.string_table = strings.table;
    out
}

/// The gzipped profile.proto bytes.
pub fn write(p: &Profile, comments: &[String]) -> Vec<u8> {
    let bytes = encode(p, comments).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The profile a gzipped pprof file holds.
    fn decoded(gz: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut raw)
            .unwrap();
        proto::Profile::decode(&raw[..]).unwrap()
    }

    #[test]
    fn round_trips_with_labels_and_sample_types() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let gz = write(&p, &["no perf map".into()]);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .unwrap();
        let d = proto::Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| d.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<(&str, &str)> = d
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("cpu", "nanoseconds"),
                ("samples", "count"),
                ("off_cpu", "nanoseconds")
            ]
        );
        assert_eq!(s(d.default_sample_type), "cpu");
        assert_eq!(d.sample.len(), p.entries.len());
        let first = &d.sample[0];
        assert_eq!(first.value, [20_000_000, 2, 0]);
        let labels: HashMap<&str, &str> = first
            .label
            .iter()
            .filter(|l| l.str != 0)
            .map(|l| (s(l.key), s(l.str)))
            .collect();
        assert_eq!(labels["trace_id"], "07070707070707070707070707070707");
        assert_eq!(labels["span_id"], "0707070707070707");
        assert_eq!(labels["thread.name"], "main");
        assert_eq!(labels["http.route"], "/a");
        assert_eq!(labels["trace_endpoint"], "/a");
        assert_eq!(labels["span_name"], "sort");
        assert_eq!(labels["local_root_span_id"], "0707070707070707");
        assert!(!labels.contains_key("span.name"));
        assert_eq!(labels["state"], "running");
        assert!(!labels.contains_key("thread.pool"));
        assert!(first
            .label
            .iter()
            .any(|l| s(l.key) == "thread.id" && l.num == 1));
        // Leaf first, every location resolvable to a function name.
        let name = |id: u64| s(d.function[(id - 1) as usize].name);
        assert_eq!(name(first.location_id[1]), "leaf");
        assert_eq!(name(*first.location_id.last().unwrap()), "main");
        let off: i64 = d.sample.iter().map(|x| x.value[2]).sum();
        assert_eq!(off, 14_000);
        assert_eq!(s(d.comment[0]), "no perf map");
    }

    #[test]
    fn one_function_at_two_lines_is_one_function_in_two_locations() {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        let leaf = p.entries[0].frames[1].clone();
        p.entries[0].frames[1].line = Some(3);
        p.entries[1].frames[1] = Frame {
            line: Some(9),
            ..leaf.clone()
        };
        let d = decoded(&write(&p, &[]));
        let s = |i: i64| d.string_table[i as usize].as_str();
        let lines: Vec<(u64, &str, i64)> = d
            .location
            .iter()
            .flat_map(|l| &l.line)
            .filter(|l| s(d.function[(l.function_id - 1) as usize].name) == leaf.name)
            .map(|l| {
                (
                    l.function_id,
                    s(d.function[(l.function_id - 1) as usize].name),
                    l.line,
                )
            })
            .collect();
        let ids: std::collections::HashSet<u64> = lines.iter().map(|l| l.0).collect();
        assert_eq!(ids.len(), 1, "{lines:?}");
        let mut at: Vec<i64> = lines.iter().map(|l| l.2).collect();
        at.sort();
        // The fixture's other samples of it have no line (0 in pprof).
        assert_eq!(at, [0, 3, 9]);
        assert_eq!(
            d.function.iter().filter(|f| s(f.name) == leaf.name).count(),
            1
        );
    }

    #[test]
    fn pool_thread_samples_carry_the_thread_pool_label() {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        p.entries[0].threadpool = true;
        let d = decoded(&write(&p, &[]));
        let s = |i: i64| d.string_table[i as usize].as_str();
        let pool = |x: &proto::Sample| {
            x.label
                .iter()
                .any(|l| s(l.key) == "thread.pool" && s(l.str) == "true")
        };
        assert!(pool(&d.sample[0]));
        assert!(!d.sample[1..].iter().any(pool));
    }
}
