//! Reading the target's memory without stopping it (`process_vm_readv`).
//!
//! Every read is bounded by the caller's buffer and fails as a whole when any
//! byte is unmapped, so garbage pointers become errors, never crashes.

use std::fmt;

/// A source of another address space's bytes.
pub trait Memory {
    /// Fills `buf` from `addr`, or fails without a partial result.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError>;

    /// Reads a host-endian `u64` at `addr`.
    fn read_u64(&self, addr: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
}

/// A failed read: which bytes, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryError {
    pub addr: u64,
    pub len: usize,
    pub reason: String,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read {} bytes at {:#x}: {}",
            self.len, self.addr, self.reason
        )
    }
}

impl std::error::Error for MemoryError {}

/// The memory of a live process, read with `process_vm_readv`.
#[derive(Clone, Copy, Debug)]
pub struct ProcessMemory {
    pid: i32,
}

impl ProcessMemory {
    /// Reads the address space of `pid` (any thread id of it works too).
    pub fn new(pid: i32) -> Self {
        ProcessMemory { pid }
    }
}

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let len = buf.len();
        let fail = |reason: String| MemoryError { addr, len, reason };
        if buf.is_empty() {
            return Ok(());
        }
        if addr == 0 || addr.checked_add(buf.len() as u64).is_none() {
            return Err(fail("address out of range".into()));
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which we borrow mutably for the
        // call; `remote` is only dereferenced by the kernel, in the target.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(fail(std::io::Error::last_os_error().to_string()));
        }
        if n as usize != buf.len() {
            return Err(fail(format!("only {n} bytes readable")));
        }
        Ok(())
    }
}

#[cfg(test)]
pub mod fake {
    //! An in-memory address space for unit tests.
    use super::*;
    use std::cell::RefCell;

    /// Regions of bytes at fixed addresses; reads spanning a hole fail.
    #[derive(Default)]
    pub struct FakeMemory {
        pub regions: RefCell<Vec<(u64, Vec<u8>)>>,
        /// Called before every read, to simulate a concurrent writer.
        pub on_read: RefCell<Option<Box<dyn FnMut(&mut Vec<(u64, Vec<u8>)>)>>>,
    }

    impl FakeMemory {
        pub fn put(&self, addr: u64, bytes: &[u8]) {
            self.regions.borrow_mut().push((addr, bytes.to_vec()));
        }
    }

    impl Memory for FakeMemory {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
            if let Some(hook) = self.on_read.borrow_mut().as_mut() {
                hook(&mut self.regions.borrow_mut());
            }
            for (start, bytes) in self.regions.borrow().iter().rev() {
                if addr >= *start && addr + buf.len() as u64 <= start + bytes.len() as u64 {
                    let off = (addr - start) as usize;
                    buf.copy_from_slice(&bytes[off..off + buf.len()]);
                    return Ok(());
                }
            }
            Err(MemoryError {
                addr,
                len: buf.len(),
                reason: "unmapped".into(),
            })
        }
    }
}
