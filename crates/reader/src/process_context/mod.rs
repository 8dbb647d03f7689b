//! The OTEP 4719 process context: a mapping named `OTEL_CTX` holding a
//! 32-byte header and a pointer to a protobuf `ProcessContext` payload.
//!
//! Unlike thread context, the writer may update this while we read, so the
//! reader protocol is followed: a non-zero timestamp, the payload copy, then
//! the same timestamp again, else retry.
//!
//! This module is the reader protocol (find the mapping, read the header,
//! retry until it settles, decode the payload); [`json`] presents the
//! decoded attributes.

pub mod json;

use std::time::Duration;

use otel_thread_ctx_abi::node_schema::{self, V8Layout, DEFAULT_LAYOUT, LAYOUT_KEYS};
use otel_thread_ctx_abi::process_context::{
    HEADER_SIZE, KEY_MAP_KEY, KNOWN_SCHEMAS, MAPPING_PATHS, MAX_KEYS, MAX_PAYLOAD_BYTES,
    OFFSET_PAYLOAD, OFFSET_PAYLOAD_SIZE, OFFSET_PUBLISHED_AT, OFFSET_SIGNATURE, OFFSET_VERSION,
    RESERVED_PREFIX, SCHEMA_VERSION_KEY, SIGNATURE, VERSION,
};
use prost::Message;

use crate::maps::Mapping;
use crate::memory::{Memory, MemoryError};

const ATTEMPTS: u32 = 50;
const RETRY_DELAY: Duration = Duration::from_micros(500);

pub use otel_thread_ctx_otlp::{any_value, AnyValue, KeyValue, ProcessContext, Resource};

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
            signature: b[OFFSET_SIGNATURE..OFFSET_SIGNATURE + 8]
                .try_into()
                .unwrap(),
            version: u32_at(OFFSET_VERSION),
            payload_size: u32_at(OFFSET_PAYLOAD_SIZE),
            published_at_ns: u64_at(OFFSET_PUBLISHED_AT),
            payload: u64_at(OFFSET_PAYLOAD),
        }
    }
}

