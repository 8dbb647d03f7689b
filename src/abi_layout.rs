//! The wire layout as a JavaScript object, so the JavaScript writer takes
//! its offsets and limits from `otel_thread_ctx_abi` instead of declaring
//! them again (`js/abi.js` loads it once and freezes it).

use napi_derive::napi;
use otel_thread_ctx_abi::{attrs, process_context as pc, record};

/// Byte offsets of the record fields.
#[napi(object)]
pub struct RecordOffsets {
    pub trace_id: u32,
    pub span_id: u32,
    pub valid: u32,
    pub trace_flags: u32,
    pub attrs_data_size: u32,
    pub attrs_data: u32,
}

/// The OTEP 4947 record.
#[napi(object)]
pub struct RecordLayout {
    pub header_size: u32,
    pub size: u32,
    pub attrs_capacity: u32,
    pub offsets: RecordOffsets,
    /// The `valid` byte of a complete, current record.
    pub valid: u32,
    pub tls_symbol: String,
}

/// The `attrs_data` entry codec.
#[napi(object)]
pub struct AttrsLayout {
    pub max_value_bytes: u32,
    pub span_name_key: String,
    pub local_root_span_id_key: String,
    pub route_key: String,
}

/// The OTEP 4719 process context.
#[napi(object)]
pub struct ProcessContextLayout {
    pub signature: String,
    pub version: u32,
    pub header_size: u32,
    pub max_payload_bytes: u32,
    pub max_keys: u32,
    pub mapping_name: String,
    pub schema_version_key: String,
    pub key_map_key: String,
    pub default_schema_version: String,
}

/// Everything `abiLayout()` returns.
#[napi(object)]
pub struct AbiLayout {
    pub record: RecordLayout,
    pub attrs: AttrsLayout,
    pub process_context: ProcessContextLayout,
}

/// A size or offset as a JavaScript number. The largest value,
/// `MAX_PAYLOAD_BYTES`, is asserted by the ABI crate to fit in a `u32`.
const fn n(value: usize) -> u32 {
    value as u32
}

/// The layout of `otel_thread_ctx_abi`.
pub fn layout() -> AbiLayout {
    AbiLayout {
        record: RecordLayout {
            header_size: n(record::HEADER_SIZE),
            size: n(record::RECORD_SIZE),
            attrs_capacity: n(record::ATTRS_CAPACITY),
            offsets: RecordOffsets {
                trace_id: n(record::OFFSET_TRACE_ID),
                span_id: n(record::OFFSET_SPAN_ID),
                valid: n(record::OFFSET_VALID),
                trace_flags: n(record::OFFSET_TRACE_FLAGS),
                attrs_data_size: n(record::OFFSET_ATTRS_DATA_SIZE),
                attrs_data: n(record::OFFSET_ATTRS_DATA),
            },
            valid: record::VALID.into(),
            tls_symbol: record::TLS_SYMBOL.to_owned(),
        },
        attrs: AttrsLayout {
            max_value_bytes: n(attrs::MAX_VALUE_BYTES),
            span_name_key: attrs::SPAN_NAME_KEY.into(),
            local_root_span_id_key: attrs::LOCAL_ROOT_SPAN_ID_KEY.into(),
            route_key: attrs::ROUTE_KEY.into(),
        },
        process_context: ProcessContextLayout {
            // The signature is ASCII, so the string is its 8 bytes.
            signature: String::from_utf8_lossy(&pc::SIGNATURE).into_owned(),
            version: pc::VERSION,
            header_size: n(pc::HEADER_SIZE),
            max_payload_bytes: n(pc::MAX_PAYLOAD_BYTES),
            max_keys: n(pc::MAX_KEYS),
            mapping_name: pc::MAPPING_NAME.to_owned(),
            schema_version_key: pc::SCHEMA_VERSION_KEY.to_owned(),
            key_map_key: pc::KEY_MAP_KEY.to_owned(),
            default_schema_version: pc::DEFAULT_SCHEMA_VERSION.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_string_is_its_bytes() {
        let layout = layout();
        assert_eq!(layout.process_context.signature.as_bytes(), pc::SIGNATURE);
        assert_eq!(
            layout.record.offsets.attrs_data as usize,
            record::HEADER_SIZE
        );
    }
}
