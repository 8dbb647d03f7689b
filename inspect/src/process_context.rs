//! The OTEP 4719 process context: a mapping named `OTEL_CTX` holding a
//! 32-byte header and a pointer to a protobuf `ProcessContext` payload.
//!
//! Unlike thread context, the writer may update this while we read, so the
//! reader protocol is followed: a non-zero timestamp, the payload copy, then
//! the same timestamp again, else retry.

use std::time::Duration;

use prost::Message;
use serde_json::{Map, Value};

use crate::maps::Mapping;
use crate::memory::{Memory, MemoryError};

/// Names the mapping may carry in `/proc/<pid>/maps` (memfd names end in
/// ` (deleted)`, which [`Mapping::name`] strips).
pub const MAPPING_NAMES: [&str; 3] = [
    "/memfd:OTEL_CTX",
    "[anon:OTEL_CTX]",
    "[anon_shmem:OTEL_CTX]",
];
pub const SIGNATURE: &[u8; 8] = b"OTEL_CTX";
pub const SUPPORTED_VERSION: u32 = 2;
pub const HEADER_SIZE: usize = 32;
/// Payloads larger than this are treated as garbage.
pub const MAX_PAYLOAD: u32 = 1 << 20;
const ATTEMPTS: u32 = 50;
const RETRY_DELAY: Duration = Duration::from_micros(500);

/// Known `threadlocal.schema_version` values for the TLS record format.
pub const KNOWN_SCHEMAS: [&str; 2] = ["tlsdesc_v1_dev", "tls_v1"];

pub use otel_thread_ctx_otlp::{any_value, AnyValue, KeyValue, ProcessContext};

/// The 32-byte header at the start of the mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub signature: [u8; 8],
    pub version: u32,
    pub payload_size: u32,
    /// Publication time; 0 while the writer is updating.
    pub published_at_ns: u64,
    /// Payload address in the target.
    pub payload: u64,
}

impl Header {
    /// Decodes little-endian header bytes.
    pub fn parse(b: &[u8; HEADER_SIZE]) -> Header {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Header {
            signature: b[0..8].try_into().unwrap(),
            version: u32_at(8),
            payload_size: u32_at(12),
            published_at_ns: u64_at(16),
            payload: u64_at(24),
        }
    }
}

/// A decoded process context.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub mapping: String,
    pub address: u64,
    pub header: Header,
    /// Resource attributes, as JSON values (key order of the payload, last
    /// duplicate wins).
    pub resource: Map<String, Value>,
    /// `ProcessContext.attributes`, as JSON values.
    pub attributes: Map<String, Value>,
    /// `threadlocal.schema_version`, if published as a string.
    pub schema_version: Option<String>,
    /// `threadlocal.attribute_key_map`, if published as an array of strings.
    pub attribute_key_map: Option<Vec<String>>,
    /// Deviations from the specification that did not prevent decoding.
    pub warnings: Vec<String>,
}

/// Why the header and payload could not be read consistently.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("header: {0}")]
    Header(#[source] MemoryError),
    #[error("signature {:?} is not OTEL_CTX", String::from_utf8_lossy(.0))]
    Signature([u8; 8]),
    #[error("unsupported version {0} (supported: {SUPPORTED_VERSION})")]
    Version(u32),
    #[error("payload_size {0} is larger than {MAX_PAYLOAD}")]
    PayloadTooLarge(u32),
    #[error("payload: {0}")]
    Payload(#[source] MemoryError),
    #[error("the context stayed mid-update over {ATTEMPTS} attempts")]
    NeverSettled,
}

/// Why a mapping named `OTEL_CTX` holds no usable process context.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("payload is not a ProcessContext protobuf: {0}")]
    Decode(#[source] prost::DecodeError),
}

/// Result of looking for the process context.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// No mapping carries one of the OTEL_CTX names.
    Absent,
    /// A mapping exists but could not be read or decoded.
    Invalid {
        mapping: String,
        address: u64,
        error: LookupError,
    },
    Found(Box<Decoded>),
}

/// Finds and decodes the process context of the process whose maps are `maps`.
pub fn lookup(maps: &[Mapping], mem: &dyn Memory) -> Lookup {
    let candidates: Vec<&Mapping> = maps
        .iter()
        .filter(|m| MAPPING_NAMES.contains(&m.name()))
        .collect();
    if candidates.is_empty() {
        return Lookup::Absent;
    }
    let mut last_error = None;
    for m in &candidates {
        match read_consistent(mem, m.start) {
            Ok((header, payload)) => {
                let mut warnings = Vec::new();
                if candidates.len() > 1 {
                    warnings.push(format!(
                        "{} OTEL_CTX mappings; the process context should be a singleton",
                        candidates.len()
                    ));
                }
                let pages = m.len() / 4096;
                if !(m.len() % 4096 == 0 && (pages == 1 || pages == 2)) {
                    warnings.push(format!(
                        "mapping is {} bytes; readers expect exactly 1 or 2 pages",
                        m.len()
                    ));
                }
                if !["rw-p", "r--p", "rw-s"].contains(&m.perms.as_str()) {
                    warnings.push(format!(
                        "mapping permissions {} (readers expect rw-p, r--p or rw-s)",
                        m.perms
                    ));
                }
                return match decode(&payload) {
                    Ok(ctx) => Lookup::Found(Box::new(interpret(
                        m.name().to_string(),
                        m.start,
                        header,
                        &ctx,
                        warnings,
                    ))),
                    Err(e) => Lookup::Invalid {
                        mapping: m.name().to_string(),
                        address: m.start,
                        error: LookupError::Decode(e),
                    },
                };
            }
            Err(e) => last_error = Some((m, e)),
        }
    }
    let (m, e) = last_error.expect("every candidate was tried and failed");
    Lookup::Invalid {
        mapping: m.name().to_string(),
        address: m.start,
        error: e.into(),
    }
}

