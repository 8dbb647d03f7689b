//! Why a process could not be read at all.

use crate::ptrace::StopError;
use crate::target::TargetError;

/// A usage, permission or environment failure that ends a read of the
/// whole process (as opposed to one thread's read failing, which is a
/// finding of the read).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A thread could not be stopped for lack of privilege.
    #[error(transparent)]
    Denied(StopError),
    #[error("interrupted by signal {0}")]
    Interrupted(i32),
    #[error("process {pid} executed a new program every time it was read ({attempts} times)")]
    ExecutedEveryTime { pid: i32, attempts: usize },
}
