//! The few V8 entry points frame mode needs, resolved at run time from the
//! `node` binary's exported C++ symbols rather than compiled against one
//! Node's headers: V8's C++ ABI changes with every Node major line, and a
//! build must keep working on every line it is loaded into. Each signature
//! below takes and returns only pointers and integers, and whatever they
//! produce is verified by walking it before anything is published.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use napi::sys;

/// `v8::Isolate*` (the same address as `v8::internal::Isolate*`).
pub type Isolate = *mut c_void;
/// `void (*)(v8::Isolate*, v8::GCType, v8::GCCallbackFlags, void*)`.
pub type GcCallback = unsafe extern "C" fn(Isolate, c_int, c_int, *mut c_void);

type GetCurrentFn = unsafe extern "C" fn() -> Isolate;
type GlobalizeFn = unsafe extern "C" fn(Isolate, u64) -> *mut u64;
type DisposeGlobalFn = unsafe extern "C" fn(*mut u64);
type IdentityHashFn = unsafe extern "C" fn(sys::napi_value) -> c_int;
type AddGcCallbackFn = unsafe extern "C" fn(Isolate, GcCallback, *mut c_void, c_int);
type RemoveGcCallbackFn = unsafe extern "C" fn(Isolate, GcCallback, *mut c_void);

/// The V8 functions frame mode calls.
pub struct V8 {
    /// `v8::Isolate::GetCurrent()`.
    pub get_current: GetCurrentFn,
    /// `v8::api_internal::GlobalizeReference(i::Isolate*, Address)`: a new
    /// strong global handle slot holding the tagged value.
    pub globalize: GlobalizeFn,
    /// `v8::api_internal::DisposeGlobal(Address*)`.
    pub dispose_global: DisposeGlobalFn,
    /// `v8::Object::GetIdentityHash()`, `this` being a `Local<Object>`'s slot.
    pub identity_hash: IdentityHashFn,
    /// `v8::Isolate::AddGCPrologueCallback(callback, data, filter)`.
    pub add_gc_prologue: AddGcCallbackFn,
    /// `v8::Isolate::AddGCEpilogueCallback(callback, data, filter)`.
    pub add_gc_epilogue: AddGcCallbackFn,
    /// `v8::Isolate::RemoveGCPrologueCallback(callback, data)`.
    pub remove_gc_prologue: RemoveGcCallbackFn,
    /// `v8::Isolate::RemoveGCEpilogueCallback(callback, data)`.
    pub remove_gc_epilogue: RemoveGcCallbackFn,
}

/// `kGCTypeScavenge | kGCTypeMinorMarkSweep | kGCTypeMarkSweepCompact`:
/// the collections that move objects.
pub const MOVING_GC_TYPES: c_int = 0b111;

fn lookup(name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: dlsym with RTLD_DEFAULT only reads the loaded symbol tables.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if symbol.is_null() {
        Err(format!(
            "the running node does not export {}",
            name.to_string_lossy()
        ))
    } else {
        Ok(symbol)
    }
}

macro_rules! resolve {
    ($ty:ty, $name:literal) => {
        // SAFETY: the mangled name encodes the C++ signature, which is the
        // type's: only pointer and integer arguments, the Itanium ABI
        // passing `this` first.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(lookup($name)?) }
    };
}

fn resolve_all() -> Result<V8, String> {
    Ok(V8 {
        get_current: resolve!(GetCurrentFn, c"_ZN2v87Isolate10GetCurrentEv"),
        globalize: resolve!(GlobalizeFn, c"_ZN2v812api_internal18GlobalizeReferenceEPNS_8internal7IsolateEm"),
        dispose_global: resolve!(DisposeGlobalFn, c"_ZN2v812api_internal13DisposeGlobalEPm"),
        identity_hash: resolve!(IdentityHashFn, c"_ZN2v86Object15GetIdentityHashEv"),
        add_gc_prologue: resolve!(
            AddGcCallbackFn,
            c"_ZN2v87Isolate21AddGCPrologueCallbackEPFvPS0_NS_6GCTypeENS_15GCCallbackFlagsEPvES4_S2_"
        ),
        add_gc_epilogue: resolve!(
            AddGcCallbackFn,
            c"_ZN2v87Isolate21AddGCEpilogueCallbackEPFvPS0_NS_6GCTypeENS_15GCCallbackFlagsEPvES4_S2_"
        ),
        remove_gc_prologue: resolve!(
            RemoveGcCallbackFn,
            c"_ZN2v87Isolate24RemoveGCPrologueCallbackEPFvPS0_NS_6GCTypeENS_15GCCallbackFlagsEPvES4_"
        ),
        remove_gc_epilogue: resolve!(
            RemoveGcCallbackFn,
            c"_ZN2v87Isolate24RemoveGCEpilogueCallbackEPFvPS0_NS_6GCTypeENS_15GCCallbackFlagsEPvES4_"
        ),
    })
}

/// The V8 entry points, or why they are not all there.
pub fn v8() -> Result<&'static V8, String> {
    static V8_FNS: OnceLock<Result<V8, String>> = OnceLock::new();
    V8_FNS
        .get_or_init(resolve_all)
        .as_ref()
        .map_err(Clone::clone)
}

/// The tagged value a napi value stands for. napi values are V8 `Local`s,
/// which point at a handle slot; the slot holds the tagged value.
///
/// # Safety
/// `value` must be a live napi value of the current callback's scope.
pub unsafe fn tagged(value: sys::napi_value) -> u64 {
    // SAFETY: per the caller, `value` addresses a live handle slot.
    unsafe { *(value as *const u64) }
}
