//! The profile as files and messages: pprof ([`pprof`]), OTLP Profiles and
//! its one-shot OTLP/HTTP send ([`otlp`]), folded stacks and flame graph
//! SVGs ([`flame`]), one JSON line per sample ([`jsonl`]), top tables
//! ([`top`]), and the profiling SIG's conformance rules for OTLP Profiles
//! ([`conformance`]).
//!
//! Each format takes the profiler's model ([`otel_thread_ctx_profiler::model`])
//! and returns bytes or text; where they go is the caller's choice. OTLP
//! files come back into the model through [`decode`]; [`filter`] keeps the
//! samples of given endpoints, span names or traces.

pub mod conformance;
pub mod decode;
pub mod filter;
pub mod flame;
pub mod jsonl;
pub mod otlp;
pub mod pprof;
pub mod top;

use std::path::Path;

/// Whether `path` can be written, leaving the file system as it was: a file
/// it creates to find out is removed, an existing file is opened without
/// being truncated.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    use std::fs::OpenOptions;
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            OpenOptions::new().write(true).open(path).map(drop)
        }
        Err(e) => Err(e),
    }
}

/// `n` and the noun, singular for one: `1 process`, `2 processes`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}
