//! Validation of JS arguments for the napi functions, without allocating on
//! the success path. Failures throw the JS error class the API promises
//! (`TypeError` for a wrong type, `RangeError` for a wrong value) before
//! anything is written. Only the error path allocates (for its message).

use napi::bindgen_prelude::{Env, Error, Result, Status, Unknown, ValueType};
use napi::sys;

/// Throws a `TypeError` and returns the error napi-rs treats as "already thrown".
pub fn type_error<T>(env: &Env, message: &str) -> Result<T> {
    env.throw_type_error(message, Some("ERR_INVALID_ARG_TYPE"))?;
    Err(Error::from_status(Status::PendingException))
}

/// Throws a `RangeError` and returns the error napi-rs treats as "already thrown".
pub fn range_error<T>(env: &Env, message: &str) -> Result<T> {
    env.throw_range_error(message, Some("ERR_OUT_OF_RANGE"))?;
    Err(Error::from_status(Status::PendingException))
}

/// A `bigint` in 0..2^64 as a `u64`. `name` appears in error messages.
pub fn u64_from_bigint(env: &Env, value: &Unknown<'_>, name: &'static str) -> Result<u64> {
    if value.get_type()? != ValueType::BigInt {
        return type_error(env, &format!("The \"{name}\" argument must be of type bigint"));
    }
    let mut result = 0u64;
    let mut lossless = false;
    // SAFETY: `value` is a live bigint handle of this env; the outputs are locals.
    let status = unsafe {
        sys::napi_get_value_bigint_uint64(env.raw(), napi::JsValue::raw(value), &mut result, &mut lossless)
    };
    if status != sys::Status::napi_ok {
        return Err(Error::from_status(Status::from(status)));
    }
    // `lossless` is false for negative values and for values >= 2^64.
    if !lossless {
        return range_error(env, &format!("The \"{name}\" argument must be >= 0n and < 2n ** 64n"));
    }
    Ok(result)
}

/// An optional integer in 0..=255 (`undefined` means `default`).
pub fn optional_u8(env: &Env, value: Option<&Unknown<'_>>, name: &'static str, default: u8) -> Result<u8> {
    let Some(value) = value else { return Ok(default) };
    match value.get_type()? {
        ValueType::Undefined => return Ok(default),
        ValueType::Number => {}
        _ => return type_error(env, &format!("The \"{name}\" argument must be of type number")),
    }
    let mut number = 0f64;
    // SAFETY: `value` is a live number handle of this env.
    let status = unsafe { sys::napi_get_value_double(env.raw(), napi::JsValue::raw(value), &mut number) };
    if status != sys::Status::napi_ok {
        return Err(Error::from_status(Status::from(status)));
    }
    if !(0.0..=255.0).contains(&number) || number.fract() != 0.0 {
        return range_error(env, &format!("The \"{name}\" argument must be an integer in 0..255"));
    }
    Ok(number as u8)
}
