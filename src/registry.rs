//! Thread registration: hands each JS thread a record slot from a
//! process-wide, pre-allocated region and recycles it when the thread's
//! environment is torn down.
//!
//! Records live in anonymous mappings of `SLOTS_PER_CHUNK` slots that are
//! never unmapped, so a pointer a profiler read a moment ago never dangles.
//! The registry lock is taken only when a thread registers or releases a
//! slot; publishing never touches it.
//!
//! A slot has two holders: the thread that publishes into it, and the JS
//! external `ArrayBuffer` that views it. V8 refuses two live external buffers
//! over the same memory, so a slot only goes back to the free list once the
//! thread has detached *and* its old buffer has been finalized.

use std::cell::Cell;
use std::io;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use otel_thread_ctx_abi::record::{ThreadContextRecord, RECORD_SIZE};

use crate::{record, tls};

/// Slots per mapping; a chunk is 160 KiB of address space, touched lazily.
pub const SLOTS_PER_CHUNK: usize = 256;

/// Who still holds a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The registered thread, until its environment is torn down.
    Thread,
    /// The JS `ArrayBuffer` over the record, until V8 finalizes it.
    View,
}

/// A registered thread's slot.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    /// Index in the registry (stable for the slot's life).
    pub index: usize,
    /// The record readers reach through `otel_thread_ctx_v1`.
    pub record: *mut ThreadContextRecord,
    /// Kernel thread id of the owner.
    pub tid: i32,
}

#[derive(Clone, Copy, Default)]
struct SlotState {
    thread: bool,
    view: bool,
}

struct Chunk(NonNull<ThreadContextRecord>);

// SAFETY: a chunk is a fixed mapping that is never unmapped; which thread
// writes which record is governed by the registry, not by this handle.
unsafe impl Send for Chunk {}

#[derive(Default)]
struct Registry {
    chunks: Vec<Chunk>,
    states: Vec<SlotState>,
    /// Free slot indexes, most recently released last (reused first).
    free: Vec<usize>,
}

/// Counters for diagnostics and leak tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryStats {
    /// Slots mapped so far.
    pub capacity: usize,
    /// Slots whose thread is still registered.
    pub attached: usize,
    /// Slots whose thread left but whose JS view is not finalized yet.
    pub awaiting_view_release: usize,
    /// Slots ready for reuse.
    pub free: usize,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    chunks: Vec::new(),
    states: Vec::new(),
    free: Vec::new(),
});

thread_local! {
    static CURRENT: Cell<Option<Slot>> = const { Cell::new(None) };
}

