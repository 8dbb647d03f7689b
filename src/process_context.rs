//! The OTEP 4719 process context: one `OTEL_CTX` mapping per process that
//! out-of-process readers (eBPF profilers, the `inspect` CLI) find in
//! `/proc/<pid>/maps` and read through `/proc/<pid>/mem` or
//! `process_vm_readv`, without any cooperation from this process.
//!
//! # What readers find
//! - A mapping of exactly one page, named `/memfd:OTEL_CTX (deleted)`
//!   (`memfd_create`, mapped private: `rw-p`) or, where memfd is refused,
//!   `[anon:OTEL_CTX]` (an anonymous `rw-p` mapping named with
//!   `PR_SET_VMA_ANON_NAME`). It is excluded from `fork()` children
//!   (`MADV_DONTFORK`): a child must not present its parent's context.
//! - At its start, the 32-byte [`Header`] (version 2), whose `payload`
//!   pointer is the address of `payload_size` bytes elsewhere in this
//!   process: a protobuf `ProcessContext { Resource resource = 1;
//!   repeated KeyValue attributes = 2; }` (see [`payload`]).
//! - In `attributes`: `threadlocal.schema_version` (default
//!   [`DEFAULT_SCHEMA_VERSION`]) and `threadlocal.attribute_key_map`, the
//!   append-only list of record attribute keys (index i = key index i).
//!
//! # Concurrency
//! Main thread and workers all load this addon into the same process and
//! share the statics below: one process-wide mutex serializes writers.
//! Readers run concurrently in other processes and take no lock; they rely
//! on the `monotonic_published_at_ns` protocol (a seqlock whose sequence
//! number is the timestamp, 0 while an update is in progress):
//! read timestamp (≠ 0), copy pointer, size and payload, re-read the
//! timestamp, retry if it changed. Timestamps strictly increase, so a
//! reader can never mistake a newer publication for the one it started on.

