//! Frame mode: the Node.js schema `nodejs_v1_dev` (`abi::node_schema`).
//!
//! Where AsyncLocalStorage runs on V8's AsyncContextFrame, V8 itself keeps
//! the current frame in the isolate (continuation-preserved embedder data,
//! CPED) and restores it on every `await` without running JavaScript. A
//! thread publishes once where that slot is and which AsyncLocalStorage is
//! the manager's; the store of that AsyncLocalStorage is a wrapper object
//! holding the address of the span's record at a fixed offset, so a reader
//! walks CPED -> frame -> wrapper -> record at sample time and nothing runs
//! per async switch.
//!
//! Nothing here is taken on trust: [`discovery`] finds the CPED slot and the
//! wrapper's record offset on the running Node by walking our own objects
//! the way a reader will, and [`thread`] publishes only what was found.
//!
//! - [`v8`]: the V8 entry points, resolved from the `node` binary;
//! - [`memory`]: non-faulting reads of our own memory;
//! - [`walk`]: the reader's walk;
//! - [`discovery`]: finding the CPED slot and the record offset;
//! - [`thread`]: the thread's `otel_thread_ctx_nodejs_v1` block ([`tls`]),
//!   its global handle and the gate kept closed during moving GCs.
//!
//! The per-span records the wrappers point at are `crate::span_slab`'s.

pub mod discovery;
mod memory;
pub mod thread;
pub mod tls;
mod v8;
pub mod walk;
