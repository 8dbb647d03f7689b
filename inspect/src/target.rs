//! The process being read: its maps, the module that defines the symbol,
//! and the module-wide TLS resolution. Nothing here stops a thread.

use std::fs;
use std::io::ErrorKind;

use crate::discovery::{self, DefiningModule, Discovery};
use crate::maps::{self, Mapping};
use crate::memory::ProcessMemory;
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
        let maps = maps::read(pid).map_err(|e| match e.kind() {
            ErrorKind::NotFound => Fatal(format!("no such process: {pid}")),
            ErrorKind::PermissionDenied => Fatal(format!(
                "permission denied reading /proc/{pid}/maps (run as root or as the target's user)"
            )),
            _ => Fatal(format!("cannot read /proc/{pid}/maps: {e}")),
        })?;
        // A main thread that called pthread_exit is a zombie without an
        // address space; any live thread of the process shows the same one.
        let (live, maps) = if maps.is_empty() {
            crate::thread::list(pid)
                .into_iter()
                .find_map(|tid| {
                    maps::read(tid)
                        .ok()
                        .filter(|m| !m.is_empty())
                        .map(|m| (tid, m))
                })
                .ok_or_else(|| {
                    Fatal(format!(
                        "process {pid} has no memory mappings (a zombie or kernel thread)"
                    ))
                })?
        } else {
            (pid, maps)
        };
        let memory = ProcessMemory::new(live);
        let discovery = discovery::discover(live, &maps);
        let module = discovery.modules.first().cloned();
        let resolution = module
            .as_ref()
            .map(|m| tls::resolve(m, &memory, &tls::HOST));
        if let (Some(Err(e)), Some(m)) = (&resolution, &module) {
            // Distinguish "not allowed to read memory" (usage) from a bad target.
            if e.contains("Operation not permitted") || e.contains("Permission denied") {
                return Err(Fatal(format!(
                    "permission denied reading the memory of {pid} ({}): {e}",
                    m.path
                )));
            }
        }
        Ok(Target {
            maps,
            memory,
            discovery,
            module,
            resolution,
        })
    }
}