fn lock() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock cannot leave the state half-updated in a
    // way that matters more than refusing every later registration would.
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registry {
    fn record(&self, index: usize) -> *mut ThreadContextRecord {
        let chunk = &self.chunks[index / SLOTS_PER_CHUNK];
        // SAFETY: index % SLOTS_PER_CHUNK is inside the chunk's mapping.
        unsafe { chunk.0.as_ptr().add(index % SLOTS_PER_CHUNK) }
    }

    fn grow(&mut self) -> io::Result<()> {
        let len = SLOTS_PER_CHUNK * RECORD_SIZE;
        let addr = crate::anonymous_memory::map(len)?;
        // A fork() child gets these pages zero-filled (every record invalid)
        // instead of sharing them copy-on-write. That keeps fork (e.g. from
        // execSync) from write-protecting the parent's records, which would
        // make a profiler's non-faulting read of a record fail until the
        // parent's next write. Pre-4.14 kernels lack the flag; records then
        // merely stay copy-on-write, so the error is ignored.
        // SAFETY: advice on the mapping created just above.
        unsafe { libc::madvise(addr, len, libc::MADV_WIPEONFORK) };
        let first = self.states.len();
        self.chunks.push(Chunk(
            NonNull::new(addr.cast()).expect("mmap returned NULL"),
        ));
        self.states
            .resize(first + SLOTS_PER_CHUNK, SlotState::default());
        // Reverse so the lowest index is handed out first.
        self.free.extend((first..first + SLOTS_PER_CHUNK).rev());
        Ok(())
    }

    fn acquire(&mut self) -> io::Result<(usize, *mut ThreadContextRecord)> {
        if self.free.is_empty() {
            self.grow()?;
        }
        let index = self.free.pop().expect("grow added free slots");
        self.states[index] = SlotState {
            thread: true,
            view: false,
        };
        Ok((index, self.record(index)))
    }

    fn hold_view(&mut self, index: usize) {
        self.states[index].view = true;
    }

    fn release(&mut self, index: usize, holder: Holder) {
        let state = &mut self.states[index];
        match holder {
            Holder::Thread => state.thread = false,
            Holder::View => state.view = false,
        }
        if !state.thread && !state.view {
            // SAFETY: both holders are gone, so nobody publishes into the slot.
            unsafe { record::reset(self.record(index)) };
            self.free.push(index);
        }
    }

    fn stats(&self) -> RegistryStats {
        let attached = self.states.iter().filter(|s| s.thread).count();
        let awaiting = self.states.iter().filter(|s| !s.thread && s.view).count();
        RegistryStats {
            capacity: self.states.len(),
            attached,
            awaiting_view_release: awaiting,
            free: self.free.len(),
        }
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Registers the calling thread if it is not yet: takes a slot and points
/// its `otel_thread_ctx_v1` at the slot's record. Returns the slot and
/// whether this call registered it.
pub fn register_current_thread() -> io::Result<(Slot, bool)> {
    if let Some(slot) = CURRENT.with(Cell::get) {
        return Ok((slot, false));
    }
    let (index, record) = lock().acquire()?;
    let slot = Slot {
        index,
        record,
        tid: gettid(),
    };
    // The record is all zeroes (valid = 0) before the pointer is published.
    tls::point_at(record);
    CURRENT.with(|current| current.set(Some(slot)));
    Ok((slot, true))
}

/// The calling thread's slot, if it is registered.
pub fn current_slot() -> Option<Slot> {
    CURRENT.with(Cell::get)
}

/// Detaches the calling thread: valid = 0, then `otel_thread_ctx_v1` = NULL,
/// then the slot's thread hold is released. A no-op if not registered.
pub fn detach_current_thread() {
    let Some(slot) = CURRENT.with(Cell::take) else {
        return;
    };
    // SAFETY: the record is ours until we release the thread hold below.
    unsafe { record::invalidate(slot.record) };
    tls::point_at(std::ptr::null_mut());
    lock().release(slot.index, Holder::Thread);
}

/// Records that a JS view over slot `index` exists; `release(index,
/// Holder::View)` must follow once V8 finalizes it.
pub fn hold_view(index: usize) {
    lock().hold_view(index);
}

/// Releases `holder`'s claim on slot `index`; the slot is recycled once no
/// holder is left.
pub fn release(index: usize, holder: Holder) {
    lock().release(index, holder);
}

/// A snapshot of the registry's counters.
pub fn stats() -> RegistryStats {
    lock().stats()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_distinct_and_recycled_after_both_holders_leave() {
        let mut registry = Registry::default();
        let (a, ra) = registry.acquire().unwrap();
        let (b, rb) = registry.acquire().unwrap();
        registry.hold_view(a);
        assert_ne!(a, b);
        assert_eq!(ra as usize % 64, 0);
        assert_eq!(rb as usize - ra as usize, RECORD_SIZE);

        registry.release(a, Holder::Thread);
        assert_eq!(registry.stats().awaiting_view_release, 1);
        let (c, _) = registry.acquire().unwrap();
        assert_ne!(c, a, "a slot whose view is alive must not be reused");

        registry.release(a, Holder::View);
        let (d, _) = registry.acquire().unwrap();
        assert_eq!(d, a, "a fully released slot is reused first");
    }

    #[test]
    fn grows_past_one_chunk_without_moving_records() {
        let mut registry = Registry::default();
        let first = registry.acquire().unwrap().1;
        for _ in 1..SLOTS_PER_CHUNK + 10 {
            registry.acquire().unwrap();
        }
        assert_eq!(registry.stats().capacity, 2 * SLOTS_PER_CHUNK);
        assert_eq!(registry.record(0), first);
    }

    #[test]
    fn a_released_slot_comes_back_zeroed() {
        let mut registry = Registry::default();
        let (index, record) = registry.acquire().unwrap();
        // SAFETY: the slot is held by this test.
        unsafe { record::publish(record, &record::SpanIds::from_words(1, 2, 3, 1)) };
        registry.release(index, Holder::Thread);
        let (again, record) = registry.acquire().unwrap();
        assert_eq!(again, index);
        // SAFETY: the slot is held by this test.
        let bytes = unsafe { std::slice::from_raw_parts(record.cast::<u8>(), RECORD_SIZE) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_fork_child_sees_zeroed_writable_records_and_the_parent_keeps_its_own() {
        let mut registry = Registry::default();
        let (_, record) = registry.acquire().unwrap();
        // SAFETY: the slot is held by this test.
        unsafe { record::publish(record, &record::SpanIds::from_words(1, 2, 3, 1)) };
        // SAFETY: the child only reads and writes the record with volatile
        // accesses and leaves with _exit, touching no lock or allocator.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: the mapping exists in the child (zero-filled).
            unsafe {
                let valid = std::ptr::addr_of_mut!((*record).valid);
                let was_zero = std::ptr::read_volatile(valid) == 0
                    && std::ptr::read_volatile(&(*record).span_id) == [0; 8];
                std::ptr::write_volatile(valid, 1);
                libc::_exit(if was_zero { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child crashed: status {status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "child saw the parent's record"
        );
        // SAFETY: the slot is held by this test.
        unsafe {
            assert_eq!((*record).valid, 1);
            assert_eq!((*record).span_id, 3u64.to_be_bytes());
        }
    }

    #[test]
    fn thread_registration_points_tls_at_the_record_and_detach_clears_it() {
        std::thread::spawn(|| {
            let (slot, fresh) = register_current_thread().unwrap();
            assert!(fresh);
            assert_eq!(tls::current(), slot.record);
            assert_eq!(slot.tid, gettid());
            let (again, fresh) = register_current_thread().unwrap();
            assert!(!fresh);
            assert_eq!(again.index, slot.index);
            detach_current_thread();
            assert!(tls::current().is_null());
            assert!(current_slot().is_none());
        })
        .join()
        .unwrap();
    }
}
