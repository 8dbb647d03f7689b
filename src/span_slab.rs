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
//! its parent's spans were, instead of a span it never ran. A finalized
//! slab's mapping is kept for the next slab (up to [`POOL_BYTES`]) rather
//! than unmapped: a service makes slabs at a steady rate, and a mapping
//! costs two system calls to make and one to drop.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use napi::sys;

use otel_thread_ctx_abi::record::HEADER_SIZE;

/// Largest slab JavaScript asks for.
pub const MAX_SLAB_BYTES: usize = 1 << 20;

/// Slabs allocated and not yet finalized, process-wide.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Most bytes of finalized slabs kept mapped for reuse, process-wide.
pub const POOL_BYTES: usize = 4 << 20;

/// Finalized slabs' mappings, `(address, length)`, for the next slabs of
/// the same length (every thread's slabs have one of a few lengths).
static POOL: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn pool() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A zeroed mapping of `len` bytes: a pooled one, else a new one.
fn take_mapping(len: usize) -> Option<*mut c_void> {
    let reused = {
        let mut pool = pool();
        let found = pool.iter().rposition(|&(_, l)| l == len);
        found.map(|i| pool.swap_remove(i).0)
    };
    if let Some(address) = reused {
        let data = address as *mut c_void;
        // SAFETY: a mapping of `len` bytes that no buffer references any
        // more (its finalizer gave it back); the records carved from it
        // must start invalid, as in a fresh mapping.
        unsafe { std::ptr::write_bytes(data.cast::<u8>(), 0, len) };
        return Some(data);
    }
    let data = crate::anonymous_memory::map(len).ok()?;
    // SAFETY: advice on the mapping just made; failure (an old kernel) only
    // loses the fork behaviour.
    unsafe { libc::madvise(data, len, libc::MADV_WIPEONFORK) };
    Some(data)
}

/// Gives a mapping back: pooled while the pool has room, else unmapped.
fn give_back(data: *mut c_void, len: usize) {
    {
        let mut pool = pool();
        let pooled: usize = pool.iter().map(|&(_, l)| l).sum();
        if pooled + len <= POOL_BYTES {
            pool.push((data as usize, len));
            return;
        }
    }
    // SAFETY: the mapping `create` made, of `len` bytes, referenced by
    // nothing any more.
    unsafe { libc::munmap(data, len) };
}

/// Slabs alive now (for leak tests).
pub fn live() -> usize {
    // ORDER: a counter for diagnostics; no other memory depends on it.
    LIVE.load(Ordering::Relaxed)
}

unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, hint: *mut c_void) {
    // `data` is the mapping `create` made, of the length passed as `hint`;
    // V8 no longer references the buffer, so nothing can reach a record in it.
    give_back(data, hint as usize);
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
    let Some(data) = take_mapping(size) else {
        return Err(sys::Status::napi_generic_failure);
    };
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
        // No buffer was made, so nothing else references `data`.
        give_back(data, size);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_back_mapping_is_reused_zeroed_and_the_pool_is_bounded() {
        let len = 4 * 4096;
        let first = take_mapping(len).unwrap();
        // SAFETY: a mapping of `len` bytes this test owns.
        unsafe { std::ptr::write_bytes(first.cast::<u8>(), 0xab, len) };
        give_back(first, len);
        let again = take_mapping(len).unwrap();
        assert_eq!(again, first, "the pooled mapping comes back first");
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(again.cast::<u8>(), len) };
        assert!(bytes.iter().all(|&b| b == 0), "a reused mapping is zeroed");
        give_back(again, len);
        let big = POOL_BYTES;
        let mapped: Vec<_> = (0..2).map(|_| take_mapping(big).unwrap()).collect();
        for &m in &mapped {
            give_back(m, big);
        }
        let pooled: usize = pool().iter().map(|&(_, l)| l).sum();
        assert!(pooled <= POOL_BYTES, "pooled {pooled} bytes");
    }
}
