//! Interpreted frames: from the bytecode offset a frame is at to the
//! script position it runs, through its BytecodeArray's source position
//! table (the table V8's own stack traces read).
//!
//! The metadata does not name the table's field (see
//! [`BytecodeLayout`]), so each BytecodeArray is checked before its table
//! is used: the constant pool and the handler table must be found by type
//! where V8 keeps them, the table must decode, and no bytecode offset it
//! lists may lie past the bytecodes.

use std::collections::HashMap;
use std::sync::Arc;

use super::code::{decode_table, invalid, read_bytes, BaselineCode, Entry};
use super::heap::{Heap, HeapError, Object};
use super::metadata::BytecodeLayout;

/// Most tables remembered; emptied past it.
const MAX_CACHED_TABLES: usize = 4096;
/// Most bytecodes a BytecodeArray is taken to have.
const MAX_BYTECODES: usize = 1 << 24;
/// Most bytes of bytecodes read to find a baseline frame's bytecode.
const MAX_BYTECODE_BYTES_READ: usize = 1 << 20;

/// Reads the source positions of one process's interpreted frames.
pub struct BytecodePositions {
    layout: BytecodeLayout,
    /// Each BytecodeArray's table (by the array's tagged address), used
    /// only while the array still holds it: bytecode freed and another
    /// array placed there reads its own, and positions V8 collects later
    /// are read then.
    tables: HashMap<u64, Table>,
}

/// One BytecodeArray's source position table, as read.
#[derive(Clone)]
struct Table {
    /// Which of the layout's unnamed slots holds it, and its tagged word.
    slot: usize,
    word: u64,
    /// The array's bytecode count.
    length: i64,
    entries: Arc<[Entry]>,
}

impl BytecodePositions {
    pub fn new(layout: BytecodeLayout) -> BytecodePositions {
        BytecodePositions {
            layout,
            tables: HashMap::new(),
        }
    }

    /// Forgets every table read.
    pub fn forget(&mut self) {
        self.tables.clear();
    }

    /// The script offset an interpreted frame runs at: `bytecode` is the
    /// frame's BytecodeArray (tagged), `raw_offset` the value of its
    /// bytecode offset slot. None where V8 has not collected the
    /// bytecode's positions, or the table has none at or before the offset.
    pub fn script_offset(
        &mut self,
        heap: &mut Heap<'_>,
        bytecode: u64,
        raw_offset: i64,
    ) -> Result<Option<u64>, HeapError> {
        // The slot counts from the object's tagged address, the heap
        // object tag (1) included: the bytecodes start one byte before
        // `data` from there.
        let offset = raw_offset - (self.layout.data as i64 - 1);
        let array = heap.object("BytecodeArray", bytecode)?;
        self.script_offset_at(heap, bytecode, array, offset)
    }

    /// The script offset a baseline frame runs at: `code` is what its
    /// Code keeps of its bytecodes, `index` the bytecode (in bytecode
    /// order) its instruction belongs to. Baseline code records no
    /// bytecode offsets, only each bytecode's instructions, so the
    /// bytecodes are walked to the offset of the `index`th.
    pub fn baseline_script_offset(
        &mut self,
        heap: &mut Heap<'_>,
        code: &BaselineCode,
        index: usize,
    ) -> Result<Option<u64>, HeapError> {
        let sizes = self
            .layout
            .sizes
            .as_ref()
            .map_err(|reason| invalid("baseline frame", reason.clone()))?;
        // Where V8 was debugging the function, the Code holds the
        // interpreter's data instead: not walked.
        let array = match heap.meta.bytecode_array_type {
            Some(t) => heap.typed("BytecodeArray", code.bytecode, (t, t))?,
            None => heap.object("BytecodeArray", code.bytecode)?,
        };
        let length = heap.smi_field("BytecodeArray", array, heap.meta.fixed_array_length)?;
        let length = usize::try_from(length)
            .ok()
            .filter(|&n| n <= MAX_BYTECODES)
            .ok_or_else(|| invalid("BytecodeArray", format!("length {length}")))?;
        if index >= length {
            return Err(invalid(
                "baseline frame",
                format!("bytecode {index} of at most {length}"),
            ));
        }
        // Only as far as `index` bytecodes of the largest size can reach; a
        // bytecode further in than the bound is not found.
        let reach = (index + 1).saturating_mul(sizes.largest());
        let mut bytes = vec![0u8; length.min(reach).min(MAX_BYTECODE_BYTES_READ)];
        heap.memory
            .read(array.address + self.layout.data, &mut bytes)?;
        let mut offset = 0usize;
        for _ in 0..index {
            let size = bytes
                .get(offset..)
                .and_then(|rest| sizes.size_at(rest))
                .ok_or_else(|| {
                    invalid(
                        "baseline frame",
                        format!("no whole bytecode at offset {offset} of {length}"),
                    )
                })?;
            offset += size;
        }
        if offset >= length {
            return Err(invalid(
                "baseline frame",
                format!("bytecode {index} lies past the {length} bytecodes"),
            ));
        }
        self.script_offset_at(heap, code.bytecode, array, offset as i64)
    }

