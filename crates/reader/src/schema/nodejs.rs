//! The Node.js schema `nodejs_v1_dev`: from a thread's TLS block, through
//! V8's current AsyncContextFrame (a JSMap keyed by AsyncLocalStorage
//! objects), to the OTEP 4947 record of the writer's active span. The walk
//! and its constants are declared in [`otel_thread_ctx_abi::node_schema`].
//!
//! Every word comes from target memory that may be stale (a sample inside
//! GC), freed (a worker that is ending) or hostile: each count and index is
//! bounded before it is used, the chain is followed at most
//! [`MAX_CHAIN_HOPS`] times, and any check that fails ends the walk as "no
//! span" with a [`Reason`]. Nothing here trusts a pointer enough to follow
//! it without a checked read.

use otel_thread_ctx_abi::node_schema::{
    smi_value, untag, ThreadContext, V8Layout, ENTRY_WORDS, MAX_BUCKETS, MAX_CHAIN_HOPS, NOT_FOUND,
    OFFSET_ALS_HANDLE, OFFSET_ALS_IDENTITY_HASH, OFFSET_CPED_SLOT, OFFSET_UNDEFINED_ADDR, SIZE,
    TABLE_PREFIX_WORDS,
};

use crate::memory::{Memory, MemoryError};
use crate::record::{self, Header, Record};

/// Why a thread publishing this schema names no span at this instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// `cped_slot` is 0: the thread has not set up (or has torn down) its
    /// block, or never touched it.
    NotPublished,
    /// The current frame is `undefined`: the thread runs outside any
    /// context (between callbacks, idle).
    NoFrame,
    /// The frame has no entry for the writer's AsyncLocalStorage.
    StoreAbsent,
    /// The entry is there with the value `undefined`: the writer cleared
    /// its context in this frame.
    StoreUndefined,
    /// The bucket's chain is longer than [`MAX_CHAIN_HOPS`] (or loops).
    ChainTooLong,
    /// A word that must be a heap pointer or a Smi is not, a count is out
    /// of bounds, or the bucket count is not a power of two: not the
    /// objects the schema describes (moved, freed, or another layout).
    WrongObject,
    /// A pointer on the way could not be read.
    Unreadable,
    /// The record the wrapper leads to is not marked valid, names all-zero
    /// ids, or is malformed.
    RecordInvalid,
}

impl Reason {
    /// The stable name reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotPublished => "not-published",
            Reason::NoFrame => "no-frame",
            Reason::StoreAbsent => "store-absent",
            Reason::StoreUndefined => "store-undefined",
            Reason::ChainTooLong => "chain-too-long",
            Reason::WrongObject => "wrong-object",
            Reason::Unreadable => "unreadable",
            Reason::RecordInvalid => "record-invalid",
        }
    }

    /// The code the BPF program reports for this reason (its
    /// `enum record_status`, after the record schema's codes).
    pub fn from_bpf_status(status: u32) -> Option<Reason> {
        Some(match status {
            4 => Reason::NotPublished,
            5 => Reason::NoFrame,
            6 => Reason::StoreAbsent,
            7 => Reason::StoreUndefined,
            8 => Reason::ChainTooLong,
            9 => Reason::WrongObject,
            _ => return None,
        })
    }

    /// Whether the reason says the target's memory is not what the schema
    /// describes (as opposed to a thread that is simply outside a span).
    pub fn is_anomaly(self) -> bool {
        matches!(
            self,
            Reason::ChainTooLong | Reason::WrongObject | Reason::Unreadable
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// "No span", with the reason and what the walk saw.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct NoSpan {
    pub reason: Reason,
    pub detail: String,
}

fn no_span(reason: Reason, detail: impl Into<String>) -> NoSpan {
    NoSpan {
        reason,
        detail: detail.into(),
    }
}

fn unreadable(what: &str, e: MemoryError) -> NoSpan {
    no_span(Reason::Unreadable, format!("{what}: {e}"))
}

/// How far the walk got: every address it followed, for reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trail {
    pub block: Option<ThreadContext>,
    /// The AsyncContextFrame (tagged).
    pub frame: Option<u64>,
    /// Its OrderedHashMap (tagged).
    pub table: Option<u64>,
    pub bucket_count: Option<u64>,
    /// Entries looked at in the bucket's chain.
    pub hops: usize,
    /// The entry's value: the writer's wrapper object (tagged).
    pub wrapper: Option<u64>,
    /// The record address held by the wrapper.
    pub record: Option<u64>,
}

