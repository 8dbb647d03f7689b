//! Fresh private anonymous mappings, for memory that must outlive any Rust
//! owner (records, the process context page): it is never unmapped through
//! an allocator, only where its owner says so.

use std::ffi::c_void;
use std::io;

/// Maps `len` bytes of zeroed, readable and writable private memory.
pub fn map(len: usize) -> io::Result<*mut c_void> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(addr)
}
