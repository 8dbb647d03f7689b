//! Finding, on the running Node, the two facts frame mode cannot take from
//! a header: where the isolate keeps its continuation-preserved embedder
//! data (V8's `Internals::kContinuationPreservedEmbedderDataOffset` differs
//! per V8 version), and at which offset a wrapper object holds its record's
//! address. Both are found by walking our own objects as a reader would,
//! inside a known `AsyncLocalStorage.run()` (JavaScript drives the runs and
//! keeps only the answers that hold at two nesting levels; js/publish/frame.js).

use napi::sys;

use otel_thread_ctx_abi::node_schema::{untag, DEFAULT_LAYOUT};

use super::memory;
use super::v8::{tagged, v8};
use super::walk::find_in_frame;

/// How far into the isolate the CPED slot is looked for. V8 keeps it in
/// `IsolateData`, at the start of the isolate, a few hundred bytes in.
const ISOLATE_SCAN_BYTES: usize = 0x2000;
/// How far into a wrapper object its record address is looked for.
const WRAPPER_SCAN_BYTES: usize = 0x100;

/// Reads up to `len` bytes at `address` as words, stopping at the first
/// page that cannot be read.
fn words(address: u64, len: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(len / 8);
    let mut chunk = [0u8; 256];
    let mut at = 0;
    while at < len {
        if memory::read(address + at as u64, &mut chunk).is_err() {
            break;
        }
        out.extend(
            chunk
                .chunks_exact(8)
                .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes"))),
        );
        at += chunk.len();
    }
    out
}

/// Offsets from the isolate of every word that, walked as an
/// AsyncContextFrame, holds `wrapper` under the key `als`.
///
/// # Safety
/// `als` and `wrapper` must be live napi values of the current callback,
/// `als` an object.
pub unsafe fn cped_candidates(
    als: sys::napi_value,
    wrapper: sys::napi_value,
) -> Result<Vec<u32>, String> {
    let v8 = v8()?;
    // SAFETY: called from a napi callback, on the isolate's thread.
    let isolate = unsafe { (v8.get_current)() } as u64;
    if isolate == 0 {
        return Err("no V8 isolate is current".to_owned());
    }
    // SAFETY: per the caller.
    let (key, wrapper, hash) = unsafe { (tagged(als), tagged(wrapper), (v8.identity_hash)(als)) };
    let found = words(isolate, ISOLATE_SCAN_BYTES)
        .into_iter()
        .enumerate()
        .filter(|&(_, word)| untag(word).is_some())
        .filter(|&(_, word)| find_in_frame(word, key, hash, &DEFAULT_LAYOUT) == Ok(wrapper))
        .map(|(i, _)| (i * 8) as u32)
        .collect();
    Ok(found)
}

/// Offsets in the object `wrapper` of every word equal to `record`.
///
/// # Safety
/// `wrapper` must be a live napi value of the current callback.
pub unsafe fn record_offset_candidates(wrapper: sys::napi_value, record: u64) -> Vec<u32> {
    // SAFETY: per the caller.
    let Some(object) = untag(unsafe { tagged(wrapper) }) else {
        return Vec::new();
    };
    words(object, WRAPPER_SCAN_BYTES)
        .into_iter()
        .enumerate()
        .filter(|&(_, word)| word == record)
        .map(|(i, _)| (i * 8) as u32)
        .collect()
}