/// The OTEP 4719 reader protocol: returns a header and a payload copy that
/// belong together, retrying while the writer is mid-update.
pub fn read_consistent(mem: &dyn Memory, address: u64) -> Result<(Header, Vec<u8>), ReadError> {
    let mut b = [0u8; HEADER_SIZE];
    for _ in 0..ATTEMPTS {
        mem.read(address, &mut b).map_err(ReadError::Header)?;
        let header = Header::parse(&b);
        if &header.signature != SIGNATURE {
            return Err(ReadError::Signature(header.signature));
        }
        if header.version != SUPPORTED_VERSION {
            return Err(ReadError::Version(header.version));
        }
        if header.published_at_ns == 0 {
            // The writer is mid-update.
            std::thread::sleep(RETRY_DELAY);
            continue;
        }
        if header.payload_size > MAX_PAYLOAD {
            return Err(ReadError::PayloadTooLarge(header.payload_size));
        }
        let mut payload = vec![0u8; header.payload_size as usize];
        mem.read(header.payload, &mut payload)
            .map_err(ReadError::Payload)?;
        // ORDER: each read is its own system call, so the payload copy is
        // complete before the timestamp is read again.
        let again = mem.read_u64(address + 16).map_err(ReadError::Header)?;
        if u64::from_le(again) == header.published_at_ns {
            return Ok((header, payload));
        }
        std::thread::sleep(RETRY_DELAY);
    }
    Err(ReadError::NeverSettled)
}

/// Decodes a `ProcessContext` payload.
pub fn decode(payload: &[u8]) -> Result<ProcessContext, prost::DecodeError> {
    ProcessContext::decode(payload)
}

