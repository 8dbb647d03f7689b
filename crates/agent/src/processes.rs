//! Which processes the agent profiles: a scan of `/proc` every few seconds
//! that finds processes publishing a thread context (a module defining
//! `otel_thread_ctx_v1` or `otel_thread_ctx_nodejs_v1`), or the ones the
//! user named, and notices when they exit.
//!
//! Whether a mapped file defines a schema's symbol is decided once per file
//! (by inode and path), so a scan after the first one reads little more
//! than each process's maps.

use std::collections::{HashMap, HashSet};
use std::fs;

use otel_thread_ctx_profiler::kernel::TargetPlan;
use otel_thread_ctx_reader::discovery::open_mapped;
use otel_thread_ctx_reader::elf::{self, MappedFile};
use otel_thread_ctx_reader::maps::{self, Mapping};
use otel_thread_ctx_reader::schema::Schema;
use otel_thread_ctx_reader::target::Target;

/// Which processes to profile.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only these pids (with or without a thread context).
    pub pids: Vec<i32>,
    /// Only processes whose command name or executable file name contains
    /// one of these (with or without a thread context).
    pub names: Vec<String>,
    /// When not empty, only the processes above (by default: every one that
    /// publishes a thread context) whose published process context has one
    /// of these `service.name`s.
    pub service_names: Vec<String>,
}

impl Selection {
    /// Whether the user named processes (else: every publishing process).
    fn explicit(&self) -> bool {
        !self.pids.is_empty() || !self.names.is_empty()
    }

    fn admits(&self, pid: i32, comm: &str, exe_name: &str) -> bool {
        if !self.explicit() {
            return true;
        }
        self.pids.contains(&pid)
            || self
                .names
                .iter()
                .any(|n| comm.contains(n.as_str()) || exe_name.contains(n.as_str()))
    }

    /// Whether a process whose process context publishes `service_name`
    /// (`None`: no process context, or no `service.name` in it) is wanted.
    fn admits_service(&self, service_name: Option<&str>) -> bool {
        self.service_names.is_empty()
            || service_name.is_some_and(|s| self.service_names.iter().any(|n| n == s))
    }
}

/// A process to profile, as found.
pub struct Found {
    pub pid: i32,
    pub plan: TargetPlan,
    pub maps: Vec<Mapping>,
    /// `/proc/<pid>/exe`, and the command it was started with (argv[0]).
    pub executable: String,
    pub command: String,
    /// What the program reads in it (for the log).
    pub notes: Vec<String>,
}

/// What changed since the last scan.
pub enum Change {
    /// Profile this process from now on.
    Added(Box<Found>),
    /// Read this process with a new plan (it loaded a writer, or published
    /// its V8 layout, since it was added).
    Updated(Box<TargetPlan>),
    /// The process exited (or its pid now names another process).
    Gone(i32),
}

/// The state of a scan between rounds.
pub struct Watcher {
    selection: Selection,
    own_pid: i32,
    /// Mapped files by (inode, path): whether they define either schema.
    defines: HashMap<(u64, String), bool>,
    /// Processes profiled: start time (to tell a reused pid) and plan.
    tracked: HashMap<i32, (u64, TargetPlan)>,
}

impl Watcher {
    pub fn new(selection: Selection) -> Watcher {
        Watcher {
            selection,
            // SAFETY: getpid has no preconditions.
            own_pid: unsafe { libc::getpid() },
            defines: HashMap::new(),
            tracked: HashMap::new(),
        }
    }

    /// One round: every process that started publishing (or was named and
    /// appeared), changed its plan, or went away.
    pub fn scan(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut alive = HashSet::new();
        for pid in all_pids() {
            if pid == self.own_pid {
                continue;
            }
            let Some(start) = start_time(pid) else {
                continue;
            };
            if let Some(&(tracked_start, plan)) = self.tracked.get(&pid) {
                if tracked_start == start {
                    alive.insert(pid);
                    if let Some(newer) = self.recheck(pid, plan) {
                        self.tracked.insert(pid, (start, newer));
                        changes.push(Change::Updated(Box::new(newer)));
                    }
                    continue;
                }
                // The pid was reused: the old process is gone.
                self.tracked.remove(&pid);
                changes.push(Change::Gone(pid));
            }
            if let Some(found) = self.consider(pid) {
                alive.insert(pid);
                self.tracked.insert(pid, (start, found.plan));
                changes.push(Change::Added(Box::new(found)));
            }
        }
        let gone: Vec<i32> = self
            .tracked
            .keys()
            .copied()
            .filter(|pid| !alive.contains(pid))
            .collect();
        for pid in gone {
            self.tracked.remove(&pid);
            changes.push(Change::Gone(pid));
        }
        changes
    }

    /// A process not profiled yet: `Some` when it is selected and (unless
    /// named explicitly) publishes a thread context.
    fn consider(&mut self, pid: i32) -> Option<Found> {
        let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_default();
        // Kernel threads have no executable.
        let executable = fs::read_link(format!("/proc/{pid}/exe"))
            .ok()?
            .to_string_lossy()
            .into_owned();
        let exe_name = executable.rsplit('/').next().unwrap_or("");
        if !self.selection.admits(pid, &comm, exe_name) {
            return None;
        }
        let maps = maps::read(pid).ok().filter(|m| !m.is_empty())?;
        if !self.selection.explicit() && !self.publishes(pid, &maps) {
            return None;
        }
        if !self.selection.service_names.is_empty() {
            // Read at every scan until it matches: a process may publish its
            // process context some time after its thread context.
            let (_, memory) = otel_thread_ctx_reader::target::open_memory(pid).ok()?;
            let (published, _) = otel_thread_ctx_profiler::plan::process_context(&maps, &memory);
            let service_name = published.as_ref().and_then(crate::resource::service_name);
            if !self.selection.admits_service(service_name) {
                return None;
            }
        }
        let target = Target::open(pid).ok()?;
        let (plan, notes) = plan_for(pid, &target);
        let command = fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .and_then(|c| {
                c.split(|&b| b == 0)
                    .next()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
            })
            .filter(|a| !a.is_empty())
            .unwrap_or(comm);
        Some(Found {
            pid,
            plan,
            maps: target.maps,
            executable,
            command,
            notes,
        })
    }

