//! The one-page `OTEL_CTX` mapping readers find in `/proc/<pid>/maps`:
//! a memfd where the kernel allows one, else anonymous memory named with
//! `PR_SET_VMA_ANON_NAME`; excluded from `fork()` children.

use std::io;
use std::ptr::NonNull;

use otel_thread_ctx_abi::process_context::MAPPING_NAME_C as MAPPING_NAME;

use super::header::Header;

/// How the mapping was created (what its name in `/proc/<pid>/maps` is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// `/memfd:OTEL_CTX (deleted)`.
    Memfd,
    /// `[anon:OTEL_CTX]`.
    Anonymous,
}

/// The page holding the header. Never unmapped once published: a reader
/// that cached its address keeps reading valid memory.
pub struct Mapping {
    header: NonNull<Header>,
    len: usize,
    backing: Backing,
    /// The process that created it: after `fork()` the child has no such
    /// mapping (`MADV_DONTFORK`) and must make its own.
    pid: libc::pid_t,
}

// SAFETY: the mapping is process-wide memory; all access goes through the
// publisher mutex (writes) or atomics (the header fields).
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps one zeroed page, from a memfd if the kernel allows it, else
    /// anonymous memory. Does not name it: naming comes after the first
    /// publication has been written, so a reader never finds it empty.
    pub fn create() -> io::Result<Mapping> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let len = if page > 0 { page as usize } else { 4096 };
        let (addr, backing) = match Self::map_memfd(len) {
            Some(addr) => (addr, Backing::Memfd),
            None => (crate::anonymous_memory::map(len)?, Backing::Anonymous),
        };
        // SAFETY: `addr..addr+len` is the mapping made above.
        if unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } != 0 {
            let error = io::Error::last_os_error();
            // SAFETY: unmapping the mapping made above, which nothing references yet.
            unsafe { libc::munmap(addr, len) };
            return Err(error);
        }
        let header = NonNull::new(addr.cast::<Header>()).expect("mmap returned NULL");
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        Ok(Mapping {
            header,
            len,
            backing,
            pid,
        })
    }

    /// A private mapping of a fresh `len`-byte memfd, or `None` when memfd
    /// is unavailable (old kernel, seccomp policy, ...). The fd is closed
    /// right away: the mapping alone keeps the file and its name visible.
    fn map_memfd(len: usize) -> Option<*mut libc::c_void> {
        // Kernels with `vm.memfd_noexec` may insist on MFD_NOEXEC_SEAL;
        // older ones reject that flag with EINVAL, so try both.
        let mut fd = -1;
        for flags in [libc::MFD_CLOEXEC | libc::MFD_NOEXEC_SEAL, libc::MFD_CLOEXEC] {
            // SAFETY: a NUL-terminated name and plain flags.
            fd = unsafe { libc::memfd_create(MAPPING_NAME.as_ptr(), flags) };
            if fd >= 0 {
                break;
            }
        }
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is the memfd opened above and closed exactly once below.
        let addr = unsafe {
            if libc::ftruncate(fd, len as libc::off_t) == 0 {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                )
            } else {
                libc::MAP_FAILED
            }
        };
        // SAFETY: as above.
        unsafe { libc::close(fd) };
        (addr != libc::MAP_FAILED).then_some(addr)
    }

    /// Names the mapping `OTEL_CTX`. Returns whether the kernel accepted it:
    /// it refuses file-backed (memfd) mappings and kernels before 5.17 or
    /// without `CONFIG_ANON_VMA_NAME` refuse it altogether. It is issued
    /// after every publication regardless, as the OTEP asks: some readers
    /// learn of publications by tracing `prctl` calls.
    pub fn name(&self) -> bool {
        // SAFETY: names our own mapping; the kernel copies the string.
        unsafe {
            libc::prctl(
                libc::PR_SET_VMA,
                libc::PR_SET_VMA_ANON_NAME as libc::c_ulong,
                self.header.as_ptr() as libc::c_ulong,
                self.len as libc::c_ulong,
                MAPPING_NAME.as_ptr() as libc::c_ulong,
            ) == 0
        }
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned, at least HEADER_SIZE bytes,
        // zero-initialized (a valid Header of atomics) and never unmapped
        // while `self` exists.
        unsafe { self.header.as_ref() }
    }

    /// Address of the mapping (the header is at its start).
    pub fn address(&self) -> usize {
        self.header.as_ptr() as usize
    }

    /// Size of the mapping in bytes (one page).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Whether this process got the mapping through `fork()`: then it does
    /// not have it (`MADV_DONTFORK`), and writing to it would fault.
    pub fn is_inherited(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        self.pid != unsafe { libc::getpid() }
    }

    /// Unmaps a mapping that was never made discoverable.
    ///
    /// # Safety
    /// No reader may have been pointed at it (it was never named, and no
    /// other reference to it is left).
    pub unsafe fn discard(self) {
        // SAFETY: per the contract above.
        unsafe { libc::munmap(self.header.as_ptr().cast(), self.len) };
    }
}
