//! Collection: everything `inspect` learns about the process, read once
//! from outside and stopping one thread at a time. No judgement here.

use std::time::Duration;

use crate::process_context::{self, Lookup};
use crate::ptrace::Tracer;
use crate::schema::Schema;
use crate::signals;
use crate::target::Target;
use crate::tasks;
use crate::thread::{self, Outcome, Plans, ThreadRead};
use crate::tls;
use crate::Error;

/// One reading of the process.
pub struct Collected {
    pub pid: i32,
    pub target: Target,
    pub process_context: Lookup,
    pub threads: Threads,
}

/// What was learnt about the threads.
pub enum Threads {
    /// No module defines a schema's symbol (the threads were listed, with
    /// their names), or none can be located per thread (not listed): none
    /// was read.
    Listed(Vec<(i32, String)>),
    /// Every thread was stopped and read.
    Read {
        threads: Vec<ReadThread>,
        /// Whether the whole process had exited by the end; only looked at
        /// when no thread pointer could be read.
        process_exited: bool,
    },
}

/// One thread that was stopped and read.
pub struct ReadThread {
    pub tid: i32,
    pub name: String,
    pub read: ThreadRead,
}

/// Reads the process once; `None` when it executed a new program meanwhile,
/// which makes everything found before stale.
pub fn collect(pid: i32, stop_timeout: Duration) -> Result<Option<Collected>, Error> {
    let target = Target::open(pid)?;
    let process_context = process_context::lookup(&target.maps, &target.memory);
    let plans = Plans {
        record: target.plan(Schema::Record),
        nodejs: target.nodejs_plans(),
        layout: process_context.v8_layout(),
    };
    if plans.record.is_none() && plans.nodejs.is_empty() {
        // No schema's variable can be found in a thread: list them, when
        // no module defines any symbol, so the report still names them.
        let unresolved = target.resolution.is_some() || !target.nodejs.is_empty();
        let threads = if unresolved {
            Vec::new()
        } else {
            tasks::list(pid)
                .into_iter()
                .map(|tid| (tid, tasks::name(pid, tid)))
                .collect()
        };
        return Ok(Some(Collected {
            pid,
            target,
            process_context,
            threads: Threads::Listed(threads),
        }));
    }
    let mut tracer = Tracer::new(pid, stop_timeout);
    let mut threads = Vec::new();
    for tid in tasks::list(pid) {
        if let Some(sig) = signals::requested() {
            return Err(Error::Interrupted(sig));
        }
        let read = thread::read(&mut tracer, tid, &plans, &target.memory, &tls::HOST, true)
            .map_err(Error::Denied)?;
        if matches!(read.outcome, Outcome::AddressSpaceGone) && !tasks::process_exited(pid) {
            return Ok(None);
        }
        threads.push(ReadThread {
            tid,
            name: tasks::name(pid, tid),
            read,
        });
    }
    drop(tracer);
    let any_read = threads.iter().any(|t| t.read.thread_pointer.is_some());
    let process_exited = !any_read && tasks::process_exited(pid);
    Ok(Some(Collected {
        pid,
        target,
        process_context,
        threads: Threads::Read {
            threads,
            process_exited,
        },
    }))
}
