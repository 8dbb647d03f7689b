//! The writer protocol of the OTEP 4947 Thread-Local Context Record (its
//! layout is `otel_thread_ctx_abi::record`).
//!
//! One record per registered thread, written only by that thread. Readers
//! (eBPF programs, ptrace-based tools) read it only while the thread is
//! stopped or interrupted, so the writer needs compiler ordering, not CPU
//! barriers: every store is volatile and separated by compiler fences.
//!
//! The writer is JavaScript (`js/record-view.js`): it stores into the record
//! through a typed-array view, with no napi call per write. `publish` below
//! is the same protocol in Rust, kept as the executable reference the unit
//! tests check the layout against.

use std::ptr::{addr_of_mut, write_volatile};
use std::sync::atomic::{compiler_fence, Ordering};

use otel_thread_ctx_abi::record::{
    ThreadContextRecord, HEADER_SIZE, OFFSET_VALID, RECORD_SIZE, VALID,
};

/// A span context as the record stores it.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanIds {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub trace_flags: u8,
}

#[cfg(test)]
impl SpanIds {
    /// Builds ids from the numbers the napi API takes: `trace_id_high` is the
    /// first 8 bytes of the W3C trace id read as a big-endian number.
    pub fn from_words(
        trace_id_high: u64,
        trace_id_low: u64,
        span_id: u64,
        trace_flags: u8,
    ) -> Self {
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&trace_id_high.to_be_bytes());
        trace_id[8..].copy_from_slice(&trace_id_low.to_be_bytes());
        SpanIds {
            trace_id,
            span_id: span_id.to_be_bytes(),
            trace_flags,
        }
    }
}

/// Publishes `ids` (no attributes) into `record`.
///
/// # Safety
/// `record` must point at a live record owned by the calling thread.
#[cfg(test)]
pub unsafe fn publish(record: *mut ThreadContextRecord, ids: &SpanIds) {
    // SAFETY: the caller guarantees `record` is live and ours to write;
    // addr_of_mut avoids creating references to memory JS also writes.
    unsafe {
        write_volatile(addr_of_mut!((*record).valid), 0);
        // ORDER: a sampler that interrupts us below sees valid = 0 and ignores
        // the half-written fields.
        compiler_fence(Ordering::SeqCst);
        write_volatile(addr_of_mut!((*record).trace_id), ids.trace_id);
        write_volatile(addr_of_mut!((*record).span_id), ids.span_id);
        write_volatile(addr_of_mut!((*record).trace_flags), ids.trace_flags);
        write_volatile(addr_of_mut!((*record).attrs_data_size), 0);
        // ORDER: every field is in memory before valid = 1 makes it readable.
        compiler_fence(Ordering::SeqCst);
        write_volatile(addr_of_mut!((*record).valid), VALID);
    }
}

/// Whether `record` carries a span now (`valid` is 1).
///
/// # Safety
/// `record` must point at a live record.
pub unsafe fn is_valid(record: *const ThreadContextRecord) -> bool {
    // SAFETY: per the caller; a volatile read, as the JS view writes it.
    unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*record).valid)) == VALID }
}

/// Marks `record` as carrying no span. The ids stay in place: readers must
/// ignore them once `valid` is not 1.
///
/// # Safety
/// `record` must point at a live record owned by the calling thread.
pub unsafe fn invalidate(record: *mut ThreadContextRecord) {
    // SAFETY: as for `publish`.
    unsafe { write_volatile(addr_of_mut!((*record).valid), 0) };
    // ORDER: later stores (a TLS pointer change, a slot release) happen after
    // readers can see the record as invalid.
    compiler_fence(Ordering::SeqCst);
}

/// Writes a record image (its header, then `attrs_data_size` bytes of
/// attributes) with the publish protocol: `valid = 0`, the fields, then the
/// image's `valid` byte last. For environments where JavaScript cannot view
/// the record directly (no external `ArrayBuffer`s).
///
/// # Safety
/// `record` must point at a live record owned by the calling thread.
pub unsafe fn write_image(record: *mut ThreadContextRecord, image: &[u8]) {
    assert!(image.len() >= HEADER_SIZE && image.len() <= RECORD_SIZE);
    let bytes = record.cast::<u8>();
    // SAFETY: as for `invalidate`; every offset written is below RECORD_SIZE
    // (asserted above), and volatile byte stores never create references to
    // memory JavaScript may also view.
    unsafe {
        write_volatile(addr_of_mut!((*record).valid), 0);
        // ORDER: a sampler that interrupts us below sees valid = 0.
        compiler_fence(Ordering::SeqCst);
        for (offset, &byte) in image.iter().enumerate() {
            if offset != OFFSET_VALID {
                write_volatile(bytes.add(offset), byte);
            }
        }
        // ORDER: every field is in memory before valid = 1 makes it readable.
        compiler_fence(Ordering::SeqCst);
        write_volatile(addr_of_mut!((*record).valid), image[OFFSET_VALID]);
    }
}

