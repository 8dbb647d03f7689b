//! The OTEP 4719 process context: the mapping's header, its limits, and the
//! thread-context keys of `ProcessContext.attributes`.

use std::ffi::CStr;
use std::mem::{align_of, offset_of, size_of};

/// The header's first 8 bytes (no NUL).
pub const SIGNATURE: [u8; 8] = *b"OTEL_CTX";
/// Header format version.
pub const VERSION: u32 = 2;

/// The 32 bytes at the start of the mapping, little-endian on the
/// platforms targeted (host order). Writers may declare the same fields as
/// atomics; its size and offsets are the contract.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// [`SIGNATURE`].
    pub signature: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// Bytes at `payload`.
    pub payload_size: u32,
    /// `CLOCK_BOOTTIME` nanoseconds of the publication; 0 while an update
    /// is in progress. Strictly increases from one publication to the next.
    pub monotonic_published_at_ns: u64,
    /// Address of the payload in the writing process.
    pub payload: u64,
}

/// Size of [`Header`].
pub const HEADER_SIZE: usize = size_of::<Header>();
/// Offset of `signature`.
pub const OFFSET_SIGNATURE: usize = offset_of!(Header, signature);
/// Offset of `version`.
pub const OFFSET_VERSION: usize = offset_of!(Header, version);
/// Offset of `payload_size`.
pub const OFFSET_PAYLOAD_SIZE: usize = offset_of!(Header, payload_size);
/// Offset of `monotonic_published_at_ns`.
pub const OFFSET_PUBLISHED_AT: usize = offset_of!(Header, monotonic_published_at_ns);
/// Offset of the payload pointer.
pub const OFFSET_PAYLOAD: usize = offset_of!(Header, payload);

/// Largest payload a writer publishes and a reader accepts: 64 KiB, the
/// limit of the OpenTelemetry eBPF profiler, which rejects a larger payload
/// whole (and with it the key map). Readers copy the whole payload on every
/// read; this also keeps that copy cheap.
pub const MAX_PAYLOAD_BYTES: usize = 64 << 10;

/// The name the writer gives the mapping (memfd name or anonymous VMA name).
pub const MAPPING_NAME: &str = "OTEL_CTX";
/// [`MAPPING_NAME`] for the C calls that take it (`memfd_create`, `prctl`).
pub const MAPPING_NAME_C: &CStr = c"OTEL_CTX";
/// How the mapping appears in `/proc/<pid>/maps` (a memfd mapping may carry
/// a trailing ` (deleted)`).
pub const MAPPING_PATHS: [&str; 3] = [
    "/memfd:OTEL_CTX",
    "[anon:OTEL_CTX]",
    "[anon_shmem:OTEL_CTX]",
];

/// Key of the thread-context schema announcement in `ProcessContext.attributes`.
pub const SCHEMA_VERSION_KEY: &str = "threadlocal.schema_version";
/// Key of the record key map in `ProcessContext.attributes`: an array of
/// strings, entry *i* naming key index *i*; append-only.
pub const KEY_MAP_KEY: &str = "threadlocal.attribute_key_map";
/// Prefix reserved for the keys above: callers may not set such attributes.
pub const RESERVED_PREFIX: &str = "threadlocal.";
/// Schema published unless configured otherwise: the thread context schema
/// of the merged OTEP 4947 text.
pub const DEFAULT_SCHEMA_VERSION: &str = "tlsdesc_v1_dev";
/// Schemas whose records have this crate's layout.
pub const KNOWN_SCHEMAS: [&str; 2] = [DEFAULT_SCHEMA_VERSION, "tls_v1"];
/// Most keys the key map holds (`key_index` is one byte).
pub const MAX_KEYS: usize = u8::MAX as usize + 1;

const fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The wire format, independent of how the struct happens to lay out.
const _: () = {
    assert!(OFFSET_SIGNATURE == 0);
    assert!(OFFSET_VERSION == 8);
    assert!(OFFSET_PAYLOAD_SIZE == 12);
    assert!(OFFSET_PUBLISHED_AT == 16);
    assert!(OFFSET_PAYLOAD == 24);
    assert!(HEADER_SIZE == 32);
    assert!(align_of::<Header>() == 8);
    assert!(MAX_PAYLOAD_BYTES <= u32::MAX as usize);
    assert!(same_bytes(
        MAPPING_NAME_C.to_bytes(),
        MAPPING_NAME.as_bytes()
    ));
    assert!(same_bytes(&SIGNATURE, MAPPING_NAME.as_bytes()));
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_the_struct_fields() {
        assert_eq!(OFFSET_SIGNATURE, offset_of!(Header, signature));
        assert_eq!(OFFSET_VERSION, offset_of!(Header, version));
        assert_eq!(OFFSET_PAYLOAD_SIZE, offset_of!(Header, payload_size));
        assert_eq!(
            OFFSET_PUBLISHED_AT,
            offset_of!(Header, monotonic_published_at_ns)
        );
        assert_eq!(OFFSET_PAYLOAD, offset_of!(Header, payload));
        assert_eq!(HEADER_SIZE, size_of::<Header>());
    }

    #[test]
    fn mapping_paths_carry_the_mapping_name() {
        for path in MAPPING_PATHS {
            assert!(path.contains(MAPPING_NAME), "{path}");
        }
    }

    #[test]
    fn reserved_keys_use_the_reserved_prefix() {
        assert!(SCHEMA_VERSION_KEY.starts_with(RESERVED_PREFIX));
        assert!(KEY_MAP_KEY.starts_with(RESERVED_PREFIX));
        assert!(KNOWN_SCHEMAS.contains(&DEFAULT_SCHEMA_VERSION));
        assert_eq!(MAX_KEYS, 256);
        assert_eq!(MAX_PAYLOAD_BYTES, 65536);
    }
}
