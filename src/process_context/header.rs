//! The OTEP 4719 header at the start of the `OTEL_CTX` mapping, and the
//! writer side of its publication protocol: which stores happen in which
//! order, and which fences separate them.

use std::mem::{align_of, offset_of, size_of};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use otel_thread_ctx_abi::process_context::{
    HEADER_SIZE, MAX_PAYLOAD_BYTES, OFFSET_PAYLOAD, OFFSET_PAYLOAD_SIZE, OFFSET_PUBLISHED_AT,
    OFFSET_SIGNATURE, OFFSET_VERSION, SIGNATURE, VERSION,
};

/// The 32 bytes at the start of the mapping, as readers decode them
/// (little-endian on the targeted platforms, i.e. host order): the ABI
/// crate's `Header`, field for field.
///
/// Every field is an atomic so that the writer's stores are real stores the
/// compiler can neither drop nor reorder across the fences of the protocol.
#[repr(C)]
pub struct Header {
    /// The bytes `OTEL_CTX`, stored as one native-endian word.
    signature: AtomicU64,
    /// [`VERSION`].
    version: AtomicU32,
    /// Bytes at `payload`.
    payload_size: AtomicU32,
    /// `CLOCK_BOOTTIME` nanoseconds of the publication; 0 while an update
    /// is in progress. Strictly increases from one publication to the next.
    monotonic_published_at_ns: AtomicU64,
    /// Address of the payload in this process.
    payload: AtomicU64,
}

// The layout readers decode is the ABI crate's.
const _: () = {
    assert!(offset_of!(Header, signature) == OFFSET_SIGNATURE);
    assert!(offset_of!(Header, version) == OFFSET_VERSION);
    assert!(offset_of!(Header, payload_size) == OFFSET_PAYLOAD_SIZE);
    assert!(offset_of!(Header, monotonic_published_at_ns) == OFFSET_PUBLISHED_AT);
    assert!(offset_of!(Header, payload) == OFFSET_PAYLOAD);
    assert!(size_of::<Header>() == HEADER_SIZE);
    assert!(align_of::<Header>() == 8);
    // The payload pointer field is 8 bytes on every target we build for.
    assert!(size_of::<usize>() == 8);
    assert!(MAX_PAYLOAD_BYTES <= u32::MAX as usize);
};

/// One store or fence of the writer protocol. The protocol is spelled out
/// as data so that the unit tests can check every interleaving of a reader
/// with it, not only the order the code happens to be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Signature,
    Version,
    PayloadSize(u32),
    Payload(u64),
    PublishedAt(u64),
    /// A full CPU barrier: `fence(SeqCst)` (`mfence` on x86-64, `dmb ish`
    /// on arm64). Readers copy from other CPUs while the writer runs, so
    /// compiler ordering alone is not enough here (unlike thread records).
    Fence,
}

/// The first publication into a fresh page: every field, then the
/// timestamp. The page is not named yet, so no reader has seen it.
pub fn first_publication_steps(size: u32, address: u64, published_at: u64) -> [Step; 6] {
    [
        Step::Signature,
        Step::Version,
        Step::PayloadSize(size),
        Step::Payload(address),
        // ORDER: a reader that sees the timestamp non-zero must also see
        // the signature, version, pointer, size and the payload bytes
        // (written by `encode` before any step).
        Step::Fence,
        Step::PublishedAt(published_at),
    ]
}

/// An update of a published page (the OTEP "Updating Protocol").
pub fn update_steps(size: u32, address: u64, published_at: u64) -> [Step; 6] {
    [
        Step::PublishedAt(0),
        // ORDER: the 0 must be visible before the pointer or size changes:
        // a reader that read the old timestamp and then copies through a
        // new pointer (or with a new size) re-reads the timestamp after its
        // copy and must find it changed.
        Step::Fence,
        Step::Payload(address),
        Step::PayloadSize(size),
        // ORDER: the new pointer, size and payload bytes must be visible
        // before the new timestamp: a reader that sees the new value copies
        // the new payload, never the old one under the new stamp.
        Step::Fence,
        Step::PublishedAt(published_at),
    ]
}

impl Header {
    /// Performs `steps` in order. Relaxed stores are enough between the
    /// fences: the fences are what order them for other CPUs.
    pub fn apply(&self, steps: &[Step]) {
        for step in steps {
            match *step {
                Step::Signature => self
                    .signature
                    .store(u64::from_ne_bytes(SIGNATURE), Ordering::Relaxed),
                Step::Version => self.version.store(VERSION, Ordering::Relaxed),
                Step::PayloadSize(size) => self.payload_size.store(size, Ordering::Relaxed),
                Step::Payload(address) => self.payload.store(address, Ordering::Relaxed),
                Step::PublishedAt(ns) => {
                    self.monotonic_published_at_ns.store(ns, Ordering::Relaxed)
                }
                // ORDER: see the step lists above for which reader each fence protects.
                Step::Fence => fence(Ordering::SeqCst),
            }
        }
    }

