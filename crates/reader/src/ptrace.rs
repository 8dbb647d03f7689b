//! Stopping one thread of another process, reading its thread pointer, and
//! letting it go: `PTRACE_SEIZE` + `PTRACE_INTERRUPT`, wait for the stop,
//! then `PTRACE_DETACH`.
//!
//! Guarantees: a thread this module stopped is detached when its [`Stopped`]
//! guard is dropped, on every path (errors, panics unwinding, termination
//! signals, which only set a flag). A thread that does not reach its stop
//! within the timeout (e.g. in uninterruptible sleep) is remembered and
//! detached as soon as it stops; whatever is still attached when the reader
//! exits is detached by the kernel. A thread killed while held (the process
//! exiting) is reaped, so the target's own parent can reap the process.
//!
//! A thread that is exiting makes ptrace fail with `ESRCH` or `EPERM`; such
//! failures are [`StopError::Gone`], not a permission error, whenever
//! `/proc` shows the thread missing, a zombie, dead, exiting or killed.
//! Only `SIGKILL` takes a thread out of a stop this module holds, so a held
//! thread that leaves it was killed: it is gone from then on, however
//! `/proc` still shows it.

use std::time::{Duration, Instant};

use crate::tasks;

/// Why a thread could not be stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// The thread exited.
    #[error("thread exited")]
    Gone,
    /// The reader lacks the privilege to trace the target (`EPERM` from
    /// `PTRACE_SEIZE` of a thread that is alive and traced by no one).
    #[error("permission denied by ptrace (run as root, or as the target's user with kernel.yama.ptrace_scope=0, or grant CAP_SYS_PTRACE)")]
    Permission,
    /// Another tracer (debugger, strace) holds the thread.
    #[error("thread is already traced by pid {0}")]
    Busy(i32),
    /// The thread did not stop in time; it will be released later.
    #[error("thread did not stop within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The thread still has not reached the stop of an earlier timeout.
    #[error("thread still has not reached an earlier stop")]
    StillStopping,
    /// `PTRACE_SEIZE` failed with this errno.
    #[error("PTRACE_SEIZE: {}", std::io::Error::from_raw_os_error(*.0))]
    Seize(i32),
    /// `PTRACE_INTERRUPT` failed with this errno.
    #[error("PTRACE_INTERRUPT: errno {0}")]
    Interrupt(i32),
}

/// A stopped thread's registers could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{request}: {source}")]
pub struct RegsError {
    pub request: &'static str,
    pub source: std::io::Error,
}

/// How often a refused `PTRACE_SEIZE` of a thread that looks alive is tried
/// again, a millisecond apart, before it counts as a permission failure.
const PERMISSION_RETRIES: u32 = 20;

/// Owns the ptrace relationship with the target's threads. All calls must
/// come from the thread that created it (ptrace binds a tracee to one tracer
/// thread); the reader is single-threaded.
pub struct Tracer {
    /// The process whose threads are stopped.
    pid: i32,
    timeout: Duration,
    /// Threads seized and interrupted whose stop we have not seen yet, and
    /// threads killed while held that are still ours to reap.
    pending: Vec<(i32, Pending)>,
}

/// Why a thread is still ours although no guard holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// Interrupted, but its stop has not been seen yet.
    Stopping,
    /// Killed while held: it will exit without stopping again.
    Killed,
}

/// Durations of one stop.
#[derive(Debug, Clone, Copy, Default)]
pub struct StopTimes {
    /// From `PTRACE_INTERRUPT` to observing the stop.
    pub to_stop: Duration,
    /// From observing the stop to the end of `PTRACE_DETACH`: how long the
    /// thread was certainly held.
    pub held: Duration,
}

/// A thread in a ptrace-stop. Dropping it detaches the thread.
pub struct Stopped<'t> {
    tid: i32,
    /// Signal that arrived while we held the thread; re-delivered on detach.
    deliver: i32,
    interrupted_at: Instant,
    stopped_at: Instant,
    released: bool,
    tracer: &'t mut Tracer,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ptrace(request: libc::c_uint, tid: i32, addr: usize, data: usize) -> libc::c_long {
    // SAFETY: the requests used here take integer arguments or pointers to
    // buffers owned by the caller for the duration of the call.
    unsafe { libc::ptrace(request, tid, addr, data) }
}

/// A periodic SIGALRM while it lives: blocking calls return EINTR (or, for
/// PTRACE_SEIZE, are restarted by the kernel) every few milliseconds, so a
/// deadline is checked even if one alarm fires before the call blocks, and
/// with `reap`, the alarm's handler reaps exited tracees (signals.rs says
/// why).
struct AlarmTicks;

