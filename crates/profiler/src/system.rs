//! What the profiler asks of its own process: its privileges, the CPU time
//! it used, the wall clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// `CAP_SYS_ADMIN`, `CAP_PERFMON`, `CAP_BPF`.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

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
