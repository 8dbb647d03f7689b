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

/// Bytes read ahead per system call. A V8 hash table's counts, buckets and
/// first entries lie within them, so one read serves a lookup's words (the
/// walk runs in every moving GC's prologue, where each call counts).
const WINDOW: usize = 256;
const PAGE: u64 = 4096;

/// Word reads served from the last bytes read ahead.
pub struct Words {
    start: u64,
    len: usize,
    bytes: [u8; WINDOW],
}

impl Words {
    pub fn new() -> Words {
        Words {
            start: 0,
            len: 0,
            bytes: [0; WINDOW],
        }
    }

    /// The 8-byte word at `address`: from the window when it holds it, else
    /// read with what follows it up to the end of its page (a read that
    /// crossed into an unmapped page would fail as a whole).
    pub fn word(&mut self, address: u64) -> io::Result<u64> {
        let held = address >= self.start && address - self.start + 8 <= self.len as u64;
        if !held {
            let to_page_end = (PAGE - address % PAGE) as usize;
            let len = WINDOW.min(to_page_end.max(8));
            self.len = 0;
            read(address, &mut self.bytes[..len])?;
            self.start = address;
            self.len = len;
        }
        let at = (address - self.start) as usize;
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.bytes[at..at + 8]);
        Ok(u64::from_ne_bytes(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_word(address: u64) -> io::Result<u64> {
        let mut bytes = [0u8; 8];
        read(address, &mut bytes)?;
        Ok(u64::from_ne_bytes(bytes))
    }

    #[test]
    fn words_come_from_one_read_ahead_and_match_single_reads() {
        let values: Vec<u64> = (0..64)
            .map(|i| 0x0101_0101_0101_0101u64.wrapping_mul(i))
            .collect();
        let base = values.as_ptr() as u64;
        let mut words = Words::new();
        for i in [0usize, 3, 1, 40, 63, 2] {
            let address = base + 8 * i as u64;
            assert_eq!(words.word(address).unwrap(), values[i]);
            assert_eq!(read_word(address).unwrap(), values[i]);
        }
        assert!(words.word(8).is_err());
        assert!(words.word(0).is_err());
        // A failed read leaves nothing stale behind.
        assert_eq!(words.word(base).unwrap(), values[0]);
    }

    #[test]
    fn reads_own_memory_and_refuses_unmapped_addresses() {
        let value: u64 = 0x1122_3344_5566_7788;
        assert_eq!(read_word(&value as *const u64 as u64).unwrap(), value);
        assert!(read_word(8).is_err());
        assert!(read_word(0).is_err());
    }
}
