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

use napi::bindgen_prelude::{Env, Error, Result, Status, Unknown};
use napi::{check_status, sys, JsValue};

use super::payload::{any_value, AnyValue, KeyValue, RESERVED_PREFIX};
use super::{PublishError, Update, MAX_KEYS, MAX_PAYLOAD_BYTES};
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

/// Raw napi helpers over one env. Each returns `Err` with the napi status
/// (`PendingException` when a getter threw: the exception propagates).
///
/// `budget` bounds the work done on any input: it starts at the largest
/// payload, every array element, key and string is charged the bytes it
/// adds to the payload at the least *before* it is read, and running out is
/// a `RangeError`. So a huge `length` or key count costs one comparison, and
/// no input makes this walk or allocate more than the limit allows.
struct Js<'a> {
    env: &'a Env,
    budget: Cell<usize>,
    object_prototype: Cell<sys::napi_value>,
}

impl<'a> Js<'a> {
    fn new(env: &'a Env) -> Self {
        Js {
            env,
            budget: Cell::new(MAX_PAYLOAD_BYTES),
            object_prototype: Cell::new(ptr::null_mut()),
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
                    "{path}: the process context payload would exceed {MAX_PAYLOAD_BYTES} bytes"
                ),
            ),
        }
    }

    /// Charges `count` items of at least `each` bytes, without overflow.
    fn charge_items(&self, count: u32, each: usize, path: &str) -> Result<()> {
        self.charge((count as usize).saturating_mul(each), path)
    }

    fn raw(&self) -> sys::napi_env {
        self.env.raw()
    }

    fn type_of(&self, value: sys::napi_value) -> Result<sys::napi_valuetype> {
        let mut kind = 0;
        // SAFETY: `value` is a live handle of this env; `kind` is a local.
        check_status!(unsafe { sys::napi_typeof(self.raw(), value, &mut kind) })?;
        Ok(kind)
    }

    fn is_array(&self, value: sys::napi_value) -> Result<bool> {
        let mut result = false;
        // SAFETY: as above.
        check_status!(unsafe { sys::napi_is_array(self.raw(), value, &mut result) })?;
        Ok(result)
    }

    /// True for objects whose prototype is `Object.prototype` or null:
    /// literals and `Object.create(null)`. Anything else (class instances,
    /// `Map`, dates, binary data, an SDK `Resource`) keeps its content
    /// somewhere its own keys do not show, so publishing those keys would
    /// publish the wrong thing.
    fn is_plain_object(&self, value: sys::napi_value) -> Result<bool> {
        let mut prototype = ptr::null_mut();
        // SAFETY: `value` is a live object handle; a Proxy trap that throws yields napi_pending_exception.
        check_status!(unsafe { sys::napi_get_prototype(self.raw(), value, &mut prototype) })?;
        if self.type_of(prototype)? == sys::ValueType::napi_null {
            return Ok(true);
        }
        let mut same = false;
        // SAFETY: both are live handles of this env.
        check_status!(unsafe {
            sys::napi_strict_equals(self.raw(), prototype, self.object_prototype()?, &mut same)
        })?;
        Ok(same)
    }

    /// This realm's `Object.prototype`, looked up once per call.
    fn object_prototype(&self) -> Result<sys::napi_value> {
        if self.object_prototype.get().is_null() {
            let mut object = ptr::null_mut();
            // SAFETY: an empty object literal of this env; its prototype is Object.prototype.
            check_status!(unsafe { sys::napi_create_object(self.raw(), &mut object) })?;
            let mut prototype = ptr::null_mut();
            // SAFETY: `object` was just created.
            check_status!(unsafe { sys::napi_get_prototype(self.raw(), object, &mut prototype) })?;
            self.object_prototype.set(prototype);
        }
        Ok(self.object_prototype.get())
    }

    fn array_length(&self, array: sys::napi_value) -> Result<u32> {
        let mut length = 0;
        // SAFETY: `array` is a live array handle of this env.
        check_status!(unsafe { sys::napi_get_array_length(self.raw(), array, &mut length) })?;
        Ok(length)
    }

    fn element(&self, array: sys::napi_value, index: u32) -> Result<sys::napi_value> {
        let mut value = ptr::null_mut();
        // SAFETY: as above; a throwing getter yields napi_pending_exception.
        check_status!(unsafe { sys::napi_get_element(self.raw(), array, index, &mut value) })?;
        Ok(value)
    }

    /// `Object.keys(object)`: own, enumerable, string keys.
    fn own_keys(&self, object: sys::napi_value) -> Result<sys::napi_value> {
        let mut keys = ptr::null_mut();
        // SAFETY: `object` is a live object handle of this env.
        check_status!(unsafe {
            sys::napi_get_all_property_names(
                self.raw(),
                object,
                sys::KeyCollectionMode::own_only,
                sys::KeyFilter::enumerable | sys::KeyFilter::skip_symbols,
                sys::KeyConversion::numbers_to_strings,
                &mut keys,
            )
        })?;
        Ok(keys)
    }

    fn property(&self, object: sys::napi_value, key: sys::napi_value) -> Result<sys::napi_value> {
        let mut value = ptr::null_mut();
        // SAFETY: live handles of this env; a throwing getter yields napi_pending_exception.
        check_status!(unsafe { sys::napi_get_property(self.raw(), object, key, &mut value) })?;
        Ok(value)
    }

    fn named(&self, object: sys::napi_value, name: &CStr) -> Result<sys::napi_value> {
        let mut value = ptr::null_mut();
        // SAFETY: as above; `name` is NUL-terminated.
        check_status!(unsafe {
            sys::napi_get_named_property(self.raw(), object, name.as_ptr(), &mut value)
        })?;
        Ok(value)
    }

    /// A JS string as UTF-8 (lone surrogates become U+FFFD).
    fn string(&self, value: sys::napi_value) -> Result<String> {
        let mut length = 0;
        // SAFETY: `value` is a live string handle; a NULL buffer asks for the
        // UTF-16 length, which costs nothing and bounds the UTF-8 length from below.
        check_status!(unsafe {
            sys::napi_get_value_string_utf16(self.raw(), value, ptr::null_mut(), 0, &mut length)
        })?;
        if length <= MAX_PAYLOAD_BYTES {
            // SAFETY: `value` is a live string handle; a NULL buffer asks for the length.
            check_status!(unsafe {
                sys::napi_get_value_string_utf8(self.raw(), value, ptr::null_mut(), 0, &mut length)
            })?;
        }
        if length > MAX_PAYLOAD_BYTES {
            return range_error(
                self.env,
                &format!(
                    "a string is longer than the {MAX_PAYLOAD_BYTES}-byte process context payload"
                ),
            );
        }
        let mut bytes = vec![0u8; length + 1];
        let mut written = 0;
        // SAFETY: `bytes` has room for `length` bytes plus the NUL napi appends.
        check_status!(unsafe {
            sys::napi_get_value_string_utf8(
                self.raw(),
                value,
                bytes.as_mut_ptr().cast(),
                bytes.len(),
                &mut written,
            )
        })?;
        bytes.truncate(written);
        String::from_utf8(bytes).map_err(|e| Error::new(Status::StringExpected, e.to_string()))
    }

    /// `String(value)` for a number or bigint (cannot throw for those).
    fn spelled(&self, value: sys::napi_value) -> Result<String> {
        let mut string = ptr::null_mut();
        // SAFETY: `value` is a live number or bigint handle.
        check_status!(unsafe { sys::napi_coerce_to_string(self.raw(), value, &mut string) })?;
        self.string(string)
    }

    fn double(&self, value: sys::napi_value) -> Result<f64> {
        let mut number = 0.0;
        // SAFETY: `value` is a live number handle.
        check_status!(unsafe { sys::napi_get_value_double(self.raw(), value, &mut number) })?;
        Ok(number)
    }

    fn boolean(&self, value: sys::napi_value) -> Result<bool> {
        let mut result = false;
        // SAFETY: `value` is a live boolean handle.
        check_status!(unsafe { sys::napi_get_value_bool(self.raw(), value, &mut result) })?;
        Ok(result)
    }

    /// The bigint as an `i64`, or `None` when it does not fit.
    fn bigint_i64(&self, value: sys::napi_value) -> Result<Option<i64>> {
        let mut result = 0i64;
        let mut lossless = false;
        // SAFETY: `value` is a live bigint handle.
        check_status!(unsafe {
            sys::napi_get_value_bigint_int64(self.raw(), value, &mut result, &mut lossless)
        })?;
        Ok(lossless.then_some(result))
    }

    fn is_nullish(kind: sys::napi_valuetype) -> bool {
        kind == sys::ValueType::napi_undefined || kind == sys::ValueType::napi_null
    }

    /// A value that becomes the attribute `path` (for error messages), or
    /// `None` for `null`/`undefined`.
    fn any_value(
        &self,
        value: sys::napi_value,
        path: &str,
        depth: usize,
    ) -> Result<Option<AnyValue>> {
        use sys::ValueType as T;
        let kind = self.type_of(value)?;
        Ok(Some(match kind {
            T::napi_undefined | T::napi_null => return Ok(None),
            T::napi_string => {
                let text = self.string(value)?;
                self.charge(text.len(), path)?;
                AnyValue::string(text)
            }
            T::napi_boolean => AnyValue::string(if self.boolean(value)? {
                "true"
            } else {
                "false"
            }),
            T::napi_number => {
                let number = self.double(value)?;
                // 2^63 is exactly representable; every integral double in
                // [-2^63, 2^63) converts to i64 without loss.
                if number.fract() == 0.0
                    && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&number)
                {
                    AnyValue::int(number as i64)
                } else {
                    AnyValue::string(self.spelled(value)?)
                }
            }
            T::napi_bigint => match self.bigint_i64(value)? {
                Some(int) => AnyValue::int(int),
                None => AnyValue::string(self.spelled(value)?),
            },
            T::napi_object => {
                if depth > MAX_DEPTH {
                    return range_error(
                        self.env,
                        &format!("{path} nests arrays or objects deeper than {MAX_DEPTH} levels (is it cyclic?)"),
                    );
                }
                if self.is_array(value)? {
                    self.array(value, path, depth)?
                } else if !self.is_plain_object(value)? {
                    return type_error(
                        self.env,
                        &format!("{path} must be a string, number, boolean, bigint, array or plain object"),
                    );
                } else {
                    AnyValue::kvlist(self.key_values(value, path, depth + 1)?)
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

    fn array(&self, array: sys::napi_value, path: &str, depth: usize) -> Result<AnyValue> {
        let length = self.array_length(array)?;
        self.charge_items(length, MIN_ELEMENT_BYTES, path)?;
        let mut values = Vec::with_capacity(length as usize);
        let mut holes = Vec::new();
        for index in 0..length {
            let element = self.element(array, index)?;
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
    fn key_values(
        &self,
        object: sys::napi_value,
        path: &str,
        depth: usize,
    ) -> Result<Vec<KeyValue>> {
        let keys = self.own_keys(object)?;
        let count = self.array_length(keys)?;
        self.charge_items(count, MIN_KEY_BYTES, path)?;
        let mut result = Vec::with_capacity(count as usize);
        for index in 0..count {
            let key_value = self.element(keys, index)?;
            let key = self.string(key_value)?;
            self.charge(key.len().saturating_sub(1), path)?;
            let item_path = format!("{path}[{key:?}]");
            if key.is_empty() {
                return range_error(self.env, &format!("{path} has an empty attribute key"));
            }
            let value = self.property(object, key_value)?;
            if let Some(value) = self.any_value(value, &item_path, depth)? {
                result.push(KeyValue::new(key, value));
            }
        }
        Ok(result)
    }

    /// An attributes object argument (`options.resource`, `options.attributes`).
    fn attributes(&self, value: sys::napi_value, path: &str) -> Result<Vec<KeyValue>> {
        if self.type_of(value)? != sys::ValueType::napi_object
            || self.is_array(value)?
            || !self.is_plain_object(value)?
        {
            return type_error(
                self.env,
                &format!("The \"{path}\" property must be an object of attributes"),
            );
        }
        self.key_values(value, path, 1)
    }
}

/// Reads `publishProcessContext(options)`'s argument. `undefined`/`null`
/// options, and `undefined`/`null` properties, keep what was published.
pub fn update_from_js(env: &Env, options: Option<&Unknown<'_>>) -> Result<Update> {
    let js = Js::new(env);
    let mut update = Update::default();
    let Some(options) = options else {
        return Ok(update);
    };
    let options = options.raw();
    let kind = js.type_of(options)?;
    if Js::is_nullish(kind) {
        return Ok(update);
    }
    if kind != sys::ValueType::napi_object || js.is_array(options)? {
        return type_error(env, "The \"options\" argument must be an object");
    }

    let resource = js.named(options, c"resource")?;
    if !Js::is_nullish(js.type_of(resource)?) {
        update.resource = Some(js.attributes(resource, "options.resource")?);
    }

    let attributes = js.named(options, c"attributes")?;
    if !Js::is_nullish(js.type_of(attributes)?) {
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

    let schema_version = js.named(options, c"schemaVersion")?;
    let kind = js.type_of(schema_version)?;
    if !Js::is_nullish(kind) {
        if kind != sys::ValueType::napi_string {
            return type_error(
                env,
                "The \"options.schemaVersion\" property must be of type string",
            );
        }
        let schema_version = js.string(schema_version)?;
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
    let keys = keys.raw();
    if js.type_of(keys)? != sys::ValueType::napi_object || !js.is_array(keys)? {
        return type_error(env, "The \"keys\" argument must be an array of strings");
    }
    let length = js.array_length(keys)?;
    if length as usize > MAX_KEYS {
        return range_error(
            env,
            &format!("The \"keys\" argument has {length} elements; the attribute key map holds at most {MAX_KEYS} keys"),
        );
    }
    let mut result = Vec::with_capacity(length as usize);
    for index in 0..length {
        let key = js.element(keys, index)?;
        if js.type_of(key)? != sys::ValueType::napi_string {
            return type_error(
                env,
                &format!("The \"keys[{index}]\" element must be of type string"),
            );
        }
        let key = js.string(key)?;
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
