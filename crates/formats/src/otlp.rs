//! OTLP Profiles output (`opentelemetry.proto.profiles.v1development`):
//! one CPU profile and, with off-CPU profiling, one off-CPU profile, under
//! the process context's Resource; each sample links to its trace and span,
//! and carries the thread and record attributes.
//!
//! With span profiles (`--span-profiles`), the form span-profile backends
//! such as Grafana Pyroscope ingest: one value per sample (no timestamps),
//! ids only in the link and, for `root`, a `span_id` attribute holding the
//! local root span's id (which such backends read in place of the link's),
//! and no per-thread or per-span keys among the attributes.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use otel_thread_ctx_otlp::profiles::{
    ExportProfilesServiceRequest, Function, InstrumentationScope, KeyValueAndUnit, Line, Link,
    Location, Profile as OtlpProfile, ProfilesData, ProfilesDictionary, ResourceProfiles, Sample,
    ScopeProfiles, Stack, ValueType,
};
use otel_thread_ctx_otlp::{AnyValue, Message, Resource};

use otel_thread_ctx_abi::attrs;

use otel_thread_ctx_profiler::kernel::Kind;
use otel_thread_ctx_profiler::model::Profile;
use otel_thread_ctx_profiler::symbolize::Frame;

/// Which span a sample's profile is filed under in a span-profile backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SpanProfiles {
    /// Under its local root span (a `span_id` sample attribute): a root's
    /// profile holds the work of every span under it.
    Root,
    /// Under the innermost span it ran in (the link's span id).
    Span,
}

/// The sample attribute span-profile backends read in place of the link's
/// span id.
pub const SPAN_ID_KEY: &str = "span_id";

#[derive(Default)]
struct Dictionary {
    d: ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(String, String), i32>,
    locations: HashMap<Frame, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    links: HashMap<([u8; 16], [u8; 8]), i32>,
    attributes: HashMap<(String, String), i32>,
    numeric: HashMap<(String, i64), i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut d = Dictionary::default();
        // Entry 0 of every table is its zero value.
        d.string("");
        d.d.mapping_table.push(Default::default());
        d.d.location_table.push(Default::default());
        d.d.function_table.push(Default::default());
        // The zero Link has no field set (not 16 and 8 zero bytes).
        d.d.link_table.push(Link::default());
        d.d.attribute_table.push(Default::default());
        d.d.stack_table.push(Default::default());
        // A sample without frames uses the zero Stack rather than a copy.
        d.stacks.insert(Vec::new(), 0);
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.into());
        self.strings.insert(s.into(), i);
        i
    }

    /// One function per name and module: the frames of one function at
    /// different lines are locations of the same function.
    fn function(&mut self, f: &Frame) -> i32 {
        let key = (f.name.clone(), f.module.clone());
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let name = self.string(&f.name);
        let filename = self.string(&f.module);
        let i = self.d.function_table.len() as i32;
        self.d.function_table.push(Function {
            name_strindex: name,
            system_name_strindex: name,
            filename_strindex: filename,
            start_line: 0,
        });
        self.functions.insert(key, i);
        i
    }

    fn location(&mut self, f: &Frame) -> i32 {
        if let Some(&i) = self.locations.get(f) {
            return i;
        }
        let function_index = self.function(f);
        let i = self.d.location_table.len() as i32;
        self.d.location_table.push(Location {
            lines: vec![Line {
                function_index,
                line: f.line.map_or(0, i64::from),
                column: 0,
            }],
            ..Default::default()
        });
        self.locations.insert(f.clone(), i);
        i
    }

    fn stack(&mut self, frames: &[Frame]) -> i32 {
        let locations: Vec<i32> = frames.iter().map(|f| self.location(f)).collect();
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    fn link(&mut self, trace_id: [u8; 16], span_id: [u8; 8]) -> i32 {
        if let Some(&i) = self.links.get(&(trace_id, span_id)) {
            return i;
        }
        let i = self.d.link_table.len() as i32;
        self.d.link_table.push(Link {
            trace_id: trace_id.to_vec(),
            span_id: span_id.to_vec(),
        });
        self.links.insert((trace_id, span_id), i);
        i
    }

    fn text(&mut self, key: &str, value: &str) -> i32 {
        if let Some(&i) = self.attributes.get(&(key.into(), value.into())) {
            return i;
        }
        let key_strindex = self.string(key);
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue::string(value)),
            unit_strindex: 0,
        });
        self.attributes.insert((key.into(), value.into()), i);
        i
    }

    fn int(&mut self, key: &str, value: i64) -> i32 {
        if let Some(&i) = self.numeric.get(&(key.into(), value)) {
            return i;
        }
        let key_strindex = self.string(key);
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue::int(value)),
            unit_strindex: 0,
        });
        self.numeric.insert((key.into(), value), i);
        i
    }
}

