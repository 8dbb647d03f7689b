//! A conformance report for one process (the `inspect` command's).
//!
//! `collect` reads the process, `rules` holds the conformance rules, and
//! `report` judges what was read by them and builds the [`Report`], which
//! serializes as the JSON report (a program prints it as text as it sees
//! fit).

mod collect;
mod report;
mod rules;

use std::time::Duration;

pub use report::{ProcessContextInfo, Report, SymbolInfo};

use crate::Error;

/// How many times a process that executes a new program while it is read
/// is read again from the start.
const ATTEMPTS: usize = 3;

/// Builds the report. `Err` is a usage/permission failure (exit 2).
pub fn run(pid: i32, stop_timeout: Duration) -> Result<Report, Error> {
    for _ in 0..ATTEMPTS {
        if let Some(collected) = collect::collect(pid, stop_timeout)? {
            return Ok(report::build(collected));
        }
    }
    Err(Error::ExecutedEveryTime {
        pid,
        attempts: ATTEMPTS,
    })
}
