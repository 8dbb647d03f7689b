//! The calling thread's frame-mode publication: its
//! `otel_thread_ctx_nodejs_v1` block, the global handle that keeps the
//! manager's AsyncLocalStorage findable (GC updates the handle's slot when
//! it moves the object), and GC callbacks that close the gate while V8
//! moves objects, so a walk inside a moving GC never follows a half-moved
//! graph; meanwhile the thread's OTEP 4947 variable, which readers read
//! first, carries the span.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};

use napi::sys;

use otel_thread_ctx_abi::node_schema::{untag, ThreadContext, V8Layout, DEFAULT_LAYOUT};

use super::v8::{tagged, v8, Isolate, MOVING_GC_TYPES};
use super::{tls, walk};

struct Publication {
    isolate: Isolate,
    /// The global handle slot (`als_handle`), disposed when replaced.
    handle: *mut u64,
    block: ThreadContext,
    layout: V8Layout,
}

/// The layout the last publishing thread used: the same on every thread of
/// a process (one V8), kept for walks of other threads' blocks.
static PROCESS_LAYOUT: std::sync::Mutex<Option<V8Layout>> = std::sync::Mutex::new(None);

thread_local! {
    // Boxed: the publication is large, and static TLS is scarce (below).
    static PUBLICATION: RefCell<Option<Box<Publication>>> = const { RefCell::new(None) };
    // The addon's whole TLS segment must fit glibc's static TLS surplus
    // (512 bytes), else a late dlopen puts it in dynamic TLS, which some
    // profilers cannot read: add no thread-local lightly.
    static GC_PAUSES: Cell<GcPauses> = const {
        Cell::new(GcPauses { moving: 0, closed: 0, pinned: 0 })
    };
}

/// Moving GCs seen on the calling thread while it published frames
/// (wrapping counters, 12 bytes of TLS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcPauses {
    /// Moving GCs whose prologue closed the gate.
    pub moving: u32,
    /// Of those, the ones where the thread's block, read at the epilogue
    /// (objects moved, gate not yet reopened), was closed: what a sample
    /// landing inside the pause finds.
    pub closed: u32,
    /// Of those, the ones during which the thread's OTEP 4947 variable
    /// carried the span the walk found at the prologue.
    pub pinned: u32,
}

/// The gate's value while it is open: the published block's `cped_slot`,
/// 0 when unpublished (or, never expected, while the publication is being
/// replaced: the gate then stays closed until the replacement stores it).
fn open_gate() -> u64 {
    published(|p| p.block.cped_slot).unwrap_or(0)
}

/// `f` of the calling thread's publication, for GC callbacks: `None` when
/// there is none, or while it is being replaced (borrowed) or torn down.
fn published<T>(f: impl FnOnce(&Publication) -> T) -> Option<T> {
    PUBLICATION
        .try_with(|p| p.try_borrow().ok().and_then(|p| p.as_deref().map(f)))
        .ok()
        .flatten()
}

/// Readers read a thread's OTEP 4947 record before they walk its frames.
/// While the gate is closed for a moving GC, that variable points at the
/// current span's record, found now, before anything moves (span records
/// live outside V8's heap, and the wrapper that owns it stays reachable
/// from the current frame, so the record outlives the pause). A span the
/// direct API put in the thread's own record is left in place.
fn pin_current_span() {
    let Some(slot) = crate::registry::current_slot() else {
        return;
    };
    if crate::tls::current() != slot.record {
        return;
    }
    // SAFETY: the slot's record is this thread's own until it detaches,
    // which this thread does, and never inside a GC callback.
    if unsafe { crate::record::is_valid(slot.record) } {
        return;
    }
    let Some(layout) = published(|p| p.layout) else {
        return;
    };
    if let Ok(record) = walk::record(&tls::load(), &layout) {
        if record != 0 {
            crate::tls::point_at(record as *mut _);
        }
    }
}

/// Points the thread's OTEP 4947 variable back at its own record. Returns
/// whether it carried a span record of the pause.
fn unpin_current_span() -> bool {
    let Some(slot) = crate::registry::current_slot() else {
        return false;
    };
    let pinned = crate::tls::current();
    if pinned == slot.record {
        return false;
    }
    crate::tls::point_at(slot.record);
    !pinned.is_null()
}

