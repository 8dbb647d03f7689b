//! OTLP Profiles back into the profiler's model, so that every writer of
//! this crate can render a file that `profile --format otlp` or the agent's
//! `--output-dir` wrote.
//!
//! What [`crate::otlp`] writes comes back as it was: the thread (`thread.id`,
//! `thread.name`, `thread.state`, `thread.pool`), the link's span, the other
//! attributes in their order, the frames leaf first, one event per value
//! with its timestamp. The span-profile form (one summed value per sample,
//! no timestamps) comes back as one event per sampling period on CPU, one
//! event off CPU, at time 0, and its `span_id` attribute (the local root's
//! id) as `local_root.span_id`. Other producers' files are read where they
//! use the same tables: a location without lines is named by its address,
//! in its mapping's file.

use std::collections::BTreeSet;
use std::path::Path;

use otel_thread_ctx_abi::attrs;
use otel_thread_ctx_otlp::any_value::Value;
use otel_thread_ctx_otlp::profiles::{Profile as OtlpProfile, ProfilesData, ProfilesDictionary};
use otel_thread_ctx_otlp::{AnyValue, Message};
use otel_thread_ctx_profiler::kernel::Kind;
use otel_thread_ctx_profiler::model::{Entry, Profile, Span, State};
use otel_thread_ctx_profiler::symbolize::Frame;

use crate::otlp::SPAN_ID_KEY;

/// Why a file could not be read as OTLP Profiles.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("{}: {source}", .path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not an OTLP ProfilesData protobuf (or a truncated one): {source}", .path.display())]
    NotProtobuf {
        path: std::path::PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{}: holds no profiles (empty, or not an OTLP ProfilesData file)", .path.display())]
    Empty { path: std::path::PathBuf },
    #[error("{}: {what}", .path.display())]
    Invalid {
        path: std::path::PathBuf,
        what: String,
    },
}

/// The profiles of one or more files, merged.
#[derive(Debug, Default)]
pub struct Decoded {
    pub profile: Profile,
    /// The `process.pid` of each process (each ResourceProfiles that names
    /// one), in order.
    pub pids: Vec<i64>,
    /// Profiles left out: their sample type is neither time nor a count.
    pub skipped: Vec<String>,
}

/// The dictionary's tables, every index checked.
struct Tables<'a> {
    d: &'a ProfilesDictionary,
}

impl<'a> Tables<'a> {
    fn string(&self, i: i32) -> Result<&'a str, String> {
        self.d
            .string_table
            .get(i as usize)
            .filter(|_| i >= 0)
            .map(String::as_str)
            .ok_or_else(|| format!("string index {i} is outside the string table"))
    }

    fn value(&self, v: &Option<AnyValue>) -> String {
        match v.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            _ => String::new(),
        }
    }

    fn attribute(&self, i: i32) -> Result<(&'a str, String), String> {
        let kv = self
            .d
            .attribute_table
            .get(i as usize)
            .filter(|_| i >= 0)
            .ok_or_else(|| format!("attribute index {i} is outside the attribute table"))?;
        Ok((self.string(kv.key_strindex)?, self.value(&kv.value)))
    }

    /// The frames of a stack, leaf first (inlined functions before their
    /// caller, as a location lists them).
    fn frames(&self, stack_index: i32) -> Result<Vec<Frame>, String> {
        let stack = self
            .d
            .stack_table
            .get(stack_index as usize)
            .filter(|_| stack_index >= 0)
            .ok_or_else(|| format!("stack index {stack_index} is outside the stack table"))?;
        let mut frames = Vec::with_capacity(stack.location_indices.len());
        for &li in &stack.location_indices {
            let loc = self
                .d
                .location_table
                .get(li as usize)
                .filter(|_| li >= 0)
                .ok_or_else(|| format!("location index {li} is outside the location table"))?;
            if loc.lines.is_empty() {
                let module = match self.d.mapping_table.get(loc.mapping_index as usize) {
                    Some(m) if loc.mapping_index > 0 => self.string(m.filename_strindex)?,
                    _ => "",
                };
                frames.push(Frame {
                    name: format!("{:#x}", loc.address),
                    module: if module.is_empty() {
                        "[unknown]".into()
                    } else {
                        module.into()
                    },
                    line: None,
                });
                continue;
            }
            for line in &loc.lines {
                let fi = line.function_index;
                let f = self
                    .d
                    .function_table
                    .get(fi as usize)
                    .filter(|_| fi >= 0)
                    .ok_or_else(|| format!("function index {fi} is outside the function table"))?;
                let mut name = self.string(f.name_strindex)?;
                if name.is_empty() {
                    name = self.string(f.system_name_strindex)?;
                }
                frames.push(Frame {
                    name: name.into(),
                    module: self.string(f.filename_strindex)?.into(),
                    line: u32::try_from(line.line).ok().filter(|&l| l > 0),
                });
            }
        }
        Ok(frames)
    }

    fn span(&self, link_index: i32) -> Result<Option<Span>, String> {
        if link_index == 0 {
            return Ok(None);
        }
        let link = self
            .d
            .link_table
            .get(link_index as usize)
            .filter(|_| link_index > 0)
            .ok_or_else(|| format!("link index {link_index} is outside the link table"))?;
        let (Ok(trace_id), Ok(span_id)) = (
            <[u8; 16]>::try_from(link.trace_id.as_slice()),
            <[u8; 8]>::try_from(link.span_id.as_slice()),
        ) else {
            return Ok(None);
        };
        Ok(Some(Span { trace_id, span_id }))
    }
}

