//! What the profiler asks of its own process: its privileges (and giving
//! up those it no longer needs), the CPU time it used, the wall clock.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

/// Capability numbers (`linux/capability.h`).
pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYSLOG: u32 = 34;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The capabilities a profiler keeps once its BPF programs are loaded and
/// attached: CAP_BPF to add targets to the loaded maps (where unprivileged
/// BPF is disabled, kernels before 6.5 refuse every bpf() call without it,
/// even on a map the process holds), CAP_SYS_PTRACE
/// and CAP_DAC_READ_SEARCH to read other users' processes and files, and
/// CAP_SYSLOG to name kernel frames: with `kernel.kptr_restrict` at 1
/// `/proc/kallsyms` shows its addresses only to a reader that holds it.
/// Capabilities the process does not hold stay absent.
pub const CAPABILITIES_AFTER_LOAD: [u32; 4] =
    [CAP_BPF, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYSLOG];

/// What `profile` keeps once its programs are attached: the same, and
/// CAP_DAC_OVERRIDE, because it writes its outputs at the end where its
/// user asked, which run with sudo is often a directory root does not own.
pub const PROFILE_CAPABILITIES_AFTER_LOAD: [u32; 5] = [
    CAP_BPF,
    CAP_SYS_PTRACE,
    CAP_DAC_READ_SEARCH,
    CAP_SYSLOG,
    CAP_DAC_OVERRIDE,
];

/// The capabilities this process lacks to load tracing BPF programs and
/// open system-wide perf events, by name: none with root's capabilities
/// (CAP_SYS_ADMIN), else CAP_BPF and CAP_PERFMON are both needed.
pub fn missing_sampling_capabilities() -> Vec<&'static str> {
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0);
    let has = |bit: u32| caps & (1 << bit) != 0;
    if has(CAP_SYS_ADMIN) {
        return Vec::new();
    }
    [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(bit, _)| !has(bit))
        .map(|(_, name)| name)
        .collect()
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64 capability bits in two words.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn check_status(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Keeps only the capabilities `keep` of the calling thread (effective and
/// permitted; none inheritable or ambient), drops the others from its
/// bounding set where CAP_SETPCAP allows, and sets no_new_privs, so no
/// program it executes regains any. Linux keeps capabilities per thread:
/// threads started afterwards inherit the reduced sets, threads already
/// running keep theirs, so call it before starting the threads that parse
/// what targets wrote.
pub fn keep_only_capabilities(keep: &[u32]) -> io::Result<()> {
    let mask = keep.iter().fold(0u64, |m, &cap| m | 1 << cap);
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget reads the header and fills two CapData words, the
    // sizes of _LINUX_CAPABILITY_VERSION_3.
    check_status(unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) })?;
    // The bounding set first: dropping from it needs CAP_SETPCAP, still
    // effective now. Without it the bounding set stays, and no_new_privs
    // keeps an executed program from using it.
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .min(63);
    for cap in (0..=last).filter(|cap| mask & (1 << cap) == 0) {
        // SAFETY: prctl with integer arguments only.
        let _ = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    // SAFETY: prctl with integer arguments only.
    let _ = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    for (word, d) in data.iter_mut().enumerate() {
        let m = (mask >> (32 * word)) as u32;
        d.effective &= m;
        d.permitted &= m;
        d.inheritable = 0;
    }
    // SAFETY: capset reads the header and two CapData words.
    check_status(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) })?;
    // SAFETY: prctl with integer arguments only.
    check_status(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)
}

/// The wall clock, in nanoseconds since the Unix epoch.
pub fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// CPU time this process used so far (user and system), in nanoseconds.
pub fn own_cpu_ns() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's capability set `field` (CapEff, CapPrm, ...).
    fn thread_caps(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")[..]))
            .unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    }

    #[test]
    fn a_thread_keeps_only_the_named_capabilities_and_passes_no_more_on() {
        // In a thread of its own: capabilities are per thread, and the
        // test harness's other threads keep theirs.
        std::thread::spawn(|| {
            let before = thread_caps("CapEff");
            keep_only_capabilities(&CAPABILITIES_AFTER_LOAD).unwrap();
            let mask = CAPABILITIES_AFTER_LOAD
                .iter()
                .fold(0u64, |m, &c| m | 1 << c);
            for field in ["CapEff", "CapPrm"] {
                assert_eq!(thread_caps(field), before & mask, "{field}");
            }
            assert_eq!(thread_caps("CapInh"), 0);
            assert_eq!(thread_caps("CapAmb"), 0);
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            assert!(status.contains("NoNewPrivs:\t1"), "{status}");
            // A thread it starts has no more.
            let child = std::thread::spawn(|| thread_caps("CapEff")).join().unwrap();
            assert_eq!(child, before & mask);
            // And cannot take a dropped one back.
            if before & (1 << CAP_SYS_ADMIN) != 0 {
                assert!(keep_only_capabilities(&[CAP_SYS_ADMIN]).is_ok());
                assert_eq!(thread_caps("CapEff") & (1 << CAP_SYS_ADMIN), 0);
            }
        })
        .join()
        .unwrap();
    }
}
