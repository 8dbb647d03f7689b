//! The JavaScript side of the process context: reading the arguments of
//! `publishProcessContext` and `registerAttributeKeys` into payload
//! messages, and turning publisher errors into JS exceptions.
//!
//! Every argument is read and checked completely before the publisher is
//! called, so a `TypeError` (wrong type) or `RangeError` (wrong value)
//! leaves the published context exactly as it was. Publishing is rare, so
//! this code favours clear error messages over avoiding allocations.
//!
//! Value rules (what a reader decodes):
//! - string → `string_value`;
//! - number: an integer in the `int64` range → `int_value`; any other number
//!   (fractions, `NaN`, `±Infinity`, huge integers) → `string_value` with the
//!   JavaScript spelling (`String(value)`);
//! - bigint in the `int64` range → `int_value`, otherwise its decimal string;
//! - boolean → `string_value` `"true"` / `"false"`;
//! - array → `array_value`; a `null`/`undefined` element becomes the zero
//!   value of the array's kind (`0` in an array of integers, `""` otherwise),
//!   as the OpenTelemetry attribute rules allow exporters to do;
//! - plain object → `kvlist_value` (own enumerable string keys, in order);
//! - `null`/`undefined` attribute values → the attribute is left out.
//!
//! Booleans and doubles become strings because some process context
//! decoders accept only string, int, array and kvlist values: one such
//! attribute would otherwise make the whole context unreadable for them.

use std::cell::Cell;
use std::ffi::CStr;
use std::ptr;

use napi::bindgen_prelude::{
    Env, Error, FromNapiValue, JsObjectValue, Object, Result, Status, Unknown,
};
use napi::{check_status, sys, JsString, JsValue, ValueType};

use otel_thread_ctx_abi::process_context::{MAX_KEYS, MAX_PAYLOAD_BYTES, RESERVED_PREFIX};

use super::payload::{any_value, AnyValue, KeyValue};
use super::{PublishError, Update};
use crate::args::{range_error, type_error};

/// Deepest nesting of arrays and kvlists accepted (a top-level value is at
/// depth 1). Also what stops a cyclic object.
pub const MAX_DEPTH: usize = 8;

/// Bytes every array element adds to the payload at the least: its tag and
/// length, and a value's tag and one byte (`null` elements become zero values).
const MIN_ELEMENT_BYTES: usize = 4;
/// Bytes every key counts for at the least: a pair's tag and length, and one
/// key byte. Keys whose value is left out count too, so that an object with
/// more keys than the limit allows is refused before its keys are read.
const MIN_KEY_BYTES: usize = 3;

/// Reads JS values of one call. Each method returns `Err` with the napi
/// status (`PendingException` when a getter threw: the exception propagates).
///
/// `budget` bounds the work done on any input: it starts at the largest
/// payload, every array element, key and string is charged the bytes it
/// adds to the payload at the least *before* it is read, and running out is
/// a `RangeError`. So a huge `length` or key count costs one comparison, and
/// no input makes this walk or allocate more than the limit allows.
struct Js<'a> {
    env: &'a Env,
    budget: Cell<usize>,
    object_prototype: Cell<Option<Unknown<'a>>>,
}

impl<'a> Js<'a> {
    fn new(env: &'a Env) -> Self {
        Js {
            env,
            budget: Cell::new(MAX_PAYLOAD_BYTES),
            object_prototype: Cell::new(None),
        }
    }