fn word(b: &[u8], offset: usize) -> u64 {
    u64::from_ne_bytes(b[offset..offset + 8].try_into().expect("8 bytes"))
}

/// Reads and decodes the 32-byte block at `variable`.
pub fn read_block(mem: &dyn Memory, variable: u64) -> Result<ThreadContext, NoSpan> {
    let mut b = [0u8; SIZE];
    mem.read(variable, &mut b)
        .map_err(|e| unreadable("the thread's block", e))?;
    Ok(ThreadContext {
        cped_slot: word(&b, OFFSET_CPED_SLOT),
        als_handle: word(&b, OFFSET_ALS_HANDLE),
        als_identity_hash: i32::from_ne_bytes(
            b[OFFSET_ALS_IDENTITY_HASH..OFFSET_ALS_IDENTITY_HASH + 4]
                .try_into()
                .expect("4 bytes"),
        ),
        // Unspecified: writers may leave anything there.
        padding: 0,
        undefined_addr: word(&b, OFFSET_UNDEFINED_ADDR),
    })
}

/// Walks from the block at `variable` to the record of the active span and
/// reads it (its attrs_data too when `with_attrs`). `Ok` holds a record that
/// names a span; every other end is a [`NoSpan`]. `trail` keeps what was
/// followed on the way, whatever the end.
pub fn read(
    mem: &dyn Memory,
    variable: u64,
    layout: &V8Layout,
    with_attrs: bool,
    trail: &mut Trail,
) -> Result<Record, NoSpan> {
    let block = read_block(mem, variable)?;
    trail.block = Some(block);
    let record_address = walk(mem, &block, layout, trail)?;
    let rec = record::read(mem, record_address, with_attrs).map_err(|e| match e {
        record::ReadError::Header(e) | record::ReadError::AttrsData(e) => {
            unreadable("the record", e)
        }
        other => no_span(Reason::RecordInvalid, other.to_string()),
    })?;
    if let Some(why) = record_invalid(&rec.header) {
        return Err(why);
    }
    Ok(rec)
}

/// Why a record names no span, if it does not.
pub fn record_invalid(h: &Header) -> Option<NoSpan> {
    if !h.is_valid() {
        return Some(no_span(
            Reason::RecordInvalid,
            format!("the record's valid byte is {}", h.valid),
        ));
    }
    h.zero_ids()
        .map(|z| no_span(Reason::RecordInvalid, z.to_string()))
}

