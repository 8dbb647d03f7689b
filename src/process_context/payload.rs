//! The process context payload: protobuf messages and their encoding.
//!
//! The messages mirror the OTLP `opentelemetry.proto.common.v1` and
//! `opentelemetry.proto.resource.v1` definitions field for field (same
//! numbers, same wire types), declared with `prost` derive instead of
//! generated from `.proto` files so the build needs no `protoc`. Fields this
//! writer never sets (`Resource.entity_refs`) are left out; decoders skip
//! absent fields, so the bytes are a valid encoding of the full messages.
//!
//! `ProcessContext` is `opentelemetry.proto.processcontext.v1development.ProcessContext`:
//! `{ Resource resource = 1; repeated KeyValue attributes = 2; }`.

use prost::Message;

/// `opentelemetry.proto.common.v1.AnyValue`.
///
/// This writer only ever produces string, int, array and kvlist values (and
/// an unset value nowhere): some process context decoders reject the other
/// kinds, so booleans and doubles are published as strings. The other
/// variants are declared so tests can decode any valid payload.
#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    /// The `value` oneof of `AnyValue`. Variant names follow the OTLP field
    /// names (`string_value`, ...), as generated OTLP code spells them.
    #[allow(clippy::enum_variant_names)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
        #[prost(message, tag = "5")]
        ArrayValue(super::ArrayValue),
        #[prost(message, tag = "6")]
        KvlistValue(super::KeyValueList),
        #[prost(bytes = "vec", tag = "7")]
        BytesValue(Vec<u8>),
    }
}

/// `opentelemetry.proto.common.v1.ArrayValue`.
#[derive(Clone, PartialEq, Message)]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

/// `opentelemetry.proto.common.v1.KeyValueList`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<KeyValue>,
}

/// `opentelemetry.proto.common.v1.KeyValue`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `opentelemetry.proto.resource.v1.Resource` (without `entity_refs`).
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    #[prost(uint32, tag = "2")]
    pub dropped_attributes_count: u32,
}

/// `opentelemetry.proto.processcontext.v1development.ProcessContext`.
#[derive(Clone, PartialEq, Message)]
pub struct ProcessContext {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub attributes: Vec<KeyValue>,
}

/// Key of the thread-context schema announcement in `ProcessContext.attributes`.
pub const SCHEMA_VERSION_KEY: &str = "threadlocal.schema_version";
/// Key of the record key map in `ProcessContext.attributes`.
pub const KEY_MAP_KEY: &str = "threadlocal.attribute_key_map";
/// Prefix reserved for the keys above: callers may not set such attributes.
pub const RESERVED_PREFIX: &str = "threadlocal.";

impl AnyValue {
    pub fn string(value: impl Into<String>) -> Self {
        AnyValue { value: Some(any_value::Value::StringValue(value.into())) }
    }

    pub fn int(value: i64) -> Self {
        AnyValue { value: Some(any_value::Value::IntValue(value)) }
    }

    pub fn array(values: Vec<AnyValue>) -> Self {
        AnyValue { value: Some(any_value::Value::ArrayValue(ArrayValue { values })) }
    }

    pub fn kvlist(values: Vec<KeyValue>) -> Self {
        AnyValue { value: Some(any_value::Value::KvlistValue(KeyValueList { values })) }
    }
}

impl KeyValue {
    pub fn new(key: impl Into<String>, value: AnyValue) -> Self {
        KeyValue { key: key.into(), value: Some(value) }
    }
}

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
}

/// Encodes a payload. The two `threadlocal.*` attributes come first, then
/// the caller's extra attributes.
pub fn encode(contents: &Contents<'_>) -> Vec<u8> {
    let mut attributes = Vec::with_capacity(2 + contents.attributes.len());
    attributes.push(KeyValue::new(SCHEMA_VERSION_KEY, AnyValue::string(contents.schema_version)));
    attributes.push(KeyValue::new(
        KEY_MAP_KEY,
        AnyValue::array(contents.key_map.iter().map(|key| AnyValue::string(key.as_str())).collect()),
    ));
    attributes.extend_from_slice(contents.attributes);
    let message = ProcessContext {
        resource: Some(Resource { attributes: contents.resource.to_vec(), dropped_attributes_count: 0 }),
        attributes,
    };
    message.encode_to_vec()
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
    fn roundtrip_keeps_resource_and_threadlocal_keys() {
        let resource = vec![
            KeyValue::new("service.name", AnyValue::string("checkout")),
            KeyValue::new("process.pid", AnyValue::int(4242)),
            KeyValue::new("tags", AnyValue::array(vec![AnyValue::string("a"), AnyValue::int(-1)])),
            KeyValue::new("nested", AnyValue::kvlist(vec![KeyValue::new("inner", AnyValue::string("x"))])),
        ];
        let extra = vec![KeyValue::new("custom", AnyValue::string("y"))];
        let key_map = vec!["http.route".to_string(), "user.id".to_string()];
        let bytes = encode(&Contents {
            resource: &resource,
            attributes: &extra,
            schema_version: "tlsdesc_v1_dev",
            key_map: &key_map,
        });

        let decoded = ProcessContext::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.resource.as_ref().unwrap().attributes, resource);
        assert_eq!(decoded.attributes.len(), 3);
        assert_eq!(decoded.attributes[0].key, SCHEMA_VERSION_KEY);
        assert_eq!(string_of(decoded.attributes[0].value.as_ref()), "tlsdesc_v1_dev");
        assert_eq!(decoded.attributes[1].key, KEY_MAP_KEY);
        match decoded.attributes[1].value.as_ref().and_then(|v| v.value.as_ref()) {
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
        let bytes = encode(&Contents { resource: &resource, attributes: &[], schema_version: "v", key_map: &[] });
        let mut expected = vec![0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, b'k', 0x12, 0x02, 0x18, 0x01];
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