    /// Charges `bytes` of payload; a `RangeError` once the total would exceed the limit.
    fn charge(&self, bytes: usize, path: &str) -> Result<()> {
        match self.budget.get().checked_sub(bytes) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => range_error(
                self.env,
                &format!(
                    "{path}: the process context payload would exceed the {MAX_PAYLOAD_BYTES} bytes \
                     profilers accept (the OpenTelemetry eBPF profiler rejects a larger one whole); \
                     shorten or leave out {path}"
                ),
            ),
        }
    }

    /// Charges `count` items of at least `each` bytes, without overflow.
    fn charge_items(&self, count: u32, each: usize, path: &str) -> Result<()> {
        self.charge((count as usize).saturating_mul(each), path)
    }

    /// `value` read as a `T` (`JsString`, `Object`, `f64`, `bool`), for a
    /// value whose type `get_type` reported.
    fn typed<T: FromNapiValue>(&self, value: Unknown<'a>) -> Result<T> {
        // SAFETY: `value` is a live handle of this env, and napi checks the
        // type again on every read (`napi_string_expected`, ...), so even a
        // mismatch would be an error, not undefined behaviour.
        unsafe { value.cast::<T>() }
    }

    /// True for objects whose prototype is `Object.prototype` or null:
    /// literals and `Object.create(null)`. Anything else (class instances,
    /// `Map`, dates, binary data, an SDK `Resource`) keeps its content
    /// somewhere its own keys do not show, so publishing those keys would
    /// publish the wrong thing.
    fn is_plain_object(&self, object: &Object<'a>) -> Result<bool> {
        // A Proxy trap that throws yields napi_pending_exception.
        let prototype = object.get_prototype()?;
        if prototype.get_type()? == ValueType::Null {
            return Ok(true);
        }
        self.env.strict_equals(prototype, self.object_prototype()?)
    }

    /// This realm's `Object.prototype`, looked up once per call.
    fn object_prototype(&self) -> Result<Unknown<'a>> {
        if let Some(prototype) = self.object_prototype.get() {
            return Ok(prototype);
        }
        // An empty object literal's prototype is Object.prototype.
        let prototype = Object::new(self.env)?.get_prototype()?;
        self.object_prototype.set(Some(prototype));
        Ok(prototype)
    }

    /// `Object.keys(object)`: own, enumerable, string keys.
    ///
    /// napi directly: napi-rs's `get_all_property_names` takes one key
    /// filter, and this needs two (enumerable, no symbols).
    fn own_keys(&self, object: &Object<'a>) -> Result<Object<'a>> {
        let mut keys = ptr::null_mut();
        // SAFETY: `object` is a live object handle of this env; `keys` is a local.
        check_status!(unsafe {
            sys::napi_get_all_property_names(
                self.env.raw(),
                object.raw(),
                sys::KeyCollectionMode::own_only,
                sys::KeyFilter::enumerable | sys::KeyFilter::skip_symbols,
                sys::KeyConversion::numbers_to_strings,
                &mut keys,
            )
        })?;
        Ok(Object::from_raw(self.env.raw(), keys))
    }

    fn named(&self, object: &Object<'a>, name: &CStr) -> Result<Unknown<'a>> {
        // A throwing getter yields napi_pending_exception.
        object.get_c_named_property_unchecked(name)
    }

    /// A JS string as UTF-8 (lone surrogates become U+FFFD); `path` names
    /// it in the error message.
    fn string(&self, value: JsString<'_>, path: &str) -> Result<String> {
        // The UTF-16 length costs nothing and bounds the UTF-8 length from below.
        let mut length = value.utf16_len()?;
        if length <= MAX_PAYLOAD_BYTES {
            length = value.utf8_len()?;
        }
        if length > MAX_PAYLOAD_BYTES {
            return range_error(
                self.env,
                &format!(
                    "{path} is longer than the {MAX_PAYLOAD_BYTES} bytes of process context payload \
                     profilers accept (the OpenTelemetry eBPF profiler rejects a larger one whole); \
                     shorten or leave out {path}"
                ),
            );
        }
        value.into_utf8()?.into_owned()
    }

    /// `String(value)` for a number or bigint (cannot throw for those).
    fn spelled(&self, value: Unknown<'a>, path: &str) -> Result<String> {
        self.string(value.coerce_to_string()?, path)
    }

    /// The bigint as an `i64`, or `None` when it does not fit.
    ///
    /// napi directly: napi-rs's `BigInt` copies every word of the value
    /// first, work proportional to the input before any limit is checked.
    fn bigint_i64(&self, value: Unknown<'a>) -> Result<Option<i64>> {
        let mut result = 0i64;
        let mut lossless = false;
        // SAFETY: `value` is a live bigint handle; `result` and `lossless` are locals.
        check_status!(unsafe {
            sys::napi_get_value_bigint_int64(
                self.env.raw(),
                value.raw(),
                &mut result,
                &mut lossless,
            )
        })?;
        Ok(lossless.then_some(result))
    }

    fn is_nullish(kind: ValueType) -> bool {
        kind == ValueType::Undefined || kind == ValueType::Null
    }

    /// A value that becomes the attribute `path` (for error messages), or
    /// `None` for `null`/`undefined`.
    fn any_value(&self, value: Unknown<'a>, path: &str, depth: usize) -> Result<Option<AnyValue>> {
        Ok(Some(match value.get_type()? {
            ValueType::Undefined | ValueType::Null => return Ok(None),
            ValueType::String => {
                let text = self.string(self.typed(value)?, path)?;
                self.charge(text.len(), path)?;
                AnyValue::string(text)
            }
            ValueType::Boolean => AnyValue::string(if self.typed::<bool>(value)? {
                "true"
            } else {
                "false"
            }),
            ValueType::Number => {
                let number = self.typed::<f64>(value)?;
                // 2^63 is exactly representable; every integral double in
                // [-2^63, 2^63) converts to i64 without loss.
                if number.fract() == 0.0
                    && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&number)
                {
                    AnyValue::int(number as i64)
                } else {
                    AnyValue::string(self.spelled(value, path)?)
                }
            }
            ValueType::BigInt => match self.bigint_i64(value)? {
                Some(int) => AnyValue::int(int),
                None => AnyValue::string(self.spelled(value, path)?),
            },
            ValueType::Object => {
                if depth > MAX_DEPTH {
                    return range_error(
                        self.env,
                        &format!("{path} nests arrays or objects deeper than {MAX_DEPTH} levels (is it cyclic?)"),
                    );
                }
                let object = self.typed::<Object>(value)?;
                if object.is_array()? {
                    self.array(&object, path, depth)?
                } else if !self.is_plain_object(&object)? {
                    return type_error(
                        self.env,
                        &format!("{path} must be a string, number, boolean, bigint, array or plain object"),
                    );
                } else {
                    AnyValue::kvlist(self.key_values(&object, path, depth + 1)?)
                }
            }
            _ => {
                return type_error(
                    self.env,
                    &format!(
                        "{path} must be a string, number, boolean, bigint, array or plain object"
                    ),
                )
            }
        }))
    }

    fn array(&self, array: &Object<'a>, path: &str, depth: usize) -> Result<AnyValue> {
        let length = array.get_array_length_unchecked()?;
        self.charge_items(length, MIN_ELEMENT_BYTES, path)?;
        let mut values = Vec::with_capacity(length as usize);
        let mut holes = Vec::new();
        for index in 0..length {
            // A throwing getter yields napi_pending_exception.
            let element = array.get_element::<Unknown>(index)?;
            match self.any_value(element, &format!("{path}[{index}]"), depth + 1)? {
                Some(value) => values.push(value),
                None => {
                    holes.push(values.len());
                    values.push(AnyValue { value: None });
                }
            }
        }
        if !holes.is_empty() {
            let ints = values
                .iter()
                .all(|v| matches!(v.value, None | Some(any_value::Value::IntValue(_))));
            let zero = if ints {
                AnyValue::int(0)
            } else {
                AnyValue::string("")
            };
            for hole in holes {
                values[hole] = zero.clone();
            }
        }
        Ok(AnyValue::array(values))
    }

    /// The own enumerable string-keyed properties of `object` as key/values,
    /// leaving out `null`/`undefined` values.
    fn key_values(&self, object: &Object<'a>, path: &str, depth: usize) -> Result<Vec<KeyValue>> {
        let keys = self.own_keys(object)?;
        let count = keys.get_array_length_unchecked()?;
        self.charge_items(count, MIN_KEY_BYTES, path)?;
        let mut result = Vec::with_capacity(count as usize);
        for index in 0..count {
            // Strings: the keys were converted (`numbers_to_strings`).
            let key_value = keys.get_element::<JsString>(index)?;
            let key = self.string(key_value, &format!("a key of {path}"))?;
            self.charge(key.len().saturating_sub(1), path)?;
            let item_path = format!("{path}[{key:?}]");
            if key.is_empty() {
                return range_error(self.env, &format!("{path} has an empty attribute key"));
            }
            // A throwing getter yields napi_pending_exception.
            let value = object.get_property_unchecked::<_, Unknown>(key_value)?;
            if let Some(value) = self.any_value(value, &item_path, depth)? {
                result.push(KeyValue::new(key, value));
            }
        }
        Ok(result)
    }

    /// An attributes object argument (`options.resource`, `options.attributes`).
    fn attributes(&self, value: Unknown<'a>, path: &str) -> Result<Vec<KeyValue>> {
        if value.get_type()? != ValueType::Object
            || value.is_array()?
            || !self.is_plain_object(&self.typed(value)?)?
        {
            return type_error(
                self.env,
                &format!("The \"{path}\" property must be an object of attributes"),
            );
        }
        self.key_values(&self.typed(value)?, path, 1)
    }
}

