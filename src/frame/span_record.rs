//! Native memory for the per-span OTEP 4947 records, handed to JavaScript as
//! external `ArrayBuffer`s, each a slab holding many records one after the
//! other (the JS writer carves them out and fills them through typed
//! arrays; a napi call per span would cost more than the rest of the span's
//! publishing). A wrapper typed array over a record's bytes is what the
//! manager's AsyncLocalStorage stores, and it keeps the whole slab alive, so
//! a record stays allocated as long as any AsyncContextFrame can reach it:
//! a slab is freed only by its buffer's finalizer, after V8 found the buffer
//! and every view of it unreachable.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use napi::sys;

use otel_thread_ctx_abi::record::HEADER_SIZE;

/// Largest slab JavaScript asks for.
pub const MAX_SLAB_BYTES: usize = 1 << 20;

/// Slabs allocated and not yet finalized, process-wide.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Slabs alive now (for leak tests).
pub fn live() -> usize {
    // ORDER: a counter for diagnostics; no other memory depends on it.
    LIVE.load(Ordering::Relaxed)
}

unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` came from `calloc` in `create` and V8 no longer
    // references the buffer, so no frame can reach the record.
    unsafe { libc::free(data) };
    // ORDER: as in `live`.
    LIVE.fetch_sub(1, Ordering::Relaxed);
}

/// The allowed sizes of a slab: at least one record header.
pub fn size_is_valid(size: usize) -> bool {
    (HEADER_SIZE..=MAX_SLAB_BYTES).contains(&size)
}

/// A zeroed (every record `valid = 0`) slab of `size` bytes as an external
/// `ArrayBuffer`, freed when V8 finalizes the buffer.
///
/// # Safety
/// `env` must be the calling thread's live napi env; `size` must satisfy
/// [`size_is_valid`].
pub unsafe fn create(env: sys::napi_env, size: usize) -> Result<sys::napi_value, sys::napi_status> {
    if std::env::var_os(crate::view::SIMULATE_NO_EXTERNAL_BUFFERS).is_some() {
        return Err(sys::Status::napi_no_external_buffers_allowed);
    }
    // Records need 2-byte alignment (OTEP 4947); calloc gives 16.
    // SAFETY: plain allocation.
    let data = unsafe { libc::calloc(1, size) };
    if data.is_null() {
        return Err(sys::Status::napi_generic_failure);
    }
    // ORDER: as in `live`.
    LIVE.fetch_add(1, Ordering::Relaxed);
    let mut value = std::ptr::null_mut();
    // SAFETY: `data` is ours until the finalizer frees it; each allocation
    // gets exactly one buffer, so no two live external buffers share memory.
    let status = unsafe {
        sys::napi_create_external_arraybuffer(
            env,
            data,
            size,
            Some(finalize),
            std::ptr::null_mut(),
            &mut value,
        )
    };
    if status != sys::Status::napi_ok {
        // SAFETY: no buffer was made, so nothing else references `data`.
        unsafe { libc::free(data) };
        LIVE.fetch_sub(1, Ordering::Relaxed);
        return Err(status);
    }
    Ok(value)
}

/// The data address of an `ArrayBuffer`.
///
/// # Safety
/// `env` and `buffer` must be live napi handles of the current callback.
pub unsafe fn address(env: sys::napi_env, buffer: sys::napi_value) -> Option<u64> {
    let mut data = std::ptr::null_mut();
    let mut len = 0;
    // SAFETY: per the caller; napi checks that `buffer` is an ArrayBuffer.
    let status = unsafe { sys::napi_get_arraybuffer_info(env, buffer, &mut data, &mut len) };
    (status == sys::Status::napi_ok && !data.is_null()).then_some(data as u64)
}
