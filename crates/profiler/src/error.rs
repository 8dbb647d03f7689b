//! Why the kernel sampler cannot run.

use crate::loader::{self, AttachError};
use crate::system;

/// Why samples cannot be taken at all: the build has no BPF program, the
/// process lacks the privileges, or the program could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("this build has no kernel sampler: {0}. To get profile, install clang and libbpf's headers (Debian: apt-get install clang libbpf-dev), then rebuild (npm install, or cargo build --release)")]
    NoSampler(&'static str),
    #[error("sampling loads BPF programs and opens a perf event on every CPU: run as root, or grant CAP_BPF and CAP_PERFMON (missing: {missing}); reading the processes of other users takes CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH as well (e.g. setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep on the binary)")]
    Unprivileged {
        /// The capabilities it lacks, by name.
        missing: String,
    },
    #[error(transparent)]
    Attach(#[from] AttachError),
}

/// Whether this build and this process can sample: checked before anything
/// else is done.
pub fn check() -> Result<(), SamplerError> {
    if let Some(reason) = loader::unavailable() {
        return Err(SamplerError::NoSampler(reason));
    }
    let missing = system::missing_sampling_capabilities();
    if !missing.is_empty() {
        return Err(SamplerError::Unprivileged {
            missing: missing.join(", "),
        });
    }
    Ok(())
}