/// Reads `publishProcessContext(options)`'s argument. `undefined`/`null`
/// options, and `undefined`/`null` properties, keep what was published.
pub fn update_from_js(env: &Env, options: Option<&Unknown<'_>>) -> Result<Update> {
    let js = Js::new(env);
    let mut update = Update::default();
    let Some(&options) = options else {
        return Ok(update);
    };
    let kind = options.get_type()?;
    if Js::is_nullish(kind) {
        return Ok(update);
    }
    if kind != ValueType::Object || options.is_array()? {
        return type_error(env, "The \"options\" argument must be an object");
    }
    let options = js.typed::<Object>(options)?;

    let resource = js.named(&options, c"resource")?;
    if !Js::is_nullish(resource.get_type()?) {
        update.resource = Some(js.attributes(resource, "options.resource")?);
    }

    let attributes = js.named(&options, c"attributes")?;
    if !Js::is_nullish(attributes.get_type()?) {
        let attributes = js.attributes(attributes, "options.attributes")?;
        if let Some(reserved) = attributes
            .iter()
            .find(|kv| kv.key.starts_with(RESERVED_PREFIX))
        {
            return range_error(
                env,
                &format!(
                    "options.attributes[{:?}]: keys starting with \"{RESERVED_PREFIX}\" are set through \
                     schemaVersion and registerAttributeKeys()",
                    reserved.key
                ),
            );
        }
        update.attributes = Some(attributes);
    }

    let schema_version = js.named(&options, c"schemaVersion")?;
    let kind = schema_version.get_type()?;
    if !Js::is_nullish(kind) {
        if kind != ValueType::String {
            return type_error(
                env,
                "The \"options.schemaVersion\" property must be of type string",
            );
        }
        let schema_version = js.string(js.typed(schema_version)?, "options.schemaVersion")?;
        if schema_version.is_empty() {
            return range_error(
                env,
                "The \"options.schemaVersion\" property must not be empty",
            );
        }
        update.schema_version = Some(schema_version);
    }
    Ok(update)
}