/// Resets a record to all zeroes (valid = 0 first), for a slot being recycled.
///
/// # Safety
/// No thread may be publishing into `record`.
pub unsafe fn reset(record: *mut ThreadContextRecord) {
    // SAFETY: as for `invalidate`; nobody else writes the record now.
    unsafe {
        invalidate(record);
        std::ptr::write_bytes(record.cast::<u8>(), 0, RECORD_SIZE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_abi::record::{
        OFFSET_ATTRS_DATA, OFFSET_ATTRS_DATA_SIZE, OFFSET_SPAN_ID, OFFSET_TRACE_FLAGS,
    };

    fn blank() -> Box<ThreadContextRecord> {
        // SAFETY: an all-zero record is a valid value of the type.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn words_map_to_w3c_byte_order() {
        let ids = SpanIds::from_words(
            0x0102030405060708,
            0x090a0b0c0d0e0f10,
            0x1112131415161718,
            1,
        );
        assert_eq!(
            ids.trace_id,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(
            ids.span_id,
            [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]
        );
    }

    #[test]
    fn write_image_copies_header_and_attributes() {
        let mut rec = blank();
        let mut image = vec![0u8; HEADER_SIZE + 3];
        image[..OFFSET_SPAN_ID].copy_from_slice(&[0xab; 16]);
        image[OFFSET_SPAN_ID..OFFSET_VALID].copy_from_slice(&[0xcd; 8]);
        image[OFFSET_VALID] = VALID;
        image[OFFSET_TRACE_FLAGS] = 1;
        image[OFFSET_ATTRS_DATA_SIZE..OFFSET_ATTRS_DATA].copy_from_slice(&3u16.to_ne_bytes());
        image[OFFSET_ATTRS_DATA..].copy_from_slice(&[0, 1, b'x']);
        // SAFETY: `rec` is a live record owned by this test.
        unsafe { write_image(&mut *rec, &image) };
        assert_eq!(rec.trace_id, [0xab; 16]);
        assert_eq!(rec.span_id, [0xcd; 8]);
        assert_eq!((rec.valid, rec.trace_flags, rec.attrs_data_size), (1, 1, 3));
        assert_eq!(&rec.attrs_data[..3], &[0, 1, b'x']);
    }

    #[test]
    fn publish_then_invalidate() {
        let mut rec = blank();
        let ids = SpanIds::from_words(1, 2, 3, 1);
        // SAFETY: `rec` is a live record owned by this test.
        unsafe { publish(&mut *rec, &ids) };
        assert_eq!(rec.valid, 1);
        assert_eq!(rec.trace_flags, 1);
        assert_eq!(rec.trace_id[7], 1);
        assert_eq!(rec.trace_id[15], 2);
        assert_eq!(rec.span_id[7], 3);
        assert_eq!(rec.attrs_data_size, 0);
        // SAFETY: as above.
        unsafe { invalidate(&mut *rec) };
        assert_eq!(rec.valid, 0);
    }

    #[test]
    fn header_bytes_are_where_readers_look() {
        let mut rec = blank();
        // SAFETY: as above.
        unsafe {
            publish(
                &mut *rec,
                &SpanIds::from_words(u64::MAX, u64::MAX, u64::MAX, 0x03),
            )
        };
        // SAFETY: the record is RECORD_SIZE plain bytes with no padding.
        let bytes: &[u8; RECORD_SIZE] = unsafe { &*(&*rec as *const ThreadContextRecord).cast() };
        assert!(bytes[..OFFSET_VALID].iter().all(|&b| b == 0xff));
        assert_eq!(bytes[OFFSET_VALID], VALID);
        assert_eq!(bytes[OFFSET_TRACE_FLAGS], 3);
        assert_eq!(&bytes[OFFSET_ATTRS_DATA_SIZE..OFFSET_ATTRS_DATA], &[0, 0]);
    }
}