/// Builds one request from the profiles of several processes: one
/// ResourceProfiles each, all sharing one dictionary.
pub struct RequestBuilder {
    dict: Dictionary,
    resource_profiles: Vec<ResourceProfiles>,
    span_profiles: Option<SpanProfiles>,
}

impl Default for RequestBuilder {
    fn default() -> Self {
        RequestBuilder::new(None)
    }
}

impl RequestBuilder {
    /// A builder whose samples take the span-profile form when asked.
    pub fn new(span_profiles: Option<SpanProfiles>) -> Self {
        RequestBuilder {
            dict: Dictionary::new(),
            resource_profiles: Vec::new(),
            span_profiles,
        }
    }

    /// Adds one process's profile under its resource.
    pub fn add(&mut self, p: &Profile, resource: Resource) {
        let dict = &mut self.dict;
        let mode = self.span_profiles;
        let mut profiles = vec![profile_of(p, Kind::OnCpu, mode, dict)];
        if p.off_cpu {
            profiles.push(profile_of(p, Kind::OffCpu, mode, dict));
        }
        self.resource_profiles.push(ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "otel-thread-ctx".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }

    /// No process was added.
    pub fn is_empty(&self) -> bool {
        self.resource_profiles.is_empty()
    }

    pub fn finish(self) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest {
            resource_profiles: self.resource_profiles,
            dictionary: Some(self.dict.d),
        }
    }
}

/// Builds the request of one process: the same message as `ProfilesData`,
/// field for field; its samples in the span-profile form when asked.
pub fn request(
    p: &Profile,
    resource: Resource,
    span_profiles: Option<SpanProfiles>,
) -> ExportProfilesServiceRequest {
    let mut b = RequestBuilder::new(span_profiles);
    b.add(p, resource);
    b.finish()
}

/// The CPU or off-CPU profile of `p`, its names and links in `dict`.
fn profile_of(
    p: &Profile,
    kind: Kind,
    span_profiles: Option<SpanProfiles>,
    dict: &mut Dictionary,
) -> OtlpProfile {
    let (type_name, period_name) = match kind {
        Kind::OnCpu => ("cpu", "cpu"),
        Kind::OffCpu => ("off_cpu", "context_switch"),
    };
    let sample_type = ValueType {
        type_strindex: dict.string(type_name),
        unit_strindex: dict.string("nanoseconds"),
    };
    let mut out = OtlpProfile {
        sample_type: Some(sample_type),
        time_unix_nano: p.start_unix_ns,
        duration_nano: p.duration_ns,
        ..Default::default()
    };
    if kind == Kind::OnCpu {
        out.period_type = Some(ValueType {
            type_strindex: dict.string("cpu"),
            unit_strindex: dict.string("nanoseconds"),
        });
        out.period = p.period_ns as i64;
    } else {
        out.period_type = Some(ValueType {
            type_strindex: dict.string(period_name),
            unit_strindex: dict.string("count"),
        });
        out.period = 1;
    }
    if let Some(mode) = span_profiles {
        span_profile_samples(p, kind, mode, dict, &mut out);
        return out;
    }
    for e in p.entries.iter().filter(|e| e.kind == kind) {
        let mut attribute_indices = vec![
            dict.int("thread.id", e.tid as i64),
            dict.text("thread.name", &e.thread_name),
            dict.text("thread.state", e.state.name()),
        ];
        if e.threadpool {
            attribute_indices.push(dict.text("thread.pool", "true"));
        }
        for (k, v) in &e.attributes {
            attribute_indices.push(dict.text(k, v));
        }
        out.samples.push(Sample {
            stack_index: dict.stack(&e.frames),
            attribute_indices,
            link_index: e.span.map_or(0, |s| dict.link(s.trace_id, s.span_id)),
            values: e.events.iter().map(|&(_, v)| v as i64).collect(),
            timestamps_unix_nano: e.events.iter().map(|&(t, _)| p.unix_ns(t)).collect(),
        });
    }
    out
}

