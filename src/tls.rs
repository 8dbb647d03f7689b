//! The `otel_thread_ctx_v1` TLS variable readers discover (defined in
//! `src/tls_shim.c`, exported through `src/exports.map`).

use otel_thread_ctx_abi::record::ThreadContextRecord;

extern "C" {
    fn otel_thread_ctx_tls_store(record: *mut ThreadContextRecord);
    fn otel_thread_ctx_tls_load() -> *mut ThreadContextRecord;
    fn otel_thread_ctx_tls_address() -> *mut *mut ThreadContextRecord;
    fn otel_thread_ctx_tls_model() -> std::ffi::c_int;
}

/// Where glibc placed this module's TLS block (and so `otel_thread_ctx_v1`)
/// for the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsModel {
    /// In the static TLS area, at a fixed offset from every thread pointer:
    /// what every TLS-reading profiler handles.
    Static,
    /// In a block reached through the thread's DTV (a late `dlopen` after the
    /// static TLS surplus ran out): some profilers cannot read it.
    Dynamic,
    /// The descriptor matched neither (not resolved yet, another C library,
    /// another architecture).
    Unknown,
}

impl TlsModel {
    pub fn name(self) -> &'static str {
        match self {
            TlsModel::Static => "static",
            TlsModel::Dynamic => "dynamic",
            TlsModel::Unknown => "unknown",
        }
    }
}

/// Points the calling thread's `otel_thread_ctx_v1` at `record` (or NULL).
pub fn point_at(record: *mut ThreadContextRecord) {
    // SAFETY: the shim only stores into the calling thread's own variable.
    unsafe { otel_thread_ctx_tls_store(record) }
}

/// What the calling thread's `otel_thread_ctx_v1` holds now.
pub fn current() -> *mut ThreadContextRecord {
    // SAFETY: the shim only loads the calling thread's own variable.
    unsafe { otel_thread_ctx_tls_load() }
}

/// Address of the calling thread's `otel_thread_ctx_v1` variable.
pub fn variable_address() -> usize {
    // SAFETY: taking the address of our own TLS variable has no side effect.
    unsafe { otel_thread_ctx_tls_address() as usize }
}

/// Where the calling thread's `otel_thread_ctx_v1` sits, read from its
/// TLSDESC descriptor as the dynamic linker filled it (see the shim).
pub fn model() -> TlsModel {
    // SAFETY: the shim reads this module's own GOT descriptor and, for a
    // dynamic one, the `tls_index` glibc allocated for it; it writes nothing.
    match unsafe { otel_thread_ctx_tls_model() } {
        1 => TlsModel::Static,
        2 => TlsModel::Dynamic,
        _ => TlsModel::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_pointer() {
        // SAFETY: an all-zero record is a valid value of the type.
        let mut record: ThreadContextRecord = unsafe { std::mem::zeroed() };
        point_at(&mut record);
        assert_eq!(current(), &mut record as *mut _);
        let (other_current, other_address) =
            std::thread::spawn(|| (current() as usize, variable_address()))
                .join()
                .unwrap();
        assert_eq!(other_current, 0);
        assert_ne!(other_address, variable_address());
        point_at(std::ptr::null_mut());
        assert!(current().is_null());
    }

    #[test]
    fn in_an_executable_the_variable_is_in_static_tls() {
        // Linked into this test executable, the linker resolves the variable
        // to static TLS; the shim must recognise that, on every thread.
        assert_eq!(model(), TlsModel::Static);
        assert_eq!(std::thread::spawn(model).join().unwrap(), TlsModel::Static);
    }

    #[test]
    fn the_shim_and_the_version_script_name_the_abi_symbol() {
        use otel_thread_ctx_abi::record::TLS_SYMBOL;
        // The symbol is spelled in C and in the linker script, which cannot
        // import the constant: this keeps them equal to it.
        let definition = format!("__thread void *{TLS_SYMBOL} = NULL;");
        assert!(include_str!("tls_shim.c").contains(&definition));
        let export = format!("global: {TLS_SYMBOL};");
        assert!(include_str!("exports.map").contains(&export));
    }
}
