//! Reading one thread's context: stop it, find its variable, follow the
//! pointer, read the record, let it go. Also lists the target's threads.

use std::fs;

use crate::memory::Memory;
use crate::ptrace::{StopError, StopTimes, Tracer};
use crate::record::{self, Record};
use crate::tls::{self, Abi, Location, Plan};

/// What was found behind one thread's `otel_thread_ctx_v1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pointer is set and the record header (and attrs, if asked and
    /// valid) was read. Whether it is valid is in `record.header`.
    Record(Record),
    /// No record: the pointer is NULL, or the thread has no TLS block yet.
    NoRecord(String),
    /// Something was unreadable or malformed.
    Error(String),
    /// The thread exited before it could be read.
    Gone,
}

/// One read of one thread.
#[derive(Clone, Debug)]
pub struct ThreadRead {
    /// CLOCK_MONOTONIC nanoseconds at which the thread was held stopped.
    pub t_ns: u64,
    pub thread_pointer: Option<u64>,
    /// Address of this thread's variable, when it has one.
    pub variable: Option<u64>,
    /// The variable's value (the record pointer).
    pub pointer: Option<u64>,
    pub outcome: Outcome,
    pub times: Option<StopTimes>,
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads `tid`'s context while it is stopped. Returns `Err` only for a
/// permission failure, which makes every further attempt pointless.
pub fn read(
    tracer: &mut Tracer,
    tid: i32,
    plan: &Plan,
    mem: &dyn Memory,
    abi: &Abi,
    with_attrs: bool,
) -> Result<ThreadRead, String> {
    let mut out = ThreadRead {
        t_ns: 0,
        thread_pointer: None,
        variable: None,
        pointer: None,
        outcome: Outcome::Gone,
        times: None,
    };
    let stopped = match tracer.stop(tid) {
        Ok(s) => s,
        Err(StopError::Gone) => return Ok(out),
        Err(StopError::Permission(e)) => return Err(e),
        Err(e) => {
            out.outcome = Outcome::Error(format!("cannot stop the thread: {e}"));
            return Ok(out);
        }
    };
    out.t_ns = monotonic_ns();
    // Everything below runs while the thread is stopped; the guard detaches
    // it on every return path.
    out.outcome = (|| {
        let tp = stopped.thread_pointer()?;
        out.thread_pointer = Some(tp);
        let var = match tls::locate(plan, tp, mem, abi)? {
            Location::At(a) => a,
            Location::Unallocated(why) => return Ok(Outcome::NoRecord(why)),
        };
        out.variable = Some(var);
        let ptr = mem
            .read_u64(var)
            .map_err(|e| format!("otel_thread_ctx_v1: {e}"))?;
        out.pointer = Some(ptr);
        if ptr == 0 {
            return Ok(Outcome::NoRecord("otel_thread_ctx_v1 is NULL".into()));
        }
        record::read(mem, ptr, with_attrs).map(Outcome::Record)
    })()
    .unwrap_or_else(Outcome::Error);
    out.times = Some(stopped.release());
    Ok(out)
}

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

/// The thread's name (`/proc/<pid>/task/<tid>/comm`).
pub fn name(pid: i32, tid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}