    /// The script offset at bytecode offset `offset` of `bytecode` (tagged;
    /// `array`, the object it was read as).
    fn script_offset_at(
        &mut self,
        heap: &mut Heap<'_>,
        bytecode: u64,
        array: Object,
        offset: i64,
    ) -> Result<Option<u64>, HeapError> {
        // A table read before, while the array still holds it: one read.
        let known = match self.tables.get(&bytecode) {
            Some(t) if heap.field(array, self.layout.table_slots[t.slot])? == t.word => {
                Some(t.clone())
            }
            _ => None,
        };
        let table = match known {
            Some(t) => t,
            None => {
                let t = self.read_table(heap, array)?;
                if self.tables.len() >= MAX_CACHED_TABLES {
                    self.tables.clear();
                }
                self.tables.insert(bytecode, t.clone());
                t
            }
        };
        if !(0..table.length).contains(&offset) {
            return Err(invalid(
                "interpreted frame",
                format!(
                    "bytecode offset {offset} outside the {} bytecodes",
                    table.length
                ),
            ));
        }
        let entries = &table.entries;
        let n = entries.partition_point(|e| e.code_offset <= offset);
        Ok(n.checked_sub(1).and_then(|i| entries[i].script_offset))
    }

    /// Reads and checks the source position table of `array`: no entries
    /// where V8 has not collected it (until the slot changes).
    fn read_table(&self, heap: &mut Heap<'_>, array: Object) -> Result<Table, HeapError> {
        let length = heap.smi_field("BytecodeArray", array, heap.meta.fixed_array_length)?;
        let (slot, word, table) = self.position_table(heap, array)?;
        let entries = match table {
            Some(table) => decode_table(
                &read_bytes(heap, table, "source position table")?,
                self.layout.positions,
            )
            .map_err(|e| invalid("bytecode source position table", e))?,
            None => Vec::new(),
        };
        // An entry may sit right past the last bytecode (a position
        // recorded after it), never further.
        if let Some(past) = entries.iter().find(|e| e.code_offset > length) {
            return Err(invalid(
                "bytecode source position table",
                format!(
                    "bytecode offset {} outside the {length} bytecodes",
                    past.code_offset
                ),
            ));
        }
        Ok(Table {
            slot,
            word,
            length,
            entries: entries.into(),
        })
    }

