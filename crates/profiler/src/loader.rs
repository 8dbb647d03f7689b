//! Loads the BPF program (built from `bpf/` by build.rs when
//! clang was there), attaches it to the perf events, sched_switch and the
//! threadpool probes, and hands over what its ring buffer sends.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{BtfTracePoint, PerfEvent, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::kernel::{
    decode_item, Item, ItemRead, Pairing, Sample, TargetPlan, ISOLATES_SIZE, PENDING_ITEMS_SIZE,
    TARGET_SIZE,
};
use crate::threadpool::{self, Probes};

/// Why the kernel side is not available in this build, if it is not.
pub fn unavailable() -> Option<&'static str> {
    #[cfg(profile_bpf)]
    return None;
    #[cfg(not(profile_bpf))]
    return Some(env!("PROFILE_BPF_UNAVAILABLE"));
}

/// Why the BPF side could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
#[error("{text}{}", .needs.map(|needs| format!(" ({needs})")).unwrap_or_default())]
pub struct AttachError {
    /// What failed, followed by its chain of causes.
    text: String,
    /// What the refused step needs, when a cause in the chain is a refused
    /// system call (`EPERM`/`EACCES`).
    needs: Option<&'static str>,
}

/// How long a wakeup waits for more samples before the ring is drained.
/// The kernel wakes the reader for each sample while it keeps up; a short
/// wait turns a wakeup per sample into one per batch. Samples are read
/// this much later, well within what V8's objects keep still for.
const GATHER: Duration = Duration::from_millis(5);

/// What loading and attaching the samplers needs.
const SAMPLERS_NEED: &str = "this needs root, or CAP_BPF and CAP_PERFMON";
/// What the libuv uprobes need: kernels that refuse uprobe perf events to
/// CAP_PERFMON alone take them from CAP_SYS_ADMIN.
const UPROBES_NEED: &str =
    "the libuv uprobes need root, or CAP_SYS_ADMIN where the kernel refuses them to CAP_PERFMON";

impl From<String> for AttachError {
    fn from(text: String) -> Self {
        AttachError { text, needs: None }
    }
}

impl From<&str> for AttachError {
    fn from(text: &str) -> Self {
        text.to_string().into()
    }
}

#[cfg(profile_bpf)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profile.bpf.o"));
// Without the program nothing is loaded: [`unavailable`] says why, and the
// commands check it before attaching.
#[cfg(not(profile_bpf))]
static OBJECT: &[u8] = &[];

/// The attached program and its ring buffer.
pub struct Loaded {
    ring: RingBuf<MapData>,
    targets: HashMap<MapData, u32, [u8; TARGET_SIZE]>,
    isolates: HashMap<MapData, u32, [u8; ISOLATES_SIZE]>,
    unread_items: HashMap<MapData, u32, [u8; PENDING_ITEMS_SIZE]>,
    counters: PerCpuArray<MapData, u64>,
    pairing: Pairing,
    item_reads: Vec<ItemRead>,
    // Holds the programs and links: dropping it detaches everything.
    ebpf: Ebpf,
}

/// Counts of samples the kernel side had to drop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    pub ring_full: u64,
    pub blocked_table_full: u64,
}

/// Counts of the threadpool probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolItems {
    /// Work items queued while their submitter was in a span.
    pub queued_in_span: u64,
    /// Of those, the items a pool thread began with their span.
    pub ran_in_span: u64,
}

