//! The target's threads as /proc lists them: which exist, which exited,
//! what they are called. Nothing here stops a thread.

use std::fs;

/// The target's thread ids, ascending. Empty if the process is gone.
pub fn list(pid: i32) -> Vec<i32> {
    let mut tids: Vec<i32> = fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// `PF_EXITING` in the flags field of `/proc/<pid>/task/<tid>/stat`: the
/// thread is inside `exit(2)` and will never run user code again.
const PF_EXITING: u64 = 0x4;

/// Whether thread `tid` of process `pid` is gone: no longer listed under
/// `/proc/<pid>/task`, a zombie or dead (state `Z` or `X`), already
/// exiting, or killed (`SIGKILL` pending). A ptrace request on such a
/// thread fails with `ESRCH` or `EPERM`; this tells that apart from a real
/// permission failure.
pub fn exited(pid: i32, tid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
        return true;
    };
    // "tid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may
    // hold spaces and parentheses, so fields are counted after the last ')'.
    let Some(fields) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    let mut fields = fields.split_whitespace();
    let state = fields.next().and_then(|s| s.chars().next());
    if matches!(state, Some('Z' | 'X' | 'x')) {
        return true;
    }
    if fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0)
    {
        return true;
    }
    // A killed thread becomes PF_EXITING only once it is scheduled again,
    // which on a busy machine can be long after the kill. Until then the
    // SIGKILL is pending, for the thread or the whole process.
    match fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
        Ok(status) => sigkill_pending(&status),
        Err(_) => true,
    }
}

/// Whether `SIGKILL` is pending in a `/proc/<pid>/task/<tid>/status`:
/// `SigPnd` (sent to the thread, or to every thread by a group exit) or
/// `ShdPnd` (sent to the process). It cannot be blocked or caught: the
/// thread will never run user code again.
fn sigkill_pending(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    status.lines().any(|line| {
        let mask = line
            .strip_prefix("SigPnd:")
            .or_else(|| line.strip_prefix("ShdPnd:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & SIGKILL_BIT != 0)
    })
}

/// Whether the whole process has exited: none of its threads is left
/// alive (a process its parent has not reaped yet still lists its zombie
/// main thread).
pub fn process_exited(pid: i32) -> bool {
    list(pid).into_iter().all(|tid| exited(pid, tid))
}

/// The thread's name (`/proc/<pid>/task/<tid>/comm`), exactly as the
/// thread set it (bytes that are not UTF-8 replaced).
pub fn name(pid: i32, tid: i32) -> String {
    fs::read(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|b| {
            let b = b.strip_suffix(b"\n").unwrap_or(&b);
            String::from_utf8_lossy(b).into_owned()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::sigkill_pending;

    const STATUS: &str = "Name:\thost\nState:\tR (running)\nTgid:\t10\n\
        SigQ:\t1/63459\nSigPnd:\t{thread}\nShdPnd:\t{shared}\n\
        SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n";

    fn status(thread: &str, shared: &str) -> String {
        STATUS
            .replace("{thread}", thread)
            .replace("{shared}", shared)
    }

    #[test]
    fn sigkill_pending_for_the_thread_or_the_process() {
        assert!(sigkill_pending(&status(
            "0000000000000100",
            "0000000000000000"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000000",
            "0000000000000100"
        )));
        assert!(sigkill_pending(&status(
            "0000000000004102",
            "0000000000000000"
        )));
    }

    #[test]
    fn other_pending_signals_are_not_a_kill() {
        assert!(!sigkill_pending(&status(
            "0000000000000000",
            "0000000000000000"
        )));
        // SIGTERM (15) for the thread, SIGSTOP (19) for the process; other
        // masks such as SigBlk are not pending signals.
        assert!(!sigkill_pending(&status(
            "0000000000004000",
            "0000000000040000"
        )));
        assert!(!sigkill_pending("SigBlk:\t0000000000000100\n"));
        assert!(!sigkill_pending(""));
    }
}