    /// The fields a reader decides on: (timestamp, payload size, payload
    /// address), as the tests read them back.
    #[cfg(test)]
    pub fn published(&self) -> (u64, u32, u64) {
        (
            self.monotonic_published_at_ns.load(Ordering::SeqCst),
            self.payload_size.load(Ordering::SeqCst),
            self.payload.load(Ordering::SeqCst),
        )
    }
}

/// Now on the clock of `monotonic_published_at_ns` (`CLOCK_BOOTTIME`).
pub fn boottime_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a local the kernel fills in.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header fields a reader can observe, in a sequentially
    /// consistent model where each step happens at once.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Fields {
        signature: bool,
        version: bool,
        size: u32,
        payload: u64,
        published_at: u64,
    }

    fn states(initial: Fields, steps: &[Step]) -> Vec<Fields> {
        let mut state = initial;
        let mut result = vec![state];
        for step in steps {
            match *step {
                Step::Signature => state.signature = true,
                Step::Version => state.version = true,
                Step::PayloadSize(size) => state.size = size,
                Step::Payload(address) => state.payload = address,
                Step::PublishedAt(ns) => state.published_at = ns,
                Step::Fence => {}
            }
            result.push(state);
        }
        result
    }

    /// Every reader interleaving: timestamp read in state `i`, each other
    /// field read in any state `j` with i <= j <= k (a header copy is not
    /// atomic), timestamp re-read in state `k`. Returns what every accepted
    /// read saw: (timestamp, signature ok, version ok, size, payload).
    fn accepted_reads(states: &[Fields]) -> Vec<(u64, bool, bool, u32, u64)> {
        let mut accepted = Vec::new();
        for i in 0..states.len() {
            for k in i..states.len() {
                let stamp = states[i].published_at;
                if stamp == 0 || states[k].published_at != stamp {
                    continue;
                }
                let window = &states[i..=k];
                for a in window {
                    for b in window {
                        for c in window {
                            for d in window {
                                accepted.push((stamp, a.signature, b.version, c.size, d.payload));
                            }
                        }
                    }
                }
            }
        }
        accepted
    }

    #[test]
    fn no_reader_interleaving_accepts_a_mixed_header() {
        // First publication: every accepted read sees the whole header.
        let first = states(Fields::default(), &first_publication_steps(10, 0x1000, 5));
        let reads = accepted_reads(&first);
        assert!(!reads.is_empty());
        assert!(
            reads.iter().all(|r| *r == (5, true, true, 10, 0x1000)),
            "{reads:?}"
        );

        // Update: an accepted read sees either the old publication or the
        // new one, never the new pointer or size under the old stamp (or
        // the reverse).
        let old = Fields {
            signature: true,
            version: true,
            size: 10,
            payload: 0x1000,
            published_at: 5,
        };
        let updated = states(old, &update_steps(20, 0x2000, 6));
        let reads = accepted_reads(&updated);
        assert!(
            reads.contains(&(5, true, true, 10, 0x1000))
                && reads.contains(&(6, true, true, 20, 0x2000))
        );
        for read in reads {
            assert!(
                read == (5, true, true, 10, 0x1000) || read == (6, true, true, 20, 0x2000),
                "{read:?}"
            );
        }

        // The model has teeth: stamping before the pointer moves, or
        // skipping the 0, lets a mixed read through.
        let stamp_first = [
            Step::PublishedAt(6),
            Step::Fence,
            Step::Payload(0x2000),
            Step::PayloadSize(20),
        ];
        assert!(accepted_reads(&states(old, &stamp_first)).contains(&(6, true, true, 10, 0x1000)));
        let no_zero = [
            Step::Payload(0x2000),
            Step::PayloadSize(20),
            Step::Fence,
            Step::PublishedAt(6),
        ];
        assert!(accepted_reads(&states(old, &no_zero)).contains(&(5, true, true, 20, 0x2000)));
    }

    #[test]
    fn every_store_is_fenced_from_the_timestamp_that_publishes_it() {
        // Between the last data store and the final timestamp there is a
        // fence, and in an update a fence follows the zeroing store.
        for steps in [first_publication_steps(1, 2, 3), update_steps(1, 2, 3)] {
            let last = steps.len() - 1;
            assert_eq!(steps[last], Step::PublishedAt(3));
            assert_eq!(steps[last - 1], Step::Fence);
        }
        let steps = update_steps(1, 2, 3);
        assert_eq!(steps[..2], [Step::PublishedAt(0), Step::Fence]);
    }
}