    /// A newer plan for a profiled process, when it has one: a writer loaded
    /// since (named processes are taken before they publish), or a V8
    /// layout published since.
    fn recheck(&mut self, pid: i32, plan: TargetPlan) -> Option<TargetPlan> {
        let maps = maps::read(pid).ok()?;
        let unresolved = plan.record.mode == otel_thread_ctx_profiler::kernel::TlsPlan::NONE.mode
            && plan.nodejs[0] == otel_thread_ctx_profiler::kernel::TlsPlan::NONE;
        if unresolved && self.publishes(pid, &maps) {
            let target = Target::open(pid).ok()?;
            let (newer, _) = plan_for(pid, &target);
            return (newer != plan).then_some(newer);
        }
        if plan.nodejs[0] == otel_thread_ctx_profiler::kernel::TlsPlan::NONE {
            return None;
        }
        let (_, memory) = otel_thread_ctx_reader::target::open_memory(pid).ok()?;
        let layout = otel_thread_ctx_reader::process_context::lookup(&maps, &memory).v8_layout();
        if layout == plan.layout {
            return None;
        }
        // It published since it was added, perhaps in frame mode: looked for
        // once then (it parses node's symbols), not at every scan.
        let pool = if plan.pool.return_address == 0 {
            otel_thread_ctx_profiler::plan::pool_at_sample_time(pid, &maps, &memory)
                .unwrap_or(plan.pool)
        } else {
            plan.pool
        };
        Some(TargetPlan {
            layout,
            pool,
            ..plan
        })
    }

    /// Whether a mapped file defines either schema's symbol.
    fn publishes(&mut self, pid: i32, maps: &[Mapping]) -> bool {
        let mut publishes = false;
        for m in maps.iter().filter(|m| m.is_file_backed()) {
            let key = (m.inode, m.path.clone());
            let defines = match self.defines.get(&key) {
                Some(&d) => d,
                None => {
                    let d = file_defines_a_schema(pid, m);
                    self.defines.insert(key, d);
                    d
                }
            };
            publishes |= defines;
        }
        publishes
    }
}

/// Whether the file behind `m` defines a thread-context symbol.
/// How the program reads `pid`: its thread context, and its pool threads'
/// requests where they can be read at sample time (the agent attaches no
/// threadpool probes). With notes for the log.
fn plan_for(pid: i32, target: &Target) -> (TargetPlan, Vec<String>) {
    let (mut plan, mut notes) = otel_thread_ctx_profiler::plan::target_plan(pid, target);
    if let Some(pool) =
        otel_thread_ctx_profiler::plan::pool_at_sample_time(pid, &target.maps, &target.memory)
    {
        plan.pool = pool;
        notes.push("threadpool: pool threads' samples read the request they run".into());
    }
    (plan, notes)
}

fn file_defines_a_schema(pid: i32, m: &Mapping) -> bool {
    let Some(file) = open_mapped(pid, m) else {
        return false;
    };
    let Ok(image) = MappedFile::map(&file) else {
        return false;
    };
    image.bytes().starts_with(b"\x7fELF")
        && Schema::ALL
            .iter()
            .any(|s| matches!(elf::analyze(image.bytes(), s.symbol()), Ok(Some(_))))
}

/// Every process id in /proc.
fn all_pids() -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The process's start time (clock ticks since boot, field 22 of
/// `/proc/<pid>/stat`): with the pid, it names one process.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_names_pids_or_processes() {
        let every = Selection::default();
        assert!(every.admits(1, "node", "node"));
        let named = Selection {
            pids: vec![7],
            names: vec!["api".into()],
            service_names: Vec::new(),
        };
        assert!(named.admits(7, "x", "y"));
        assert!(named.admits(8, "api-server", "node"));
        assert!(named.admits(9, "node", "my-api"));
        assert!(!named.admits(10, "node", "node"));
    }

    #[test]
    fn service_names_narrow_the_selection() {
        let every = Selection::default();
        assert!(every.admits_service(None));
        assert!(every.admits_service(Some("checkout")));
        let narrowed = Selection {
            service_names: vec!["checkout".into(), "cart".into()],
            ..Selection::default()
        };
        // Narrowing alone keeps the default: publishing processes.
        assert!(!narrowed.explicit());
        assert!(narrowed.admits(1, "node", "node"));
        assert!(narrowed.admits_service(Some("checkout")));
        assert!(narrowed.admits_service(Some("cart")));
        assert!(!narrowed.admits_service(Some("Checkout")));
        assert!(!narrowed.admits_service(Some("checkout-v2")));
        assert!(!narrowed.admits_service(None));
    }

    #[test]
    fn start_time_reads_past_a_command_name_with_spaces() {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        assert!(start_time(me).is_some());
        assert!(all_pids().contains(&me));
    }
}
