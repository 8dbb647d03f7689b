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
//! - At its start, the 32-byte [`header::Header`] (version 2), whose `payload`
//!   pointer is the address of `payload_size` bytes elsewhere in this
//!   process: a protobuf `ProcessContext { Resource resource = 1;
//!   repeated KeyValue attributes = 2; }` (see [`payload`]).
//! - In `attributes`: `threadlocal.schema_version` (default
//!   [`DEFAULT_SCHEMA_VERSION`](otel_thread_ctx_abi::process_context::DEFAULT_SCHEMA_VERSION))
//!   and `threadlocal.attribute_key_map`, the append-only list of record
//!   attribute keys (index i = key index i).
//!
//! # Concurrency
//! Main thread and workers all load this addon into the same process and
//! share the publisher's state: one process-wide mutex serializes writers.
//! Readers run concurrently in other processes and take no lock; they rely
//! on the `monotonic_published_at_ns` protocol (a seqlock whose sequence
//! number is the timestamp, 0 while an update is in progress):
//! read timestamp (≠ 0), copy pointer, size and payload, re-read the
//! timestamp, retry if it changed. Timestamps strictly increase, so a
//! reader can never mistake a newer publication for the one it started on.
//!
//! # Modules
//! - [`header`]: the 32-byte header and the store/fence order of the
//!   publication protocol;
//! - [`mapping`]: the page itself (memfd or named anonymous memory);
//! - [`publisher`]: the process-wide writer, and the retention of
//!   superseded payloads;
//! - [`key_map`]: the append-only attribute key map;
//! - [`payload`]: the protobuf payload; [`js`]: reading it from JS values.

mod header;
mod js;
mod key_map;
mod mapping;
mod payload;
mod publisher;

pub use js::{keys_from_js, throw, update_from_js};
pub use mapping::Backing;
use payload::KeyValue;

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

/// Publishes the process context with `update` applied: each given part
/// replaces the published one, omitted parts stay as they were. The first
/// call creates the mapping. On error nothing changes.
pub fn publish(update: Update) -> Result<(), PublishError> {
    publisher::lock().publish(
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
/// would exceed [`MAX_KEYS`](otel_thread_ctx_abi::process_context::MAX_KEYS).
pub fn register_keys(keys: &[String]) -> Result<Vec<u32>, PublishError> {
    publisher::lock().register_keys(keys)
}

/// Counts a thread starting or stopping frame-mode publication: while any
/// thread publishes in frame mode, `threadlocal.schema_version` is the
/// Node.js schema's and the V8 layout keys are published with it.
pub fn frame_thread(
    joining: bool,
    layout: otel_thread_ctx_abi::node_schema::V8Layout,
) -> Result<(), PublishError> {
    publisher::lock().frame_thread(joining, layout)
}

/// The published context, or `None` before the first publication.
pub fn info() -> Option<Info> {
    let mut publisher = publisher::lock();
    publisher.forget_if_forked();
    publisher.info()
}