/// Reads `registerAttributeKeys(keys)`'s argument: an array of non-empty strings.
pub fn keys_from_js(env: &Env, keys: &Unknown<'_>) -> Result<Vec<String>> {
    let js = Js::new(env);
    if keys.get_type()? != ValueType::Object || !keys.is_array()? {
        return type_error(env, "The \"keys\" argument must be an array of strings");
    }
    let keys = js.typed::<Object>(*keys)?;
    let length = keys.get_array_length_unchecked()?;
    if length as usize > MAX_KEYS {
        return range_error(
            env,
            &format!("The \"keys\" argument has {length} elements; the attribute key map holds at most {MAX_KEYS} keys"),
        );
    }
    let mut result = Vec::with_capacity(length as usize);
    for index in 0..length {
        let key = keys.get_element::<Unknown>(index)?;
        if key.get_type()? != ValueType::String {
            return type_error(
                env,
                &format!("The \"keys[{index}]\" element must be of type string"),
            );
        }
        let key = js.string(js.typed(key)?, &format!("keys[{index}]"))?;
        js.charge(key.len(), "keys")?;
        if key.is_empty() {
            return range_error(
                env,
                &format!("The \"keys[{index}]\" element must not be empty"),
            );
        }
        result.push(key);
    }
    Ok(result)
}

/// Throws `error` as the JS exception the API promises.
pub fn throw<T>(env: &Env, error: PublishError) -> Result<T> {
    match error {
        PublishError::Range(message) => range_error(env, &message),
        PublishError::Os(message) => {
            env.throw_error(&message, Some("ERR_OTEL_PROCESS_CONTEXT"))?;
            Err(Error::from_status(Status::PendingException))
        }
    }
}