fn interpret(
    mapping: String,
    address: u64,
    header: Header,
    ctx: &ProcessContext,
    mut warnings: Vec<String>,
) -> Decoded {
    let to_map = |kvs: &[KeyValue]| {
        let mut m = Map::new();
        for kv in kvs {
            m.insert(
                kv.key.clone(),
                kv.value.as_ref().map_or(Value::Null, any_to_json),
            );
        }
        m
    };
    let resource_kvs = ctx
        .resource
        .as_ref()
        .map(|r| r.attributes.as_slice())
        .unwrap_or(&[]);
    if resource_kvs
        .iter()
        .any(|kv| kv.key.starts_with("threadlocal."))
    {
        warnings.push(
            "threadlocal.* keys found in the resource; they belong in ProcessContext.attributes"
                .into(),
        );
    }
    let find = |key: &str| {
        ctx.attributes
            .iter()
            .rev()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
    };
    use any_value::Value as V;
    let schema_version = match find("threadlocal.schema_version").and_then(|v| v.value.as_ref()) {
        Some(V::StringValue(s)) => {
            if !KNOWN_SCHEMAS.contains(&s.as_str()) {
                warnings.push(format!(
                    "threadlocal.schema_version {s:?} is not a TLS record schema this reader knows"
                ));
            }
            Some(s.clone())
        }
        Some(_) => {
            warnings.push("threadlocal.schema_version is not a string".into());
            None
        }
        None => None,
    };
    let attribute_key_map =
        match find("threadlocal.attribute_key_map").and_then(|v| v.value.as_ref()) {
            Some(V::ArrayValue(a)) => {
                let keys: Option<Vec<String>> = a
                    .values
                    .iter()
                    .map(|v| match &v.value {
                        Some(V::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .collect();
                if keys.is_none() {
                    warnings.push("threadlocal.attribute_key_map holds non-string values".into());
                } else if a.values.len() > 256 {
                    warnings.push(format!(
                        "threadlocal.attribute_key_map has {} keys (at most 256 are addressable)",
                        a.values.len()
                    ));
                }
                keys
            }
            Some(_) => {
                warnings.push("threadlocal.attribute_key_map is not an array".into());
                None
            }
            None => None,
        };
    Decoded {
        mapping,
        address,
        header,
        resource: to_map(resource_kvs),
        attributes: to_map(&ctx.attributes),
        schema_version,
        attribute_key_map,
        warnings,
    }
}

/// Converts an OTLP `AnyValue` to JSON: strings, booleans and numbers as
/// such, arrays as arrays, kvlists as objects, bytes as lowercase hex.
pub fn any_to_json(v: &AnyValue) -> Value {
    use any_value::Value as V;
    match &v.value {
        None => Value::Null,
        Some(V::StringValue(s)) => Value::String(s.clone()),
        Some(V::BoolValue(b)) => Value::Bool(*b),
        Some(V::IntValue(i)) => Value::from(*i),
        Some(V::DoubleValue(d)) => {
            serde_json::Number::from_f64(*d).map_or(Value::Null, Value::Number)
        }
        Some(V::ArrayValue(a)) => Value::Array(a.values.iter().map(any_to_json).collect()),
        Some(V::KvlistValue(l)) => Value::Object(
            l.values
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        kv.value.as_ref().map_or(Value::Null, any_to_json),
                    )
                })
                .collect(),
        ),
        Some(V::BytesValue(b)) => Value::String(crate::record::hex(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::fake::FakeMemory;
    use otel_thread_ctx_otlp::{ArrayValue, Resource};

    fn s(v: &str) -> AnyValue {
        AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }
    }

    fn kv(k: &str, v: AnyValue) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(v),
        }
    }

    fn payload() -> Vec<u8> {
        ProcessContext {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s("svc")),
                    kv(
                        "pid",
                        AnyValue {
                            value: Some(any_value::Value::IntValue(42)),
                        },
                    ),
                ],
                dropped_attributes_count: 0,
            }),
            attributes: vec![
                kv("threadlocal.schema_version", s("tlsdesc_v1_dev")),
                kv(
                    "threadlocal.attribute_key_map",
                    AnyValue {
                        value: Some(any_value::Value::ArrayValue(ArrayValue {
                            values: vec![s("http.route"), s("user")],
                        })),
                    },
                ),
            ],
        }
        .encode_to_vec()
    }

    fn header(ts: u64, size: usize, at: u64) -> Vec<u8> {
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&2u32.to_le_bytes());
        h.extend_from_slice(&(size as u32).to_le_bytes());
        h.extend_from_slice(&ts.to_le_bytes());
        h.extend_from_slice(&at.to_le_bytes());
        h
    }

    fn mapping(start: u64) -> Mapping {
        Mapping {
            start,
            end: start + 4096,
            perms: "rw-p".into(),
            offset: 0,
            inode: 7,
            path: "/memfd:OTEL_CTX (deleted)".into(),
        }
    }

    #[test]
    fn decodes_resource_and_threadlocal_keys() {
        let mem = FakeMemory::default();
        let p = payload();
        mem.put(0x1000, &header(123, p.len(), 0x5000));
        mem.put(0x5000, &p);
        let Lookup::Found(d) = lookup(&[mapping(0x1000)], &mem) else {
            panic!()
        };
        assert_eq!(d.header.published_at_ns, 123);
        assert_eq!(d.resource["service.name"], "svc");
        assert_eq!(d.resource["pid"], 42);
        assert_eq!(d.schema_version.as_deref(), Some("tlsdesc_v1_dev"));
        assert_eq!(
            d.attribute_key_map,
            Some(vec!["http.route".into(), "user".into()])
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }

    #[test]
    fn retries_while_the_writer_updates() {
        let mem = FakeMemory::default();
        let p = payload();
        mem.put(0x1000, &header(0, p.len(), 0x5000));
        mem.put(0x5000, &p);
        // Reads see: timestamp 0, then 5, then (re-read) 6, then stable 6.
        let mut n = 0;
        *mem.on_read.borrow_mut() = Some(Box::new(move |regions: &mut Vec<(u64, Vec<u8>)>| {
            n += 1;
            let ts: u64 = match n {
                1 => 0,
                2 | 3 => 5,
                _ => 6,
            };
            regions[0].1[16..24].copy_from_slice(&ts.to_le_bytes());
        }));
        let (h, got) = read_consistent(&mem, 0x1000).unwrap();
        assert_eq!(h.published_at_ns, 6);
        assert_eq!(got, p);
    }

    #[test]
    fn a_context_that_never_settles_is_an_error() {
        let mem = FakeMemory::default();
        mem.put(0x1000, &header(0, 4, 0x5000));
        assert!(read_consistent(&mem, 0x1000)
            .unwrap_err()
            .to_string()
            .contains("mid-update"));
    }

    #[test]
    fn bad_signature_version_or_payload_is_reported() {
        let mem = FakeMemory::default();
        let mut h = header(1, 3, 0x5000);
        h[0] = b'X';
        mem.put(0x1000, &h);
        assert!(matches!(
            lookup(&[mapping(0x1000)], &mem),
            Lookup::Invalid { .. }
        ));
        let mut h = header(1, 3, 0x5000);
        h[8] = 9;
        mem.put(0x1000, &h);
        assert!(read_consistent(&mem, 0x1000)
            .unwrap_err()
            .to_string()
            .contains("version"));
        mem.put(0x1000, &header(1, 3, 0x5000));
        mem.put(0x5000, &[0xff, 0xff, 0xff]);
        assert!(matches!(
            lookup(&[mapping(0x1000)], &mem),
            Lookup::Invalid { .. }
        ));
        assert_eq!(lookup(&[], &mem), Lookup::Absent);
    }
}
