//! Reads of this process's own memory that cannot crash: the start-up
//! verification follows pointers the way an out-of-process reader does, and
//! a wrong guess about V8's layout must end in an error, not a fault.

use std::io;

/// Copies `buf.len()` bytes at `address` of this process through
/// `process_vm_readv`, which reports an unmapped or unreadable address as
/// an error instead of faulting.
pub fn read(address: u64, buf: &mut [u8]) -> io::Result<()> {
    if address == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "null address"));
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` covers `buf`, which we own; the kernel checks
    // `remote` against our address space and never faults us on it.
    let copied = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    match copied {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize == buf.len() => Ok(()),
        _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "partial read")),
    }
}

/// The 8-byte word at `address`.
pub fn read_word(address: u64) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    read(address, &mut bytes)?;
    Ok(u64::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_unmapped_addresses() {
        let value: u64 = 0x1122_3344_5566_7788;
        assert_eq!(read_word(&value as *const u64 as u64).unwrap(), value);
        assert!(read_word(8).is_err());
        assert!(read_word(0).is_err());
    }
}
