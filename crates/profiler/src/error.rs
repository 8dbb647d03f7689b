//! Why the kernel sampler cannot run.

use crate::loader::{self, AttachError};
use crate::system;

/// Why samples cannot be taken at all: the build has no BPF program, the
/// process lacks the privileges, or the program could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("this build has no kernel sampler: {0}. To get profile, install clang and libbpf's headers (Debian: apt-get install clang libbpf-dev), then rebuild (npm install, or cargo build --release)")]
    NoSampler(&'static str),
    #[error("profile loads BPF programs and opens a perf event on every CPU: run it as root, or with CAP_BPF and CAP_PERFMON (e.g. setcap cap_bpf,cap_perfmon+ep on the binary)")]
    Unprivileged,
    #[error(transparent)]
    Attach(#[from] AttachError),
}

/// Whether this build and this process can sample: checked before anything
/// else is done.
pub fn check() -> Result<(), SamplerError> {
    if let Some(reason) = loader::unavailable() {
        return Err(SamplerError::NoSampler(reason));
    }
    if !system::privileged() {
        return Err(SamplerError::Unprivileged);
    }
    Ok(())
}
