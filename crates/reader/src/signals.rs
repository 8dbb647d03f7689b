//! Termination requests (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) and the alarm that
//! bounds waits for a ptrace stop.
//!
//! The handlers only record the signal: whatever thread of the target is
//! stopped at that moment is still read to the end and detached by its guard,
//! and the command loops then stop at the next thread boundary.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

static REQUESTED: AtomicI32 = AtomicI32::new(0);

/// CLOCK_MONOTONIC (ns) when the first termination signal arrived; 0 before.
static REQUESTED_AT_NS: AtomicU64 = AtomicU64::new(0);

/// Whether the alarm reaps exited tracees (only while a seize waits).
static REAP_EXITED: AtomicBool = AtomicBool::new(false);

/// Makes the alarm's handler reap exited tracees, or stop doing so.
pub fn reap_exited_tracees(on: bool) {
    REAP_EXITED.store(on, Ordering::SeqCst);
}

extern "C" fn on_terminate(sig: libc::c_int) {
    // clock_gettime is async-signal-safe; a 0 reading (never, in practice)
    // would only read as "no time recorded".
    let now = crate::clock::monotonic_ns();
    let _ = REQUESTED_AT_NS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    REQUESTED.store(sig, Ordering::SeqCst);
}

extern "C" fn on_alarm(_: libc::c_int) {
    // The point is that a blocking waitpid returns EINTR. Besides, while a
    // seize waits, tracees that exited are reaped here: a thread
    // killed by another thread's execve while we trace it stays a zombie
    // until we reap it, and execve waits for that while holding the lock
    // that PTRACE_SEIZE of the executing thread waits for (the kernel
    // restarts that seize after each alarm instead of failing it). Reaping
    // from here lets execve finish, then the seize. Only exits are reaped
    // (WEXITED): stops stay for the waits that expect them, which see a
    // reaped thread as gone (ECHILD).
    if !REAP_EXITED.load(Ordering::SeqCst) {
        return;
    }
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-buffer; waitid is
        // async-signal-safe.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `info` outlives the call.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::__WALL,
            )
        };
        // SAFETY: waitid filled `info` (or left it zeroed: pid 0, nothing reaped).
        if r != 0 || unsafe { info.si_pid() } == 0 {
            break;
        }
    }
}

fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: a zeroed sigaction is valid; the handlers are async-signal-safe
    // (one atomic store or nothing). No SA_RESTART, so blocking system calls
    // return EINTR and the caller re-checks its deadline.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Installs the handlers; call once at start-up, before touching the target.
pub fn install_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        install(sig, on_terminate);
    }
    install(libc::SIGALRM, on_alarm);
}

/// When the first termination signal arrived (CLOCK_MONOTONIC, ns), if one
/// did: a shutdown bounded from the signal itself, not from when a loop
/// noticed it.
pub fn requested_at_monotonic_ns() -> Option<u64> {
    match REQUESTED_AT_NS.load(Ordering::SeqCst) {
        0 => None,
        at => Some(at),
    }
}

/// The termination signal received so far, if any.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