/// How a profile's values read as nanoseconds.
struct Values {
    kind: Kind,
    /// Nanoseconds per value unit (a count of samples: the period).
    scale: u64,
    /// Nanoseconds per on-CPU sample, when the profile says.
    period_ns: Option<u64>,
}

fn values_of(t: &Tables, p: &OtlpProfile) -> Result<Option<Values>, String> {
    let Some(st) = &p.sample_type else {
        return Ok(None);
    };
    let (kind_name, unit) = (t.string(st.type_strindex)?, t.string(st.unit_strindex)?);
    let kind = if kind_name == "off_cpu" {
        Kind::OffCpu
    } else {
        Kind::OnCpu
    };
    let period_ns = match &p.period_type {
        Some(pt) if kind == Kind::OnCpu && t.string(pt.unit_strindex)? == "nanoseconds" => {
            u64::try_from(p.period).ok().filter(|&n| n > 0)
        }
        _ => None,
    };
    let scale = match unit {
        "nanoseconds" => 1,
        "count" if kind == Kind::OnCpu => match period_ns {
            Some(n) => n,
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    Ok(Some(Values {
        kind,
        scale,
        period_ns,
    }))
}

/// Decodes one ProfilesData into `out`; `path` names it in errors.
fn add(data: &ProfilesData, path: &Path, out: &mut Decoded) -> Result<(), DecodeError> {
    let invalid = |what: String| DecodeError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    let empty = ProfilesDictionary::default();
    let t = Tables {
        d: data.dictionary.as_ref().unwrap_or(&empty),
    };
    for rp in &data.resource_profiles {
        let pid = rp.resource.as_ref().and_then(|r| {
            r.attributes
                .iter()
                .find(|kv| kv.key == "process.pid")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::IntValue(i) => Some(*i),
                    Value::StringValue(s) => s.parse().ok(),
                    _ => None,
                })
        });
        if let Some(pid) = pid {
            out.pids.push(pid);
        }
        for p in rp.scope_profiles.iter().flat_map(|s| &s.profiles) {
            let Some(values) = values_of(&t, p).map_err(invalid)? else {
                let name = p
                    .sample_type
                    .as_ref()
                    .map(|st| {
                        format!(
                            "{}/{}",
                            t.string(st.type_strindex).unwrap_or("?"),
                            t.string(st.unit_strindex).unwrap_or("?")
                        )
                    })
                    .unwrap_or_else(|| "no sample type".into());
                out.skipped.push(name);
                continue;
            };
            add_profile(&t, p, &values, &mut out.profile).map_err(invalid)?;
        }
    }
    Ok(())
}

