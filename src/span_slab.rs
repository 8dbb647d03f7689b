//! Native memory for the per-span OTEP 4947 records of both publishing
//! modes, handed to JavaScript as external `ArrayBuffer`s, each a slab
//! holding many records one after the other (the JS writer carves them out
//! and fills them through typed arrays; a napi call per span would cost
//! more than the rest of the span's publishing).
//!
//! A slab is freed only by its buffer's finalizer, after V8 found the buffer
//! and every view of it unreachable. Frame mode's wrappers are views of it,
//! and record mode keeps the record the thread's `otel_thread_ctx_v1` points
//! at reachable from JavaScript, so no reader can be led to freed memory.
//!
//! Slabs are private mappings marked `MADV_WIPEONFORK`, like the threads'
//! own records: a child forked without exec reads zeroes (no span) where
//! its parent's spans were, instead of a span it never ran.

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

unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `data` is the mapping `create` made, of the length passed as
    // `hint`; V8 no longer references the buffer, so nothing can reach a
    // record in it.
    unsafe { libc::munmap(data, hint as usize) };
    // ORDER: as in `live`.
    LIVE.fetch_sub(1, Ordering::Relaxed);
}

/// The allowed sizes of a slab: at least one record header.
pub fn size_is_valid(size: usize) -> bool {
    (HEADER_SIZE..=MAX_SLAB_BYTES).contains(&size)
}

/// A zeroed (every record `valid = 0`) slab of `size` bytes as an external
/// `ArrayBuffer`, page-aligned, freed when V8 finalizes the buffer.
///
/// # Safety
/// `env` must be the calling thread's live napi env; `size` must satisfy
/// [`size_is_valid`].
pub unsafe fn create(env: sys::napi_env, size: usize) -> Result<sys::napi_value, sys::napi_status> {
    if std::env::var_os(crate::view::SIMULATE_NO_EXTERNAL_BUFFERS).is_some() {
        return Err(sys::Status::napi_no_external_buffers_allowed);
    }
    let Ok(data) = crate::anonymous_memory::map(size) else {
        return Err(sys::Status::napi_generic_failure);
    };
    // SAFETY: advice on the mapping just made; failure (an old kernel) only
    // loses the fork behaviour.
    unsafe { libc::madvise(data, size, libc::MADV_WIPEONFORK) };
    // ORDER: as in `live`.
    LIVE.fetch_add(1, Ordering::Relaxed);
    let mut value = std::ptr::null_mut();
    // SAFETY: `data` is ours until the finalizer unmaps it; each mapping
    // gets exactly one buffer, so no two live external buffers share memory.
    let status = unsafe {
        sys::napi_create_external_arraybuffer(
            env,
            data,
            size,
            Some(finalize),
            size as *mut c_void,
            &mut value,
        )
    };
    if status != sys::Status::napi_ok {
        // SAFETY: no buffer was made, so nothing else references `data`.
        unsafe { libc::munmap(data, size) };
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
