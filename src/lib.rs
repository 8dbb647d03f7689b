//! otel-thread-ctx: publishes the active OpenTelemetry span of every JS thread
//! as an OTEP 4947 Thread-Local Context Record, discoverable by out-of-process
//! profilers through the `otel_thread_ctx_v1` TLS symbol.
//!
//! This file holds the napi surface only; each concept has its own module.

mod abi_layout;
mod anonymous_memory;
mod args;
mod frame;
mod idle;
mod record;
mod registry;
mod span_slab;
mod tls;
mod trace_roots;
mod view;

use napi::bindgen_prelude::{BigInt, Env, Error, Object, Result, Status, Uint8Array, Unknown};
use napi::JsValue;
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
            stop_frame_publication();
            idle::stop();
            if let Some(slot) = registry::current_slot() {
                trace_roots::forget_thread(slot.index);
            }
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
    /// Address of this thread's own record (what `otel_thread_ctx_v1`
    /// points at with no span; record mode points it at span records).
    pub record_address: BigInt,
    /// Address of this thread's `otel_thread_ctx_v1` variable.
    pub tls_address: BigInt,
    /// Value of this thread's `otel_thread_ctx_v1` now: the record a reader
    /// reads.
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

/// The calling thread's `otel_thread_ctx_v1` as an 8-byte `ArrayBuffer`:
/// record mode points it at the active span's record with one store.
#[napi]
pub fn record_pointer_buffer(env: &Env) -> Result<Object<'_>> {
    current_slot(env)?;
    view::pointer_buffer(env)
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

// ---------------------------------------------------------------------------
// Frame mode (the Node.js schema nodejs_v1_dev): logic in src/frame/

/// Stops the calling thread's frame publication (gate first) and updates
/// the process context's schema when it was the last frame-mode thread.
fn stop_frame_publication() {
    if let Some(layout) = frame::thread::unpublish() {
        // The context keeps announcing the layout if this fails; the gate
        // is closed, so a reader finds no span on this thread either way.
        let _ = process_context::frame_thread(false, layout);
    }
}

fn frame_error<T>(message: String) -> Result<T> {
    Err(Error::new(Status::GenericFailure, message))
}

/// A zeroed slab of `size` bytes for span records (both modes), as an
/// external `ArrayBuffer`, unmapped when V8 finalizes the buffer.
#[napi]
pub fn span_record_slab(env: &Env, size: u32) -> Result<Object<'_>> {
    if !span_slab::size_is_valid(size as usize) {
        return args::range_error(
            env,
            &format!(
                "a span record slab is {HEADER_SIZE} to {} bytes",
                span_slab::MAX_SLAB_BYTES
            ),
        );
    }
    // SAFETY: `env` is this callback's env and the size was checked.
    match unsafe { span_slab::create(env.raw(), size as usize) } {
        Ok(value) => Ok(Object::from_raw(env.raw(), value)),
        Err(status) => Err(Error::new(
            Status::from(status),
            "cannot allocate a span record slab".to_owned(),
        )),
    }
}

/// Span record slabs allocated and not yet finalized, process-wide.
#[napi]
pub fn span_record_slabs() -> u32 {
    span_slab::live() as u32
}

/// The address of an `ArrayBuffer`'s memory (a slab's, or the thread's
/// record), as a number: user-space addresses are below 2^47, so exact.
#[napi]
pub fn buffer_address(env: &Env, buffer: Object) -> Result<f64> {
    // SAFETY: `buffer` is a live handle of this callback.
    match unsafe { span_slab::address(env.raw(), buffer.raw()) } {
        Some(address) => Ok(address as f64),
        None => args::type_error(env, "The \"buffer\" argument must be an ArrayBuffer"),
    }
}

/// Offsets from the isolate of the words that hold an AsyncContextFrame
/// mapping `storage` to `wrapper` now (called inside `storage.run(wrapper)`).
#[napi]
pub fn frame_cped_candidates(storage: Object, wrapper: Object) -> Result<Vec<u32>> {
    // SAFETY: both are live objects of this callback.
    unsafe { frame::discovery::cped_candidates(storage.raw(), wrapper.raw()) }.or_else(frame_error)
}

/// Offsets in `wrapper` of the words equal to `buffer`'s data address.
#[napi]
pub fn frame_record_offset_candidates(
    env: &Env,
    wrapper: Object,
    buffer: Unknown,
) -> Result<Vec<u32>> {
    // SAFETY: live handles of this callback.
    let Some(address) = (unsafe { span_slab::address(env.raw(), buffer.raw()) }) else {
        return args::type_error(env, "The \"buffer\" argument must be an ArrayBuffer");
    };
    // SAFETY: as above.
    Ok(unsafe { frame::discovery::record_offset_candidates(wrapper.raw(), address) })
}

