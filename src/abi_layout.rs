//! The wire layout as a JavaScript object, so the JavaScript writer takes
//! its offsets and limits from `otel_thread_ctx_abi` instead of declaring
//! them again (`js/abi.js` loads it once and freezes it).

use napi_derive::napi;
use otel_thread_ctx_abi::{attrs, node_schema as node, process_context as pc, record};

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

/// Byte offsets of the fields of the Node.js schema's thread block.
#[napi(object)]
pub struct NodeSchemaOffsets {
    pub cped_slot: u32,
    pub als_handle: u32,
    pub als_identity_hash: u32,
    pub undefined_addr: u32,
}

/// The V8 layout constants of the walk (`node_schema::V8Layout`).
#[napi(object)]
pub struct V8LayoutObject {
    pub js_object_record_offset: u32,
    pub tagged_size: u32,
    pub js_map_table_offset: u32,
    pub ordered_hash_map_header_size: u32,
}

/// The Node.js schema `nodejs_v1_dev`: the thread block and the walk's
/// constants, for samplers written in JavaScript or generated from it.
#[napi(object)]
pub struct NodeSchemaLayout {
    pub tls_symbol: String,
    pub schema_version: String,
    pub size: u32,
    pub offsets: NodeSchemaOffsets,
    /// The layout a reader uses when the process context names none.
    pub default_layout: V8LayoutObject,
    /// Process-context keys of the layout constants, in `default_layout` order.
    pub layout_keys: Vec<String>,
    pub table_prefix_words: u32,
    pub entry_words: u32,
    pub not_found: i32,
    pub max_chain_hops: u32,
    pub max_buckets: u32,
    pub heap_object_tag: u32,
    pub smi_shift: u32,
}

/// Everything `abiLayout()` returns.
#[napi(object)]
pub struct AbiLayout {
    pub record: RecordLayout,
    pub attrs: AttrsLayout,
    pub process_context: ProcessContextLayout,
    pub node_schema: NodeSchemaLayout,
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
        node_schema: node_schema(),
    }
}

/// The Node.js schema's part of the layout. Every constant is small (the
/// walk's bounds and word counts), so the narrowing casts are exact.
fn node_schema() -> NodeSchemaLayout {
    let layout = node::DEFAULT_LAYOUT;
    NodeSchemaLayout {
        tls_symbol: node::TLS_SYMBOL.to_owned(),
        schema_version: node::SCHEMA_VERSION.to_owned(),
        size: n(node::SIZE),
        offsets: NodeSchemaOffsets {
            cped_slot: n(node::OFFSET_CPED_SLOT),
            als_handle: n(node::OFFSET_ALS_HANDLE),
            als_identity_hash: n(node::OFFSET_ALS_IDENTITY_HASH),
            undefined_addr: n(node::OFFSET_UNDEFINED_ADDR),
        },
        default_layout: V8LayoutObject {
            js_object_record_offset: layout.js_object_record_offset as u32,
            tagged_size: layout.tagged_size as u32,
            js_map_table_offset: layout.js_map_table_offset as u32,
            ordered_hash_map_header_size: layout.ordered_hash_map_header_size as u32,
        },
        layout_keys: node::LAYOUT_KEYS.iter().map(|k| (*k).to_owned()).collect(),
        table_prefix_words: node::TABLE_PREFIX_WORDS as u32,
        entry_words: node::ENTRY_WORDS as u32,
        not_found: node::NOT_FOUND as i32,
        max_chain_hops: n(node::MAX_CHAIN_HOPS),
        max_buckets: node::MAX_BUCKETS as u32,
        heap_object_tag: node::HEAP_OBJECT_TAG as u32,
        smi_shift: node::SMI_SHIFT,
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

    #[test]
    fn the_node_schema_constants_are_exact() {
        let node_layout = layout().node_schema;
        assert_eq!(node_layout.size as usize, node::SIZE);
        assert_eq!(i64::from(node_layout.not_found), node::NOT_FOUND);
        assert_eq!(u64::from(node_layout.max_buckets), node::MAX_BUCKETS);
        assert_eq!(
            u64::from(node_layout.default_layout.js_object_record_offset),
            node::DEFAULT_LAYOUT.js_object_record_offset
        );
        assert_eq!(node_layout.layout_keys.len(), node::LAYOUT_KEYS.len());
    }
}