/// The samples of `kind` in the span-profile form: one summed value each,
/// samples that differ only in what is left out merged.
fn span_profile_samples(
    p: &Profile,
    kind: Kind,
    mode: SpanProfiles,
    dict: &mut Dictionary,
    out: &mut OtlpProfile,
) {
    let mut merged: HashMap<(i32, Vec<i32>, i32), usize> = HashMap::new();
    for e in p.entries.iter().filter(|e| e.kind == kind) {
        let mut attribute_indices = vec![
            dict.text("thread.name", &e.thread_name),
            dict.text("thread.state", e.state.name()),
        ];
        if e.threadpool {
            attribute_indices.push(dict.text("thread.pool", "true"));
        }
        for (k, v) in &e.attributes {
            if k != attrs::LOCAL_ROOT_SPAN_ID_KEY && k != SPAN_ID_KEY {
                attribute_indices.push(dict.text(k, v));
            }
        }
        if mode == SpanProfiles::Root && e.span.is_some() {
            if let Some(root) = e.local_root_span_id() {
                attribute_indices.push(dict.text(SPAN_ID_KEY, root));
            }
        }
        let stack_index = dict.stack(&e.frames);
        let link_index = e.span.map_or(0, |s| dict.link(s.trace_id, s.span_id));
        let value = e.total_ns() as i64;
        match merged.entry((stack_index, attribute_indices, link_index)) {
            std::collections::hash_map::Entry::Occupied(o) => {
                out.samples[*o.get()].values[0] += value;
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                let (stack_index, attribute_indices, link_index) = v.key().clone();
                v.insert(out.samples.len());
                out.samples.push(Sample {
                    stack_index,
                    attribute_indices,
                    link_index,
                    values: vec![value],
                    timestamps_unix_nano: Vec::new(),
                });
            }
        }
    }
}

/// The file form.
pub fn data(r: ExportProfilesServiceRequest) -> ProfilesData {
    ProfilesData {
        resource_profiles: r.resource_profiles,
        dictionary: r.dictionary,
    }
}

/// Why a profile could not be sent to an OTLP/HTTP receiver.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("--otlp-endpoint {0:?}: only plain http:// receivers are supported")]
    NotHttp(String),
    #[error("--otlp-endpoint {0:?} names no host")]
    NoHost(String),
    #[error("sending to {endpoint}: {source}")]
    Io {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{endpoint} answered {status:?}")]
    Rejected { endpoint: String, status: String },
}

/// Where OTLP/HTTP profiles go on a receiver given as `http://host:port`
/// (the signal path is added unless the URL has a path).
pub fn endpoint_url(endpoint: &str) -> Result<(String, String), SendError> {
    let rest = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| SendError::NotHttp(endpoint.to_string()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) if rest[i..].len() > 1 => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], "/v1development/profiles".to_string()),
        None => (rest, "/v1development/profiles".to_string()),
    };
    if authority.is_empty() {
        return Err(SendError::NoHost(endpoint.to_string()));
    }
    let authority = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:4318")
    };
    Ok((authority, path))
}