mod js;
mod payload;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::io;
use std::mem::{align_of, offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

pub use js::{keys_from_js, throw, update_from_js};
use payload::{Contents, KeyValue};

/// `threadlocal.schema_version` published unless configured otherwise: the
/// thread context schema of the merged OTEP 4947 text.
pub const DEFAULT_SCHEMA_VERSION: &str = "tlsdesc_v1_dev";
/// Most record attribute keys the key map holds (`key_index` is one byte).
pub const MAX_KEYS: usize = 256;
/// Largest payload published. Readers copy the whole payload on every
/// read; this keeps that copy small enough to be practical for them.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// Header format version written in [`Header::version`].
pub const VERSION: u32 = 2;
/// The header's first 8 bytes (no NUL).
pub const SIGNATURE: [u8; 8] = *b"OTEL_CTX";
const MAPPING_NAME: &CStr = c"OTEL_CTX";

/// How long a superseded payload stays allocated after the update that
/// replaced it (see [`Publisher::retire`]).
const RETAIN_NS: u64 = 10_000_000_000;
/// Bytes of superseded payloads kept inside the grace period at most.
const RETAINED_BYTES_MAX: usize = 16 << 20;

/// The 32 bytes at the start of the mapping, as readers decode them
/// (little-endian on the targeted platforms, i.e. host order).
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

/// Byte offsets of the header fields, shared with the tests that read a
/// live process from outside.
pub const OFFSET_SIGNATURE: usize = 0;
pub const OFFSET_VERSION: usize = 8;
pub const OFFSET_PAYLOAD_SIZE: usize = 12;
pub const OFFSET_PUBLISHED_AT: usize = 16;
pub const OFFSET_PAYLOAD: usize = 24;
pub const HEADER_SIZE: usize = 32;

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
enum Step {
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
fn first_publication_steps(size: u32, address: u64, published_at: u64) -> [Step; 6] {
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
fn update_steps(size: u32, address: u64, published_at: u64) -> [Step; 6] {
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
    fn apply(&self, steps: &[Step]) {
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
}

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
struct Mapping {
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
    fn create() -> io::Result<Mapping> {
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
    fn name(&self) -> bool {
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

    fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned, at least HEADER_SIZE bytes,
        // zero-initialized (a valid Header of atomics) and never unmapped
        // while `self` exists.
        unsafe { self.header.as_ref() }
    }

    /// Unmaps a mapping that was never made discoverable.
    ///
    /// # Safety
    /// No reader may have been pointed at it (it was never named, and no
    /// other reference to it is left).
    unsafe fn discard(self) {
        // SAFETY: per the contract above.
        unsafe { libc::munmap(self.header.as_ptr().cast(), self.len) };
    }
}

/// A payload replaced by a newer publication, kept allocated for a while.
struct Retired {
    bytes: Box<[u8]>,
    since_ns: u64,
}

/// What one `publishProcessContext` call changes; `None` keeps the
/// published value.
#[derive(Debug, Default)]
pub struct Update {
    pub resource: Option<Vec<KeyValue>>,
    pub attributes: Option<Vec<KeyValue>>,
    pub schema_version: Option<String>,
}

/// Why a publication did not happen. In every case the published context
/// (if any) is unchanged.
#[derive(Debug, PartialEq, Eq)]
pub enum PublishError {
    /// Input out of bounds (too many keys, payload too large).
    Range(String),
    /// The kernel refused the mapping.
    Os(String),
}

/// Diagnostics about the published context.
#[derive(Clone, Copy, Debug)]
pub struct Info {
    pub mapping_address: usize,
    pub mapping_len: usize,
    pub backing: Backing,
    pub published_at_ns: u64,
    pub payload_address: usize,
    pub payload_size: usize,
    pub key_count: usize,
    /// Attributes of the published Resource (0: none published yet).
    pub resource_attribute_count: usize,
    pub publications: u64,
    pub retained_payloads: usize,
}

/// The process-wide writer state. Only the holder of [`PUBLISHER`]'s lock
/// writes the header.
struct Publisher {
    mapping: Option<Mapping>,
    resource: Vec<KeyValue>,
    attributes: Vec<KeyValue>,
    schema_version: Cow<'static, str>,
    key_map: Vec<String>,
    /// The payload the header points at now.
    current: Option<Box<[u8]>>,
    retired: VecDeque<Retired>,
    retired_bytes: usize,
    published_at_ns: u64,
    publications: u64,
}

static PUBLISHER: Mutex<Publisher> = Mutex::new(Publisher::new());

fn lock() -> MutexGuard<'static, Publisher> {
    // The header is consistent between any two statements that can panic
    // (none run while an update is half done), so a poisoned lock is safe to
    // reuse.
    PUBLISHER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn boottime_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a local the kernel fills in.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

impl Publisher {
    const fn new() -> Self {
        Publisher {
            mapping: None,
            resource: Vec::new(),
            attributes: Vec::new(),
            schema_version: Cow::Borrowed(DEFAULT_SCHEMA_VERSION),
            key_map: Vec::new(),
            current: None,
            retired: VecDeque::new(),
            retired_bytes: 0,
            published_at_ns: 0,
            publications: 0,
        }
    }

    /// Forgets a mapping inherited through `fork()`: the child does not have
    /// it (`MADV_DONTFORK`), so writing to it would fault. The payloads are
    /// the parent's copies and are freed like any heap memory.
    fn forget_if_forked(&mut self) {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        if self.mapping.as_ref().is_some_and(|m| m.pid != pid) {
            self.mapping = None;
            self.current = None;
            self.retired.clear();
            self.retired_bytes = 0;
        }
    }

    /// Publishes a payload built from the given contents and, only when
    /// that succeeded, makes them the publisher's state.
    fn publish(
        &mut self,
        resource: Option<Vec<KeyValue>>,
        attributes: Option<Vec<KeyValue>>,
        schema_version: Option<String>,
        key_map: Option<Vec<String>>,
    ) -> Result<(), PublishError> {
        self.forget_if_forked();
        let bytes = payload::encode(&Contents {
            resource: resource.as_deref().unwrap_or(&self.resource),
            attributes: attributes.as_deref().unwrap_or(&self.attributes),
            schema_version: schema_version.as_deref().unwrap_or(&self.schema_version),
            key_map: key_map.as_deref().unwrap_or(&self.key_map),
        });
        if bytes.len() > MAX_PAYLOAD_BYTES {
            return Err(PublishError::Range(format!(
                "the process context payload would be {} bytes; at most {MAX_PAYLOAD_BYTES} are published",
                bytes.len()
            )));
        }
        let bytes = bytes.into_boxed_slice();

        let created = match self.mapping {
            Some(_) => None,
            None => Some(
                Mapping::create()
                    .map_err(|e| PublishError::Os(format!("cannot map the OTEL_CTX page: {e}")))?,
            ),
        };
        let mapping = created
            .as_ref()
            .or(self.mapping.as_ref())
            .expect("a mapping exists");
        let header = mapping.header();
        let published_at = boottime_ns().max(self.published_at_ns + 1);
        let size = bytes.len() as u32;
        let address = bytes.as_ptr() as u64;

        header.apply(&if self.current.is_none() {
            first_publication_steps(size, address, published_at)
        } else {
            update_steps(size, address, published_at)
        });

        // Naming last: a reader that finds the mapping by name finds it
        // complete. Without memfd the name is the only way to find it.
        let named = mapping.name();
        if let Some(created) = created {
            if created.backing == Backing::Anonymous && !named {
                // SAFETY: never named, so no reader could locate it; no
                // payload pointer escapes (this publication is abandoned).
                unsafe { created.discard() };
                return Err(PublishError::Os(
                    "cannot publish the process context: memfd_create is unavailable and the kernel \
                     refused to name an anonymous mapping (PR_SET_VMA_ANON_NAME needs Linux 5.17+ with \
                     CONFIG_ANON_VMA_NAME)"
                        .into(),
                ));
            }
            self.mapping = Some(created);
        }

        if let Some(previous) = self.current.replace(bytes) {
            self.retire(previous, published_at);
        }
        if let Some(resource) = resource {
            self.resource = resource;
        }
        if let Some(attributes) = attributes {
            self.attributes = attributes;
        }
        if let Some(schema_version) = schema_version {
            self.schema_version = Cow::Owned(schema_version);
        }
        if let Some(key_map) = key_map {
            self.key_map = key_map;
        }
        self.published_at_ns = published_at;
        self.publications += 1;
        Ok(())
    }

    /// Keeps a superseded payload allocated for a grace period.
    ///
    /// A reader that read the old pointer just before an update may still
    /// be copying the old bytes. Its copy is discarded by protocol (the
    /// timestamp it re-reads has changed), so freeing early would not make
    /// it accept garbage; keeping the bytes intact and mapped is defence in
    /// depth for readers that stop on read errors or validate the payload
    /// before the timestamp. Bounds: a payload superseded for longer than
    /// [`RETAIN_NS`] is freed at the next publication, and the newest
    /// superseded payloads are kept only up to [`RETAINED_BYTES_MAX`] bytes
    /// (older ones are freed first), so memory stays bounded however often
    /// a caller republishes.
    fn retire(&mut self, bytes: Box<[u8]>, now_ns: u64) {
        self.retired_bytes += bytes.len();
        self.retired.push_back(Retired {
            bytes,
            since_ns: now_ns,
        });
        while let Some(oldest) = self.retired.front() {
            let expired = now_ns.saturating_sub(oldest.since_ns) > RETAIN_NS;
            if !expired && self.retired_bytes <= RETAINED_BYTES_MAX {
                break;
            }
            self.retired_bytes -= oldest.bytes.len();
            self.retired.pop_front();
        }
    }

    /// Appends the keys not yet in the key map; returns every key's index.
    /// Republishes only if a key was added.
    fn register_keys(&mut self, keys: &[String]) -> Result<Vec<u32>, PublishError> {
        let mut key_map = Cow::Borrowed(&self.key_map);
        let mut indexes = Vec::with_capacity(keys.len());
        for key in keys {
            let index = match key_map.iter().position(|known| known == key) {
                Some(index) => index,
                None => {
                    if key_map.len() == MAX_KEYS {
                        return Err(PublishError::Range(format!(
                            "the attribute key map holds at most {MAX_KEYS} keys; \"{key}\" would be key number {}",
                            key_map.len() + 1
                        )));
                    }
                    key_map.to_mut().push(key.clone());
                    key_map.len() - 1
                }
            };
            indexes.push(index as u32);
        }
        if let Cow::Owned(key_map) = key_map {
            self.publish(None, None, None, Some(key_map))?;
        }
        Ok(indexes)
    }

    fn info(&self) -> Option<Info> {
        let mapping = self.mapping.as_ref()?;
        let current = self.current.as_ref()?;
        Some(Info {
            mapping_address: mapping.header.as_ptr() as usize,
            mapping_len: mapping.len,
            backing: mapping.backing,
            published_at_ns: self.published_at_ns,
            payload_address: current.as_ptr() as usize,
            payload_size: current.len(),
            key_count: self.key_map.len(),
            resource_attribute_count: self.resource.len(),
            publications: self.publications,
            retained_payloads: self.retired.len(),
        })
    }
}

/// Publishes the process context with `update` applied: each given part
/// replaces the published one, omitted parts stay as they were. The first
/// call creates the mapping. On error nothing changes.
pub fn publish(update: Update) -> Result<(), PublishError> {
    lock().publish(
        update.resource,
        update.attributes,
        update.schema_version,
        None,
    )
}

/// Appends the keys that are new to `threadlocal.attribute_key_map` (in
/// order, duplicates once) and returns the index of every key. Indexes never
/// change once handed out. Republishes (creating the mapping if needed) only
/// when a key was added. Fails without registering any key when the map
/// would exceed [`MAX_KEYS`].
pub fn register_keys(keys: &[String]) -> Result<Vec<u32>, PublishError> {
    lock().register_keys(keys)
}

/// The published context, or `None` before the first publication.
pub fn info() -> Option<Info> {
    let mut publisher = lock();
    publisher.forget_if_forked();
    publisher.info()
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::payload::{any_value, AnyValue, ProcessContext, KEY_MAP_KEY};
    use super::*;

    /// Reads the published context the way an outside reader does, from
    /// the header fields (one attempt; tests run without concurrent writers).
    fn read(publisher: &Publisher) -> (u64, ProcessContext) {
        let header = publisher.mapping.as_ref().unwrap().header();
        let published_at = header.monotonic_published_at_ns.load(Ordering::SeqCst);
        assert_ne!(published_at, 0);
        let size = header.payload_size.load(Ordering::SeqCst) as usize;
        let address = header.payload.load(Ordering::SeqCst) as usize as *const u8;
        // SAFETY: the payload the header points at is owned by `publisher.current`.
        let bytes = unsafe { std::slice::from_raw_parts(address, size) };
        (published_at, ProcessContext::decode(bytes).unwrap())
    }

    fn key_map(context: &ProcessContext) -> Vec<String> {
        let entry = context
            .attributes
            .iter()
            .find(|kv| kv.key == KEY_MAP_KEY)
            .unwrap();
        match entry.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::ArrayValue(array)) => array
                .values
                .iter()
                .map(|v| match &v.value {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("key map entry is not a string: {other:?}"),
                })
                .collect(),
            other => panic!("key map is not an array: {other:?}"),
        }
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

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

    #[test]
    fn header_is_written_as_specified_and_payload_decodes() {
        let mut publisher = Publisher::new();
        let resource = vec![KeyValue::new("service.name", AnyValue::string("svc"))];
        publisher
            .publish(Some(resource.clone()), None, None, None)
            .unwrap();
        let mapping = publisher.mapping.as_ref().unwrap();
        // SAFETY: sysconf has no preconditions.
        assert_eq!(mapping.len, unsafe { libc::sysconf(libc::_SC_PAGESIZE) }
            as usize);
        // SAFETY: the header page is mapped and HEADER_SIZE bytes long at least.
        let raw = unsafe {
            std::slice::from_raw_parts(mapping.header.as_ptr().cast::<u8>(), HEADER_SIZE)
        };
        assert_eq!(&raw[OFFSET_SIGNATURE..OFFSET_SIGNATURE + 8], b"OTEL_CTX");
        assert_eq!(
            u32::from_le_bytes(raw[OFFSET_VERSION..OFFSET_VERSION + 4].try_into().unwrap()),
            2
        );
        let current = publisher.current.as_ref().unwrap();
        assert_eq!(
            u32::from_le_bytes(
                raw[OFFSET_PAYLOAD_SIZE..OFFSET_PAYLOAD_SIZE + 4]
                    .try_into()
                    .unwrap()
            ) as usize,
            current.len()
        );
        assert_eq!(
            u64::from_le_bytes(raw[OFFSET_PAYLOAD..OFFSET_PAYLOAD + 8].try_into().unwrap()),
            current.as_ptr() as u64
        );
        let published_at = u64::from_le_bytes(
            raw[OFFSET_PUBLISHED_AT..OFFSET_PUBLISHED_AT + 8]
                .try_into()
                .unwrap(),
        );
        assert!(published_at > 0 && published_at <= boottime_ns());

        let (_, context) = read(&publisher);
        assert_eq!(context.resource.unwrap().attributes, resource);
        assert_eq!(
            context.attributes[0].value,
            Some(AnyValue::string(DEFAULT_SCHEMA_VERSION))
        );
        assert!(key_map(&ProcessContext::decode(&current[..]).unwrap()).is_empty());
    }

    #[test]
    fn updates_keep_omitted_parts_and_strictly_increase_the_timestamp() {
        let mut publisher = Publisher::new();
        let resource = vec![KeyValue::new("service.name", AnyValue::string("svc"))];
        publisher
            .publish(Some(resource.clone()), None, Some("tls_v1".into()), None)
            .unwrap();
        let address = publisher.info().unwrap().mapping_address;
        let (first, _) = read(&publisher);
        let extra = vec![KeyValue::new("custom", AnyValue::int(7))];
        publisher
            .publish(None, Some(extra.clone()), None, None)
            .unwrap();
        let (second, context) = read(&publisher);
        assert!(second > first);
        assert_eq!(
            publisher.info().unwrap().mapping_address,
            address,
            "one mapping per process"
        );
        assert_eq!(context.resource.unwrap().attributes, resource);
        assert_eq!(
            context.attributes[0].value,
            Some(AnyValue::string("tls_v1"))
        );
        assert_eq!(context.attributes[2], extra[0]);
        assert_eq!(publisher.retired.len(), 1, "the superseded payload is kept");
    }

    #[test]
    fn key_map_is_append_only_deduplicated_and_capped() {
        let mut publisher = Publisher::new();
        assert_eq!(
            publisher.register_keys(&keys(&["a", "b", "a"])).unwrap(),
            [0, 1, 0]
        );
        let publications = publisher.publications;
        assert_eq!(publisher.register_keys(&keys(&["b", "a"])).unwrap(), [1, 0]);
        assert_eq!(
            publisher.publications, publications,
            "no new key, no republication"
        );
        assert_eq!(publisher.register_keys(&keys(&["c"])).unwrap(), [2]);
        assert_eq!(key_map(&read(&publisher).1), ["a", "b", "c"]);

        let many: Vec<String> = (3..MAX_KEYS).map(|i| format!("k{i}")).collect();
        let indexes = publisher.register_keys(&many).unwrap();
        assert_eq!(indexes.first(), Some(&3));
        assert_eq!(indexes.last(), Some(&(MAX_KEYS as u32 - 1)));
        let before = read(&publisher);
        // Full: a known key still resolves, a new one fails and changes nothing,
        // even when it comes after known keys in the same call.
        assert_eq!(publisher.register_keys(&keys(&["c"])).unwrap(), [2]);
        let error = publisher
            .register_keys(&keys(&["a", "one-too-many"]))
            .unwrap_err();
        assert!(matches!(error, PublishError::Range(_)), "{error:?}");
        assert_eq!(publisher.key_map.len(), MAX_KEYS);
        let after = read(&publisher);
        assert_eq!(before.0, after.0, "nothing was republished");
        let published = key_map(&after.1);
        assert_eq!(published.len(), MAX_KEYS);
        assert_eq!(&published[..3], ["a", "b", "c"]);
        assert_eq!(published[MAX_KEYS - 1], format!("k{}", MAX_KEYS - 1));
    }

    #[test]
    fn oversized_payload_is_refused_without_change() {
        let mut publisher = Publisher::new();
        publisher.publish(None, None, None, None).unwrap();
        let before = read(&publisher);
        let huge = vec![KeyValue::new(
            "blob",
            AnyValue::string("x".repeat(MAX_PAYLOAD_BYTES)),
        )];
        let error = publisher.publish(Some(huge), None, None, None).unwrap_err();
        assert!(matches!(error, PublishError::Range(_)), "{error:?}");
        assert_eq!(read(&publisher), before);
        assert!(publisher.resource.is_empty());
    }

    #[test]
    fn superseded_payloads_are_retained_within_bounds() {
        let mut publisher = Publisher::new();
        publisher.publish(None, None, None, None).unwrap();
        let first_payload = publisher.current.as_ref().unwrap().as_ptr();
        let big = |n: usize| vec![KeyValue::new("blob", AnyValue::string("y".repeat(n)))];
        publisher
            .publish(Some(big(1000)), None, None, None)
            .unwrap();
        assert_eq!(
            publisher.retired.front().unwrap().bytes.as_ptr(),
            first_payload,
            "kept, not freed"
        );

        // Past the byte budget the oldest go first; the newest is always kept.
        for _ in 0..40 {
            publisher
                .publish(Some(big(1 << 19)), None, None, None)
                .unwrap();
        }
        assert!(publisher.retired_bytes <= RETAINED_BYTES_MAX);
        assert_eq!(
            publisher.retired_bytes,
            publisher
                .retired
                .iter()
                .map(|r| r.bytes.len())
                .sum::<usize>()
        );
        assert!(!publisher.retired.is_empty());

        // Past the grace period everything superseded is freed at the next
        // publication.
        let later = publisher.published_at_ns + RETAIN_NS + 1;
        publisher.retire(vec![0u8; 1].into_boxed_slice(), later + 1);
        assert_eq!(publisher.retired.len(), 1);
    }
}