fn add_profile(
    t: &Tables,
    p: &OtlpProfile,
    values: &Values,
    out: &mut Profile,
) -> Result<(), String> {
    let kind = values.kind;
    if kind == Kind::OffCpu {
        out.off_cpu = true;
    }
    if let (Some(period), 0) = (values.period_ns, out.period_ns) {
        out.period_ns = period;
        out.hz = 1_000_000_000 / period;
    }
    if p.time_unix_nano > 0 {
        let end = p.time_unix_nano.saturating_add(p.duration_nano);
        let old_end = out.start_unix_ns + out.duration_ns;
        if out.start_unix_ns == 0 || p.time_unix_nano < out.start_unix_ns {
            out.start_unix_ns = p.time_unix_nano;
        }
        out.duration_ns = end.max(old_end) - out.start_unix_ns;
        // Events carry wall-clock times: the model's clock is the wall clock.
        out.start_monotonic_ns = out.start_unix_ns;
    }
    for (n, s) in p.samples.iter().enumerate() {
        let ns = |v: i64| -> Result<u64, String> {
            u64::try_from(v)
                .ok()
                .and_then(|v| v.checked_mul(values.scale))
                .ok_or_else(|| format!("sample {n}: value {v} is not a duration"))
        };
        let events: Vec<(u64, u64)> = if s.timestamps_unix_nano.is_empty() {
            let mut events = Vec::new();
            for &v in &s.values {
                let v = ns(v)?;
                match out.period_ns {
                    // One summed value: one event per sampling period.
                    period if kind == Kind::OnCpu && period > 0 && v % period == 0 => {
                        events.extend(std::iter::repeat_n((0, period), (v / period) as usize))
                    }
                    _ => events.push((0, v)),
                }
            }
            events
        } else if s.values.is_empty() {
            // Events with times and no values (as the OpenTelemetry eBPF
            // profiler sends them): the proto says each counts 1.
            let one = ns(1)?;
            s.timestamps_unix_nano
                .iter()
                .map(|&time| (time, one))
                .collect()
        } else if s.timestamps_unix_nano.len() == s.values.len() {
            let mut events = Vec::with_capacity(s.values.len());
            for (&time, &v) in s.timestamps_unix_nano.iter().zip(&s.values) {
                events.push((time, ns(v)?));
            }
            events
        } else {
            return Err(format!(
                "sample {n}: {} but {}",
                crate::count(s.values.len() as u64, "value", "values"),
                crate::count(
                    s.timestamps_unix_nano.len() as u64,
                    "timestamp",
                    "timestamps"
                )
            ));
        };
        if events.is_empty() {
            continue;
        }
        let span = t.span(s.link_index)?;
        let mut entry = Entry {
            kind,
            state: State::Running,
            tid: 0,
            thread_name: String::new(),
            span,
            threadpool: false,
            attributes: Vec::new(),
            frames: t.frames(s.stack_index)?,
            events,
        };
        let mut state = None;
        let mut root = None;
        for &i in &s.attribute_indices {
            let (key, value) = t.attribute(i)?;
            match key {
                "thread.id" => entry.tid = value.parse().unwrap_or(0),
                "thread.name" => entry.thread_name = value,
                "thread.state" => state = Some(value),
                "thread.pool" => entry.threadpool = value == "true",
                SPAN_ID_KEY => root = Some(value),
                _ => entry.attributes.push((key.to_string(), value)),
            }
        }
        if let Some(root) = root {
            if entry.local_root_span_id().is_none() {
                entry
                    .attributes
                    .push((attrs::LOCAL_ROOT_SPAN_ID_KEY.to_string(), root));
            }
        }
        entry.state = match (state.as_deref(), kind, entry.span.is_some()) {
            (Some("running"), _, _) | (_, Kind::OnCpu, _) => State::Running,
            (Some("blocked"), _, _) | (None, Kind::OffCpu, true) => State::Blocked,
            _ => State::Idle,
        };
        out.entries.push(entry);
    }
    Ok(())
}

/// Decodes the bytes of one file.
pub fn decode(bytes: &[u8], path: &Path, out: &mut Decoded) -> Result<(), DecodeError> {
    let data = ProfilesData::decode(bytes).map_err(|source| DecodeError::NotProtobuf {
        path: path.to_path_buf(),
        source,
    })?;
    if data.resource_profiles.is_empty() {
        return Err(DecodeError::Empty {
            path: path.to_path_buf(),
        });
    }
    add(&data, path, out)
}

/// Reads and merges the files, in order. The profile's `pid` is the pid of
/// the only process the files hold (0 when they hold several); with several,
/// each sample gets a `process.pid` attribute.
pub fn read_files(paths: &[impl AsRef<Path>]) -> Result<Decoded, DecodeError> {
    let mut out = Decoded::default();
    // Where each file's samples start, and its processes' pids.
    let mut spans: Vec<(usize, Vec<i64>)> = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| DecodeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let (first_entry, first_pid) = (out.profile.entries.len(), out.pids.len());
        decode(&bytes, path, &mut out)?;
        spans.push((first_entry, out.pids[first_pid..].to_vec()));
    }
    finish(&mut out, &spans);
    Ok(out)
}