/// Sends the request to an OTLP/HTTP receiver (protobuf body) and returns
/// its HTTP status line.
pub fn send(endpoint: &str, r: &ExportProfilesServiceRequest) -> Result<String, SendError> {
    let (authority, path) = endpoint_url(endpoint)?;
    let body = r.encode_to_vec();
    let fail = |source| SendError::Io {
        endpoint: endpoint.to_string(),
        source,
    };
    let mut stream = TcpStream::connect(&authority).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(&body))
        .map_err(fail)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(fail)?;
    let text = String::from_utf8_lossy(&response);
    let status = text.lines().next().unwrap_or("").to_string();
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok());
    match code {
        Some(200..=299) => Ok(status),
        _ => Err(SendError::Rejected {
            endpoint: endpoint.to_string(),
            status,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_otlp::KeyValue;

    #[test]
    fn samples_link_to_their_span_and_tables_start_with_zero_values() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let resource = Resource {
            attributes: vec![KeyValue::new("service.name", AnyValue::string("svc"))],
            dropped_attributes_count: 0,
        };
        let bytes = data(request(&p, resource, None)).encode_to_vec();
        let d = ProfilesData::decode(&bytes[..]).unwrap();
        let dict = d.dictionary.unwrap();
        assert_eq!(dict.string_table[0], "");
        assert_eq!(dict.link_table[0], Link::default());
        assert_eq!(dict.stack_table[0], Stack::default());
        let rp = &d.resource_profiles[0];
        assert_eq!(
            rp.resource.as_ref().unwrap().attributes[0].key,
            "service.name"
        );
        let profiles = &rp.scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let s = |i: i32| dict.string_table[i as usize].as_str();
        assert_eq!(
            s(profiles[0].sample_type.as_ref().unwrap().type_strindex),
            "cpu"
        );
        assert_eq!(
            s(profiles[1].sample_type.as_ref().unwrap().type_strindex),
            "off_cpu"
        );
        let first = &profiles[0].samples[0];
        assert_eq!(
            dict.link_table[first.link_index as usize].span_id,
            vec![7; 8]
        );
        assert_eq!(first.values, [10_000_000, 10_000_000]);
        assert_eq!(first.timestamps_unix_nano.len(), 2);
        let attrs: Vec<(&str, String)> = first
            .attribute_indices
            .iter()
            .map(|&i| {
                let kv = &dict.attribute_table[i as usize];
                (
                    s(kv.key_strindex),
                    format!("{:?}", kv.value.as_ref().unwrap().value.as_ref().unwrap()),
                )
            })
            .collect();
        assert!(
            attrs
                .iter()
                .any(|(k, v)| *k == "http.route" && v.contains("/a")),
            "{attrs:?}"
        );
        assert!(attrs.iter().any(|(k, _)| *k == "thread.id"));
        // An idle sample has no link.
        let idle = profiles[1]
            .samples
            .iter()
            .find(|x| x.values == [9_000])
            .unwrap();
        assert_eq!(idle.link_index, 0);
        let stack = &dict.stack_table[first.stack_index as usize];
        let leaf = &dict.location_table[stack.location_indices[1] as usize];
        assert_eq!(
            s(dict.function_table[leaf.lines[0].function_index as usize].name_strindex),
            "leaf"
        );
    }

    /// The sample attributes of `sample` as (key, string value).
    fn attributes_of(dict: &ProfilesDictionary, sample: &Sample) -> Vec<(String, String)> {
        sample
            .attribute_indices
            .iter()
            .map(|&i| {
                let kv = &dict.attribute_table[i as usize];
                let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(otel_thread_ctx_otlp::any_value::Value::StringValue(s)) => s.clone(),
                    other => format!("{other:?}"),
                };
                (dict.string_table[kv.key_strindex as usize].clone(), value)
            })
            .collect()
    }

    /// The test profile, its first entry's span under another local root.
    fn profile_with_a_child_span() -> Profile {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        for (k, v) in p.entries[0].attributes.iter_mut() {
            if k == attrs::LOCAL_ROOT_SPAN_ID_KEY {
                *v = "0101010101010101".into();
            }
        }
        p
    }

    fn span_profile_data(mode: SpanProfiles) -> ProfilesData {
        let p = profile_with_a_child_span();
        let resource = Resource {
            attributes: vec![KeyValue::new("service.name", AnyValue::string("svc"))],
            dropped_attributes_count: 0,
        };
        let bytes = data(request(&p, resource, Some(mode))).encode_to_vec();
        ProfilesData::decode(&bytes[..]).unwrap()
    }

    #[test]
    fn root_span_profiles_file_samples_under_the_local_root_and_keep_the_innermost_link() {
        let d = span_profile_data(SpanProfiles::Root);
        assert!(
            crate::conformance::check(&d).is_empty(),
            "{:?}",
            crate::conformance::check(&d)
        );
        let dict = d.dictionary.as_ref().unwrap();
        let profiles = &d.resource_profiles[0].scope_profiles[0].profiles;
        for p in profiles {
            assert!(p.period > 0 && p.period_type.is_some());
            for s in &p.samples {
                assert_eq!(s.values.len(), 1, "{s:?}");
                assert!(s.timestamps_unix_nano.is_empty());
                let keys: Vec<String> =
                    attributes_of(dict, s).into_iter().map(|(k, _)| k).collect();
                for banned in ["thread.id", "local_root.span_id", "trace_id"] {
                    assert!(!keys.iter().any(|k| k == banned), "{keys:?}");
                }
            }
        }
        let on_cpu = &profiles[0];
        let first = on_cpu.samples.iter().find(|s| s.link_index != 0).unwrap();
        // Two samples of 10 ms, one value.
        assert_eq!(first.values, [20_000_000]);
        let link = &dict.link_table[first.link_index as usize];
        assert_eq!(
            (link.trace_id.len(), link.span_id.clone()),
            (16, vec![7; 8])
        );
        let attrs = attributes_of(dict, first);
        assert!(attrs.contains(&("span_id".into(), "0101010101010101".into())));
        assert!(attrs.contains(&("span.name".into(), "sort".into())));
        assert!(attrs.contains(&("http.route".into(), "/a".into())));
        // A sample outside any span is filed under no span.
        let spanless = on_cpu.samples.iter().find(|s| s.link_index == 0).unwrap();
        assert!(!attributes_of(dict, spanless)
            .iter()
            .any(|(k, _)| k == "span_id"));
    }

    #[test]
    fn innermost_span_profiles_leave_the_span_to_the_link() {
        let d = span_profile_data(SpanProfiles::Span);
        assert!(crate::conformance::check(&d).is_empty());
        let dict = d.dictionary.as_ref().unwrap();
        let on_cpu = &d.resource_profiles[0].scope_profiles[0].profiles[0];
        let first = on_cpu.samples.iter().find(|s| s.link_index != 0).unwrap();
        assert_eq!(
            dict.link_table[first.link_index as usize].span_id,
            vec![7; 8]
        );
        assert_eq!(first.values, [20_000_000]);
        assert!(!attributes_of(dict, first)
            .iter()
            .any(|(k, _)| k == "span_id" || k == "local_root.span_id"));
    }

    #[test]
    fn samples_differing_only_in_their_thread_merge_in_span_profiles() {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        let mut twin = p.entries[0].clone();
        twin.tid = 99;
        p.entries.push(twin);
        let resource = Resource {
            attributes: Vec::new(),
            dropped_attributes_count: 0,
        };
        let plain = request(&p, resource.clone(), None);
        let merged = request(&p, resource, Some(SpanProfiles::Root));
        let samples = |r: &ExportProfilesServiceRequest| {
            r.resource_profiles[0].scope_profiles[0].profiles[0]
                .samples
                .clone()
        };
        assert_eq!(samples(&merged).len() + 1, samples(&plain).len());
        let total: i64 = samples(&merged).iter().map(|s| s.values[0]).sum();
        let plain_total: i64 = samples(&plain).iter().flat_map(|s| s.values.clone()).sum();
        assert_eq!(total, plain_total);
    }

    #[test]
    fn endpoints_get_the_profiles_path_and_default_port() {
        assert_eq!(
            endpoint_url("http://127.0.0.1:4318").unwrap(),
            ("127.0.0.1:4318".into(), "/v1development/profiles".into())
        );
        assert_eq!(
            endpoint_url("http://localhost/").unwrap(),
            ("localhost:4318".into(), "/v1development/profiles".into())
        );
        assert_eq!(
            endpoint_url("http://h:1/x/y").unwrap(),
            ("h:1".into(), "/x/y".into())
        );
        assert!(endpoint_url("https://h").is_err());
        assert!(endpoint_url("http://").is_err());
    }
}