/// The walk proper, steps 2 to 6 of the schema: from the block to the
/// record's address.
pub fn walk(
    mem: &dyn Memory,
    block: &ThreadContext,
    layout: &V8Layout,
    trail: &mut Trail,
) -> Result<u64, NoSpan> {
    if block.cped_slot == 0 {
        return Err(no_span(Reason::NotPublished, "cped_slot is 0"));
    }
    let ts = layout.tagged_size;
    if ts != 8 {
        // Smis and pointers below are full words: a 4-byte tagged size is a
        // pointer-compressed build, which this reader does not walk.
        return Err(no_span(
            Reason::WrongObject,
            format!("tagged_size {ts} is not supported (only 8: no pointer compression)"),
        ));
    }
    let read = |what: &str, addr: u64| mem.read_u64(addr).map_err(|e| unreadable(what, e));
    let frame = read("cped_slot", block.cped_slot)?;
    trail.frame = Some(frame);
    if frame == block.undefined_addr {
        return Err(no_span(Reason::NoFrame, "the current frame is undefined"));
    }
    let Some(frame_obj) = untag(frame) else {
        return Err(no_span(
            Reason::NoFrame,
            format!("the current frame {frame:#x} is not a heap object"),
        ));
    };
    let table = read(
        "the frame's table",
        frame_obj.wrapping_add(layout.js_map_table_offset),
    )?;
    trail.table = Some(table);
    let table_obj = untag(table).ok_or_else(|| {
        no_span(
            Reason::WrongObject,
            format!("the frame's table {table:#x} is not a heap object"),
        )
    })?;
    let base = table_obj.wrapping_add(layout.ordered_hash_map_header_size);
    let mut prefix = [0u8; (TABLE_PREFIX_WORDS * 8) as usize];
    mem.read(base, &mut prefix)
        .map_err(|e| unreadable("the table's counts", e))?;
    let smi = |what: &str, w: u64| {
        smi_value(w).ok_or_else(|| {
            no_span(
                Reason::WrongObject,
                format!("the table's {what} {w:#x} is not a Smi"),
            )
        })
    };
    let elements = smi("element count", word(&prefix, 0))?;
    let deleted = smi("deleted count", word(&prefix, 8))?;
    let buckets = smi("bucket count", word(&prefix, 16))?;
    if buckets <= 0 || buckets as u64 > MAX_BUCKETS || !(buckets as u64).is_power_of_two() {
        return Err(no_span(
            Reason::WrongObject,
            format!("bucket count {buckets} is not a power of two in [1, {MAX_BUCKETS}]"),
        ));
    }
    let buckets = buckets as u64;
    trail.bucket_count = Some(buckets);
    // Entries live after the buckets; a table never holds more entries
    // than twice its buckets (V8's load factor), so larger counts are
    // not a table.
    let capacity = buckets * 2;
    if elements < 0 || deleted < 0 || (elements + deleted) as u64 > capacity {
        return Err(no_span(
            Reason::WrongObject,
            format!("{elements} elements and {deleted} deleted do not fit {capacity} entries"),
        ));
    }
    let used = (elements + deleted) as u64;
    let als = read("als_handle", block.als_handle)?;
    let bucket = (block.als_identity_hash as u32 as u64) & (buckets - 1);
    let head = read("the bucket head", base + (TABLE_PREFIX_WORDS + bucket) * ts)?;
    let mut index = smi("bucket head", head)?;
    let entries = base + (TABLE_PREFIX_WORDS + buckets) * ts;
    loop {
        if index == NOT_FOUND {
            return Err(no_span(
                Reason::StoreAbsent,
                "the frame has no entry for the writer's AsyncLocalStorage",
            ));
        }
        if index < 0 || index as u64 >= used {
            return Err(no_span(
                Reason::WrongObject,
                format!("entry index {index} is outside the table's {used} entries"),
            ));
        }
        if trail.hops == MAX_CHAIN_HOPS {
            return Err(no_span(
                Reason::ChainTooLong,
                format!("no match within {MAX_CHAIN_HOPS} entries of the chain"),
            ));
        }
        trail.hops += 1;
        let mut entry = [0u8; (ENTRY_WORDS * 8) as usize];
        mem.read(entries + index as u64 * ENTRY_WORDS * ts, &mut entry)
            .map_err(|e| unreadable("an entry", e))?;
        if word(&entry, 0) == als {
            let value = word(&entry, 8);
            trail.wrapper = Some(value);
            if value == block.undefined_addr {
                return Err(no_span(
                    Reason::StoreUndefined,
                    "the writer's store is undefined in this frame",
                ));
            }
            let wrapper = untag(value).ok_or_else(|| {
                no_span(
                    Reason::WrongObject,
                    format!("the store {value:#x} is not a heap object"),
                )
            })?;
            let rec = read(
                "the wrapper's field",
                wrapper.wrapping_add(layout.js_object_record_offset),
            )?;
            trail.record = Some(rec);
            if rec == 0 {
                return Err(no_span(
                    Reason::RecordInvalid,
                    "the wrapper's field holds no record address",
                ));
            }
            return Ok(rec);
        }
        index = smi("chain link", word(&entry, 16))?;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::memory::fake::FakeMemory;
    use otel_thread_ctx_abi::node_schema::DEFAULT_LAYOUT;

    pub(crate) const BLOCK: u64 = 0x1000;
    const CPED: u64 = 0x2000;
    const HANDLE: u64 = 0x2100;
    const UNDEFINED: u64 = 0x9_0011;
    const ALS: u64 = 0x3_0001;
    const FRAME: u64 = 0x4_0000;
    const TABLE: u64 = 0x5_0000;
    const WRAPPER: u64 = 0x6_0000;
    const RECORD: u64 = 0x7_0000;
    const HASH: i32 = 0x148af1;

    fn smi(v: i64) -> u64 {
        (v << 32) as u64
    }

    fn words(ws: &[u64]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    /// A fake isolate: the block, a frame whose table has `buckets` buckets
    /// and the given entries `{key, value, chain}`, one wrapper and its
    /// record. The writer's entry sits in the bucket of `HASH`.
    pub(crate) struct Heap {
        pub buckets: u64,
        pub entries: Vec<[u64; 3]>,
        pub heads: Vec<u64>,
        pub deleted: i64,
    }

    impl Heap {
        /// One bucket pair; the writer's entry at index 1, chained after an
        /// unrelated one at index 0.
        pub(crate) fn good() -> Heap {
            let mut heads = vec![smi(-1); 2];
            heads[(HASH as u64 & 1) as usize] = smi(0);
            Heap {
                buckets: 2,
                entries: vec![[0x3_1001, 0x3_2001, smi(1)], [ALS, WRAPPER + 1, smi(-1)]],
                heads,
                deleted: 0,
            }
        }

        pub(crate) fn install(&self, mem: &FakeMemory) {
            let mut block = words(&[CPED, HANDLE]);
            block.extend_from_slice(&HASH.to_ne_bytes());
            block.extend_from_slice(&0x20u32.to_ne_bytes());
            block.extend_from_slice(&UNDEFINED.to_ne_bytes());
            mem.put(BLOCK, &block);
            mem.put(CPED, &words(&[FRAME + 1]));
            mem.put(HANDLE, &words(&[ALS]));
            mem.put(FRAME, &words(&[0, 0, 0, TABLE + 1]));
            let mut table = vec![0, 0];
            table.push(smi(self.entries.len() as i64 - self.deleted));
            table.push(smi(self.deleted));
            table.push(smi(self.buckets as i64));
            table.extend_from_slice(&self.heads);
            for e in &self.entries {
                table.extend_from_slice(e);
            }
            mem.put(TABLE, &words(&table));
            mem.put(WRAPPER, &words(&[0, 0, 0, 0, RECORD]));
            let mut rec: Vec<u8> = (1..=24).collect();
            rec.extend_from_slice(&[1, 1, 3, 0, 0, 1, b'/']);
            mem.put(RECORD, &rec);
        }
    }

    fn run(mem: &FakeMemory) -> (Result<Record, NoSpan>, Trail) {
        let mut trail = Trail::default();
        let r = read(mem, BLOCK, &DEFAULT_LAYOUT, true, &mut trail);
        (r, trail)
    }

    fn reason(mem: &FakeMemory) -> Reason {
        run(mem).0.unwrap_err().reason
    }

    #[test]
    fn follows_the_chain_to_the_record() {
        let mem = FakeMemory::default();
        Heap::good().install(&mem);
        let (r, trail) = run(&mem);
        let rec = r.unwrap();
        assert_eq!(rec.address, RECORD);
        assert_eq!(rec.header.span_id.to_string(), "1112131415161718");
        assert_eq!(rec.attrs_data, [0, 1, b'/']);
        assert_eq!(trail.hops, 2);
        assert_eq!(trail.wrapper, Some(WRAPPER + 1));
        assert_eq!(trail.bucket_count, Some(2));
        assert_eq!(trail.block.unwrap().als_identity_hash, HASH);
    }

    #[test]
    fn a_thread_outside_any_context_names_no_span() {
        let mem = FakeMemory::default();
        Heap::good().install(&mem);
        mem.put(CPED, &words(&[UNDEFINED]));
        assert_eq!(reason(&mem), Reason::NoFrame);
        mem.put(BLOCK, &words(&[0, HANDLE, 0, UNDEFINED]));
        assert_eq!(reason(&mem), Reason::NotPublished);
    }

    #[test]
    fn a_frame_without_the_store_or_with_it_cleared() {
        let mem = FakeMemory::default();
        let mut heap = Heap::good();
        heap.entries[1][0] = 0x3_5001;
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::StoreAbsent);
        let mut heap = Heap::good();
        heap.entries[1][1] = UNDEFINED;
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::StoreUndefined);
        let mut heap = Heap::good();
        heap.heads = vec![smi(-1); 2];
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::StoreAbsent);
    }

    #[test]
    fn a_cycle_is_a_chain_too_long() {
        let mem = FakeMemory::default();
        let mut heap = Heap::good();
        heap.entries[1] = [0x3_5001, 0, smi(0)];
        heap.install(&mem);
        let (r, trail) = run(&mem);
        assert_eq!(r.unwrap_err().reason, Reason::ChainTooLong);
        assert_eq!(trail.hops, MAX_CHAIN_HOPS);
    }

    #[test]
    fn objects_that_are_not_the_schemas_are_wrong_objects() {
        let mem = FakeMemory::default();
        let mut heap = Heap::good();
        heap.buckets = 3;
        heap.heads.push(smi(-1));
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::WrongObject);
        let mut heap = Heap::good();
        heap.entries[0][2] = smi(7);
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::WrongObject);
        let mut heap = Heap::good();
        heap.entries[0][2] = 0x1234_5679;
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::WrongObject);
        // A table pointer that is a Smi, and an element count far too large.
        Heap::good().install(&mem);
        mem.put(FRAME, &words(&[0, 0, 0, smi(4)]));
        assert_eq!(reason(&mem), Reason::WrongObject);
        let mut heap = Heap::good();
        heap.deleted = -1_000_000;
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::WrongObject);
        // A store that is a Smi, not a wrapper.
        let mut heap = Heap::good();
        heap.entries[1][1] = smi(3);
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::WrongObject);
    }

    #[test]
    fn unmapped_memory_anywhere_is_unreadable() {
        let mem = FakeMemory::default();
        Heap::good().install(&mem);
        mem.put(CPED, &words(&[0xdead_0001]));
        assert_eq!(reason(&mem), Reason::Unreadable);
        Heap::good().install(&mem);
        // A wrapper without the field: its store points into nothing.
        let mut heap = Heap::good();
        heap.entries[1][1] = 0xbad_0001;
        heap.install(&mem);
        assert_eq!(reason(&mem), Reason::Unreadable);
        let mem = FakeMemory::default();
        assert_eq!(reason(&mem), Reason::Unreadable);
    }

    #[test]
    fn a_record_that_is_not_valid_names_no_span() {
        let mem = FakeMemory::default();
        Heap::good().install(&mem);
        let mut rec: Vec<u8> = (1..=24).collect();
        rec.extend_from_slice(&[0, 1, 0, 0]);
        mem.put(RECORD, &rec);
        assert_eq!(reason(&mem), Reason::RecordInvalid);
        mem.put(WRAPPER, &words(&[0, 0, 0, 0, 0]));
        assert_eq!(reason(&mem), Reason::RecordInvalid);
        mem.put(WRAPPER, &words(&[0, 0, 0, 0, RECORD + 1]));
        assert_eq!(reason(&mem), Reason::RecordInvalid);
    }

    #[test]
    fn layout_constants_move_the_reads() {
        let mem = FakeMemory::default();
        Heap::good().install(&mem);
        mem.put(WRAPPER, &words(&[0, 0, 0, 0, 0, 0, 0, RECORD]));
        let layout = V8Layout {
            js_object_record_offset: 0x38,
            ..DEFAULT_LAYOUT
        };
        let mut trail = Trail::default();
        assert_eq!(
            read(&mem, BLOCK, &layout, false, &mut trail)
                .unwrap()
                .address,
            RECORD
        );
        let compressed = V8Layout {
            tagged_size: 4,
            ..DEFAULT_LAYOUT
        };
        assert_eq!(
            read(&mem, BLOCK, &compressed, false, &mut Trail::default())
                .unwrap_err()
                .reason,
            Reason::WrongObject
        );
    }
}
