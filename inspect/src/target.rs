//! The process being read: its maps, the module that defines the symbol,
//! and the module-wide TLS resolution. Nothing here stops a thread.

use std::fs;
use std::io::ErrorKind;

use crate::discovery::{self, DefiningModule, Discovery};
use crate::maps::{self, Mapping};
use crate::memory::{Memory, OpenError, ProcessMemory};
use crate::tls::{self, Resolution};

/// A usage or permission failure: the command exits with status 2.
#[derive(Debug)]
pub struct Fatal(pub String);

/// What the reader knows about the target before touching any thread.
pub struct Target {
    pub maps: Vec<Mapping>,
    pub memory: ProcessMemory,
    pub discovery: Discovery,
    /// The module whose variable is read (the first definition).
    pub module: Option<DefiningModule>,
    /// How each thread's variable is found, or why it cannot be.
    pub resolution: Option<Result<Resolution, String>>,
}

impl Target {
    /// Inspects `pid`'s mappings and modules.
    pub fn open(pid: i32) -> Result<Target, Fatal> {
        if pid <= 0 {
            return Err(Fatal(format!("invalid pid {pid}")));
        }
        // SAFETY: getpid has no preconditions.
        if pid == unsafe { libc::getpid() } {
            return Err(Fatal("refusing to inspect the reader's own process".into()));
        }
        let status = fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|_| Fatal(format!("no such process: {pid}")))?;
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        if let Some(tgid) = tgid.filter(|&t| t != pid) {
            return Err(Fatal(format!(
                "{pid} is a thread of process {tgid}; pass the process id"
            )));
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
            let module = discovery.modules.first().cloned();
            let resolution = module
                .as_ref()
                .map(|m| tls::resolve(m, &memory, &tls::HOST));
            if memory.ended() {
                continue;
            }
            return Ok(Target {
                maps,
                memory,
                discovery,
                module,
                resolution,
            });
        }
        if crate::thread::process_exited(pid) {
            return Err(Fatal(format!("no such process: {pid} (it exited)")));
        }
        Err(Fatal(format!(
            "process {pid} kept executing new programs while it was examined"
        )))
    }
}

/// How often [`Target::open`] looks again at a process that executed a new
/// program (or lost its last thread) while it was examined.
const OPEN_ATTEMPTS: usize = 5;

/// Opens the memory of `pid` through a thread that still has it. A main
/// thread that called pthread_exit is a zombie without an address space;
/// any live thread of the process shows the same one.
pub(crate) fn open_memory(pid: i32) -> Result<(i32, ProcessMemory), Fatal> {
    let maps = maps::read(pid).map_err(|e| match e.kind() {
        ErrorKind::NotFound => Fatal(format!("no such process: {pid}")),
        ErrorKind::PermissionDenied => Fatal(format!(
            "permission denied reading /proc/{pid}/maps (run as root or as the target's user)"
        )),
        _ => Fatal(format!("cannot read /proc/{pid}/maps: {e}")),
    })?;
    let candidates = if maps.is_empty() {
        crate::thread::list(pid)
    } else {
        vec![pid]
    };
    for tid in candidates {
        match ProcessMemory::open(pid, tid) {
            Ok(memory) if !memory.ended() => return Ok((tid, memory)),
            Ok(_) | Err(OpenError::Gone) => continue,
            Err(OpenError::PermissionDenied(e)) => {
                return Err(Fatal(format!(
                    "permission denied reading the memory of {pid} (run as root, or as the target's user with kernel.yama.ptrace_scope=0, or grant CAP_SYS_PTRACE): {e}"
                )))
            }
            Err(OpenError::Other(e)) => {
                return Err(Fatal(format!("cannot open the memory of {pid}: {e}")))
            }
        }
    }
    Err(Fatal(format!(
        "process {pid} has no memory mappings (a zombie or kernel thread)"
    )))
}