/// Sets ITIMER_REAL to fire every `usec` microseconds (0: disarmed).
fn set_alarm_interval(usec: libc::suseconds_t) {
    let slice = libc::timeval {
        tv_sec: 0,
        tv_usec: usec,
    };
    let timer = libc::itimerval {
        it_interval: slice,
        it_value: slice,
    };
    // SAFETY: plain system call with a valid itimerval.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) };
}

impl AlarmTicks {
    fn start(reap: bool) -> AlarmTicks {
        crate::signals::reap_exited_tracees(reap);
        set_alarm_interval(2000);
        AlarmTicks
    }
}

impl Drop for AlarmTicks {
    fn drop(&mut self) {
        set_alarm_interval(0);
        crate::signals::reap_exited_tracees(false);
    }
}

/// Blocking `waitpid` for `tid` that returns `None` once `deadline` passes.
fn wait_stop(tid: i32, deadline: Instant, blocking: bool) -> Option<i32> {
    let _ticks = blocking.then(|| AlarmTicks::start(false));
    let mut status = 0;
    loop {
        let flags = libc::__WALL | if blocking { 0 } else { libc::WNOHANG };
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, flags) };
        if r == tid {
            return Some(status);
        }
        if r == 0 || (r < 0 && errno() != libc::EINTR) {
            // WNOHANG and nothing yet, or a real error (ECHILD: not ours,
            // or reaped by the alarm's handler once it exited).
            return if r < 0 { Some(-1) } else { None };
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}

/// What a wait status means for us.
enum Waited {
    /// In a ptrace-stop; the signal to re-deliver on detach (0 if none).
    Stopped(i32),
    Gone,
}

fn classify(status: i32) -> Waited {
    if status == -1 || libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Waited::Gone;
    }
    let event = (status >> 16) & 0xff;
    if event == libc::PTRACE_EVENT_STOP {
        // Our interrupt, or a group-stop: nothing to re-deliver (the kernel
        // keeps a group-stop in force after detach).
        Waited::Stopped(0)
    } else {
        // A signal-delivery-stop: the thread got a signal while seized.
        Waited::Stopped(libc::WSTOPSIG(status))
    }
}

/// `TracerPid` of a thread, from `/proc/<pid>/task/<tid>/status`.
fn tracer_pid(pid: i32, tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))?
        .trim()
        .parse()
        .ok()
}

impl Tracer {
    /// A tracer for the threads of process `pid` that waits at most
    /// `timeout` for each thread to stop.
    pub fn new(pid: i32, timeout: Duration) -> Tracer {
        Tracer {
            pid,
            timeout,
            pending: Vec::new(),
        }
    }

    /// The process whose threads this tracer stops.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Why `PTRACE_SEIZE` of `tid` failed with `EPERM`. An exiting thread
    /// (or one of a process that is exiting) cannot be seized either; only a
    /// thread that is still alive afterwards proves a permission failure.
    fn seize_denied(&self, tid: i32) -> StopError {
        if tasks::exited(self.pid, tid) {
            // Includes a main thread that called pthread_exit: a zombie
            // cannot be traced and has no context left to read.
            return StopError::Gone;
        }
        match tracer_pid(self.pid, tid) {
            None => StopError::Gone,
            Some(t) if t != 0 => StopError::Busy(t),
            Some(_) => StopError::Permission,
        }
    }

