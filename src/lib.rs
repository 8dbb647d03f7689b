//! otel-thread-ctx: publishes the active OpenTelemetry span of every JS thread
//! as an OTEP 4947 Thread-Local Context Record, discoverable by out-of-process
//! profilers through the `otel_thread_ctx_v1` TLS symbol.
//!
//! This file holds the napi surface only; each concept has its own module.

mod args;
mod idle;
mod record;
mod registry;
mod tls;
mod view;

use napi::bindgen_prelude::{BigInt, Env, Error, Object, Result, Status, Unknown};
use napi::sys;
use napi_derive::napi;

use record::{SpanIds, RECORD_SIZE};
use registry::Slot;

/// Registers the loading thread (main thread or worker) once, when the addon
/// is loaded into its environment, and detaches it when that environment is
/// torn down.
#[napi(module_exports)]
pub fn init(_exports: Object, env: Env) -> Result<()> {
    let (_, registered_now) = registry::register_current_thread()
        .map_err(|e| Error::new(Status::GenericFailure, format!("cannot map thread context records: {e}")))?;
    if registered_now {
        env.add_env_cleanup_hook((), |()| {
            idle::stop();
            registry::detach_current_thread();
            view::forget();
        })?;
    }
    Ok(())
}

fn current_slot(env: &Env) -> Result<Slot> {
    match registry::current_slot() {
        Some(slot) => Ok(slot),
        None => {
            env.throw_error("otel-thread-ctx is not loaded on this thread", None)?;
            Err(Error::from_status(Status::PendingException))
        }
    }
}

/// Publishes a span in the calling thread's record. `traceIdHigh` is the
/// first 8 bytes of the W3C trace id as a big-endian number. Invalid input
/// throws before the record is touched.
#[napi]
pub fn set_span_context(
    env: Env,
    trace_id_high: Unknown,
    trace_id_low: Unknown,
    span_id: Unknown,
    trace_flags: Option<Unknown>,
) -> Result<()> {
    let high = args::u64_from_bigint(&env, &trace_id_high, "traceIdHigh")?;
    let low = args::u64_from_bigint(&env, &trace_id_low, "traceIdLow")?;
    let span = args::u64_from_bigint(&env, &span_id, "spanId")?;
    let flags = args::optional_u8(&env, trace_flags.as_ref(), "traceFlags", 0)?;
    if high == 0 && low == 0 {
        return args::range_error(&env, "The trace id must not be all zeroes (W3C invalid)");
    }
    if span == 0 {
        return args::range_error(&env, "The span id must not be all zeroes (W3C invalid)");
    }
    let slot = current_slot(&env)?;
    // SAFETY: the slot belongs to this thread while it is registered.
    unsafe { record::publish(slot.record, &SpanIds::from_words(high, low, span, flags)) };
    Ok(())
}

/// Marks the calling thread's record as carrying no span.
#[napi]
pub fn clear_span_context(env: Env) -> Result<()> {
    let slot = current_slot(&env)?;
    // SAFETY: the slot belongs to this thread while it is registered.
    unsafe { record::invalidate(slot.record) };
    Ok(())
}

/// Diagnostics about the calling thread's registration.
#[napi(object)]
pub struct ThreadInfo {
    /// Kernel thread id.
    pub tid: i32,
    /// Address of this thread's record (what `otel_thread_ctx_v1` points at).
    pub record_address: BigInt,
    /// Address of this thread's `otel_thread_ctx_v1` variable.
    pub tls_address: BigInt,
    /// Value of this thread's `otel_thread_ctx_v1` now.
    pub tls_value: BigInt,
    /// Slot index in the process-wide registry.
    pub slot: u32,
    /// Size of the record in bytes.
    pub record_size: u32,
    /// Whether the record is cleared while the event loop is idle.
    pub clears_on_idle: bool,
}

#[napi]
pub fn thread_info(env: Env) -> Result<ThreadInfo> {
    let slot = current_slot(&env)?;
    Ok(ThreadInfo {
        tid: slot.tid,
        record_address: BigInt::from(slot.record as u64),
        tls_address: BigInt::from(tls::variable_address() as u64),
        tls_value: BigInt::from(tls::current() as u64),
        slot: slot.index as u32,
        record_size: RECORD_SIZE as u32,
        clears_on_idle: idle::is_active(),
    })
}

/// Registry counters, for diagnostics and leak tests.
#[napi(object)]
pub struct RegistryStats {
    pub capacity: u32,
    pub attached: u32,
    pub awaiting_view_release: u32,
    pub free: u32,
}

#[napi]
pub fn registry_stats() -> RegistryStats {
    let s = registry::stats();
    RegistryStats {
        capacity: s.capacity as u32,
        attached: s.attached as u32,
        awaiting_view_release: s.awaiting_view_release as u32,
        free: s.free as u32,
    }
}

/// Turns clearing the record while the event loop is idle on or off for the
/// calling thread (`ProfilingContextManager` turns it on when enabled).
#[napi]
pub fn set_clear_on_idle(env: Env, enabled: bool) -> Result<bool> {
    let slot = current_slot(&env)?;
    if !enabled {
        idle::stop();
        return Ok(false);
    }
    let event_loop = env.get_uv_event_loop()?;
    // SAFETY: the loop is this thread's own; the handle is closed by
    // `idle::stop` (at the latest in the env cleanup hook) before the slot's
    // thread hold is released.
    Ok(unsafe { idle::start(event_loop.cast(), slot.record) })
}

/// The calling thread's record as an `ArrayBuffer`, for the allocation-free
/// JavaScript writer. The same buffer is returned on every call.
#[napi]
pub fn record_buffer(env: Env) -> Result<sys::napi_value> {
    let slot = current_slot(&env)?;
    view::get_or_create(&env, slot)
}
