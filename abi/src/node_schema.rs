//! The Node.js thread-context schema `nodejs_v1_dev`: instead of a record
//! kept current on every async switch, each isolate thread publishes once
//! where V8 keeps the current AsyncContextFrame, and the reader walks from
//! there to the active span's OTEP 4947 record at sample time.
//!
//! # The walk (x86-64, no pointer compression: what Node ships)
//! A tagged heap pointer is `address | 1`; a Smi is `value << 32`.
//! `tagged_size`, `js_map_table_offset`, `ordered_hash_map_header_size` and
//! `js_object_record_offset` below come from the process context's
//! [`LAYOUT_KEYS`] when present, else [`DEFAULT_LAYOUT`]. While the thread is
//! stopped or interrupted, a reader:
//! 1. reads the thread's [`TLS_SYMBOL`] ([`ThreadContext`], [`SIZE`] bytes);
//!    `cped_slot == 0` means the thread publishes nothing;
//! 2. `frame = *cped_slot`; `frame == undefined_addr` means no context
//!    (the thread is between callbacks: idle); a frame that is not a tagged
//!    pointer means no context too;
//! 3. `table = *(frame - 1 + js_map_table_offset)` (the JSMap's
//!    OrderedHashMap);
//! 4. at `base = table - 1 + ordered_hash_map_header_size`, three Smis:
//!    element count, deleted count, bucket count (a power of two); then
//!    `bucket_count` bucket heads (Smi entry index, -1 = empty); then the
//!    entries, [`ENTRY_WORDS`] words each: `{key, value, chain}`;
//! 5. entry index `i = bucket[als_identity_hash & (bucket_count - 1)]`;
//!    while `i != -1` (at most [`MAX_CHAIN_HOPS`] hops, and `i` below the
//!    element count plus the deleted count): if `key == *als_handle`, the
//!    entry's `value` is the wrapper; else `i = chain`. A `value` equal to
//!    `undefined_addr` means no context: `AsyncLocalStorage.run()` leaves
//!    the key mapped to `undefined` in the frames that follow it;
//! 6. `record = *(wrapper - 1 + js_object_record_offset)`, the address of
//!    an OTEP 4947 record ([`crate::record`]) itself, not of an object
//!    holding it (no further hop), read and validated as in the record
//!    schema (`valid` must be [`crate::record::VALID`]).
//!
//! Every step reads target memory that may be stale or hostile: a reader
//! bounds every count and index and reports "no span" with a reason when a
//! check fails, never a guess.
//!
//! # Writers
//! `cped_slot` is written last when a thread sets up and cleared first on
//! teardown (worker exit, addon unload, disable). The per-span record is
//! never freed while a frame can still reach its wrapper; `span.end()` sets
//! its `valid` to 0 in place.

use std::mem::{offset_of, size_of};

/// Name of the ELF TLS variable (STT_TLS, exported in `.dynsym`) holding a
/// thread's [`ThreadContext`].
pub const TLS_SYMBOL: &str = "otel_thread_ctx_nodejs_v1";

/// `threadlocal.schema_version` of a process that publishes this schema.
pub const SCHEMA_VERSION: &str = "nodejs_v1_dev";

/// The thread-local discovery block, one per isolate thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadContext {
    /// Address of the isolate's continuation-preserved-embedder-data slot
    /// (the current AsyncContextFrame, tagged); 0 = not published.
    pub cped_slot: u64,
    /// Address of a V8 global-handle slot holding the writer's
    /// AsyncLocalStorage (tagged); GC keeps the slot current.
    pub als_handle: u64,
    /// JS identity hash of that AsyncLocalStorage (a 32-bit int; the four
    /// bytes after it are padding).
    pub als_identity_hash: i32,
    /// Padding. Unspecified: a writer may leave anything here (Datadog's
    /// stores the hash as part of a wider word), so readers ignore it.
    pub padding: u32,
    /// This isolate's tagged `undefined` (read-only space, never moves).
    pub undefined_addr: u64,
}

/// Size of [`ThreadContext`].
pub const SIZE: usize = size_of::<ThreadContext>();
/// Offset of `cped_slot`.
pub const OFFSET_CPED_SLOT: usize = offset_of!(ThreadContext, cped_slot);
/// Offset of `als_handle`.
pub const OFFSET_ALS_HANDLE: usize = offset_of!(ThreadContext, als_handle);
/// Offset of `als_identity_hash`.
pub const OFFSET_ALS_IDENTITY_HASH: usize = offset_of!(ThreadContext, als_identity_hash);
/// Offset of `undefined_addr`.
pub const OFFSET_UNDEFINED_ADDR: usize = offset_of!(ThreadContext, undefined_addr);

