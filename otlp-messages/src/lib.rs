//! The protobuf messages of the OTEP 4719 process context, shared by the
//! writer (the addon) and the reader CLI so both speak exactly one schema.
//!
//! They mirror the OTLP `opentelemetry.proto.common.v1` and
//! `opentelemetry.proto.resource.v1` definitions field for field (same
//! numbers, same wire types), declared with `prost` derive instead of
//! generated from `.proto` files so the build needs no `protoc`.
//! `Resource.entity_refs` is left out: decoders skip unknown fields, and the
//! writer never sets it. The project's JavaScript tests decode the payload
//! with protobufjs and their own `.proto`, an independent check of these
//! declarations.
//!
//! `ProcessContext` is `opentelemetry.proto.processcontext.v1development.ProcessContext`:
//! `{ Resource resource = 1; repeated KeyValue attributes = 2; }`.

pub use prost::Message;

pub mod profiles;

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

/// The thread-context keys of `ProcessContext.attributes`, declared in the
/// ABI crate (`otel_thread_ctx_abi::process_context`).
pub use otel_thread_ctx_abi::process_context::{KEY_MAP_KEY, RESERVED_PREFIX, SCHEMA_VERSION_KEY};

impl AnyValue {
    /// A string value.
    pub fn string(value: impl Into<String>) -> Self {
        AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }
    }

    /// An int64 value.
    pub fn int(value: i64) -> Self {
        AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }
    }

    /// An array value.
    pub fn array(values: Vec<AnyValue>) -> Self {
        AnyValue {
            value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
        }
    }

    /// A key/value-list value.
    pub fn kvlist(values: Vec<KeyValue>) -> Self {
        AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList { values })),
        }
    }
}

impl KeyValue {
    /// A key with a value.
    pub fn new(key: impl Into<String>, value: AnyValue) -> Self {
        KeyValue {
            key: key.into(),
            value: Some(value),
        }
    }
}