/// A decoded process context.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub mapping: String,
    pub address: u64,
    pub header: Header,
    /// The resource, as published.
    pub resource: Option<Resource>,
    /// `ProcessContext.attributes`, as published.
    pub attributes: Vec<KeyValue>,
    /// `threadlocal.schema_version`, if published as a string.
    pub schema_version: Option<String>,
    /// `threadlocal.attribute_key_map`, if published as an array of strings.
    pub attribute_key_map: Option<Vec<String>>,
    /// The Node.js schema's V8 layout: the `threadlocal.*` layout keys
    /// published as integers, the schema's defaults for the others; `None`
    /// when no layout key is published.
    pub v8_layout: Option<V8Layout>,
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
    #[error("unsupported version {0} (supported: {VERSION})")]
    Version(u32),
    #[error("payload_size {0} is larger than {MAX_PAYLOAD_BYTES}")]
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
        .filter(|m| MAPPING_PATHS.contains(&m.name()))
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
        if header.signature != SIGNATURE {
            return Err(ReadError::Signature(header.signature));
        }
        if header.version != VERSION {
            return Err(ReadError::Version(header.version));
        }
        if header.published_at_ns == 0 {
            // The writer is mid-update.
            std::thread::sleep(RETRY_DELAY);
            continue;
        }
        if header.payload_size as usize > MAX_PAYLOAD_BYTES {
            return Err(ReadError::PayloadTooLarge(header.payload_size));
        }
        let mut payload = vec![0u8; header.payload_size as usize];
        mem.read(header.payload, &mut payload)
            .map_err(ReadError::Payload)?;
        // ORDER: each read is its own system call, so the payload copy is
        // complete before the timestamp is read again.
        let again = mem
            .read_u64(address + OFFSET_PUBLISHED_AT as u64)
            .map_err(ReadError::Header)?;
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
    let resource_kvs = ctx
        .resource
        .as_ref()
        .map(|r| r.attributes.as_slice())
        .unwrap_or(&[]);
    if resource_kvs
        .iter()
        .any(|kv| kv.key.starts_with(RESERVED_PREFIX))
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
    let schema_version = match find(SCHEMA_VERSION_KEY).and_then(|v| v.value.as_ref()) {
        Some(V::StringValue(s)) => {
            if !KNOWN_SCHEMAS.contains(&s.as_str()) && s != node_schema::SCHEMA_VERSION {
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
    let attribute_key_map = match find(KEY_MAP_KEY).and_then(|v| v.value.as_ref()) {
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
            } else if a.values.len() > MAX_KEYS {
                warnings.push(format!(
                        "threadlocal.attribute_key_map has {} keys (at most {MAX_KEYS} are addressable)",
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
    let mut layout_values = [None; LAYOUT_KEYS.len()];
    for (key, slot) in LAYOUT_KEYS.iter().zip(layout_values.iter_mut()) {
        match find(key).and_then(|v| v.value.as_ref()) {
            Some(V::IntValue(v)) if (0..=1 << 20).contains(v) => *slot = Some(*v as u64),
            Some(_) => warnings.push(format!(
                "{key} is not a small non-negative integer; the default is used"
            )),
            None => {}
        }
    }
    let v8_layout = layout_values.iter().any(Option::is_some).then(|| {
        let [record_offset, tagged_size, table_offset, header_size] = layout_values;
        V8Layout {
            js_object_record_offset: record_offset
                .unwrap_or(DEFAULT_LAYOUT.js_object_record_offset),
            tagged_size: tagged_size.unwrap_or(DEFAULT_LAYOUT.tagged_size),
            js_map_table_offset: table_offset.unwrap_or(DEFAULT_LAYOUT.js_map_table_offset),
            ordered_hash_map_header_size: header_size
                .unwrap_or(DEFAULT_LAYOUT.ordered_hash_map_header_size),
        }
    });
    Decoded {
        mapping,
        address,
        header,
        resource: ctx.resource.clone(),
        attributes: ctx.attributes.clone(),
        schema_version,
        attribute_key_map,
        v8_layout,
        warnings,
    }
}

impl Lookup {
    /// The V8 layout a Node.js-schema walk uses: the published one, else the
    /// schema's defaults.
    pub fn v8_layout(&self) -> V8Layout {
        match self {
            Lookup::Found(d) => d.v8_layout.unwrap_or(DEFAULT_LAYOUT),
            _ => DEFAULT_LAYOUT,
        }
    }

    /// Whether the process says it publishes the Node.js schema.
    pub fn publishes_nodejs_schema(&self) -> bool {
        matches!(self, Lookup::Found(d)
            if d.schema_version.as_deref() == Some(node_schema::SCHEMA_VERSION))
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
        assert_eq!(h.len(), OFFSET_VERSION);
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
        let resource = json::object(&d.resource.as_ref().unwrap().attributes);
        assert_eq!(resource["service.name"], "svc");
        assert_eq!(resource["pid"], 42);
        assert_eq!(d.schema_version.as_deref(), Some("tlsdesc_v1_dev"));
        assert_eq!(
            d.attribute_key_map,
            Some(vec!["http.route".into(), "user".into()])
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }

    #[test]
    fn node_schema_layout_keys_override_the_defaults() {
        let int = |v: i64| AnyValue {
            value: Some(any_value::Value::IntValue(v)),
        };
        let ctx = ProcessContext {
            resource: None,
            attributes: vec![
                kv("threadlocal.schema_version", s("nodejs_v1_dev")),
                kv("threadlocal.js_object_record_offset", int(0x38)),
                kv("threadlocal.tagged_size", s("eight")),
            ],
        };
        let mem = FakeMemory::default();
        let p = ctx.encode_to_vec();
        mem.put(0x1000, &header(9, p.len(), 0x5000));
        mem.put(0x5000, &p);
        let found = lookup(&[mapping(0x1000)], &mem);
        let Lookup::Found(d) = &found else { panic!() };
        assert_eq!(
            found.v8_layout(),
            V8Layout {
                js_object_record_offset: 0x38,
                ..DEFAULT_LAYOUT
            }
        );
        // The schema is known; the string tagged_size is not an integer.
        assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
        assert!(d.warnings[0].contains("threadlocal.tagged_size"));
        assert_eq!(Lookup::Absent.v8_layout(), DEFAULT_LAYOUT);
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