/// V8 layout constants a reader needs for the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V8Layout {
    /// Offset, from the wrapper's untagged address, of the word holding the
    /// record's address.
    pub js_object_record_offset: u64,
    /// Bytes per tagged value.
    pub tagged_size: u64,
    /// Offset of the table pointer in a JSMap (untagged).
    pub js_map_table_offset: u64,
    /// Bytes before the element count in an OrderedHashMap (untagged).
    pub ordered_hash_map_header_size: u64,
}

/// The layout when the process context names none: x86-64 Node 24 and 26
/// without pointer compression, a wrapper whose internal field 0 holds the
/// record address (map, properties, elements, cpp_heap_wrappable, then the
/// embedder fields). Node 22's V8 has no cpp_heap_wrappable word, so field
/// 0 sits at 0x18 there: a writer on Node 22 publishes
/// [`JS_OBJECT_RECORD_OFFSET_KEY`], else readers find no record.
pub const DEFAULT_LAYOUT: V8Layout = V8Layout {
    js_object_record_offset: 0x20,
    tagged_size: 8,
    js_map_table_offset: 0x18,
    ordered_hash_map_header_size: 0x10,
};

/// `ProcessContext.attributes` keys of the layout constants (integers).
pub const JS_OBJECT_RECORD_OFFSET_KEY: &str = "threadlocal.js_object_record_offset";
/// See [`JS_OBJECT_RECORD_OFFSET_KEY`].
pub const TAGGED_SIZE_KEY: &str = "threadlocal.tagged_size";
/// See [`JS_OBJECT_RECORD_OFFSET_KEY`].
pub const JS_MAP_TABLE_OFFSET_KEY: &str = "threadlocal.js_map_table_offset";
/// See [`JS_OBJECT_RECORD_OFFSET_KEY`].
pub const ORDERED_HASH_MAP_HEADER_SIZE_KEY: &str = "threadlocal.ordered_hash_map_header_size";
/// Every layout key, in [`V8Layout`] field order.
pub const LAYOUT_KEYS: [&str; 4] = [
    JS_OBJECT_RECORD_OFFSET_KEY,
    TAGGED_SIZE_KEY,
    JS_MAP_TABLE_OFFSET_KEY,
    ORDERED_HASH_MAP_HEADER_SIZE_KEY,
];

/// Smis before the bucket heads: element count, deleted count, bucket count.
pub const TABLE_PREFIX_WORDS: u64 = 3;
/// Words per OrderedHashMap entry: key, value, chain.
pub const ENTRY_WORDS: u64 = 3;
/// The chain's end (a Smi).
pub const NOT_FOUND: i64 = -1;
/// Most chain hops a reader follows before it gives up ("no span").
pub const MAX_CHAIN_HOPS: usize = 8;
/// Most modules defining [`TLS_SYMBOL`] that a reader reads each thread
/// through (an addon in use beside others that are loaded but idle).
pub const MAX_MODULES: usize = 4;
/// Most buckets a reader accepts; a frame holds a few AsyncLocalStorage
/// entries, so a larger count means a wrong or moved object.
pub const MAX_BUCKETS: u64 = 1 << 16;

/// V8's heap-object tag in the low bit of a tagged pointer.
pub const HEAP_OBJECT_TAG: u64 = 1;
/// Bits a Smi's value is shifted by (no pointer compression).
pub const SMI_SHIFT: u32 = 32;

/// The Smi value of a tagged word, or `None` when it is a heap pointer.
pub const fn smi_value(word: u64) -> Option<i64> {
    if word & HEAP_OBJECT_TAG != 0 {
        return None;
    }
    Some((word as i64) >> SMI_SHIFT)
}

/// The untagged address of a tagged heap pointer, or `None` for a Smi.
pub const fn untag(word: u64) -> Option<u64> {
    if word & HEAP_OBJECT_TAG == 0 {
        return None;
    }
    Some(word - HEAP_OBJECT_TAG)
}

const _: () = {
    assert!(OFFSET_CPED_SLOT == 0);
    assert!(OFFSET_ALS_HANDLE == 8);
    assert!(OFFSET_ALS_IDENTITY_HASH == 16);
    assert!(OFFSET_UNDEFINED_ADDR == 24);
    assert!(SIZE == 32);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smis_and_pointers() {
        assert_eq!(smi_value(5 << 32), Some(5));
        assert_eq!(smi_value((-1i64 as u64) << 32), Some(-1));
        assert_eq!(smi_value(0x1001), None);
        assert_eq!(untag(0x1001), Some(0x1000));
        assert_eq!(untag(5 << 32), None);
    }

    #[test]
    fn layout_keys_are_thread_local_keys() {
        for key in LAYOUT_KEYS {
            assert!(
                key.starts_with(crate::process_context::RESERVED_PREFIX),
                "{key}"
            );
        }
    }
}
