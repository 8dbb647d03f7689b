//! The process context as JSON: OTLP attributes become a JSON object (the
//! last duplicate of a key wins).

use serde_json::{Map, Value};

use super::{any_value, AnyValue, KeyValue};

/// `kvs` as a JSON object.
pub fn object(kvs: &[KeyValue]) -> Map<String, Value> {
    let mut m = Map::new();
    for kv in kvs {
        m.insert(
            kv.key.clone(),
            kv.value.as_ref().map_or(Value::Null, any_to_json),
        );
    }
    m
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
        Some(V::BytesValue(b)) => Value::String(b.iter().map(|b| format!("{b:02x}")).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_otlp::{ArrayValue, KeyValueList};

    fn value(v: any_value::Value) -> AnyValue {
        AnyValue { value: Some(v) }
    }

    #[test]
    fn every_value_kind_has_a_json_form() {
        use any_value::Value as V;
        let kvs = vec![
            KeyValue::new("s", value(V::StringValue("x".into()))),
            KeyValue::new("b", value(V::BoolValue(true))),
            KeyValue::new("i", value(V::IntValue(-3))),
            KeyValue::new("d", value(V::DoubleValue(0.5))),
            KeyValue::new("nan", value(V::DoubleValue(f64::NAN))),
            KeyValue::new("bytes", value(V::BytesValue(vec![0x00, 0xab]))),
            KeyValue::new(
                "a",
                value(V::ArrayValue(ArrayValue {
                    values: vec![value(V::IntValue(1))],
                })),
            ),
            KeyValue::new(
                "kv",
                value(V::KvlistValue(KeyValueList {
                    values: vec![KeyValue::new("k", value(V::StringValue("v".into())))],
                })),
            ),
            KeyValue::new("s", value(V::StringValue("last".into()))),
        ];
        let o = Value::Object(object(&kvs));
        assert_eq!(
            o,
            serde_json::json!({
                "s": "last", "b": true, "i": -3, "d": 0.5, "nan": null,
                "bytes": "00ab", "a": [1], "kv": {"k": "v"}
            })
        );
    }
}
