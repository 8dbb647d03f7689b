//! Reading the target's memory without stopping it (`/proc/<pid>/task/<tid>/mem`).
//!
//! Every read is bounded by the caller's buffer and fails as a whole when any
//! byte is unmapped, so garbage pointers become errors, never crashes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

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

    /// Whether the address space behind this memory is gone for good (the
    /// process executed a new program or exited): no read will succeed again.
    fn ended(&self) -> bool {
        false
    }
}

/// A failed read: which bytes, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {len} bytes at {addr:#x}: {reason}")]
pub struct MemoryError {
    pub addr: u64,
    pub len: usize,
    pub reason: String,
}

/// The memory of one address space of a live process, read through
/// `/proc/<pid>/task/<tid>/mem`. The open file is bound to the address space
/// the process had when it was opened, not to the process: once the process
/// executes a new program (or exits), every read fails as
/// [`Memory::ended`] instead of returning the new program's bytes at the old
/// addresses. Any live thread's file reads the same memory, and keeps working
/// after the main thread exits.
#[derive(Debug)]
pub struct ProcessMemory {
    file: File,
}

/// Why the memory of a process could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The thread (or the whole process) no longer exists.
    #[error("the thread no longer exists")]
    Gone,
    /// The reader may not read this process's memory.
    #[error("{0}")]
    PermissionDenied(#[source] io::Error),
    #[error("{0}")]
    Other(#[source] io::Error),
}

impl ProcessMemory {
    /// Opens the memory of thread `tid` of process `pid` (the address space
    /// every thread of the process shares).
    pub fn open(pid: i32, tid: i32) -> Result<Self, OpenError> {
        File::open(format!("/proc/{pid}/task/{tid}/mem"))
            .map(|file| ProcessMemory { file })
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => OpenError::Gone,
                io::ErrorKind::PermissionDenied => OpenError::PermissionDenied(e),
                _ if e.raw_os_error() == Some(libc::ESRCH) => OpenError::Gone,
                _ => OpenError::Other(e),
            })
    }
}

/// Reason of a read from an address space that no longer exists.
const ENDED: &str = "the address space is gone (the process executed a new program or exited)";

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
        // The kernel returns the bytes up to the first unreadable page, an
        // error when none is readable, and nothing at all once the address
        // space is gone.
        match self.file.read_at(buf, addr) {
            Ok(n) if n == len => Ok(()),
            Ok(0) => Err(fail(ENDED.into())),
            Ok(n) => Err(fail(format!("only {n} bytes readable"))),
            Err(e) => Err(fail(e.to_string())),
        }
    }

    fn ended(&self) -> bool {
        // Reading the first byte of an address space that exists fails
        // (nothing is mapped there) or succeeds; only a gone one reads nothing.
        matches!(self.file.read_at(&mut [0u8], 0), Ok(0))
    }
}

#[cfg(test)]
pub mod fake {
    //! An in-memory address space for unit tests.
    use super::*;
    use std::cell::RefCell;

    /// Byte regions at fixed addresses.
    pub type Regions = Vec<(u64, Vec<u8>)>;
    /// A hook run before each read.
    pub type ReadHook = Box<dyn FnMut(&mut Regions)>;

    /// Regions of bytes at fixed addresses; reads spanning a hole fail.
    #[derive(Default)]
    pub struct FakeMemory {
        pub regions: RefCell<Regions>,
        /// Called before every read, to simulate a concurrent writer.
        pub on_read: RefCell<Option<ReadHook>>,
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
