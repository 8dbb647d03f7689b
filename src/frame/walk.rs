//! The reader's walk of the Node.js schema (`abi::node_schema`), done over
//! this process's own memory with non-faulting reads. The writer runs it at
//! start-up to prove its V8 facts on the running Node before it publishes
//! anything, and tests run it to check what a reader would find.

use otel_thread_ctx_abi::node_schema::{
    smi_value, untag, ThreadContext, V8Layout, ENTRY_WORDS, MAX_BUCKETS, MAX_CHAIN_HOPS,
    TABLE_PREFIX_WORDS,
};

use super::memory::Words;

/// Why a walk found no wrapper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// `cped_slot` is 0: the thread publishes nothing.
    Closed,
    /// The frame is `undefined` (or not a heap object): no context.
    NoFrame,
    /// The frame holds no entry for the AsyncLocalStorage, or its entry is
    /// `undefined` (what `run()` leaves behind when it returns to no store).
    NoEntry,
    /// A read failed or a value was out of bounds.
    Bad(&'static str),
}

impl Miss {
    pub fn reason(self) -> &'static str {
        match self {
            Miss::Closed => "the thread publishes no frame (cped_slot is 0)",
            Miss::NoFrame => "no AsyncContextFrame is current",
            Miss::NoEntry => "the current frame has no entry for the manager's AsyncLocalStorage",
            Miss::Bad(why) => why,
        }
    }
}

fn word(words: &mut Words, address: u64, what: &'static str) -> Result<u64, Miss> {
    words.word(address).map_err(|_| Miss::Bad(what))
}

fn smi(words: &mut Words, address: u64, what: &'static str) -> Result<i64, Miss> {
    smi_value(word(words, address, what)?).ok_or(Miss::Bad(what))
}

/// The value stored under `key` (tagged) in the AsyncContextFrame `frame`
/// (tagged), found as a reader finds it: through the bucket of `hash`.
pub fn find_in_frame(frame: u64, key: u64, hash: i32, layout: &V8Layout) -> Result<u64, Miss> {
    find_in_frame_with(&mut Words::new(), frame, key, hash, layout)
}

fn find_in_frame_with(
    words: &mut Words,
    frame: u64,
    key: u64,
    hash: i32,
    layout: &V8Layout,
) -> Result<u64, Miss> {
    let tagged = layout.tagged_size;
    let frame = untag(frame).ok_or(Miss::NoFrame)?;
    let table = untag(word(
        words,
        frame + layout.js_map_table_offset,
        "cannot read the frame's table",
    )?)
    .ok_or(Miss::Bad("the frame's table is not a heap object"))?;
    let base = table + layout.ordered_hash_map_header_size;
    let elements = smi(words, base, "bad element count")?;
    let deleted = smi(words, base + tagged, "bad deleted count")?;
    let buckets = smi(words, base + 2 * tagged, "bad bucket count")?;
    if buckets <= 0 || buckets as u64 > MAX_BUCKETS || (buckets as u64).count_ones() != 1 {
        return Err(Miss::Bad("bucket count out of bounds"));
    }
    if elements < 0 || deleted < 0 || elements + deleted > 2 * buckets {
        return Err(Miss::Bad("entry counts out of bounds"));
    }
    let used = (elements + deleted) as u64;
    let buckets = buckets as u64;
    let bucket = (hash as u32 as u64) & (buckets - 1);
    let mut index = smi(
        words,
        base + (TABLE_PREFIX_WORDS + bucket) * tagged,
        "bad bucket head",
    )?;
    for _ in 0..MAX_CHAIN_HOPS {
        if index == otel_thread_ctx_abi::node_schema::NOT_FOUND {
            return Err(Miss::NoEntry);
        }
        if index < 0 || index as u64 >= used {
            return Err(Miss::Bad("entry index out of bounds"));
        }
        let entry = base + (TABLE_PREFIX_WORDS + buckets + index as u64 * ENTRY_WORDS) * tagged;
        if word(words, entry, "cannot read an entry key")? == key {
            return word(words, entry + tagged, "cannot read an entry value");
        }
        index = smi(words, entry + 2 * tagged, "bad chain link")?;
    }
    Err(Miss::Bad("chain too long"))
}

/// The wrapper (tagged) a reader finds for a thread whose block is `block`.
fn wrapper(words: &mut Words, block: &ThreadContext, layout: &V8Layout) -> Result<u64, Miss> {
    if block.cped_slot == 0 {
        return Err(Miss::Closed);
    }
    let frame = word(words, block.cped_slot, "cannot read the frame slot")?;
    if frame == block.undefined_addr {
        return Err(Miss::NoFrame);
    }
    let key = word(
        words,
        block.als_handle,
        "cannot read the AsyncLocalStorage handle",
    )?;
    match find_in_frame_with(words, frame, key, block.als_identity_hash, layout)? {
        value if value == block.undefined_addr => Err(Miss::NoEntry),
        value => Ok(value),
    }
}