/// Sets the pid, and with several processes, tags the samples with theirs
/// where a file holds only one.
fn finish(out: &mut Decoded, files: &[(usize, Vec<i64>)]) {
    let distinct: BTreeSet<i64> = out.pids.iter().copied().collect();
    if distinct.len() == 1 {
        out.profile.pid = out.pids[0] as i32;
        return;
    }
    let mut ends: Vec<usize> = files.iter().skip(1).map(|&(start, _)| start).collect();
    ends.push(out.profile.entries.len());
    for ((start, pids), end) in files.iter().zip(ends) {
        if let [pid] = pids.as_slice() {
            for e in &mut out.profile.entries[*start..end] {
                e.attributes.push(("process.pid".into(), pid.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{data, request, SpanProfiles};
    use otel_thread_ctx_otlp::{KeyValue, Resource};

    fn resource(pid: i64) -> Resource {
        Resource {
            attributes: vec![
                KeyValue::new("service.name", AnyValue::string("svc")),
                KeyValue::new("process.pid", AnyValue::int(pid)),
            ],
            dropped_attributes_count: 0,
        }
    }

    fn round_trip(p: &Profile, mode: Option<SpanProfiles>) -> Decoded {
        let bytes = data(request(p, resource(42), mode)).encode_to_vec();
        let mut out = Decoded::default();
        decode(&bytes, Path::new("x.otlp.pb"), &mut out).unwrap();
        out
    }

    #[test]
    fn a_profile_comes_back_from_its_otlp_bytes() {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        p.start_unix_ns = 1_000_000_000;
        p.start_monotonic_ns = 500;
        p.duration_ns = 2_000_000_000;
        // A JavaScript frame at a line comes back at it.
        p.entries[0].frames[1].line = Some(7);
        let back = round_trip(&p, None).profile;
        assert_eq!(back.period_ns, p.period_ns);
        assert_eq!(back.hz, 100);
        assert!(back.off_cpu);
        assert_eq!(back.start_unix_ns, p.start_unix_ns);
        assert_eq!(back.duration_ns, p.duration_ns);
        assert_eq!(back.entries.len(), p.entries.len());
        // On-CPU entries first, then off-CPU ones, each in the model's order.
        let mut expected: Vec<&Entry> =
            p.entries.iter().filter(|e| e.kind == Kind::OnCpu).collect();
        expected.extend(p.entries.iter().filter(|e| e.kind == Kind::OffCpu));
        for (a, b) in expected.iter().zip(&back.entries) {
            assert_eq!(a.kind, b.kind);
            assert_eq!(a.state, b.state);
            assert_eq!(a.tid, b.tid);
            assert_eq!(a.thread_name, b.thread_name);
            assert_eq!(a.span, b.span);
            assert_eq!(a.threadpool, b.threadpool);
            assert_eq!(a.attributes, b.attributes);
            assert_eq!(a.frames, b.frames);
            // Times come back on the wall clock.
            let times: Vec<(u64, u64)> = a.events.iter().map(|&(t, v)| (p.unix_ns(t), v)).collect();
            assert_eq!(times, b.events);
        }
        assert_eq!(back.on_cpu_samples(), p.on_cpu_samples());
        assert_eq!(back.off_cpu_ns(), p.off_cpu_ns());
    }

    #[test]
    fn pool_threads_and_unnamed_spans_come_back() {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        p.entries[0].threadpool = true;
        p.entries[0].attributes.clear();
        let back = round_trip(&p, None).profile;
        assert!(back.entries[0].threadpool);
        assert!(back.entries[0].attributes.is_empty());
        assert!(back.entries[0].span_name().is_none());
        assert!(!back.entries[1].threadpool);
    }

    #[test]
    fn the_span_profile_form_comes_back_as_samples_of_the_period() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let back = round_trip(&p, Some(SpanProfiles::Root)).profile;
        assert_eq!(back.on_cpu_samples(), p.on_cpu_samples());
        assert_eq!(back.off_cpu_ns(), p.off_cpu_ns());
        let first = back.entries.iter().find(|e| e.span.is_some()).unwrap();
        assert_eq!(first.events, [(0, 10_000_000), (0, 10_000_000)]);
        assert_eq!(first.local_root_span_id(), Some("0707070707070707"));
        assert_eq!(first.endpoint().as_deref(), Some("/a"));
        assert!(!first.attributes.iter().any(|(k, _)| k == SPAN_ID_KEY));
    }

    #[test]
    fn samples_with_times_and_no_values_count_one_each() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let times = |d: &mut ProfilesData| {
            let profile = &mut d.resource_profiles[0].scope_profiles[0].profiles[0];
            let sample = &mut profile.samples[0];
            sample.values.clear();
            sample.timestamps_unix_nano = vec![1, 2, 3];
        };
        let first_events = |d: &ProfilesData| {
            let mut out = Decoded::default();
            decode(&d.encode_to_vec(), Path::new("x.otlp.pb"), &mut out).unwrap();
            let first = out.profile.entries[0].clone();
            assert_eq!(first.kind, Kind::OnCpu);
            first.events
        };
        // CPU time in nanoseconds: 1 ns each.
        let mut d = data(request(&p, resource(42), None));
        times(&mut d);
        assert_eq!(first_events(&d), [(1, 1), (2, 1), (3, 1)]);
        // A count of samples: each is one sampling period.
        let mut d = data(request(&p, resource(42), None));
        times(&mut d);
        let strings = &mut d.dictionary.as_mut().unwrap().string_table;
        strings.push("count".into());
        let count = (strings.len() - 1) as i32;
        let profile = &mut d.resource_profiles[0].scope_profiles[0].profiles[0];
        profile.sample_type.as_mut().unwrap().unit_strindex = count;
        let period = p.period_ns;
        assert_eq!(first_events(&d), [(1, period), (2, period), (3, period)]);
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let bytes = data(request(&p, resource(42), None)).encode_to_vec();
        let path = Path::new("f");
        let mut out = Decoded::default();
        // Every truncation is an error: not a protobuf, or a dictionary
        // that lacks what the samples name.
        for len in 1..bytes.len() {
            assert!(
                decode(&bytes[..len], path, &mut Decoded::default()).is_err(),
                "{len} of {}",
                bytes.len()
            );
        }
        let e = decode(b"", path, &mut out).unwrap_err();
        assert!(e.to_string().contains("holds no profiles"), "{e}");
        let e = decode(b"\xff\xff\xff", path, &mut out).unwrap_err();
        assert!(e.to_string().contains("not an OTLP ProfilesData"), "{e}");
        // Indices outside the tables.
        let mut d = data(request(&p, resource(42), None));
        d.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 9999;
        let e = decode(&d.encode_to_vec(), path, &mut out).unwrap_err();
        assert!(e.to_string().contains("stack index 9999"), "{e}");
        let mut d = data(request(&p, resource(42), None));
        d.resource_profiles[0].scope_profiles[0].profiles[0].samples[0]
            .timestamps_unix_nano
            .push(1);
        let e = decode(&d.encode_to_vec(), path, &mut out).unwrap_err();
        assert!(e.to_string().contains("3 timestamps"), "{e}");
    }

    #[test]
    fn files_merge_and_several_processes_tag_their_samples() {
        let dir =
            std::env::temp_dir().join(format!("otel-thread-ctx-decode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let a = dir.join("a.otlp.pb");
        let b = dir.join("b.otlp.pb");
        std::fs::write(&a, data(request(&p, resource(1), None)).encode_to_vec()).unwrap();
        std::fs::write(&b, data(request(&p, resource(2), None)).encode_to_vec()).unwrap();
        let one = read_files(&[&a]).unwrap();
        assert_eq!(one.profile.pid, 1);
        assert!(one
            .profile
            .entries
            .iter()
            .all(|e| e.attribute("process.pid").is_none()));
        let both = read_files(&[&a, &b]).unwrap();
        assert_eq!(both.profile.pid, 0);
        assert_eq!(both.pids, [1, 2]);
        assert_eq!(both.profile.on_cpu_samples(), 2 * p.on_cpu_samples());
        assert_eq!(
            both.profile
                .entries
                .last()
                .unwrap()
                .attribute("process.pid"),
            Some("2")
        );
        let e = read_files(&[dir.join("missing")]).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
