//! The OTEP 4947 Thread-Local Context Record, as a reader sees it.

use opentelemetry::trace::{SpanId, TraceFlags, TraceId};
use otel_thread_ctx_abi::attrs;
use otel_thread_ctx_abi::record::{
    ATTRS_CAPACITY, OFFSET_ATTRS_DATA_SIZE, OFFSET_SPAN_ID, OFFSET_TRACE_FLAGS, OFFSET_TRACE_ID,
    OFFSET_VALID, VALID,
};
pub use otel_thread_ctx_abi::record::{HEADER_SIZE, RECORD_SIZE};

use crate::memory::{Memory, MemoryError};

/// Largest `attrs_data` a reader accepts: a whole record minus its header.
pub const MAX_ATTRS_DATA: usize = ATTRS_CAPACITY;

/// The decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// 1 = valid; any other value means "ignore this record".
    pub valid: u8,
    pub trace_flags: TraceFlags,
    pub attrs_data_size: u16,
}

/// The `N` bytes of `b` at `offset`.
fn bytes_at<const N: usize>(b: &[u8], offset: usize) -> [u8; N] {
    b[offset..offset + N]
        .try_into()
        .expect("the field lies inside the header")
}

impl Header {
    /// Decodes the header bytes (host endianness for the size field).
    pub fn parse(b: &[u8; HEADER_SIZE]) -> Header {
        Header {
            trace_id: TraceId::from_bytes(bytes_at(b, OFFSET_TRACE_ID)),
            span_id: SpanId::from_bytes(bytes_at(b, OFFSET_SPAN_ID)),
            valid: b[OFFSET_VALID],
            trace_flags: TraceFlags::new(b[OFFSET_TRACE_FLAGS]),
            attrs_data_size: u16::from_ne_bytes(bytes_at(b, OFFSET_ATTRS_DATA_SIZE)),
        }
    }

    /// True when the writer marked the record valid (valid byte is exactly 1).
    pub fn is_valid(&self) -> bool {
        self.valid == VALID
    }

    /// Which ids are all zero. W3C Trace Context makes such an id invalid, so
    /// a record marked valid that carries one names no span.
    pub fn zero_ids(&self) -> Option<ZeroIds> {
        let trace = self.trace_id == TraceId::INVALID;
        let span = self.span_id == SpanId::INVALID;
        match (trace, span) {
            (true, true) => Some(ZeroIds::Both),
            (true, false) => Some(ZeroIds::Trace),
            (false, true) => Some(ZeroIds::Span),
            (false, false) => None,
        }
    }

    /// True when the record names a span: marked valid, with ids that are
    /// not all zero.
    pub fn names_a_span(&self) -> bool {
        self.is_valid() && self.zero_ids().is_none()
    }
}

/// The all-zero ids of a record marked valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroIds {
    Trace,
    Span,
    Both,
}

impl std::fmt::Display for ZeroIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ZeroIds::Trace => "valid is 1 but trace_id is all zero",
            ZeroIds::Span => "valid is 1 but span_id is all zero",
            ZeroIds::Both => "valid is 1 but trace_id and span_id are all zero",
        })
    }
}

/// A record read from the target: header plus, when valid, its attrs_data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub address: u64,
    pub header: Header,
    pub attrs_data: Vec<u8>,
}

/// Why a record could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("record pointer {0:#x} is not 2-byte aligned")]
    Misaligned(u64),
    #[error("record header: {0}")]
    Header(#[source] MemoryError),
    #[error("attrs_data_size {0} exceeds the {MAX_ATTRS_DATA}-byte limit")]
    AttrsTooLarge(usize),
    #[error("attrs_data: {0}")]
    AttrsData(#[source] MemoryError),
}

/// Reads the record at `address` the way the specification describes: the
/// header first, then `attrs_data_size` bytes only if the record is valid
/// (and only when `with_attrs`). Bounded: never more than 640 bytes.
pub fn read(mem: &dyn Memory, address: u64, with_attrs: bool) -> Result<Record, ReadError> {
    if !address.is_multiple_of(2) {
        return Err(ReadError::Misaligned(address));
    }
    let mut b = [0u8; HEADER_SIZE];
    mem.read(address, &mut b).map_err(ReadError::Header)?;
    let header = Header::parse(&b);
    let mut attrs_data = Vec::new();
    if header.is_valid() {
        let size = header.attrs_data_size as usize;
        if size > MAX_ATTRS_DATA {
            return Err(ReadError::AttrsTooLarge(size));
        }
        if with_attrs && size > 0 {
            attrs_data.resize(size, 0);
            mem.read(address + HEADER_SIZE as u64, &mut attrs_data)
                .map_err(ReadError::AttrsData)?;
        }
    }
    Ok(Record {
        address,
        header,
        attrs_data,
    })
}

/// One attribute entry after "last occurrence wins".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attribute {
    pub key_index: u8,
    pub value: Vec<u8>,
}