/// The record address a reader finds for a thread whose block is `block`.
pub fn record(block: &ThreadContext, layout: &V8Layout) -> Result<u64, Miss> {
    let words = &mut Words::new();
    let wrapper =
        untag(wrapper(words, block, layout)?).ok_or(Miss::Bad("the store is not a heap object"))?;
    word(
        words,
        wrapper + layout.js_object_record_offset,
        "cannot read the wrapper's record address",
    )
}

/// The header of the record at `address`, read as a reader reads it.
pub fn header(address: u64) -> Result<[u8; otel_thread_ctx_abi::record::HEADER_SIZE], Miss> {
    let mut bytes = [0u8; otel_thread_ctx_abi::record::HEADER_SIZE];
    super::memory::read(address, &mut bytes).map_err(|_| Miss::Bad("cannot read the record"))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_abi::node_schema::{DEFAULT_LAYOUT, SMI_SHIFT};

    fn smi_word(v: i64) -> u64 {
        (v << SMI_SHIFT) as u64
    }

    /// A JSMap laid out as V8 does (x86-64, no pointer compression), with
    /// `entries` `(key, value)` in one bucket chain of a 2-bucket table.
    struct FakeMap {
        map: Box<[u64; 4]>,
        table: Box<[u64]>,
    }

    impl FakeMap {
        fn new(entries: &[(u64, u64)], bucket_of_chain: u64) -> FakeMap {
            let buckets = 2u64;
            let mut table = vec![0u64; 2 + 3 + buckets as usize + 3 * entries.len()];
            table[2] = smi_word(entries.len() as i64);
            table[3] = smi_word(0);
            table[4] = smi_word(buckets as i64);
            table[5] = smi_word(-1);
            table[6] = smi_word(-1);
            if !entries.is_empty() {
                table[5 + bucket_of_chain as usize] = smi_word(entries.len() as i64 - 1);
            }
            for (i, (k, v)) in entries.iter().enumerate() {
                let at = 7 + 3 * i;
                table[at] = *k;
                table[at + 1] = *v;
                table[at + 2] = smi_word(i as i64 - 1);
            }
            let table = table.into_boxed_slice();
            let mut map = Box::new([0u64; 4]);
            map[3] = table.as_ptr() as u64 + 1;
            FakeMap { map, table }
        }

        fn tagged(&self) -> u64 {
            self.map.as_ptr() as u64 + 1
        }
    }

    #[test]
    fn follows_the_chain_of_the_hash_bucket() {
        let fake = FakeMap::new(&[(0x1001, 0x2001), (0x3001, 0x4001)], 1);
        assert!(!fake.table.is_empty());
        assert_eq!(
            find_in_frame(fake.tagged(), 0x1001, 3, &DEFAULT_LAYOUT),
            Ok(0x2001)
        );
        assert_eq!(
            find_in_frame(fake.tagged(), 0x3001, 1, &DEFAULT_LAYOUT),
            Ok(0x4001)
        );
        assert_eq!(
            find_in_frame(fake.tagged(), 0x1001, 2, &DEFAULT_LAYOUT),
            Err(Miss::NoEntry)
        );
        assert_eq!(
            find_in_frame(fake.tagged(), 0x5001, 1, &DEFAULT_LAYOUT),
            Err(Miss::NoEntry)
        );
    }

    #[test]
    fn a_smi_or_garbage_frame_is_no_span() {
        assert_eq!(
            find_in_frame(smi_word(7), 1, 1, &DEFAULT_LAYOUT),
            Err(Miss::NoFrame)
        );
        assert!(matches!(
            find_in_frame(0x11, 1, 1, &DEFAULT_LAYOUT),
            Err(Miss::Bad(_))
        ));
    }

    #[test]
    fn the_walk_reaches_the_record_through_the_block() {
        let record = [0u64; 4];
        let wrapper = [0u64, 0, 0, 0, record.as_ptr() as u64];
        let als = [0u64; 2];
        let als_tagged = als.as_ptr() as u64 + 1;
        let fake = FakeMap::new(&[(als_tagged, wrapper.as_ptr() as u64 + 1)], 1);
        let handle = als_tagged;
        let slot = fake.tagged();
        let block = ThreadContext {
            cped_slot: &slot as *const u64 as u64,
            als_handle: &handle as *const u64 as u64,
            als_identity_hash: 5,
            padding: 0,
            undefined_addr: 0x99,
        };
        let layout = V8Layout {
            js_object_record_offset: 0x20,
            ..DEFAULT_LAYOUT
        };
        assert_eq!(record_of(&block, &layout), Ok(record.as_ptr() as u64));
        let closed = ThreadContext {
            cped_slot: 0,
            ..block
        };
        assert_eq!(record_of(&closed, &layout), Err(Miss::Closed));
        let idle_slot = 0x99u64;
        let idle = ThreadContext {
            cped_slot: &idle_slot as *const u64 as u64,
            ..block
        };
        assert_eq!(record_of(&idle, &layout), Err(Miss::NoFrame));
    }

    fn record_of(block: &ThreadContext, layout: &V8Layout) -> Result<u64, Miss> {
        record(block, layout)
    }
}
