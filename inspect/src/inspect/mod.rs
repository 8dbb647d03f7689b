//! `otel-thread-ctx inspect`: a conformance report for one process.
//!
//! [`collect`] reads the process, [`conformance`] holds the rules, and
//! [`report`] judges what was read by them and builds the report that
//! `output` prints as text (or `--json` prints as is).

mod collect;
mod conformance;
mod report;

use std::time::Duration;

pub use report::{ProcessContextInfo, Report, SymbolInfo};

use crate::error::Fatal;

/// How many times a process that executes a new program while it is read
/// is read again from the start.
const ATTEMPTS: usize = 3;

/// Builds the report. `Err` is a usage/permission failure (exit 2).
pub fn run(pid: i32, stop_timeout: Duration) -> Result<Report, Fatal> {
    for _ in 0..ATTEMPTS {
        if let Some(collected) = collect::collect(pid, stop_timeout)? {
            return Ok(report::build(collected));
        }
    }
    Err(Fatal::ExecutedEveryTime {
        pid,
        attempts: ATTEMPTS,
    })
}
