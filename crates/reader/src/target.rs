//! The process being read: its maps, the modules that define a schema's
//! symbol, and the module-wide TLS resolution of each schema read. Nothing
//! here stops a thread.

use std::fs;
use std::io::{self, ErrorKind};

use crate::discovery::{self, DefiningModule, Discovery};
use crate::maps::{self, Mapping};
use crate::memory::{Memory, OpenError, ProcessMemory};
use crate::schema::Schema;
use crate::tls::{self, Plan, Resolution, TlsError};

/// Why the target cannot be examined at all (a usage or permission failure).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("invalid pid {0}")]
    InvalidPid(i32),
    #[error("refusing to inspect the reader's own process")]
    OwnProcess,
    #[error("no such process: {0}")]
    NoSuchProcess(i32),
    #[error("{pid} is a thread of process {tgid}; pass the process id")]
    NotAProcess { pid: i32, tgid: i32 },
    #[error("no such process: {0} (it exited)")]
    Exited(i32),
    #[error("process {0} kept executing new programs while it was examined")]
    KeptExecuting(i32),
    #[error("permission denied reading /proc/{pid}/maps (run as root or as the target's user)")]
    MapsDenied {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("cannot read /proc/{pid}/maps: {source}")]
    Maps {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("permission denied reading the memory of {pid} (run as root, or as the target's user with kernel.yama.ptrace_scope=0, or grant CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH): {source}")]
    MemoryDenied {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the memory of {pid}: {source}")]
    Memory {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("process {0} has no memory mappings (a zombie or kernel thread)")]
    NoMappings(i32),
}

/// What the reader knows about the target before touching any thread.
pub struct Target {
    pub maps: Vec<Mapping>,
    pub memory: ProcessMemory,
    pub discovery: Discovery,
    /// The module whose `otel_thread_ctx_v1` is read (the first definition).
    pub module: Option<DefiningModule>,
    /// How each thread's variable is found, or why it cannot be.
    pub resolution: Option<Result<Resolution, TlsError>>,
    /// Every module that defines `otel_thread_ctx_nodejs_v1` (the
    /// executable first, then in address order) and its resolution, through
    /// the same code as the record's. Several addons may define it (a writer
    /// in use beside one that is loaded but idle): each thread is read
    /// through all of them, and the first that publishes wins.
    pub nodejs: Vec<(DefiningModule, Result<Resolution, TlsError>)>,
}

impl Target {
    /// The module read for `schema`, and its resolution.
    pub fn schema(
        &self,
        schema: Schema,
    ) -> Option<(&DefiningModule, &Result<Resolution, TlsError>)> {
        match schema {
            Schema::Record => self.module.as_ref().zip(self.resolution.as_ref()),
            Schema::Nodejs => self.nodejs.first().map(|(m, r)| (m, r)),
        }
    }

    /// The resolved plan of `schema`, when its variable can be found.
    pub fn plan(&self, schema: Schema) -> Option<Plan> {
        self.schema(schema)
            .and_then(|(_, r)| r.as_ref().ok())
            .map(|r| r.plan)
    }

    /// The resolved plans of every module that defines the Node.js schema's
    /// variable, in [`Target::nodejs`] order.
    pub fn nodejs_plans(&self) -> Vec<Plan> {
        self.nodejs
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().map(|r| r.plan))
            .collect()
    }
}

impl Target {
    /// Inspects `pid`'s mappings and modules.
    pub fn open(pid: i32) -> Result<Target, TargetError> {
        if pid <= 0 {
            return Err(TargetError::InvalidPid(pid));
        }
        // SAFETY: getpid has no preconditions.
        if pid == unsafe { libc::getpid() } {
            return Err(TargetError::OwnProcess);
        }
        let status = fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|_| TargetError::NoSuchProcess(pid))?;
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        if let Some(tgid) = tgid.filter(|&t| t != pid) {
            return Err(TargetError::NotAProcess { pid, tgid });
        }
        // The memory file is opened before the mappings are read and checked
        // after everything is resolved: a process that executes a new program
        // in between is looked at again, so the mappings, the modules and the
        // resolution all belong to the address space the file reads.
        for _ in 0..OPEN_ATTEMPTS {
            let (live, memory) = open_memory(pid)?;
            let maps = match maps::read(live) {
                Ok(m) if !m.is_empty() => m,
                _ => continue,
            };
            let discovery = discovery::discover(live, &maps);
            let module = discovery.of(Schema::Record).next().cloned();
            let resolution = module
                .as_ref()
                .map(|m| tls::resolve(m, &memory, &tls::HOST));
            let nodejs = discovery
                .of(Schema::Nodejs)
                .map(|m| (m.clone(), tls::resolve(m, &memory, &tls::HOST)))
                .collect();
            if memory.ended() {
                continue;
            }
            return Ok(Target {
                maps,
                memory,
                discovery,
                module,
                resolution,
                nodejs,
            });
        }
        if crate::tasks::process_exited(pid) {
            return Err(TargetError::Exited(pid));
        }
        Err(TargetError::KeptExecuting(pid))
    }
}

/// How often [`Target::open`] looks again at a process that executed a new
/// program (or lost its last thread) while it was examined.
const OPEN_ATTEMPTS: usize = 5;

/// Opens the memory of `pid` through a thread that still has it. A main
/// thread that called pthread_exit is a zombie without an address space;
/// any live thread of the process shows the same one.
pub fn open_memory(pid: i32) -> Result<(i32, ProcessMemory), TargetError> {
    let maps = maps::read(pid).map_err(|source| match source.kind() {
        ErrorKind::NotFound => TargetError::NoSuchProcess(pid),
        ErrorKind::PermissionDenied => TargetError::MapsDenied { pid, source },
        _ => TargetError::Maps { pid, source },
    })?;
    let candidates = if maps.is_empty() {
        crate::tasks::list(pid)
    } else {
        vec![pid]
    };
    for tid in candidates {
        match ProcessMemory::open(pid, tid) {
            Ok(memory) if !memory.ended() => return Ok((tid, memory)),
            Ok(_) | Err(OpenError::Gone) => continue,
            Err(OpenError::PermissionDenied(source)) => {
                return Err(TargetError::MemoryDenied { pid, source })
            }
            Err(OpenError::Other(source)) => return Err(TargetError::Memory { pid, source }),
        }
    }
    Err(TargetError::NoMappings(pid))
}