/// Inside `storage.run(wrapper)`, where `wrapper` views the record at
/// `byte_offset` in `buffer`: walks a block for `storage` as a reader would
/// (without publishing it) and throws unless the walk ends at that record.
#[napi]
pub fn frame_verify(
    env: &Env,
    storage: Object,
    buffer: Unknown,
    byte_offset: u32,
    cped_offset: u32,
    record_offset: u32,
) -> Result<()> {
    // SAFETY: live handles of this callback.
    let Some(address) = (unsafe { span_slab::address(env.raw(), buffer.raw()) }) else {
        return args::type_error(env, "The \"buffer\" argument must be an ArrayBuffer");
    };
    let record = address + u64::from(byte_offset);
    // SAFETY: as above.
    unsafe {
        frame::thread::verify(
            env.raw(),
            storage.raw(),
            cped_offset.into(),
            record_offset.into(),
            record,
        )
    }
    .or_else(frame_error)
}

/// Publishes the calling thread's `otel_thread_ctx_nodejs_v1` block for the
/// AsyncLocalStorage `storage` (replacing a previous one), and announces the
/// Node.js schema in the process context.
#[napi]
pub fn frame_publish(
    env: &Env,
    storage: Object,
    cped_offset: u32,
    record_offset: u32,
) -> Result<()> {
    // SAFETY: `storage` is a live object of this callback on this env.
    let first = unsafe {
        frame::thread::publish(
            env.raw(),
            storage.raw(),
            cped_offset.into(),
            record_offset.into(),
        )
    }
    .or_else(frame_error)?;
    if first {
        let layout = frame::thread::layout().expect("just published");
        if let Err(error) = process_context::frame_thread(true, layout) {
            frame::thread::unpublish();
            return process_context::throw(env, error);
        }
    }
    Ok(())
}

/// Stops the calling thread's frame publication (a no-op when none).
#[napi]
pub fn frame_unpublish() {
    stop_frame_publication();
}

/// What a reader walking the Node.js schema finds on a thread.
#[napi(object)]
pub struct FrameWalk {
    /// The record address found, or null.
    pub record: Option<BigInt>,
    /// Why none was found, or null.
    pub reason: Option<String>,
    /// The record's header (OTEP 4947), when one was found and readable.
    pub header: Option<Uint8Array>,
}

fn frame_walk_result(found: std::result::Result<u64, frame::walk::Miss>) -> FrameWalk {
    let found = found.and_then(|record| Ok((record, frame::walk::header(record)?)));
    match found {
        Ok((record, header)) => FrameWalk {
            record: Some(BigInt::from(record)),
            reason: None,
            header: Some(Uint8Array::from(header.to_vec())),
        },
        Err(miss) => FrameWalk {
            record: None,
            reason: Some(miss.reason().to_owned()),
            header: None,
        },
    }
}

/// The reader's walk on the calling thread, from its TLS block, now.
#[napi]
pub fn frame_walk() -> FrameWalk {
    frame_walk_result(frame::thread::walk())
}

/// The reader's walk from the `otel_thread_ctx_nodejs_v1` block at
/// `address` (another thread's, from its `threadInfo().frame.tlsAddress`),
/// with the layout this process publishes: an in-process reader for tests.
#[napi]
pub fn frame_walk_at(address: BigInt) -> FrameWalk {
    frame_walk_result(frame::thread::walk_at(address.get_u64().1))
}

/// The calling thread's published `otel_thread_ctx_nodejs_v1` block.
#[napi(object)]
pub struct FrameInfo {
    /// Address of this thread's `otel_thread_ctx_nodejs_v1` variable.
    pub tls_address: BigInt,
    pub cped_slot: BigInt,
    pub als_handle: BigInt,
    pub als_identity_hash: i32,
    pub undefined_addr: BigInt,
    /// Where a wrapper holds its record's address.
    pub js_object_record_offset: u32,
    /// Moving GCs (scavenges, compactions) this thread went through while
    /// publishing frames: each closes the gate for its pause.
    pub moving_gcs: f64,
    /// Of those, the ones where the thread's block, read at the end of the
    /// pause (objects moved, gate not yet reopened), was closed.
    pub moving_gcs_gate_closed: f64,
    /// Of those, the ones during which the thread's OTEP 4947 variable
    /// carried the span current at the pause's start (readers read it
    /// first, so samples inside the pause still find the span).
    pub moving_gcs_span_pinned: f64,
}

/// Moving GCs the calling thread's GC callbacks saw (see [`FrameInfo`]).
#[napi(object)]
pub struct FrameGcPauses {
    pub moving: f64,
    pub gate_closed: f64,
    pub span_pinned: f64,
}