/// The entries of an `attrs_data` buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// One entry per key index, in order of first appearance, holding the
    /// value of the last occurrence.
    pub entries: Vec<Attribute>,
    /// Bytes left at the end that could not hold a complete entry.
    pub trailing_bytes: usize,
}

/// The endpoint of a record's attributes: its `http.route`, after its
/// `http.request.method` when it has one (`GET /sort`), as the local root
/// published it for every span of its tree.
pub fn endpoint<'a>(attribute: impl Fn(&str) -> Option<&'a str>) -> Option<String> {
    let route = attribute(attrs::ROUTE_KEY)?;
    Some(match attribute(attrs::METHOD_KEY) {
        Some(method) => format!("{method} {route}"),
        None => route.to_string(),
    })
}

/// Splits `data` into entries with the ABI's codec, stopping at the first
/// incomplete one.
pub fn decode_attributes(data: &[u8]) -> Attributes {
    let mut out = Attributes::default();
    for entry in attrs::entries(data) {
        match entry {
            Ok(attrs::Entry { key_index, value }) => {
                let value = value.to_vec();
                match out.entries.iter_mut().find(|e| e.key_index == key_index) {
                    Some(e) => e.value = value,
                    None => out.entries.push(Attribute { key_index, value }),
                }
            }
            Err(truncated) => out.trailing_bytes = truncated.available,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::fake::FakeMemory;

    fn record_bytes(valid: u8, attrs: &[u8], claimed: u16) -> Vec<u8> {
        let mut b: Vec<u8> = (1..=24).collect();
        b.push(valid);
        b.push(0x01);
        b.extend_from_slice(&claimed.to_ne_bytes());
        b.extend_from_slice(attrs);
        b
    }

    #[test]
    fn reads_header_then_attrs_of_a_valid_record() {
        let mem = FakeMemory::default();
        let attrs = [0, 3, b'a', b'b', b'c', 1, 0];
        mem.put(0x1000, &record_bytes(1, &attrs, attrs.len() as u16));
        let r = read(&mem, 0x1000, true).unwrap();
        assert!(r.header.is_valid());
        assert_eq!(
            r.header.trace_id.to_string(),
            "0102030405060708090a0b0c0d0e0f10"
        );
        assert_eq!(r.header.span_id.to_string(), "1112131415161718");
        assert_eq!(r.header.trace_flags, TraceFlags::SAMPLED);
        assert_eq!(r.attrs_data, attrs);
    }

    #[test]
    fn all_zero_ids_name_no_span() {
        let mut h = Header::parse(&record_bytes(1, &[], 0)[..HEADER_SIZE].try_into().unwrap());
        assert!(h.names_a_span());
        assert_eq!(h.zero_ids(), None);
        let span = h.span_id;
        h.trace_id = TraceId::INVALID;
        assert_eq!(h.zero_ids(), Some(ZeroIds::Trace));
        assert!(h.is_valid() && !h.names_a_span());
        h.span_id = SpanId::INVALID;
        assert_eq!(h.zero_ids(), Some(ZeroIds::Both));
        h.trace_id = TraceId::from_bytes([0xff; 16]);
        assert_eq!(h.zero_ids(), Some(ZeroIds::Span));
        h.span_id = span;
        h.valid = 2;
        assert!(!h.names_a_span());
    }

    #[test]
    fn invalid_records_skip_the_attrs_read() {
        let mem = FakeMemory::default();
        // Claims attrs that are not mapped: must not be read when valid != 1.
        mem.put(0x1000, &record_bytes(2, &[], 40));
        let r = read(&mem, 0x1000, true).unwrap();
        assert!(!r.header.is_valid());
        assert!(r.attrs_data.is_empty());
    }

    #[test]
    fn garbage_is_an_error() {
        let mem = FakeMemory::default();
        mem.put(0x1000, &record_bytes(1, &[], 613));
        assert!(read(&mem, 0x1000, true)
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        assert!(read(&mem, 0x1001, true)
            .unwrap_err()
            .to_string()
            .contains("aligned"));
        assert!(read(&mem, 0x5000, true).is_err());
        // Valid record whose attrs run into unmapped memory.
        mem.put(0x2000, &record_bytes(1, &[0, 1], 100));
        assert!(read(&mem, 0x2000, true)
            .unwrap_err()
            .to_string()
            .contains("attrs_data"));
    }

    #[test]
    fn last_occurrence_wins_and_partial_entries_stop_parsing() {
        let a = decode_attributes(&[0, 1, b'x', 2, 2, b'h', b'i', 0, 1, b'y', 5, 9, b'z']);
        assert_eq!(
            a.entries,
            vec![
                Attribute {
                    key_index: 0,
                    value: b"y".to_vec()
                },
                Attribute {
                    key_index: 2,
                    value: b"hi".to_vec()
                }
            ]
        );
        assert_eq!(a.trailing_bytes, 3);
        assert_eq!(decode_attributes(&[7]).trailing_bytes, 1);
        assert_eq!(
            decode_attributes(&[7, 0]).entries,
            vec![Attribute {
                key_index: 7,
                value: vec![]
            }]
        );
    }
}
