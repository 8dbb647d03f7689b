//! Reading one thread's context: stop it, find its variables (one per
//! schema the process publishes), follow them to a record, let it go.

use otel_thread_ctx_abi::node_schema::V8Layout;

use crate::memory::{Memory, MemoryError};
use crate::ptrace::{RegsError, StopError, StopTimes, Tracer};
use crate::record::{self, Record};
use crate::schema::nodejs::{self, NoSpan, Reason, Trail};
use crate::schema::Schema;
use crate::tasks;
use crate::tls::{self, Abi, Location, Plan, TlsError};

/// How to find each schema's variable in any thread of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plans {
    /// `otel_thread_ctx_v1`, when a module defines it and it resolves.
    pub record: Option<Plan>,
    /// `otel_thread_ctx_nodejs_v1` of every module that defines it and
    /// resolves, in the target's order (see [`Plans::nodejs`] reads).
    pub nodejs: Vec<Plan>,
    /// The V8 layout the Node.js walk uses.
    pub layout: V8Layout,
}

/// Why one thread's context could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot stop the thread: {0}")]
    Stop(#[source] StopError),
    #[error(transparent)]
    ThreadPointer(#[from] RegsError),
    #[error(transparent)]
    Locate(#[from] TlsError),
    #[error("otel_thread_ctx_v1: {0}")]
    Variable(#[source] MemoryError),
    #[error(transparent)]
    Record(#[from] record::ReadError),
}

/// What one schema's read of one thread found.
#[derive(Debug)]
enum SchemaOutcome {
    Record(Record),
    NoRecord(String),
    NoSpan(NoSpan),
}

/// What was found behind one thread's `otel_thread_ctx_v1`.
#[derive(Debug)]
pub enum Outcome {
    /// The pointer is set and the record header (and attrs, if asked and
    /// valid) was read. Whether it is valid is in `record.header`.
    Record(Record),
    /// No record: the pointer is NULL, or the thread has no TLS block yet.
    NoRecord(String),
    /// The Node.js walk found no span, for this reason.
    NoSpan(NoSpan),
    /// Something was unreadable or malformed.
    Error(ReadError),
    /// The thread exited before it could be read.
    Gone,
    /// The address space the plan was made for is gone: the process
    /// executed a new program (or exited). Nothing was learnt about the
    /// thread, and no read with this plan can succeed again.
    AddressSpaceGone,
}

/// One read of one thread.
#[derive(Debug)]
pub struct ThreadRead {
    /// CLOCK_MONOTONIC nanoseconds at which the thread was held stopped.
    pub t_ns: u64,
    pub thread_pointer: Option<u64>,
    /// Address of this thread's variable, when it has one.
    pub variable: Option<u64>,
    /// The variable's value (the record pointer).
    pub pointer: Option<u64>,
    /// The schema the outcome comes from, when a variable was read.
    pub schema: Option<Schema>,
    /// The Node.js schema: this thread's `otel_thread_ctx_nodejs_v1`
    /// address and how far the walk got.
    pub nodejs: Option<(u64, Trail)>,
    pub outcome: Outcome,
    pub times: Option<StopTimes>,
    /// The thread did not reach its stop within the timeout (or is still on
    /// its way to an earlier one): nothing was read, the outcome is an error.
    pub late_stop: bool,
}

impl ThreadRead {
    /// Nothing read yet: the outcome stays `Gone` unless a read replaces it.
    fn unread() -> ThreadRead {
        ThreadRead {
            t_ns: 0,
            thread_pointer: None,
            variable: None,
            pointer: None,
            schema: None,
            nodejs: None,
            outcome: Outcome::Gone,
            times: None,
            late_stop: false,
        }
    }
}

pub use crate::clock::monotonic_ns;

/// Reads `tid`'s context while it is stopped. Returns `Err` only for a
/// permission failure ([`StopError::Permission`]), which makes every further attempt pointless. A
/// thread that exits before or while it is read is `Outcome::Gone`, even
/// when the failure showed up as an error of ptrace or of a memory read.
/// A read that fails because `mem`'s address space is gone (the process
/// executed a new program, or exited) is `Outcome::AddressSpaceGone`.
pub fn read(
    tracer: &mut Tracer,
    tid: i32,
    plans: &Plans,
    mem: &dyn Memory,
    abi: &Abi,
    with_attrs: bool,
) -> Result<ThreadRead, StopError> {
    let mut out = ThreadRead::unread();
    let pid = tracer.pid();
    let stopped = match tracer.stop(tid) {
        Ok(s) => s,
        Err(StopError::Gone) => return Ok(out),
        Err(e @ StopError::Permission) => return Err(e),
        Err(_) if tasks::exited(pid, tid) => return Ok(out),
        Err(e) => {
            out.late_stop = matches!(e, StopError::Timeout(_) | StopError::StillStopping);
            out.outcome = Outcome::Error(ReadError::Stop(e));
            return Ok(out);
        }
    };
    out.t_ns = monotonic_ns();
    // Everything below runs while the thread is stopped; the guard detaches
    // it on every return path.
    out.outcome = (|| -> Result<Outcome, ReadError> {
        let tp = stopped.thread_pointer()?;
        out.thread_pointer = Some(tp);
        let record = plans
            .record
            .map(|plan| read_record_schema(&plan, tp, mem, abi, with_attrs, &mut out));
        let nodejs = read_nodejs_modules(plans, tp, mem, abi, with_attrs, &mut out);
        let (schema, outcome) =
            choose(record, nodejs).ok_or(ReadError::Locate(TlsError::Unreferenced))?;
        out.schema = Some(schema);
        Ok(match outcome? {
            SchemaOutcome::Record(r) => Outcome::Record(r),
            SchemaOutcome::NoRecord(why) => Outcome::NoRecord(why),
            SchemaOutcome::NoSpan(n) => Outcome::NoSpan(n),
        })
    })()
    .unwrap_or_else(Outcome::Error);
    let failed = read_failed(&out.outcome);
    // Nothing but SIGKILL takes a thread out of a stop this reader holds: a
    // thread no longer in it was killed (the process is exiting or was
    // killed), even while /proc still shows it running, as it does until
    // the thread is next scheduled and enters exit.
    let killed = failed && !stopped.still_held();
    out.times = Some(stopped.release());
    // A thread pointer of 0 gives an answer without reading memory, so
    // nothing proved it belongs to the address space the plan was made for
    // (it is what a program just executed starts with).
    let unread = out.thread_pointer == Some(0);
    if (failed || unread) && mem.ended() {
        out.outcome = Outcome::AddressSpaceGone;
        out.times = None;
    } else if killed || (failed && tasks::exited(pid, tid)) {
        // The failed read says nothing about the thread's context.
        out.outcome = Outcome::Gone;
        out.times = None;
    }
    Ok(out)
}

/// Whether the read failed for want of memory or a stop. The Node.js walk
/// reports memory it could not read as a reason for no span, not an error;
/// once the address space is gone it is the same failure, and must end the
/// plan the same way.
fn read_failed(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Error(_)
            | Outcome::NoSpan(NoSpan {
                reason: Reason::Unreadable,
                ..
            })
    )
}

/// The record schema: the variable holds the record's address, or NULL.
fn read_record_schema(
    plan: &Plan,
    tp: u64,
    mem: &dyn Memory,
    abi: &Abi,
    with_attrs: bool,
    out: &mut ThreadRead,
) -> Result<SchemaOutcome, ReadError> {
    let var = match tls::locate(plan, tp, mem, abi)? {
        Location::At(a) => a,
        Location::Unallocated(why) => return Ok(SchemaOutcome::NoRecord(why)),
    };
    out.variable = Some(var);
    let ptr = mem.read_u64(var).map_err(ReadError::Variable)?;
    out.pointer = Some(ptr);
    if ptr == 0 {
        return Ok(SchemaOutcome::NoRecord("otel_thread_ctx_v1 is NULL".into()));
    }
    Ok(SchemaOutcome::Record(record::read(mem, ptr, with_attrs)?))
}

/// The Node.js schema: the walk from the thread's block to a record.
fn read_nodejs_schema(
    plan: &Plan,
    tp: u64,
    mem: &dyn Memory,
    abi: &Abi,
    layout: &V8Layout,
    with_attrs: bool,
    out: &mut ThreadRead,
) -> Result<SchemaOutcome, ReadError> {
    let var = match tls::locate(plan, tp, mem, abi)? {
        Location::At(a) => a,
        Location::Unallocated(why) => {
            return Ok(SchemaOutcome::NoSpan(NoSpan {
                reason: Reason::NotPublished,
                detail: why,
            }))
        }
    };
    let mut trail = Trail::default();
    let result = nodejs::read(mem, var, layout, with_attrs, &mut trail);
    out.nodejs = Some((var, trail));
    Ok(match result {
        Ok(r) => SchemaOutcome::Record(r),
        Err(n) => SchemaOutcome::NoSpan(n),
    })
}

/// The Node.js schema through every module that defines its variable:
/// the first answer that names a span, else the first whose block is
/// published, else the first. An addon that is loaded but does not publish
/// (its block's `cped_slot` is 0) must not hide one that does.
fn read_nodejs_modules(
    plans: &Plans,
    tp: u64,
    mem: &dyn Memory,
    abi: &Abi,
    with_attrs: bool,
    out: &mut ThreadRead,
) -> Option<Result<SchemaOutcome, ReadError>> {
    let mut chosen: Option<(SchemaRead, Option<(u64, Trail)>)> = None;
    for plan in &plans.nodejs {
        out.nodejs = None;
        let outcome = read_nodejs_schema(plan, tp, mem, abi, &plans.layout, with_attrs, out);
        let trail = out.nodejs.take();
        if names_a_span(&Some(&outcome)) {
            chosen = Some((outcome, trail));
            break;
        }
        let better = match &chosen {
            None => true,
            Some((previous, _)) => !is_published(&Some(previous)) && is_published(&Some(&outcome)),
        };
        if better {
            chosen = Some((outcome, trail));
        }
    }
    let (outcome, trail) = chosen?;
    out.nodejs = trail;
    Some(outcome)
}

/// One schema's answer for one thread.
type SchemaRead = Result<SchemaOutcome, ReadError>;

fn names_a_span(o: &Option<&SchemaRead>) -> bool {
    matches!(o, Some(Ok(SchemaOutcome::Record(r))) if r.header.names_a_span())
}

/// Whether a Node.js answer comes from a published block (anything but
/// "not published").
fn is_published(o: &Option<&SchemaRead>) -> bool {
    !matches!(
        o,
        None | Some(Ok(SchemaOutcome::NoSpan(NoSpan {
            reason: Reason::NotPublished,
            ..
        })))
    )
}

/// Which schema's answer a thread gets when the process publishes both: a
/// span from either (the record's first), else the Node.js walk's reason
/// when its block is published, else the record schema's answer.
fn choose(
    record: Option<Result<SchemaOutcome, ReadError>>,
    nodejs: Option<Result<SchemaOutcome, ReadError>>,
) -> Option<(Schema, Result<SchemaOutcome, ReadError>)> {
    if names_a_span(&record.as_ref()) {
        return record.map(|o| (Schema::Record, o));
    }
    if names_a_span(&nodejs.as_ref()) || is_published(&nodejs.as_ref()) || record.is_none() {
        return nodejs.map(|o| (Schema::Nodejs, o));
    }
    record.map(|o| (Schema::Record, o))
}

#[cfg(test)]
mod tests {

    mod several_nodejs_modules {
        use super::super::*;
        use crate::memory::fake::FakeMemory;
        use crate::schema::nodejs::tests::{Heap, BLOCK};
        use otel_thread_ctx_abi::node_schema::{DEFAULT_LAYOUT, SIZE};

        const TP: u64 = 0x10_0000;
        /// A module whose block is all zeros: loaded, never published.
        const IDLE_BLOCK: u64 = 0x8000;

        fn plan(block: u64) -> Plan {
            Plan::Static {
                tp_offset: block as i64 - TP as i64,
            }
        }

        fn read_with(blocks: &[u64]) -> (Option<Result<SchemaOutcome, ReadError>>, ThreadRead) {
            let mem = FakeMemory::default();
            Heap::good().install(&mem);
            mem.put(IDLE_BLOCK, &[0; SIZE]);
            let plans = Plans {
                record: None,
                nodejs: blocks.iter().map(|&b| plan(b)).collect(),
                layout: DEFAULT_LAYOUT,
            };
            let mut out = ThreadRead::unread();
            let outcome = read_nodejs_modules(&plans, TP, &mem, &tls::HOST, true, &mut out);
            (outcome, out)
        }

        fn span_of(o: Option<Result<SchemaOutcome, ReadError>>) -> Option<String> {
            match o {
                Some(Ok(SchemaOutcome::Record(r))) if r.header.names_a_span() => {
                    Some(r.header.span_id.to_string())
                }
                _ => None,
            }
        }

        #[test]
        fn a_module_that_publishes_wins_over_an_idle_one_before_it() {
            let (outcome, out) = read_with(&[IDLE_BLOCK, BLOCK]);
            assert_eq!(span_of(outcome).as_deref(), Some("1112131415161718"));
            // The trail is the publishing module's.
            assert_eq!(out.nodejs.map(|(var, _)| var), Some(BLOCK));
        }

        #[test]
        fn the_order_of_the_modules_does_not_matter() {
            let (outcome, _) = read_with(&[BLOCK, IDLE_BLOCK]);
            assert_eq!(span_of(outcome).as_deref(), Some("1112131415161718"));
        }

        #[test]
        fn only_idle_modules_read_as_not_published() {
            let (outcome, out) = read_with(&[IDLE_BLOCK, IDLE_BLOCK]);
            assert!(matches!(
                outcome,
                Some(Ok(SchemaOutcome::NoSpan(NoSpan {
                    reason: Reason::NotPublished,
                    ..
                })))
            ));
            assert_eq!(out.nodejs.map(|(var, _)| var), Some(IDLE_BLOCK));
        }

        #[test]
        fn no_module_no_answer() {
            assert!(read_with(&[]).0.is_none());
        }
    }

    #[test]
    fn an_unreadable_walk_is_a_failed_read_other_reasons_are_answers() {
        use super::{read_failed, NoSpan, Outcome, Reason};
        let no_span = |reason| {
            Outcome::NoSpan(NoSpan {
                reason,
                detail: String::new(),
            })
        };
        assert!(read_failed(&no_span(Reason::Unreadable)));
        assert!(!read_failed(&no_span(Reason::NotPublished)));
        assert!(!read_failed(&Outcome::NoRecord(
            "otel_thread_ctx_v1 is NULL".into()
        )));
    }
}