/// The calling thread's moving-GC counts, published or not: tests check
/// that the callbacks go with the publication.
#[napi]
pub fn frame_gc_pauses() -> FrameGcPauses {
    let pauses = frame::thread::gc_pauses();
    FrameGcPauses {
        moving: pauses.moving.into(),
        gate_closed: pauses.closed.into(),
        span_pinned: pauses.pinned.into(),
    }
}

/// The calling thread's frame publication, or null when it publishes none.
#[napi]
pub fn frame_info() -> Option<FrameInfo> {
    let block = frame::thread::block()?;
    let layout = frame::thread::layout()?;
    let pauses = frame::thread::gc_pauses();
    Some(FrameInfo {
        tls_address: BigInt::from(frame::tls::address() as u64),
        cped_slot: BigInt::from(block.cped_slot),
        als_handle: BigInt::from(block.als_handle),
        als_identity_hash: block.als_identity_hash,
        undefined_addr: BigInt::from(block.undefined_addr),
        js_object_record_offset: layout.js_object_record_offset as u32,
        moving_gcs: pauses.moving.into(),
        moving_gcs_gate_closed: pauses.closed.into(),
        moving_gcs_span_pinned: pauses.pinned.into(),
    })
}

/// Longest trace or span id text the trace-root table takes (hex digits).
const MAX_ID_TEXT: usize = 32;
/// Most key and value texts of one trace root (key, value, key, value, ...).
const MAX_ROOT_TEXTS: usize = 2 * 16;
/// Longest key or value text of a trace root, in bytes.
const MAX_ROOT_TEXT_BYTES: usize = 1024;

fn check_id(env: &Env, id: &str, what: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_ID_TEXT || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return args::range_error(
            env,
            &format!("{what} must be 1 to {MAX_ID_TEXT} hex digits"),
        );
    }
    Ok(())
}

/// Puts the calling thread's local root of trace `traceId` where the
/// process's other threads find it: its span id and its endpoint
/// attributes as `[key, value, ...]`. Replaces an earlier root of the trace.
#[napi]
pub fn trace_root_publish(
    env: Env,
    trace_id: String,
    root_span_id: String,
    values: Vec<String>,
) -> Result<()> {
    check_id(&env, &trace_id, "traceId")?;
    check_id(&env, &root_span_id, "rootSpanId")?;
    if !values.len().is_multiple_of(2) || values.len() > MAX_ROOT_TEXTS {
        return args::range_error(
            &env,
            &format!("values must be key, value pairs, at most {MAX_ROOT_TEXTS} texts"),
        );
    }
    if values.iter().any(|v| v.len() > MAX_ROOT_TEXT_BYTES) {
        return args::range_error(
            &env,
            &format!("a key or value of at most {MAX_ROOT_TEXT_BYTES} bytes"),
        );
    }
    let owner = current_slot(&env)?.index;
    let mut texts = values.into_iter();
    let mut pairs = Vec::with_capacity(texts.len() / 2);
    while let (Some(key), Some(value)) = (texts.next(), texts.next()) {
        pairs.push((key, value));
    }
    let root = trace_roots::TraceRoot {
        root_span_id: root_span_id.to_ascii_lowercase(),
        values: pairs,
    };
    trace_roots::publish(trace_id.to_ascii_lowercase(), root, owner);
    Ok(())
}

/// Takes trace `traceId`'s root away if it is still `rootSpanId` (it ended).
#[napi]
pub fn trace_root_withdraw(trace_id: String, root_span_id: String) {
    trace_roots::withdraw(
        &trace_id.to_ascii_lowercase(),
        &root_span_id.to_ascii_lowercase(),
    );
}

/// A trace's local root as another thread of this process published it.
#[napi(object)]
pub struct TraceRootInfo {
    pub root_span_id: String,
    /// `[key, value, ...]`.
    pub values: Vec<String>,
}

/// Trace `traceId`'s local root in this process, or `null`.
#[napi]
pub fn trace_root_find(trace_id: String) -> Option<TraceRootInfo> {
    trace_roots::find(&trace_id.to_ascii_lowercase()).map(|root| TraceRootInfo {
        root_span_id: root.root_span_id,
        values: root.values.into_iter().flat_map(|(k, v)| [k, v]).collect(),
    })
}

/// The trace-root table's size now and how many entries gave way to newer
/// ones while it was full.
#[napi(object)]
pub struct TraceRootStats {
    pub entries: u32,
    pub evicted: f64,
}

#[napi]
pub fn trace_root_stats() -> TraceRootStats {
    let (entries, evicted) = trace_roots::stats();
    TraceRootStats {
        entries: entries as u32,
        evicted: evicted as f64,
    }
}
