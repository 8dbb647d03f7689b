//! The external `ArrayBuffers` per thread for the allocation-free
//! JavaScript writers: one views the thread's own record
//! (`js/record-view.js`), one its `otel_thread_ctx_v1` variable, which
//! record mode points at the active span's record (`js/publish/record.js`).

use std::cell::RefCell;
use std::ffi::c_void;

use napi::bindgen_prelude::{Env, Error, Object, ObjectRef, Result, Status};
use napi::sys;

use crate::registry::{self, Holder, Slot};
use otel_thread_ctx_abi::record::RECORD_SIZE;

/// Set (to anything) to make `get_or_create` fail as it does where the
/// runtime forbids external buffers, so the fallback writer can be tested.
pub const SIMULATE_NO_EXTERNAL_BUFFERS: &str = "OTEL_THREAD_CTX_SIMULATE_NO_EXTERNAL_BUFFERS";

thread_local! {
    /// Strong reference to this thread's buffer, held until env teardown.
    /// Dropping it does not delete it (`false`: no leak check either):
    /// Node deletes the references of a torn-down env itself.
    static BUFFER: RefCell<Option<ObjectRef<false>>> = const { RefCell::new(None) };
    /// The same for the view of the thread's `otel_thread_ctx_v1`.
    static POINTER: RefCell<Option<ObjectRef<false>>> = const { RefCell::new(None) };
}

/// This thread's `otel_thread_ctx_v1` as an 8-byte external `ArrayBuffer`
/// (the same one on every call). JavaScript stores a record's address into
/// it with one aligned 8-byte store, which a sampler interrupting the thread
/// sees whole or not at all.
pub fn pointer_buffer(env: &Env) -> Result<Object<'_>> {
    if let Some(existing) = POINTER.with_borrow(|buffer| buffer.as_ref().map(|r| r.get_value(env)))
    {
        return existing;
    }
    if std::env::var_os(SIMULATE_NO_EXTERNAL_BUFFERS).is_some() {
        return Err(Error::new(
            Status::NoExternalBuffersAllowed,
            format!("external buffers are not allowed ({SIMULATE_NO_EXTERNAL_BUFFERS} is set)"),
        ));
    }
    let mut value = std::ptr::null_mut();
    // SAFETY: the variable is this thread's and lives as long as the thread;
    // the buffer belongs to this thread's env, which is torn down (and its
    // buffers with it) before the thread exits. No finalizer: nothing to free.
    let status = unsafe {
        sys::napi_create_external_arraybuffer(
            env.raw(),
            crate::tls::variable_address() as *mut c_void,
            std::mem::size_of::<usize>(),
            None,
            std::ptr::null_mut(),
            &mut value,
        )
    };
    if status != sys::Status::napi_ok {
        return Err(Error::new(
            Status::from(status),
            "cannot create the record pointer view".to_owned(),
        ));
    }
    let buffer = Object::from_raw(env.raw(), value);
    let reference = buffer.create_ref::<false>()?;
    POINTER.with_borrow_mut(|b| *b = Some(reference));
    Ok(buffer)
}

pub fn get_or_create(env: &Env, slot: Slot) -> Result<Object<'_>> {
    if let Some(existing) = BUFFER.with_borrow(|buffer| buffer.as_ref().map(|r| r.get_value(env))) {
        return existing;
    }
    if std::env::var_os(SIMULATE_NO_EXTERNAL_BUFFERS).is_some() {
        return Err(Error::new(
            Status::NoExternalBuffersAllowed,
            format!("external buffers are not allowed ({SIMULATE_NO_EXTERNAL_BUFFERS} is set)"),
        ));
    }
    let buffer = Object::from_raw(env.raw(), external_view(env, slot)?);
    let reference = buffer.create_ref::<false>()?;
    BUFFER.with_borrow_mut(|b| *b = Some(reference));
    Ok(buffer)
}

unsafe extern "C" fn finalize(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // V8 has dropped the buffer: the slot may now be recycled.
    registry::release(hint as usize, Holder::View);
}

/// An external `ArrayBuffer` over `slot`'s record, holding the slot until
/// V8 finalizes it.
///
/// napi directly rather than napi-rs's `ArrayBuffer::from_external`: where
/// the runtime forbids external buffers, that one returns a copy, whose
/// writes would publish nothing, instead of the error the JS writer falls
/// back on; and its debug-build check against reusing a data pointer does
/// not fit records, whose slots are recycled by design (safely: a slot is
/// reused only after this buffer's finalizer ran).
fn external_view(env: &Env, slot: Slot) -> Result<sys::napi_value> {
    registry::hold_view(slot.index);
    let mut value = std::ptr::null_mut();
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
    Ok(value)
}

/// Drops the strong reference at env teardown so V8 can finalize the buffer.
pub fn forget() {
    BUFFER.with_borrow_mut(|b| *b = None);
    POINTER.with_borrow_mut(|b| *b = None);
    // Node deletes every remaining reference of a torn-down env itself;
    // deleting it here would need the env, which cleanup hooks do not get.
}