impl Loaded {
    /// Loads the program with room for `max_targets` processes, attaches
    /// a perf event per online CPU at `hz`, and sched_switch when
    /// `off_cpu`. Nothing is sampled until [`Loaded::add_target`].
    pub fn attach(hz: u64, off_cpu: bool, max_targets: u32) -> Result<Loaded, AttachError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| format!("counting CPUs: {e}"))?;
        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries("stack_scratch", cpus as u32)
            .map_max_entries("targets", max_targets.max(1))
            // One entry per target at most: remove_target deletes them.
            .map_max_entries("isolates", max_targets.max(1))
            .map_max_entries("unread_items", max_targets.max(1))
            // The threadpool's per-thread state is task storage, a map
            // type aya creates but has no typed wrapper for.
            .allow_unsupported_maps();
        let mut ebpf = loader
            .load(OBJECT)
            .map_err(|e| explain("loading the BPF object", &e))?;
        let prog: &mut PerfEvent = ebpf
            .program_mut("on_cpu")
            .ok_or("the BPF object has no on_cpu program")?
            .try_into()
            .map_err(|e| format!("on_cpu: {e}"))?;
        prog.load()
            .map_err(|e| explain("loading the on-CPU program", &e))?;
        let cpus =
            aya::util::online_cpus().map_err(|(_, e)| format!("listing online CPUs: {e}"))?;
        for cpu in cpus {
            prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(hz),
                false,
            )
            .map_err(|e| explain(&format!("attaching the perf event of CPU {cpu}"), &e))?;
        }
        if off_cpu {
            let btf = Btf::from_sys_fs().map_err(|e| {
                AttachError::from(format!(
                    "--off-cpu needs the kernel's BTF (/sys/kernel/btf/vmlinux): {e}"
                ))
            })?;
            // off_cpu first: it checks the switching thread's isolate
            // before pending_on_switch reads the process's waiting items.
            for name in ["off_cpu", "pending_on_switch"] {
                let prog: &mut BtfTracePoint = ebpf
                    .program_mut(name)
                    .ok_or_else(|| format!("the BPF object has no {name} program"))?
                    .try_into()
                    .map_err(|e| format!("{name}: {e}"))?;
                prog.load("sched_switch", &btf).map_err(|e| {
                    explain(&format!("loading the sched_switch program {name}"), &e)
                })?;
                prog.attach()
                    .map_err(|e| explain(&format!("attaching {name} to sched_switch"), &e))?;
            }
        }
        let ring = RingBuf::try_from(ebpf.take_map("samples").ok_or("no samples map")?)
            .map_err(|e| format!("samples map: {e}"))?;
        let counters = PerCpuArray::try_from(ebpf.take_map("counters").ok_or("no counters map")?)
            .map_err(|e| format!("counters map: {e}"))?;
        let targets = HashMap::try_from(ebpf.take_map("targets").ok_or("no targets map")?)
            .map_err(|e| format!("targets map: {e}"))?;
        let isolates = HashMap::try_from(ebpf.take_map("isolates").ok_or("no isolates map")?)
            .map_err(|e| format!("isolates map: {e}"))?;
        let unread_items =
            HashMap::try_from(ebpf.take_map("unread_items").ok_or("no unread_items map")?)
                .map_err(|e| format!("unread_items map: {e}"))?;
        Ok(Loaded {
            ring,
            counters,
            targets,
            isolates,
            unread_items,
            pairing: Pairing::default(),
            item_reads: Vec::new(),
            ebpf,
        })
    }

    /// Samples the process `plan` names from now on (or with this plan,
    /// when it already was).
    pub fn add_target(&mut self, plan: &TargetPlan) -> Result<(), AttachError> {
        // Room for the items its pool samples could not read (the
        // program only fills entries: a BPF-made one would need the
        // whole value on its small stack). Kept when it exists.
        if plan.pool.return_address != 0 && self.unread_items.get(&plan.tgid, 0).is_err() {
            self.unread_items
                .insert(plan.tgid, [0; PENDING_ITEMS_SIZE], 0)
                .map_err(|e| {
                    explain(
                        &format!("adding pid {} to the threadpool's tables", plan.tgid),
                        &e,
                    )
                })?;
        }
        self.targets
            .insert(plan.tgid, plan.encode(), 0)
            .map_err(|e| explain(&format!("adding pid {} to the targets", plan.tgid), &e))
    }

    /// Follows process `tgid`'s threadpool work to the span that queued
    /// it: attaches the submit probes and the probe where the worker
    /// loop starts an item (or, without it, the entry probe of every
    /// work function), for that process only (the kernel places the
    /// breakpoints in its memory alone). They stay until `self` drops.
    pub fn attach_threadpool(&mut self, tgid: u32, probes: &Probes) -> Result<(), AttachError> {
        attach_threadpool(&mut self.ebpf, probes, tgid)
    }

    /// Stops sampling process `tgid` (nothing when it was not sampled).
    pub fn remove_target(&mut self, tgid: u32) {
        // Not found is the only failure: the entry is gone either way.
        let _ = self.targets.remove(&tgid);
        let _ = self.isolates.remove(&tgid);
        let _ = self.unread_items.remove(&tgid);
    }

    /// The item reads received since the last call.
    pub fn take_item_reads(&mut self) -> Vec<ItemRead> {
        std::mem::take(&mut self.item_reads)
    }

    /// Waits up to `timeout` for samples, then hands every pending one
    /// to `each`; item reads wait for [`Loaded::take_item_reads`].
    pub fn poll(&mut self, timeout: Duration, mut each: impl FnMut(Sample)) {
        let mut fds = libc::pollfd {
            fd: self.ring.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; EINTR (a signal) just returns early.
        let ready = unsafe { libc::poll(&mut fds, 1, timeout.as_millis() as libc::c_int) };
        if ready > 0 && !timeout.is_zero() {
            std::thread::sleep(GATHER.min(timeout));
        }
        while let Some(item) = self.ring.next() {
            match decode_item(&item) {
                Some(Item::ItemRead(read)) => self.item_reads.push(read),
                Some(item) => {
                    if let Some(s) = self.pairing.take(item) {
                        each(s);
                    }
                }
                None => {}
            }
        }
    }

    /// What the kernel side dropped so far, summed over CPUs.
    pub fn lost(&self) -> Lost {
        Lost {
            ring_full: self.sum(0),
            blocked_table_full: self.sum(1),
        }
    }

    /// What the threadpool probes saw so far.
    pub fn pool_items(&self) -> PoolItems {
        PoolItems {
            queued_in_span: self.sum(2),
            ran_in_span: self.sum(3),
        }
    }

    fn sum(&self, counter: u32) -> u64 {
        self.counters
            .get(&counter, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }
}

fn attach_threadpool(ebpf: &mut Ebpf, probes: &Probes, tgid: u32) -> Result<(), AttachError> {
    let scope = UProbeScope::OneProcess(
        std::num::NonZeroU32::new(tgid).ok_or("the threadpool probes need a pid")?,
    );
    // The cookie tells the submit probe where the work item is in its
    // second argument.
    let mut sites: Vec<(&str, u64, Option<u64>, &str)> = probes
        .sites
        .submitters
        .iter()
        .map(|s| ("pool_submit", s.offset, Some(s.work_offset), s.function))
        .collect();
    // The worker loop's item start covers every kind of item with one
    // emulated probe; without it, the entry of each work function.
    match probes.sites.item_start {
        Some(start) => sites.push((
            "pool_item_start",
            start.offset,
            Some(start.cookie()),
            threadpool::WORKER_LOOP,
        )),
        None => {
            for &(name, offset) in &probes.sites.work {
                sites.push(("pool_work_enter", offset, None, name));
            }
        }
    }
    for (program, offset, cookie, function) in sites {
        let prog: &mut UProbe = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("the BPF object has no {program} program"))?
            .try_into()
            .map_err(|e| format!("{program}: {e}"))?;
        if prog.fd().is_err() {
            prog.load()
                .map_err(|e| explain(&format!("loading {program}"), &e))?;
        }
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie,
        };
        prog.attach(point, &probes.attach_path, scope)
            .map_err(|e| {
                explain_needing(
                    &format!("attaching {program} to {function}"),
                    &e,
                    UPROBES_NEED,
                )
            })?;
    }
    Ok(())
}

/// Names the failed step with its chain of causes, and tells a refused
/// system call (decided by its errno) from other failures.
fn explain(what: &str, e: &(dyn std::error::Error + 'static)) -> AttachError {
    explain_needing(what, e, SAMPLERS_NEED)
}

/// explain(), saying that a refused step needs `needs`.
fn explain_needing(
    what: &str,
    e: &(dyn std::error::Error + 'static),
    needs: &'static str,
) -> AttachError {
    let mut text = what.to_string();
    let mut denied = false;
    for cause in std::iter::successors(Some(e), |c| c.source()) {
        text.push_str(&format!(": {cause}"));
        denied |= cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(is_permission_denied);
    }
    AttachError {
        text,
        needs: denied.then_some(needs),
    }
}

/// Whether a system call was refused for lack of privilege: `EPERM` or
/// `EACCES`, whatever the message says.
fn is_permission_denied(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
        || matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}