unsafe extern "C" fn on_gc_start(_: Isolate, _: c_int, _: c_int, _: *mut c_void) {
    // The span is readable through the 4947 variable before the walk stops.
    pin_current_span();
    tls::gate(0);
    GC_PAUSES.with(|p| {
        let mut pauses = p.get();
        pauses.moving = pauses.moving.wrapping_add(1);
        p.set(pauses);
    });
}

unsafe extern "C" fn on_gc_end(_: Isolate, _: c_int, _: c_int, _: *mut c_void) {
    // The block's first word only: the walk stops there when it is 0.
    let closed = tls::load().cped_slot == 0;
    tls::gate(open_gate());
    // The walk answers again before the 4947 variable stops carrying the span.
    let pinned = unpin_current_span();
    GC_PAUSES.with(|p| {
        let mut pauses = p.get();
        pauses.closed = pauses.closed.wrapping_add(closed.into());
        pauses.pinned = pauses.pinned.wrapping_add(pinned.into());
        p.set(pauses);
    });
}

/// The calling thread's moving-GC counts (kept across publications).
pub fn gc_pauses() -> GcPauses {
    GC_PAUSES.with(Cell::get)
}

/// Publishes the calling thread's block for the AsyncLocalStorage `als`:
/// its CPED slot at `cped_offset` from the isolate, and wrappers holding
/// their record address at `record_offset`. Replaces a previous
/// publication of the thread (another manager taking over). Returns
/// whether the thread was not publishing before.
///
/// # Safety
/// `env` must be the calling thread's env and `als` a live napi object of
/// the current callback.
pub unsafe fn publish(
    env: sys::napi_env,
    als: sys::napi_value,
    cped_offset: u64,
    record_offset: u64,
) -> Result<bool, String> {
    let v8 = v8()?;
    // SAFETY: per the caller.
    let (isolate, block) = unsafe { new_block(env, als, cped_offset)? };
    let layout = V8Layout {
        js_object_record_offset: record_offset,
        ..DEFAULT_LAYOUT
    };
    *PROCESS_LAYOUT.lock().unwrap_or_else(|e| e.into_inner()) = Some(layout);
    let previous = PUBLICATION.with_borrow_mut(|p| {
        p.replace(Box::new(Publication {
            isolate,
            handle: block.als_handle as *mut u64,
            block,
            layout,
        }))
    });
    // The store closes the gate before it changes any field, so the old
    // handle is unreachable from the block before it is disposed below.
    tls::store(&block);
    let first = previous.is_none();
    match previous {
        // SAFETY: the old handle is ours and no longer published.
        Some(previous) => unsafe { (v8.dispose_global)(previous.handle) },
        // SAFETY: `isolate` is current; the callbacks only touch this
        // thread's TLS and are removed in `unpublish`.
        None => unsafe {
            (v8.add_gc_prologue)(isolate, on_gc_start, std::ptr::null_mut(), MOVING_GC_TYPES);
            (v8.add_gc_epilogue)(isolate, on_gc_end, std::ptr::null_mut(), MOVING_GC_TYPES);
        },
    }
    Ok(first)
}

/// A block for the AsyncLocalStorage `als`, with a new global handle the
/// caller owns (`als_handle`), and the current isolate.
///
/// # Safety
/// As for [`publish`].
unsafe fn new_block(
    env: sys::napi_env,
    als: sys::napi_value,
    cped_offset: u64,
) -> Result<(Isolate, ThreadContext), String> {
    let v8 = v8()?;
    // SAFETY: called from a napi callback, on the isolate's thread.
    let isolate = unsafe { (v8.get_current)() };
    if isolate.is_null() {
        return Err("no V8 isolate is current".to_owned());
    }
    let mut undefined = std::ptr::null_mut();
    // SAFETY: a plain napi call on the live env.
    if unsafe { sys::napi_get_undefined(env, &mut undefined) } != sys::Status::napi_ok {
        return Err("napi_get_undefined failed".to_owned());
    }
    // SAFETY: per the caller; `undefined` is a live value of this scope.
    let (key, undefined_addr, hash) =
        unsafe { (tagged(als), tagged(undefined), (v8.identity_hash)(als)) };
    if untag(key).is_none() || untag(undefined_addr).is_none() {
        return Err("napi values are not V8 handle slots on this Node".to_owned());
    }
    // SAFETY: `isolate` is current and `key` a live tagged object.
    let handle = unsafe { (v8.globalize)(isolate, key) };
    if handle.is_null() {
        return Err("cannot create a global handle".to_owned());
    }
    Ok((
        isolate,
        ThreadContext {
            cped_slot: isolate as u64 + cped_offset,
            als_handle: handle as u64,
            als_identity_hash: hash,
            padding: 0,
            undefined_addr,
        },
    ))
}

