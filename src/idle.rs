//! Marks a thread's record invalid while its event loop is idle.
//!
//! libuv runs prepare handles right before it blocks in `epoll_wait`, so a
//! prepare callback that writes `valid = 0` guarantees that a thread parked
//! in the event loop publishes no span, at no cost to JavaScript. Every
//! callback that runs afterwards republishes its own span (see
//! `js/context-manager.js`). Blocking calls made *by* JS (`Atomics.wait`,
//! `fs.readFileSync`) do not go through the loop, so the span stays published
//! during them, which is what off-CPU profilers need.
//!
//! libuv's functions are looked up in the host process with `dlsym` rather
//! than linked, so the crate's unit tests link without a Node binary.

use std::cell::Cell;
use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use otel_thread_ctx_abi::record::ThreadContextRecord;

use crate::record;

/// `UV_PREPARE` in libuv's `uv_handle_type` (stable ABI since libuv 1.0).
const UV_PREPARE: c_int = 9;

type UvHandle = c_void;
type UvLoop = c_void;
type PrepareCb = unsafe extern "C" fn(*mut UvHandle);
type CloseCb = unsafe extern "C" fn(*mut UvHandle);

type HandleSizeFn = unsafe extern "C" fn(c_int) -> usize;
type PrepareInitFn = unsafe extern "C" fn(*mut UvLoop, *mut UvHandle) -> c_int;
type PrepareStartFn = unsafe extern "C" fn(*mut UvHandle, PrepareCb) -> c_int;
type UnrefFn = unsafe extern "C" fn(*mut UvHandle);
type CloseFn = unsafe extern "C" fn(*mut UvHandle, Option<CloseCb>);

struct Libuv {
    handle_size: HandleSizeFn,
    prepare_init: PrepareInitFn,
    prepare_start: PrepareStartFn,
    unref: UnrefFn,
    close: CloseFn,
}

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT only reads the loaded symbol tables.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!symbol.is_null()).then_some(symbol)
}

fn libuv() -> Option<&'static Libuv> {
    static LIBUV: OnceLock<Option<Libuv>> = OnceLock::new();
    LIBUV
        .get_or_init(|| {
            // SAFETY: each symbol is libuv's public function of that name,
            // whose C signature matches the field it is transmuted into.
            unsafe {
                Some(Libuv {
                    handle_size: std::mem::transmute::<*mut c_void, HandleSizeFn>(lookup(
                        c"uv_handle_size",
                    )?),
                    prepare_init: std::mem::transmute::<*mut c_void, PrepareInitFn>(lookup(
                        c"uv_prepare_init",
                    )?),
                    prepare_start: std::mem::transmute::<*mut c_void, PrepareStartFn>(lookup(
                        c"uv_prepare_start",
                    )?),
                    unref: std::mem::transmute::<*mut c_void, UnrefFn>(lookup(c"uv_unref")?),
                    close: std::mem::transmute::<*mut c_void, CloseFn>(lookup(c"uv_close")?),
                })
            }
        })
        .as_ref()
}

thread_local! {
    /// This thread's prepare handle, or NULL.
    static HANDLE: Cell<*mut UvHandle> = const { Cell::new(std::ptr::null_mut()) };
}

unsafe extern "C" fn on_prepare(handle: *mut UvHandle) {
    // SAFETY: `data` (the handle's first field) holds the record pointer set
    // in `start`, and the handle is closed before the record is released.
    unsafe {
        let record = *(handle as *mut *mut ThreadContextRecord);
        record::invalidate(record);
        // Record mode points the variable at span records; idle, it points
        // back at the thread's own record, now invalid.
        crate::tls::point_at(record);
    }
}

unsafe extern "C" fn on_closed(handle: *mut UvHandle) {
    // SAFETY: allocated by `libc::calloc` in `start`; libuv is done with it.
    unsafe { libc::free(handle) }
}

/// Starts clearing `record` whenever `event_loop` (the calling thread's loop)
/// is about to block. Idempotent. Returns false when libuv is not reachable.
///
/// # Safety
/// `event_loop` must be the calling thread's live libuv loop, and `record`
/// must stay valid until `stop` runs on this thread.
pub unsafe fn start(event_loop: *mut UvLoop, record: *mut ThreadContextRecord) -> bool {
    if !HANDLE.with(Cell::get).is_null() {
        return true;
    }
    let Some(uv) = libuv() else { return false };
    // SAFETY: plain libuv calls on a zeroed allocation of the size libuv asks for.
    unsafe {
        let handle = libc::calloc(1, (uv.handle_size)(UV_PREPARE));
        if handle.is_null() || (uv.prepare_init)(event_loop, handle) != 0 {
            libc::free(handle);
            return false;
        }
        *(handle as *mut *mut ThreadContextRecord) = record;
        (uv.prepare_start)(handle, on_prepare);
        // The handle must never keep a process or worker alive.
        (uv.unref)(handle);
        HANDLE.with(|h| h.set(handle));
    }
    true
}

/// Stops and closes the calling thread's prepare handle, if any.
pub fn stop() {
    let handle = HANDLE.with(|h| h.replace(std::ptr::null_mut()));
    if handle.is_null() {
        return;
    }
    if let Some(uv) = libuv() {
        // SAFETY: `handle` is an open prepare handle of this thread's loop;
        // uv_close also stops it, and `on_closed` frees it afterwards.
        unsafe { (uv.close)(handle, Some(on_closed)) };
    }
}

/// Whether the calling thread clears its record on idle.
pub fn is_active() -> bool {
    !HANDLE.with(Cell::get).is_null()
}
