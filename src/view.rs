//! The one external `ArrayBuffer` per thread that views its record, for the
//! allocation-free JavaScript writer (`js/record-view.js`).

use std::cell::Cell;
use std::ffi::c_void;

use napi::bindgen_prelude::{Env, Error, Result, Status};
use napi::sys;

use crate::registry::{self, Holder, Slot};
use otel_thread_ctx_abi::record::RECORD_SIZE;

/// Set (to anything) to make `get_or_create` fail as it does where the
/// runtime forbids external buffers, so the fallback writer can be tested.
const SIMULATE_NO_EXTERNAL_BUFFERS: &str = "OTEL_THREAD_CTX_SIMULATE_NO_EXTERNAL_BUFFERS";

thread_local! {
    /// Strong reference to this thread's buffer, held until env teardown.
    static BUFFER: Cell<sys::napi_ref> = const { Cell::new(std::ptr::null_mut()) };
}

unsafe extern "C" fn finalize(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // V8 has dropped the buffer: the slot may now be recycled.
    registry::release(hint as usize, Holder::View);
}

pub fn get_or_create(env: &Env, slot: Slot) -> Result<sys::napi_value> {
    let mut value = std::ptr::null_mut();
    let existing = BUFFER.with(Cell::get);
    if !existing.is_null() {
        // SAFETY: `existing` is a live strong reference created below in this env.
        napi::check_status!(unsafe {
            sys::napi_get_reference_value(env.raw(), existing, &mut value)
        })?;
        return Ok(value);
    }
    if std::env::var_os(SIMULATE_NO_EXTERNAL_BUFFERS).is_some() {
        return Err(Error::new(
            Status::NoExternalBuffersAllowed,
            format!("external buffers are not allowed ({SIMULATE_NO_EXTERNAL_BUFFERS} is set)"),
        ));
    }
    registry::hold_view(slot.index);
    // SAFETY: the record stays mapped for the life of the process and the
    // finalizer releases the slot only after V8 is done with the buffer.
    let status = unsafe {
        sys::napi_create_external_arraybuffer(
            env.raw(),
            slot.record.cast(),
            RECORD_SIZE,
            Some(finalize),
            slot.index as *mut c_void,
            &mut value,
        )
    };
    if status != sys::Status::napi_ok {
        registry::release(slot.index, Holder::View);
        return Err(Error::new(
            Status::from(status),
            "cannot create the record view".to_owned(),
        ));
    }
    let mut reference = std::ptr::null_mut();
    // SAFETY: `value` is the buffer just created in this env.
    napi::check_status!(unsafe {
        sys::napi_create_reference(env.raw(), value, 1, &mut reference)
    })?;
    BUFFER.with(|b| b.set(reference));
    Ok(value)
}

/// Drops the strong reference at env teardown so V8 can finalize the buffer.
pub fn forget() {
    BUFFER.with(|b| b.set(std::ptr::null_mut()));
    // Node deletes every remaining reference of a torn-down env itself;
    // deleting it here would need the env, which cleanup hooks do not get.
}