/// Walks, as a reader would, a block built for `als` exactly as [`publish`]
/// builds it, without publishing it: called inside `als.run(wrapper)`, the
/// walk must end at `record`. Proves the whole chain (handle slot, identity
/// hash, CPED slot, table layout, record offset) on the running Node.
///
/// # Safety
/// As for [`publish`].
pub unsafe fn verify(
    env: sys::napi_env,
    als: sys::napi_value,
    cped_offset: u64,
    record_offset: u64,
    record: u64,
) -> Result<(), String> {
    let v8 = v8()?;
    // SAFETY: per the caller.
    let (_, block) = unsafe { new_block(env, als, cped_offset)? };
    let layout = V8Layout {
        js_object_record_offset: record_offset,
        ..DEFAULT_LAYOUT
    };
    let found = walk::record(&block, &layout);
    // SAFETY: the handle was made for this check and is not published.
    unsafe { (v8.dispose_global)(block.als_handle as *mut u64) };
    match found {
        Ok(address) if address == record => Ok(()),
        Ok(address) => Err(format!(
            "the walk ended at {address:#x}, not at the span record {record:#x}"
        )),
        Err(miss) => Err(format!("the walk found no span record: {}", miss.reason())),
    }
}

/// Stops the calling thread's publication: the gate closes first, then the
/// handle and the GC callbacks go. Returns the layout the thread published
/// with, or `None` when it published nothing.
pub fn unpublish() -> Option<V8Layout> {
    tls::gate(0);
    let publication = PUBLICATION.with_borrow_mut(Option::take)?;
    tls::store(&ThreadContext::default());
    let v8 = v8().ok()?;
    // SAFETY: the handle is ours and unpublished; the isolate is the one
    // the callbacks were added to, still alive (env teardown runs before
    // the isolate is disposed).
    unsafe {
        (v8.dispose_global)(publication.handle);
        (v8.remove_gc_prologue)(publication.isolate, on_gc_start, std::ptr::null_mut());
        (v8.remove_gc_epilogue)(publication.isolate, on_gc_end, std::ptr::null_mut());
    }
    Some(publication.layout)
}

/// The layout the calling thread publishes with, when it publishes.
pub fn layout() -> Option<V8Layout> {
    PUBLICATION.with_borrow(|p| p.as_ref().map(|p| p.layout))
}

/// What a reader finds for the calling thread now: the record address, or
/// why there is none.
pub fn walk() -> Result<u64, walk::Miss> {
    let layout = layout().ok_or(walk::Miss::Closed)?;
    walk::record(&tls::load(), &layout)
}

/// What a reader finds for the thread whose block is at `address` (any
/// thread of this process), with the process's layout.
pub fn walk_at(address: u64) -> Result<u64, walk::Miss> {
    let layout = PROCESS_LAYOUT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ok_or(walk::Miss::Closed)?;
    let mut bytes = [0u8; otel_thread_ctx_abi::node_schema::SIZE];
    super::memory::read(address, &mut bytes)
        .map_err(|_| walk::Miss::Bad("cannot read the block"))?;
    // SAFETY: ThreadContext is plain integers, any bit pattern is valid.
    let block: ThreadContext = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    walk::record(&block, &layout)
}

/// The block as published (not as read: the gate may be closed in GC).
pub fn block() -> Option<ThreadContext> {
    PUBLICATION.with_borrow(|p| p.as_ref().map(|p| p.block))
}
