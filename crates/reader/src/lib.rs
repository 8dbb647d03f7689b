//! Reads OTEP 4947 thread context and OTEP 4719 process context from a
//! running process, from the outside, as a profiler would.
//!
//! This crate is the reading half of otel-thread-ctx as a library: a
//! profiler that wants the trace and span each thread of a process is
//! running can depend on it alone. It finds the modules that define a
//! schema's variable ([`discovery`], [`maps`], [`elf`]), resolves each
//! thread's copy of it ([`tls`]), reads memory from outside ([`memory`]),
//! stops one thread at a time to read it ([`ptrace`], [`thread`]), decodes
//! the record ([`record`]) or walks the Node.js schema ([`schema`]), and
//! reads the process context ([`process_context`]). [`conformance`] and
//! [`sampler`] are whole reads of a process built on those: a conformance
//! report, and span shares sampled over time. Nothing here prints: the
//! results are values (serializable where a report is).
//!
//! [`signals`] holds the termination requests a long read checks between
//! threads, and the alarm that bounds a wait for a ptrace stop; a program
//! that uses [`ptrace`] installs its handlers once at start-up.

pub mod clock;
pub mod conformance;
pub mod discovery;
pub mod elf;
pub mod error;
pub mod maps;
pub mod memory;
pub mod process_context;
pub mod ptrace;
pub mod record;
pub mod sampler;
pub mod schema;
pub mod signals;
pub mod target;
pub mod tasks;
pub mod thread;
pub mod tls;

pub use error::Error;