    /// Stops `tid`. The returned guard detaches it when dropped.
    pub fn stop(&mut self, tid: i32) -> Result<Stopped<'_>, StopError> {
        self.settle_pending();
        match self.pending.iter().find(|p| p.0 == tid).map(|p| p.1) {
            // Not reaped yet because it has not been scheduled since the
            // kill, or because it is the main thread, whose exit is
            // reported only after the other threads'.
            Some(Pending::Killed) => return Err(StopError::Gone),
            Some(Pending::Stopping) if tasks::exited(self.pid, tid) => return Err(StopError::Gone),
            Some(Pending::Stopping) => return Err(StopError::StillStopping),
            None => {}
        }
        let mut denials = 0;
        // The seize of a thread that is executing a program waits for the
        // threads execve killed to be reaped; the ticks reap them.
        let ticks = AlarmTicks::start(true);
        while ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            let error = match errno() {
                libc::ESRCH => StopError::Gone,
                libc::EPERM => self.seize_denied(tid),
                e => StopError::Seize(e),
            };
            // While another thread executes a program, the main thread's id
            // names the exiting main thread (which refuses to be traced),
            // then the executing thread (which is alive): a refusal that
            // does not last is that, not a lack of privilege.
            if matches!(error, StopError::Permission) && denials < PERMISSION_RETRIES {
                denials += 1;
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            return Err(error);
        }
        drop(ticks);
        let interrupted_at = Instant::now();
        if ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) != 0 {
            let e = errno();
            if e == libc::ESRCH {
                // Seized but not interruptible: it exited.
                return Err(StopError::Gone);
            }
            // Still seized: keep it on the list so it is released if it
            // ever stops (and by the kernel when we exit otherwise).
            self.pending.push((tid, Pending::Stopping));
            return Err(StopError::Interrupt(e));
        }
        let deadline = interrupted_at + self.timeout;
        match wait_stop(tid, deadline, true).map(classify) {
            Some(Waited::Stopped(deliver)) => Ok(Stopped {
                tid,
                deliver,
                interrupted_at,
                stopped_at: Instant::now(),
                released: false,
                tracer: self,
            }),
            Some(Waited::Gone) => Err(StopError::Gone),
            None => {
                self.pending.push((tid, Pending::Stopping));
                Err(StopError::Timeout(self.timeout))
            }
        }
    }

    /// Detaches threads that reached their stop after a timeout.
    pub fn settle_pending(&mut self) {
        self.pending.retain(|&(tid, _)| {
            match wait_stop(tid, Instant::now(), false).map(classify) {
                Some(Waited::Stopped(deliver)) => {
                    ptrace(libc::PTRACE_DETACH, tid, 0, deliver as usize);
                    false
                }
                Some(Waited::Gone) => false,
                None => true,
            }
        });
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let until = Instant::now() + Duration::from_secs(1);
        while !self.pending.is_empty() && Instant::now() < until {
            self.settle_pending();
            std::thread::sleep(Duration::from_millis(1));
        }
        // Anything still pending is detached by the kernel when we exit.
    }
}

impl Stopped<'_> {
    /// The thread pointer (`fs_base` on x86-64).
    #[cfg(target_arch = "x86_64")]
    pub fn thread_pointer(&self) -> Result<u64, RegsError> {
        // SAFETY: user_regs_struct is plain data; zeroed is a valid value.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        if ptrace(
            libc::PTRACE_GETREGS,
            self.tid,
            0,
            &mut regs as *mut _ as usize,
        ) != 0
        {
            return Err(RegsError {
                request: "PTRACE_GETREGS",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(regs.fs_base)
    }

    /// The thread pointer (`tpidr_el0` on arm64, regset `NT_ARM_TLS`).
    #[cfg(target_arch = "aarch64")]
    pub fn thread_pointer(&self) -> Result<u64, RegsError> {
        const NT_ARM_TLS: usize = 0x401;
        let mut tpidr = 0u64;
        let mut iov = libc::iovec {
            iov_base: (&mut tpidr as *mut u64).cast(),
            iov_len: 8,
        };
        if ptrace(
            libc::PTRACE_GETREGSET,
            self.tid,
            NT_ARM_TLS,
            &mut iov as *mut _ as usize,
        ) != 0
        {
            return Err(RegsError {
                request: "PTRACE_GETREGSET(NT_ARM_TLS)",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(tpidr)
    }

    /// Whether the thread is still in the stop this guard holds. It leaves
    /// it only when killed (`SIGKILL` wakes a stopped tracee), so `false`
    /// means the thread is exiting even if `/proc` does not show it yet.
    pub fn still_held(&self) -> bool {
        let mut message: libc::c_ulong = 0;
        // Any request that needs the tracee stopped would do; this one has
        // no effect and exists on every architecture.
        ptrace(
            libc::PTRACE_GETEVENTMSG,
            self.tid,
            0,
            &mut message as *mut libc::c_ulong as usize,
        ) == 0
            || errno() != libc::ESRCH
    }

    /// Detaches now and reports how long the stop lasted.
    pub fn release(mut self) -> StopTimes {
        self.detach();
        let done = Instant::now();
        StopTimes {
            to_stop: self.stopped_at - self.interrupted_at,
            held: done - self.stopped_at,
        }
    }

    fn detach(&mut self) {
        if !self.released {
            self.released = true;
            if ptrace(libc::PTRACE_DETACH, self.tid, 0, self.deliver as usize) != 0
                && errno() == libc::ESRCH
            {
                // Killed meanwhile (e.g. the process is exiting): there is
                // nothing left to release, but the dead thread is still our
                // tracee and must be reaped before the process can be.
                self.tracer.pending.push((self.tid, Pending::Killed));
            }
        }
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.detach();
    }
}
