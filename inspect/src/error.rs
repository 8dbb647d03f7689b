//! The failures that end a command with exit status 2 (or 128 + N when a
//! signal ended it), each with the chain of causes behind it.

use otel_thread_ctx_reader::target::TargetError;

/// A usage, permission or environment failure of `profile`: the command
/// exits with status 2. (`inspect` and `sample` end on the reader's
/// [`otel_thread_ctx_reader::Error`], `agent` on the agent's
/// [`otel_thread_ctx_agent::AgentError`].)
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
}
