//! otel-thread-ctx: publishes the active OpenTelemetry span of every JS thread
//! as an OTEP 4947 Thread-Local Context Record, discoverable by out-of-process
//! profilers through the `otel_thread_ctx_v1` TLS symbol.
//!
//! This file holds the napi surface only; each concept has its own module.

mod abi_layout;
mod anonymous_memory;
mod args;
mod idle;
mod record;
mod registry;
mod tls;
mod view;

use napi::bindgen_prelude::{BigInt, Env, Error, Object, Result, Status, Uint8Array, Unknown};
use napi_derive::napi;

use otel_thread_ctx_abi::record::{HEADER_SIZE, RECORD_SIZE};
use registry::Slot;

/// Registers the loading thread (main thread or worker) once, when the addon
/// is loaded into its environment, and detaches it when that environment is
/// torn down.
#[napi(module_exports)]
pub fn init(_exports: Object, env: Env) -> Result<()> {
    let (_, registered_now) = registry::register_current_thread().map_err(|e| {
        Error::new(
            Status::GenericFailure,
            format!("cannot map thread context records: {e}"),
        )
    })?;
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

/// The wire layout (record offsets and sizes, limits, process-context
/// names) from the ABI crate, for the JavaScript writer.
#[napi]
pub fn abi_layout() -> abi_layout::AbiLayout {
    abi_layout::layout()
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
    /// `"static"` or `"dynamic"`: whether glibc placed `otel_thread_ctx_v1`
    /// in static TLS or in dynamic TLS (DTV); `"unknown"` where that cannot
    /// be told.
    #[napi(ts_type = "'static' | 'dynamic' | 'unknown'")]
    pub tls_model: String,
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
        tls_model: tls::model().name().to_owned(),
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
pub fn record_buffer(env: &Env) -> Result<Object<'_>> {
    let slot = current_slot(env)?;
    view::get_or_create(env, slot)
}

/// Writes a record image (header, then attributes) into the calling
/// thread's record: the writer for environments without external
/// `ArrayBuffer`s, where `recordBuffer()` fails.
#[napi]
pub fn write_record(env: Env, image: Uint8Array) -> Result<()> {
    let slot = current_slot(&env)?;
    if image.len() < HEADER_SIZE || image.len() > RECORD_SIZE {
        return args::range_error(
            &env,
            &format!("a record image is {HEADER_SIZE} to {RECORD_SIZE} bytes"),
        );
    }
    // SAFETY: the slot's record is live and owned by this thread.
    unsafe { record::write_image(slot.record, &image) };
    Ok(())
}

/// Marks the calling thread's record invalid (the fallback writer's clear).
#[napi]
pub fn clear_record(env: Env) -> Result<()> {
    let slot = current_slot(&env)?;
    // SAFETY: as above.
    unsafe { record::invalidate(slot.record) };
    Ok(())
}

// ---------------------------------------------------------------------------
// Process context (OTEP 4719): logic in src/process_context/

mod process_context;

/// Publishes (or updates) the process context read by out-of-process
/// profilers: `{ resource?, attributes?, schemaVersion? }`. Each given option
/// replaces the published one; omitted ones stay. Throws `TypeError` /
/// `RangeError` on bad input, leaving the published context unchanged.
#[napi]
pub fn publish_process_context(env: Env, options: Option<Unknown>) -> Result<()> {
    let update = process_context::update_from_js(&env, options.as_ref())?;
    process_context::publish(update).or_else(|e| process_context::throw(&env, e))
}

/// Appends new keys to `threadlocal.attribute_key_map` and returns every
/// key's index (at most 256 keys; indexes never change).
#[napi]
pub fn register_attribute_keys(env: Env, keys: Unknown) -> Result<Vec<u32>> {
    let keys = process_context::keys_from_js(&env, &keys)?;
    process_context::register_keys(&keys).or_else(|e| process_context::throw(&env, e))
}

/// Diagnostics about the published process context.
#[napi(object)]
pub struct ProcessContextInfo {
    /// Address of the `OTEL_CTX` mapping (the 32-byte header is at its start).
    pub mapping_address: BigInt,
    /// Size of the mapping in bytes (one page).
    pub mapping_size: u32,
    /// `"memfd"` (`/memfd:OTEL_CTX`) or `"anonymous"` (`[anon:OTEL_CTX]`).
    pub backing: String,
    /// `monotonic_published_at_ns` of the current publication.
    pub published_at_ns: BigInt,
    /// Address of the current payload.
    pub payload_address: BigInt,
    /// Size of the current payload in bytes.
    pub payload_size: u32,
    /// Number of keys in `threadlocal.attribute_key_map`.
    pub key_count: u32,
    /// Number of attributes of the published Resource (0 before any thread
    /// published one).
    pub resource_attributes: u32,
    /// Publications since the process started.
    pub publications: f64,
    /// Superseded payloads still kept allocated for slow readers.
    pub retained_payloads: u32,
}

/// The published process context, or `null` before the first publication.
#[napi]
pub fn process_context_info() -> Option<ProcessContextInfo> {
    process_context::info().map(|info| ProcessContextInfo {
        mapping_address: BigInt::from(info.mapping_address as u64),
        mapping_size: info.mapping_len as u32,
        backing: match info.backing {
            process_context::Backing::Memfd => "memfd",
            process_context::Backing::Anonymous => "anonymous",
        }
        .to_owned(),
        published_at_ns: BigInt::from(info.published_at_ns),
        payload_address: BigInt::from(info.payload_address as u64),
        payload_size: info.payload_size as u32,
        key_count: info.key_count as u32,
        resource_attributes: info.resource_attribute_count as u32,
        publications: info.publications as f64,
        retained_payloads: info.retained_payloads as u32,
    })
}
