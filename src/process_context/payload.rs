//! The process context payload and its encoding. The messages are the
//! workspace's shared OTLP declarations (`otlp-messages/`), the
//! `threadlocal.*` keys the ABI crate's.

use prost::Message;

use otel_thread_ctx_abi::node_schema::{self, V8Layout};
use otel_thread_ctx_abi::process_context::{KEY_MAP_KEY, SCHEMA_VERSION_KEY};
pub use otel_thread_ctx_otlp::{any_value, AnyValue, KeyValue, ProcessContext, Resource};

/// Everything one payload is built from.
pub struct Contents<'a> {
    /// Resource attributes, in publication order.
    pub resource: &'a [KeyValue],
    /// Extra `ProcessContext.attributes` besides the two `threadlocal.*` keys.
    pub attributes: &'a [KeyValue],
    /// Value of `threadlocal.schema_version`.
    pub schema_version: &'a str,
    /// `threadlocal.attribute_key_map`: index i names key index i of records.
    pub key_map: &'a [String],
    /// Frame mode's V8 layout: when present, the schema is the Node.js
    /// schema's (whatever `schema_version` says) and the layout keys follow.
    pub frame_layout: Option<V8Layout>,
}

/// Encodes a payload. The `threadlocal.*` attributes come first, then the
/// caller's extra attributes.
pub fn encode(contents: &Contents<'_>) -> Vec<u8> {
    let mut attributes = Vec::with_capacity(6 + contents.attributes.len());
    let schema_version = match contents.frame_layout {
        Some(_) => node_schema::SCHEMA_VERSION,
        None => contents.schema_version,
    };
    attributes.push(KeyValue::new(
        SCHEMA_VERSION_KEY,
        AnyValue::string(schema_version),
    ));
    attributes.push(KeyValue::new(KEY_MAP_KEY, key_map_value(contents.key_map)));
    if let Some(layout) = contents.frame_layout {
        let values = [
            layout.js_object_record_offset,
            layout.tagged_size,
            layout.js_map_table_offset,
            layout.ordered_hash_map_header_size,
        ];
        for (key, value) in node_schema::LAYOUT_KEYS.into_iter().zip(values) {
            attributes.push(KeyValue::new(key, AnyValue::int(value as i64)));
        }
    }
    attributes.extend_from_slice(contents.attributes);
    let message = ProcessContext {
        resource: Some(Resource {
            attributes: contents.resource.to_vec(),
            dropped_attributes_count: 0,
        }),
        attributes,
    };
    message.encode_to_vec()
}

/// The value of `threadlocal.attribute_key_map`: the keys, in index order.
pub fn key_map_value(key_map: &[String]) -> AnyValue {
    AnyValue::array(
        key_map
            .iter()
            .map(|key| AnyValue::string(key.as_str()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string_of(value: Option<&AnyValue>) -> &str {
        match value.and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s,
            other => panic!("expected a string value, got {other:?}"),
        }
    }

    #[test]
    fn frame_mode_announces_the_node_schema_and_its_layout() {
        let layout = node_schema::V8Layout {
            js_object_record_offset: 0x48,
            ..node_schema::DEFAULT_LAYOUT
        };
        let bytes = encode(&Contents {
            resource: &[],
            attributes: &[],
            schema_version: "tlsdesc_v1_dev",
            key_map: &[],
            frame_layout: Some(layout),
        });
        let decoded = ProcessContext::decode(bytes.as_slice()).unwrap();
        let value = |key: &str| {
            decoded
                .attributes
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.clone())
                .and_then(|v| v.value)
        };
        assert_eq!(
            value(SCHEMA_VERSION_KEY),
            Some(any_value::Value::StringValue(
                node_schema::SCHEMA_VERSION.into()
            ))
        );
        let ints: Vec<_> = node_schema::LAYOUT_KEYS.iter().map(|k| value(k)).collect();
        assert_eq!(
            ints,
            [0x48, 8, 0x18, 0x10].map(|v| Some(any_value::Value::IntValue(v)))
        );
    }

    #[test]
    fn roundtrip_keeps_resource_and_threadlocal_keys() {
        let resource = vec![
            KeyValue::new("service.name", AnyValue::string("checkout")),
            KeyValue::new("process.pid", AnyValue::int(4242)),
            KeyValue::new(
                "tags",
                AnyValue::array(vec![AnyValue::string("a"), AnyValue::int(-1)]),
            ),
            KeyValue::new(
                "nested",
                AnyValue::kvlist(vec![KeyValue::new("inner", AnyValue::string("x"))]),
            ),
        ];
        let extra = vec![KeyValue::new("custom", AnyValue::string("y"))];
        let key_map = vec!["http.route".to_string(), "user.id".to_string()];
        let bytes = encode(&Contents {
            resource: &resource,
            attributes: &extra,
            schema_version: "tlsdesc_v1_dev",
            frame_layout: None,
            key_map: &key_map,
        });

        let decoded = ProcessContext::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.resource.as_ref().unwrap().attributes, resource);
        assert_eq!(decoded.attributes.len(), 3);
        assert_eq!(decoded.attributes[0].key, SCHEMA_VERSION_KEY);
        assert_eq!(
            string_of(decoded.attributes[0].value.as_ref()),
            "tlsdesc_v1_dev"
        );
        assert_eq!(decoded.attributes[1].key, KEY_MAP_KEY);
        match decoded.attributes[1]
            .value
            .as_ref()
            .and_then(|v| v.value.as_ref())
        {
            Some(any_value::Value::ArrayValue(array)) => {
                let keys: Vec<&str> = array.values.iter().map(|v| string_of(Some(v))).collect();
                assert_eq!(keys, ["http.route", "user.id"]);
            }
            other => panic!("key map is not an array: {other:?}"),
        }
        assert_eq!(decoded.attributes[2], extra[0]);
    }

    #[test]
    fn wire_format_matches_hand_computed_bytes() {
        // ProcessContext{ resource{ attributes[{key:"k", value{int:1}}] },
        //                 attributes[schema "v", key map []] }, checked byte by
        // byte so a field-number or wire-type slip cannot hide behind a
        // roundtrip through the same declarations.
        let resource = vec![KeyValue::new("k", AnyValue::int(1))];
        let bytes = encode(&Contents {
            resource: &resource,
            attributes: &[],
            schema_version: "v",
            frame_layout: None,
            key_map: &[],
        });
        let mut expected = vec![
            0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, b'k', 0x12, 0x02, 0x18, 0x01,
        ];
        // attributes[0]: key "threadlocal.schema_version" (26 bytes), value {string "v"}
        expected.extend_from_slice(&[0x12, 0x21, 0x0a, 0x1a]);
        expected.extend_from_slice(SCHEMA_VERSION_KEY.as_bytes());
        expected.extend_from_slice(&[0x12, 0x03, 0x0a, 0x01, b'v']);
        // attributes[1]: key "threadlocal.attribute_key_map" (29 bytes), value {array {}}
        expected.extend_from_slice(&[0x12, 0x23, 0x0a, 0x1d]);
        expected.extend_from_slice(KEY_MAP_KEY.as_bytes());
        expected.extend_from_slice(&[0x12, 0x02, 0x2a, 0x00]);
        assert_eq!(bytes, expected);
    }
}
