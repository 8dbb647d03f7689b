//! Termination requests (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) and the alarm that
//! bounds waits for a ptrace stop.
//!
//! The handlers only record the signal: whatever thread of the target is
//! stopped at that moment is still read to the end and detached by its guard,
//! and the command loops then stop at the next thread boundary.

use std::sync::atomic::{AtomicI32, Ordering};

static REQUESTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_terminate(sig: libc::c_int) {
    REQUESTED.store(sig, Ordering::SeqCst);
}

extern "C" fn on_alarm(_: libc::c_int) {
    // Nothing to do: the point is that a blocking waitpid returns EINTR.
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

/// The termination signal received so far, if any.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
