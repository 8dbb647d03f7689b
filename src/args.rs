//! Throwing the JS error classes the API promises for bad arguments
//! (`TypeError` for a wrong type, `RangeError` for a wrong value), before
//! anything is written.

use napi::bindgen_prelude::{Env, Error, Result, Status};

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
