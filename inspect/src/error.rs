//! The failures that end a command with exit status 2 (or 128 + N when a
//! signal ended it), each with the chain of causes behind it.

use otel_thread_ctx_reader::target::TargetError;

/// A usage, permission or environment failure of `profile` or `agent`: the
/// command exits with status 2. (`inspect` and `sample` end on the reader's
/// own [`otel_thread_ctx_reader::Error`].)
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
}