    /// Where `array` keeps its source position table (the index of the
    /// slot and its tagged word) and the table, None where V8 has not
    /// collected it; an error when the array's unnamed slots do not hold a
    /// constant pool and a handler table where they must.
    fn position_table(
        &self,
        heap: &mut Heap<'_>,
        array: Object,
    ) -> Result<(usize, u64, Option<Object>), HeapError> {
        let l = &self.layout;
        let mut words = [0u64; 3];
        let mut objects = [None; 3];
        for (i, &slot) in l.table_slots.iter().enumerate() {
            words[i] = heap.field(array, slot)?;
            // A Smi or a word that is no object is neither array.
            objects[i] = heap.object("BytecodeArray field", words[i]).ok();
        }
        let of_types =
            |o: Option<Object>, types: &[u16]| o.filter(|o| types.contains(&o.instance_type));
        let constant_pool = |i: usize| of_types(objects[i], &l.fixed_array_types).is_some();
        let handler_table = of_types(objects[1], &l.byte_array_types).is_some();
        let at = match (constant_pool(0), constant_pool(2)) {
            (true, false) if handler_table => 2,
            (false, true) if handler_table => 0,
            _ => {
                return Err(invalid(
                    "BytecodeArray",
                    "no constant pool and handler table where V8 keeps them",
                ))
            }
        };
        Ok((at, words[at], of_types(objects[at], &l.byte_array_types)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::code::tests::{array, byte_array, position, table};
    use super::super::function::fake::{self, smi, FakeHeap};
    use super::super::metadata::{BytecodeSizes, PositionEncoding};
    use super::*;
    use std::collections::HashMap;

    /// Node.js 24's layout: the table first, the constant pool last.
    fn layout() -> BytecodeLayout {
        BytecodeLayout {
            data: 64,
            table_slots: [24, 32, 40],
            byte_array_types: vec![fake::TRUSTED_BYTE_ARRAY_TYPE],
            fixed_array_types: vec![fake::FIXED_ARRAY_TYPE],
            positions: PositionEncoding::Signed,
            sizes: Err("no table".into()),
        }
    }

    /// A BytecodeArray of `length` bytecodes whose three unnamed slots hold
    /// `slots`.
    fn bytecode(h: &mut FakeHeap, length: i64, slots: [u64; 3]) -> u64 {
        let b = h.object(fake::BYTECODE_ARRAY_TYPE, 8 + (length as u64).div_ceil(8));
        h.set(b, 8, smi(length));
        for (i, w) in slots.into_iter().enumerate() {
            h.set(b, 24 + 8 * i as u64, w);
        }
        b
    }

    /// The offset slot's value for bytecode offset `offset`.
    fn raw(offset: i64) -> i64 {
        offset + 63
    }

    fn offset_at(
        h: &FakeHeap,
        positions: &mut BytecodePositions,
        b: u64,
        raw: i64,
    ) -> Result<Option<u64>, HeapError> {
        let meta = fake::metadata(true);
        let mut maps = HashMap::new();
        let mut heap = Heap::new(h, &meta, &mut maps);
        positions.script_offset(&mut heap, b, raw)
    }

    #[test]
    fn an_offset_runs_at_the_last_position_at_or_before_it() {
        let mut h = FakeHeap::new();
        let positions = byte_array(
            &mut h,
            &table(&[
                (0, true, position(100, None)),
                (5, false, position(120, None)),
                (12, true, position(140, None)),
            ]),
        );
        let handlers = byte_array(&mut h, &[]);
        let pool = array(&mut h, fake::FIXED_ARRAY_TYPE, &[]);
        let b = bytecode(&mut h, 20, [positions, handlers, pool]);
        let mut p = BytecodePositions::new(layout());
        for (offset, want) in [
            (0, 100),
            (4, 100),
            (5, 120),
            (11, 120),
            (12, 140),
            (19, 140),
        ] {
            assert_eq!(
                offset_at(&h, &mut p, b, raw(offset)),
                Ok(Some(want)),
                "offset {offset}"
            );
        }
        // Past the bytecodes, or before them: the frame is not at this array.
        assert!(offset_at(&h, &mut p, b, raw(20)).is_err());
        assert!(offset_at(&h, &mut p, b, raw(-1)).is_err());
    }

    #[test]
    fn the_reversed_order_of_older_v8_is_read_the_same() {
        let mut h = FakeHeap::new();
        let positions = byte_array(&mut h, &table(&[(0, true, position(7, None))]));
        let handlers = byte_array(&mut h, &[]);
        let pool = array(&mut h, fake::FIXED_ARRAY_TYPE, &[]);
        let b = bytecode(&mut h, 4, [pool, handlers, positions]);
        let mut p = BytecodePositions::new(layout());
        assert_eq!(offset_at(&h, &mut p, b, raw(2)), Ok(Some(7)));
    }

    #[test]
    fn positions_not_collected_give_no_offset_and_misplaced_tables_an_error() {
        let mut h = FakeHeap::new();
        let handlers = byte_array(&mut h, &[]);
        let pool = array(&mut h, fake::FIXED_ARRAY_TYPE, &[]);
        let undefined = h.undefined;
        let uncollected = bytecode(&mut h, 4, [undefined, handlers, pool]);
        let mut p = BytecodePositions::new(layout());
        assert_eq!(offset_at(&h, &mut p, uncollected, raw(1)), Ok(None));
        // Collected later: read then.
        let collected = byte_array(&mut h, &table(&[(0, true, position(5, None))]));
        h.set(uncollected, 24, collected);
        assert_eq!(offset_at(&h, &mut p, uncollected, raw(1)), Ok(Some(5)));

        // Two byte arrays and no constant pool: which is the table cannot
        // be told.
        let positions = byte_array(&mut h, &table(&[(0, true, position(7, None))]));
        let no_pool = bytecode(&mut h, 4, [positions, handlers, positions]);
        assert!(offset_at(&h, &mut p, no_pool, raw(1)).is_err());
        // A Smi where the handler table should be.
        let no_handlers = bytecode(&mut h, 4, [positions, smi(3), pool]);
        assert!(offset_at(&h, &mut p, no_handlers, raw(1)).is_err());
    }

    #[test]
    fn a_table_that_lists_offsets_past_the_end_of_the_bytecodes_is_refused() {
        let mut h = FakeHeap::new();
        // A handler table read as positions would look like this.
        let positions = byte_array(
            &mut h,
            &table(&[(0, true, position(7, None)), (40, true, position(9, None))]),
        );
        let handlers = byte_array(&mut h, &[]);
        let pool = array(&mut h, fake::FIXED_ARRAY_TYPE, &[]);
        let b = bytecode(&mut h, 8, [positions, handlers, pool]);
        let mut p = BytecodePositions::new(layout());
        let err = offset_at(&h, &mut p, b, raw(1)).unwrap_err();
        assert!(err.to_string().contains("outside the 8 bytecodes"), "{err}");
        // One right past the last bytecode is a position V8 records there.
        let at_end = byte_array(
            &mut h,
            &table(&[(0, true, position(7, None)), (8, true, position(9, None))]),
        );
        let b = bytecode(&mut h, 8, [at_end, handlers, pool]);
        assert_eq!(offset_at(&h, &mut p, b, raw(7)), Ok(Some(7)));
    }

    /// Writes `bytes` as the bytecodes of the BytecodeArray `b`.
    fn put_bytecodes(h: &mut FakeHeap, b: u64, bytes: &[u8]) {
        for (i, &byte) in bytes.iter().enumerate() {
            let at = b - 1 + 64 + i as u64;
            let word = at & !7;
            let mut w = h.bytes[(word - fake::BASE) as usize..][..8].to_vec();
            w[(at - word) as usize] = byte;
            h.put(word, u64::from_ne_bytes(w.try_into().unwrap()));
        }
    }

    /// A size table of 128 bytecodes: the four prefixes, then bytecode 4
    /// of one byte, 5 of two (one operand) and 6 of three, each operand
    /// twice and four times as wide at the larger scales.
    fn sizes() -> BytecodeSizes {
        let mut table = vec![1u8; 3 * 128];
        for (row, scale) in [1u8, 2, 4].into_iter().enumerate() {
            table[row * 128 + 5] = 1 + scale;
            table[row * 128 + 6] = 1 + 2 * scale;
        }
        BytecodeSizes::new(&table).unwrap()
    }

    /// A BytecodeArray holding `code`, with a position table of `entries`
    /// (bytecode offset, script offset), and baseline code over it whose
    /// bytecodes' instructions end at `ends`.
    fn baseline_code(
        h: &mut FakeHeap,
        code: &[u8],
        entries: &[(u64, u64)],
        ends: &[u64],
    ) -> BaselineCode {
        let entries: Vec<_> = entries
            .iter()
            .map(|&(at, to)| (at, true, position(to, None)))
            .collect();
        let positions = byte_array(h, &table(&entries));
        let handlers = byte_array(h, &[]);
        let pool = array(h, fake::FIXED_ARRAY_TYPE, &[]);
        let b = bytecode(h, code.len() as i64, [positions, handlers, pool]);
        put_bytecodes(h, b, code);
        BaselineCode {
            bytecode: b,
            ends: ends.to_vec(),
        }
    }

    /// baseline_script_offset() with the fake metadata, walking with sizes().
    fn baseline_at(
        h: &FakeHeap,
        code: &BaselineCode,
        index: usize,
        sized: bool,
    ) -> Result<Option<u64>, HeapError> {
        let sizes = if sized {
            Ok(sizes())
        } else {
            Err("no table".into())
        };
        let mut p = BytecodePositions::new(BytecodeLayout { sizes, ..layout() });
        let meta = fake::metadata(true);
        let mut maps = HashMap::new();
        let mut heap = Heap::new(h, &meta, &mut maps);
        p.baseline_script_offset(&mut heap, code, index)
    }

    #[test]
    fn a_baseline_frame_runs_at_the_position_of_its_bytecode() {
        let mut h = FakeHeap::new();
        // Bytecodes at offsets 0 (4), 1 (5 x), 3 (Wide 6 xx xx: five
        // bytes), 8 (ExtraWide 5 xxxx), 14 (4).
        let code = baseline_code(
            &mut h,
            &[4, 5, 9, 0, 6, 1, 2, 3, 4, 1, 5, 1, 2, 3, 4, 4],
            &[(0, 100), (3, 130), (8, 180), (14, 240)],
            &[10, 20, 30, 40, 50, 60, 70],
        );
        for (index, want) in [(0, 100), (1, 100), (2, 130), (3, 180), (4, 240)] {
            assert_eq!(
                baseline_at(&h, &code, index, true),
                Ok(Some(want)),
                "bytecode {index}"
            );
        }
        // Past the bytecodes: not this array's.
        assert!(baseline_at(&h, &code, 6, true).is_err());
        // Without the size table, no walk.
        assert!(baseline_at(&h, &code, 1, false).is_err());
    }

    #[test]
    fn a_walk_that_meets_no_whole_bytecode_fails() {
        let mut h = FakeHeap::new();
        // An opcode past the table, and a prefix before a prefix.
        for bytes in [[4u8, 200, 4, 4], [4, 0, 1, 4]] {
            let code = baseline_code(&mut h, &bytes, &[(0, 5)], &[1, 2, 3, 4, 5]);
            assert_eq!(baseline_at(&h, &code, 1, true), Ok(Some(5)));
            let err = baseline_at(&h, &code, 3, true).unwrap_err();
            assert!(
                err.to_string().contains("no whole bytecode at offset 1"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_cached_table_is_used_only_while_the_array_still_holds_it() {
        let mut h = FakeHeap::new();
        let first = byte_array(&mut h, &table(&[(0, true, position(7, None))]));
        let second = byte_array(&mut h, &table(&[(0, true, position(70, None))]));
        let handlers = byte_array(&mut h, &[]);
        let pool = array(&mut h, fake::FIXED_ARRAY_TYPE, &[]);
        let b = bytecode(&mut h, 4, [first, handlers, pool]);
        let mut p = BytecodePositions::new(layout());
        assert_eq!(offset_at(&h, &mut p, b, raw(0)), Ok(Some(7)));
        h.set(b, 24, second);
        assert_eq!(offset_at(&h, &mut p, b, raw(0)), Ok(Some(70)));
    }
}
