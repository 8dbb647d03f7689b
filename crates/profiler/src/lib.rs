//! Samples the threads of one or more processes in the kernel with eBPF,
//! each sample tagged with the trace and span its thread was running, and
//! turns the samples into a profile.
//!
//! The BPF program (`bpf/`, built by build.rs when clang and libbpf's
//! headers are there) reads each sampled thread's context the way
//! [`otel_thread_ctx_reader`] resolved it for the process ([`plan`]);
//! [`loader`] loads and attaches it, [`kernel`] decodes what it sends,
//! [`unwind`] completes user stacks where frame pointers end, [`symbolize`]
//! names the frames (JIT code from V8's heap with [`v8`], else from
//! [`perf_map`]), [`threadpool`]
//! attributes libuv pool work to the span that queued it, and [`model`]
//! builds the profile the output formats write. The unwinder, V8's naming
//! and the symbolizer place a process's addresses in one snapshot of its
//! mappings ([`process_maps`]).

pub mod error;
pub mod kernel;
pub mod loader;
pub mod model;
pub mod perf_map;
pub mod plan;
pub mod process_maps;
pub mod symbolize;
pub mod system;
pub mod threadpool;
pub mod unwind;
pub mod v8;

pub use error::{check, SamplerError};
