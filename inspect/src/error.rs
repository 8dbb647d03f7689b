//! The failures that end a command with exit status 2 (or 128 + N when a
//! signal ended it), each with the chain of causes behind it.

use crate::ptrace::StopError;
use crate::target::TargetError;

/// A usage, permission or environment failure: the command exits with
/// status 2 (128 + N for [`Fatal::Interrupted`]).
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A thread could not be stopped for lack of privilege.
    #[error(transparent)]
    Denied(StopError),
    #[error("interrupted by signal {0}")]
    Interrupted(i32),
    #[error("process {pid} executed a new program every time it was read ({attempts} times)")]
    ExecutedEveryTime { pid: i32, attempts: usize },
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
}

/// Whether a system call was refused for lack of privilege: `EPERM` or
/// `EACCES`, whatever the message says.
pub fn is_permission_denied(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
        || matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}
