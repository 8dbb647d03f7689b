//! The OTEP 4947 Thread-Local Context Record.

use std::mem::{align_of, offset_of, size_of};

/// Name of the ELF TLS variable that points at the thread's record.
pub const TLS_SYMBOL: &str = "otel_thread_ctx_v1";

/// Bytes of the fixed header readers fetch first.
pub const HEADER_SIZE: usize = OFFSET_ATTRS_DATA;
/// Size of a whole record (the upper bound the specification recommends).
pub const RECORD_SIZE: usize = size_of::<ThreadContextRecord>();
/// Room for `attrs_data` entries after the header.
pub const ATTRS_CAPACITY: usize = RECORD_SIZE - HEADER_SIZE;

/// Offset of `trace_id`.
pub const OFFSET_TRACE_ID: usize = offset_of!(ThreadContextRecord, trace_id);
/// Offset of `span_id`.
pub const OFFSET_SPAN_ID: usize = offset_of!(ThreadContextRecord, span_id);
/// Offset of `valid`.
pub const OFFSET_VALID: usize = offset_of!(ThreadContextRecord, valid);
/// Offset of `trace_flags`.
pub const OFFSET_TRACE_FLAGS: usize = offset_of!(ThreadContextRecord, trace_flags);
/// Offset of `attrs_data_size`.
pub const OFFSET_ATTRS_DATA_SIZE: usize = offset_of!(ThreadContextRecord, attrs_data_size);
/// Offset of `attrs_data`.
pub const OFFSET_ATTRS_DATA: usize = offset_of!(ThreadContextRecord, attrs_data);

/// The `valid` byte of a complete, current record. Any other value means
/// "ignore this record".
pub const VALID: u8 = 1;

/// The record as readers see it. Host endianness, no padding; aligned to a
/// cache line so the header never straddles two.
#[repr(C, align(64))]
pub struct ThreadContextRecord {
    /// W3C trace-id bytes in the order of the hex string. All zero = none.
    pub trace_id: [u8; 16],
    /// W3C span-id bytes in the order of the hex string.
    pub span_id: [u8; 8],
    /// [`VALID`] = complete and current; anything else = ignore the record.
    pub valid: u8,
    /// W3C trace-flags byte (0x01 sampled); 0 when no ids are set.
    pub trace_flags: u8,
    /// Number of `attrs_data` bytes in use.
    pub attrs_data_size: u16,
    /// Packed entries (see [`crate::attrs`]).
    pub attrs_data: [u8; 612],
}

// The wire format, independent of how the struct happens to lay out.
const _: () = {
    assert!(OFFSET_TRACE_ID == 0);
    assert!(OFFSET_SPAN_ID == 16);
    assert!(OFFSET_VALID == 24);
    assert!(OFFSET_TRACE_FLAGS == 25);
    assert!(OFFSET_ATTRS_DATA_SIZE == 26);
    assert!(OFFSET_ATTRS_DATA == 28);
    assert!(RECORD_SIZE == 640);
    assert!(align_of::<ThreadContextRecord>() == 64);
    // attrs_data_size must be able to say "all of it".
    assert!(ATTRS_CAPACITY <= u16::MAX as usize);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_the_struct_fields() {
        assert_eq!(OFFSET_TRACE_ID, offset_of!(ThreadContextRecord, trace_id));
        assert_eq!(OFFSET_SPAN_ID, offset_of!(ThreadContextRecord, span_id));
        assert_eq!(OFFSET_VALID, offset_of!(ThreadContextRecord, valid));
        assert_eq!(
            OFFSET_TRACE_FLAGS,
            offset_of!(ThreadContextRecord, trace_flags)
        );
        assert_eq!(
            OFFSET_ATTRS_DATA_SIZE,
            offset_of!(ThreadContextRecord, attrs_data_size)
        );
        assert_eq!(
            OFFSET_ATTRS_DATA,
            offset_of!(ThreadContextRecord, attrs_data)
        );
        assert_eq!(RECORD_SIZE, size_of::<ThreadContextRecord>());
    }

    #[test]
    fn fields_tile_the_record_without_gaps() {
        let fields = [
            (OFFSET_TRACE_ID, 16),
            (OFFSET_SPAN_ID, 8),
            (OFFSET_VALID, 1),
            (OFFSET_TRACE_FLAGS, 1),
            (OFFSET_ATTRS_DATA_SIZE, 2),
            (OFFSET_ATTRS_DATA, ATTRS_CAPACITY),
        ];
        let mut end = 0;
        for (offset, size) in fields {
            assert_eq!(offset, end);
            end = offset + size;
        }
        assert_eq!(end, RECORD_SIZE);
        assert_eq!(HEADER_SIZE + ATTRS_CAPACITY, RECORD_SIZE);
    }
}
