//! Optimized code: from an instruction back to the Code object it belongs
//! to, and from an offset in that code to the functions V8 inlined there.
//!
//! Optimized code (Maglev, TurboFan) runs in its own frame, the frame of
//! the function it was compiled for, even where it runs the body of a
//! function it inlined. V8 keeps, per Code, a source position table (each
//! instruction offset to a script position and the inlining it belongs
//! to) and deoptimization data (each inlining's function and the position
//! of its call in the caller), the tables V8's own stack traces use. They
//! are read here as the target runs: every object is checked through its
//! map, the Code and its InstructionStream must point at each other, and
//! every table is bounded and decoded with its invariants checked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use otel_thread_ctx_abi::node_schema::smi_value;

use super::heap::{Heap, HeapError, Object};
use super::metadata::{CodeLayout, OwnFunction, PositionEncoding};

/// Farthest back from an instruction its InstructionStream is looked for,
/// and how many stream starts that do not hold it are passed on the way
/// (a word in instructions may look like a stream's map).
const MAX_CODE_BYTES: u64 = 1 << 20;
const MAX_FALSE_STARTS: u32 = 4;

/// Largest source position table and inlining table read.
const MAX_TABLE_BYTES: u64 = 4 << 20;

/// Most functions one Code may inline (V8 numbers them in 16 bits).
const MAX_INLINED: u64 = 1 << 16;

/// Bytes of one InliningPosition: its caller's SourcePosition, the
/// inlined function's index in the literal array, padding.
const INLINING_POSITION_BYTES: u64 = 16;

/// Pages of the target read at once while looking for a stream's start.
const PAGE: u64 = 4096;

/// Most instructions and Code objects remembered; emptied past it.
const MAX_CACHED_PCS: usize = 1 << 16;
const MAX_CACHED_CODES: usize = 4096;

/// How long a Code found still in its place is trusted before it is
/// checked again. A check runs when a sample is processed, not when it
/// was taken, so a name already rests on what was seen up to the ring's
/// delay later; a sample of the same code within this window reuses the
/// check instead of two more reads of the target per frame.
const RECHECK_AFTER: Duration = Duration::from_millis(10);

/// A SourcePosition, as V8 packs it in 64 bits: bit 0 says whether it is
/// external (a line in another file, never in JavaScript code), bits 1-30
/// the script offset plus one, bits 31-46 the inlining id plus one.
fn decode_source_position(raw: u64) -> (Option<u64>, Option<u64>) {
    if raw & 1 != 0 {
        return (None, None);
    }
    let script_offset = ((raw >> 1) & ((1 << 30) - 1)).checked_sub(1);
    let inlining_id = ((raw >> 31) & 0xffff).checked_sub(1);
    (script_offset, inlining_id)
}

/// One entry of a source position table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    /// -1 for the entry of a function's entry (bytecode only).
    pub(super) code_offset: i64,
    pub(super) script_offset: Option<u64>,
    inlining_id: Option<u64>,
}

/// A variable-length integer: 7 bits a byte, low first, the high bit set
/// on every byte but the last.
fn read_unsigned(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// A zigzag-coded variable-length integer.
fn read_varint(bytes: &[u8], at: &mut usize) -> Option<i64> {
    let value = read_unsigned(bytes, at)?;
    Some((value >> 1) as i64 ^ -((value & 1) as i64))
}

/// Decodes a source position table: pairs of deltas, the code offset's
/// (written as `encoding` says) then the position's (zigzag-coded). Code
/// offsets never decrease; a table that breaks that is not one. The first
/// delta counts from -1, the offset V8 gives a function's entry (a bytecode
/// table's first entry, where it has one).
pub(super) fn decode_table(bytes: &[u8], encoding: PositionEncoding) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let (mut at, mut code_offset, mut position) = (0usize, -1i64, 0i64);
    while at < bytes.len() {
        let delta = match encoding {
            PositionEncoding::Signed => {
                let delta = read_varint(bytes, &mut at).ok_or("a truncated code offset")?;
                if delta >= 0 {
                    delta
                } else {
                    -(delta + 1)
                }
            }
            PositionEncoding::Flagged => {
                let raw = read_unsigned(bytes, &mut at).ok_or("a truncated code offset")?;
                i64::try_from(raw >> 2).map_err(|_| "a code offset past range")?
            }
        };
        code_offset = code_offset
            .checked_add(delta)
            .ok_or("a code offset past range")?;
        let step = read_varint(bytes, &mut at).ok_or("a truncated position")?;
        position = position.wrapping_add(step);
        let (script_offset, inlining_id) = decode_source_position(position as u64);
        entries.push(Entry {
            code_offset,
            script_offset,
            inlining_id,
        });
    }
    Ok(entries)
}

/// Where an inlined function was called from: the call's position in its
/// caller (which may itself be inlined), and the function's index in the
/// deoptimization data's literal array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InliningPosition {
    script_offset: Option<u64>,
    caller: Option<u64>,
    function: u64,
}

/// What one Code object says of its instructions.
#[derive(Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// The Code (tagged) and the untagged address of its InstructionStream.
    pub code: u64,
    stream: u64,
    pub instruction_start: u64,
    /// Its own function's SharedFunctionInfo (tagged), when the code keeps
    /// it (optimized code does; baseline code does not).
    pub own: Option<u64>,
    entries: Vec<Entry>,
    inlining: Vec<InliningPosition>,
    /// The SharedFunctionInfos (tagged) of the functions it inlined.
    inlined_functions: Vec<u64>,
    /// Baseline code: its BytecodeArray and where each bytecode's
    /// instructions end (None: not baseline code).
    pub baseline: Option<Result<BaselineCode, String>>,
}

/// What baseline code keeps of its bytecodes: V8 compiles each bytecode in
/// order, and records how many bytes of instructions each one took.
#[derive(Debug, PartialEq, Eq)]
pub struct BaselineCode {
    /// The BytecodeArray (tagged).
    pub bytecode: u64,
    /// Where the prologue's instructions end (the first), then each
    /// bytecode's, in bytecode order: offsets from the instruction start.
    pub ends: Vec<u64>,
}

impl BaselineCode {
    /// Decodes V8's bytecode offset table of baseline code: one unsigned
    /// variable-length delta per bytecode, after the prologue's.
    fn decode(bytecode: u64, table: &[u8]) -> Result<BaselineCode, String> {
        let (mut at, mut end) = (0usize, 0u64);
        let mut ends = Vec::new();
        while at < table.len() {
            let delta = read_unsigned(table, &mut at).ok_or("a truncated bytecode offset table")?;
            end = end
                .checked_add(delta)
                .ok_or("an instruction offset past range")?;
            ends.push(end);
        }
        Ok(BaselineCode { bytecode, ends })
    }

    /// Which bytecode (by its index in bytecode order) the instruction at
    /// `offset` bytes into the code belongs to: None for the prologue and
    /// past the last bytecode. (Callers are looked up one byte before
    /// their return address, inside their call.)
    pub fn bytecode_index_at(&self, offset: u64) -> Option<usize> {
        let n = self.ends.partition_point(|&end| end <= offset);
        (n >= 1 && n < self.ends.len()).then(|| n - 1)
    }
}

/// The functions running at one instruction of a Code: those inlined
/// there, innermost first, each with the script offset it was at, and the
/// script offset of the code's own function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inlining {
    pub inlined: Vec<(u64, Option<u64>)>,
    pub own_offset: Option<u64>,
}

impl CodeInfo {
    /// The functions at `offset` bytes into the instructions.
    pub fn at(&self, offset: u64) -> Result<Inlining, String> {
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let n = self.entries.partition_point(|e| e.code_offset <= offset);
        let Some(entry) = n.checked_sub(1).map(|i| self.entries[i]) else {
            return Ok(Inlining::default());
        };
        let mut out = Inlining::default();
        let (mut script_offset, mut id) = (entry.script_offset, entry.inlining_id);
        // A caller's id need not be smaller than its callee's; a chain
        // longer than the table would be a cycle.
        while let Some(i) = id {
            if out.inlined.len() > self.inlining.len() {
                return Err("the inlining table has a cycle".into());
            }
            let p = self
                .inlining
                .get(i as usize)
                .ok_or_else(|| format!("inlining id {i} past the table"))?;
            let shared = *self
                .inlined_functions
                .get(p.function as usize)
                .ok_or_else(|| format!("inlined function {} past the table", p.function))?;
            out.inlined.push((shared, script_offset));
            script_offset = p.script_offset;
            id = p.caller;
        }
        out.own_offset = script_offset;
        Ok(out)
    }
}

/// Finds and reads the Code objects of one process's instructions.
pub struct CodeFinder {
    layout: CodeLayout,
    /// The map every InstructionStream has (tagged), once one was found.
    stream_map: Option<u64>,
    /// Lookup address -> its InstructionStream and Code, checked again at
    /// each use.
    by_pc: HashMap<u64, (u64, u64)>,
    codes: HashMap<u64, Arc<CodeInfo>>,
    /// Code (tagged) -> when it was last found in place, with the stream
    /// `codes` gives it.
    checked: HashMap<u64, Instant>,
    recheck_after: Duration,
}

impl CodeFinder {
    pub fn new(layout: CodeLayout) -> CodeFinder {
        CodeFinder {
            layout,
            stream_map: None,
            by_pc: HashMap::new(),
            codes: HashMap::new(),
            checked: HashMap::new(),
            recheck_after: RECHECK_AFTER,
        }
    }

    pub fn forget(&mut self) {
        self.by_pc.clear();
        self.codes.clear();
        self.checked.clear();
    }

    /// The Code whose instructions hold `pc`.
    pub fn code_at(&mut self, heap: &mut Heap<'_>, pc: u64) -> Result<Arc<CodeInfo>, HeapError> {
        if let Some(&(stream, code)) = self.by_pc.get(&pc) {
            // V8 frees and moves code: the stream must still be there and
            // still be that Code's.
            if let Some(info) = self.codes.get(&code).cloned() {
                if info.stream == stream && self.still_in_place(heap, stream, code) {
                    return Ok(info);
                }
            }
            self.by_pc.remove(&pc);
            self.checked.remove(&code);
        }
        let (stream, code) = self.find_stream(heap, pc)?;
        let info = match self.codes.get(&code) {
            Some(info) if info.stream == stream => info.clone(),
            _ => {
                let info = Arc::new(self.read_code(heap, stream, code)?);
                if self.codes.len() >= MAX_CACHED_CODES {
                    self.codes.clear();
                    self.by_pc.clear();
                    self.checked.clear();
                }
                self.codes.insert(code, info.clone());
                info
            }
        };
        if self.by_pc.len() >= MAX_CACHED_PCS {
            self.by_pc.clear();
        }
        self.by_pc.insert(pc, (stream, code));
        self.checked.insert(code, Instant::now());
        Ok(info)
    }

    /// still_stream_of() for `code` and the stream `codes` gives it, or
    /// its answer from less than `recheck_after` ago.
    fn still_in_place(&mut self, heap: &Heap<'_>, stream: u64, code: u64) -> bool {
        let now = Instant::now();
        if let Some(&at) = self.checked.get(&code) {
            if now.duration_since(at) < self.recheck_after {
                return true;
            }
        }
        if !self.still_stream_of(heap, stream, code) {
            return false;
        }
        self.checked.insert(code, now);
        true
    }

    /// Whether the stream at `stream` is still there and still `code`'s:
    /// its header read at once, then the Code's link back.
    fn still_stream_of(&self, heap: &Heap<'_>, stream: u64, code: u64) -> bool {
        let mut header = [0u8; 64];
        let len = (self.layout.instruction_stream_header as usize).min(header.len());
        if heap.memory.read(stream, &mut header[..len]).is_err() {
            return false;
        }
        let words: Vec<u64> = header[..len]
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
            .collect();
        if words.first().copied() != self.stream_map || !words.iter().skip(1).any(|&w| w == code) {
            return false;
        }
        let slots = &self.layout.code_stream_slots;
        let (Some(&first), Some(&last)) = (slots.iter().min(), slots.iter().max()) else {
            return false;
        };
        let mut fields = vec![0u8; (last - first + 8) as usize];
        if heap.memory.read(code - 1 + first, &mut fields).is_err() {
            return false;
        }
        slots.iter().any(|&slot| {
            let at = (slot - first) as usize;
            fields[at..at + 8] == (stream | 1).to_ne_bytes()
        })
    }

    /// Whether `word`, found where an InstructionStream would start, is
    /// the map of one.
    fn is_stream_map(&mut self, heap: &mut Heap<'_>, word: u64) -> bool {
        if let Some(map) = self.stream_map {
            return word == map;
        }
        // Until one stream is found, any word that could be a tagged
        // pointer is asked for its type (the first time only: types of
        // maps are remembered).
        word & 3 == 1
            && word < 1 << 47
            && heap.map_type(word).ok() == Some(self.layout.instruction_stream_type)
    }

    /// Looks back from `pc` for the InstructionStream that holds it: the
    /// nearest stream start below it whose Code points back at it and
    /// whose instructions cover `pc`. Returns the stream's address and its
    /// Code (tagged).
    fn find_stream(&mut self, heap: &mut Heap<'_>, pc: u64) -> Result<(u64, u64), HeapError> {
        let header = self.layout.instruction_stream_header;
        let limit = pc.saturating_sub(MAX_CODE_BYTES);
        let mut top = pc.checked_sub(header).ok_or(HeapError::NotAnObject {
            what: "instructions",
            word: pc,
        })? & !7;
        let mut page = vec![0u8; PAGE as usize];
        let mut false_starts = 0;
        while top >= limit && top > 0 && false_starts < MAX_FALSE_STARTS {
            let start = (top & !(PAGE - 1)).max(limit & !7);
            let len = (top + 8 - start) as usize;
            heap.memory.read(start, &mut page[..len])?;
            for at in (0..len).step_by(8).rev() {
                let word = u64::from_ne_bytes(page[at..at + 8].try_into().unwrap_or([0; 8]));
                if !self.is_stream_map(heap, word) {
                    continue;
                }
                let stream = start + at as u64;
                if let Some(found) = self.check_stream(heap, stream, pc)? {
                    self.stream_map = Some(word);
                    return Ok(found);
                }
                false_starts += 1;
                if false_starts >= MAX_FALSE_STARTS {
                    break;
                }
            }
            match start.checked_sub(8) {
                Some(t) => top = t,
                None => break,
            }
        }
        Err(HeapError::Invalid {
            what: "instructions",
            detail: format!("no InstructionStream holds {pc:#x}"),
        })
    }

    /// The stream at `stream` and its Code, when they point at each other
    /// and the instructions cover `pc`.
    fn check_stream(
        &mut self,
        heap: &mut Heap<'_>,
        stream: u64,
        pc: u64,
    ) -> Result<Option<(u64, u64)>, HeapError> {
        let l = &self.layout;
        let (header, code_type) = (l.instruction_stream_header, l.code_type);
        for slot in (8..header).step_by(8) {
            let word = heap.word(stream + slot)?;
            let Ok(code) = heap.typed("Code", word, (code_type, code_type)) else {
                continue;
            };
            let points_back = l
                .code_stream_slots
                .iter()
                .any(|&s| heap.field(code, s).ok() == Some(stream | 1));
            if !points_back {
                continue;
            }
            let start = stream + header;
            if let Some(at) = l.code_instruction_start {
                if heap.field(code, at)? != start {
                    continue;
                }
            }
            if let Some(at) = l.code_instruction_size {
                let size = u64::from(heap.field(code, at)? as u32);
                if pc >= start + size {
                    continue;
                }
            }
            if pc >= start {
                return Ok(Some((stream, word)));
            }
        }
        Ok(None)
    }

    /// The object in the first of `slots` of `code` whose type is one of
    /// `types`.
    fn slot_of_type(
        heap: &mut Heap<'_>,
        code: Object,
        slots: &[u64],
        types: &[u16],
    ) -> Result<Option<(u64, Object)>, HeapError> {
        for &slot in slots {
            let word = heap.field(code, slot)?;
            if let Ok(o) = heap.object("Code field", word) {
                if types.contains(&o.instance_type) {
                    return Ok(Some((word, o)));
                }
            }
        }
        Ok(None)
    }

    fn read_code(
        &mut self,
        heap: &mut Heap<'_>,
        stream: u64,
        code: u64,
    ) -> Result<CodeInfo, HeapError> {
        let l = self.layout.clone();
        let code_object = heap.typed("Code", code, (l.code_type, l.code_type))?;
        let mut info = CodeInfo {
            code,
            stream,
            instruction_start: stream + l.instruction_stream_header,
            own: None,
            entries: Vec::new(),
            inlining: Vec::new(),
            inlined_functions: Vec::new(),
            baseline: None,
        };
        // Baseline code keeps its bytecode where optimized code keeps its
        // deoptimization data, and a table of bytecode offsets where
        // optimized code keeps source positions: no inlining, and its own
        // function is the frame's.
        if let Some((bytecode, _)) = Self::slot_of_type(
            heap,
            code_object,
            &l.deoptimization_data_slots,
            &l.baseline_data_types,
        )? {
            let table = match Self::slot_of_type(
                heap,
                code_object,
                &l.position_table_slots,
                &l.byte_array_types,
            )? {
                Some((_, table)) => read_bytes(heap, table, "bytecode offset table")
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| BaselineCode::decode(bytecode, &bytes)),
                None => Err("baseline code without a bytecode offset table".into()),
            };
            info.baseline = Some(table);
            return Ok(info);
        }
        let Some((_, deopt)) = Self::slot_of_type(
            heap,
            code_object,
            &l.deoptimization_data_slots,
            &l.deoptimization_data_types,
        )?
        else {
            return Err(invalid("Code", "no deoptimization data"));
        };
        let length = heap.smi_field("deoptimization data", deopt, heap.meta.fixed_array_length)?;
        let length =
            u64::try_from(length).map_err(|_| invalid("deoptimization data", "negative length"))?;
        let element = |heap: &Heap<'_>, index: u64| -> Result<u64, HeapError> {
            if index >= length {
                return Err(invalid(
                    "deoptimization data",
                    format!("no slot {index} of {length}"),
                ));
            }
            heap.field(deopt, heap.meta.fixed_array_data + 8 * index)
        };
        // Code that cannot deoptimize has empty deoptimization data.
        if length == 0 {
            return Ok(info);
        }
        info.own = Some(match l.own_function {
            OwnFunction::Shared(index) => element(heap, index)?,
            OwnFunction::Wrapped {
                index,
                wrapper_type,
                shared_info,
            } => {
                let w = element(heap, index)?;
                let wrapper =
                    heap.typed("SharedFunctionInfoWrapper", w, (wrapper_type, wrapper_type))?;
                heap.field(wrapper, shared_info)?
            }
        });

        if let Some((_, table)) = Self::slot_of_type(
            heap,
            code_object,
            &l.position_table_slots,
            &l.byte_array_types,
        )? {
            info.entries = decode_table(
                &read_bytes(heap, table, "source position table")?,
                l.positions,
            )
            .map_err(|e| invalid("source position table", e))?;
        }
        let count = smi_value(element(heap, l.inlined_function_count)?)
            .and_then(|n| u64::try_from(n).ok())
            .filter(|&n| n <= MAX_INLINED)
            .ok_or_else(|| invalid("deoptimization data", "inlined function count"))?;
        if count == 0 {
            return Ok(info);
        }
        let literals_word = element(heap, l.literal_array)?;
        let literals =
            object_of_types(heap, "literal array", literals_word, &l.literal_array_types)?;
        let literal_count =
            heap.smi_field("literal array", literals, heap.meta.fixed_array_length)?;
        if literal_count < count as i64 {
            return Err(invalid(
                "literal array",
                format!("{literal_count} literals for {count} inlined functions"),
            ));
        }
        for i in 0..count {
            let w = heap.field(literals, heap.meta.fixed_array_data + 8 * i)?;
            // A weak reference is the pointer with bit 1 set as well.
            info.inlined_functions
                .push(if w & 3 == 3 { w & !2 } else { w });
        }
        let positions_word = element(heap, l.inlining_positions)?;
        let positions = object_of_types(
            heap,
            "inlining positions",
            positions_word,
            &l.byte_array_types,
        )?;
        let bytes = read_bytes(heap, positions, "inlining positions")?;
        if !(bytes.len() as u64).is_multiple_of(INLINING_POSITION_BYTES) {
            return Err(invalid(
                "inlining positions",
                format!("{} bytes", bytes.len()),
            ));
        }
        for p in bytes.chunks_exact(INLINING_POSITION_BYTES as usize) {
            let raw = u64::from_ne_bytes(p[..8].try_into().unwrap_or([0; 8]));
            let function = i32::from_ne_bytes(p[8..12].try_into().unwrap_or([0; 4]));
            let function = u64::try_from(function)
                .ok()
                .filter(|&f| f < count)
                .ok_or_else(|| {
                    invalid(
                        "inlining positions",
                        format!("function {function} of {count}"),
                    )
                })?;
            let (script_offset, caller) = decode_source_position(raw);
            info.inlining.push(InliningPosition {
                script_offset,
                caller,
                function,
            });
        }
        Ok(info)
    }
}

/// The object `word` points to, when its type is one of `types`.
fn object_of_types(
    heap: &mut Heap<'_>,
    what: &'static str,
    word: u64,
    types: &[u16],
) -> Result<Object, HeapError> {
    let o = heap.object(what, word)?;
    if types.contains(&o.instance_type) {
        Ok(o)
    } else {
        Err(HeapError::WrongType {
            what,
            found: o.instance_type,
        })
    }
}

pub(super) fn invalid(what: &'static str, detail: impl Into<String>) -> HeapError {
    HeapError::Invalid {
        what,
        detail: detail.into(),
    }
}

/// The bytes of a byte array: a Smi length after the map, then the bytes.
pub(super) fn read_bytes(
    heap: &Heap<'_>,
    array: Object,
    what: &'static str,
) -> Result<Vec<u8>, HeapError> {
    let len = heap.smi_field(what, array, heap.meta.fixed_array_length)?;
    let len = u64::try_from(len)
        .ok()
        .filter(|&n| n <= MAX_TABLE_BYTES)
        .ok_or_else(|| invalid(what, format!("length {len}")))?;
    let mut bytes = vec![0u8; len as usize];
    if len > 0 {
        heap.memory
            .read(array.address + heap.meta.fixed_array_data, &mut bytes)?;
    }
    Ok(bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::function::fake::{self, smi, FakeHeap};
    use super::super::metadata::Metadata;
    use super::*;
    use std::collections::HashMap;

    /// A SourcePosition at `offset` in the inlining `id` (None: the code's
    /// own function).
    pub(crate) fn position(offset: u64, id: Option<u64>) -> u64 {
        ((offset + 1) << 1) | (id.map_or(0, |i| i + 1) << 31)
    }

    fn put_varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let more = z >= 0x80;
            out.push((z & 0x7f) as u8 | if more { 0x80 } else { 0 });
            z >>= 7;
            if !more {
                break;
            }
        }
    }

    /// A source position table: (code offset, statement, position), its
    /// deltas counted from -1 as V8 counts them.
    pub(crate) fn table(entries: &[(u64, bool, u64)]) -> Vec<u8> {
        let (mut out, mut code, mut pos) = (Vec::new(), -1i64, 0i64);
        for &(c, statement, p) in entries {
            let delta = c as i64 - code;
            put_varint(&mut out, if statement { delta } else { -delta - 1 });
            put_varint(&mut out, p as i64 - pos);
            (code, pos) = (c as i64, p as i64);
        }
        out
    }

    pub(crate) fn byte_array(h: &mut FakeHeap, bytes: &[u8]) -> u64 {
        let a = h.object(
            fake::TRUSTED_BYTE_ARRAY_TYPE,
            1 + bytes.len() as u64 / 8 + 1,
        );
        h.set(a, 8, smi(bytes.len() as i64));
        for (i, b) in bytes.iter().enumerate() {
            let at = a - 1 + 16 + i as u64;
            let word = at & !7;
            let mut w = h.bytes[(word - fake::BASE) as usize..][..8].to_vec();
            w[(at - word) as usize] = *b;
            h.put(word, u64::from_ne_bytes(w.try_into().unwrap()));
        }
        a
    }

    pub(crate) fn array(h: &mut FakeHeap, t: u16, items: &[u64]) -> u64 {
        let a = h.object(t, 1 + items.len() as u64);
        h.set(a, 8, smi(items.len() as i64));
        for (i, &w) in items.iter().enumerate() {
            h.set(a, 16 + 8 * i as u64, w);
        }
        a
    }

    /// Optimized code of `own` (a SharedFunctionInfo) that inlined
    /// `middle` at script offset 50 of `own` and `leaf` at offset 80 of
    /// `middle`: instructions 0-15 are `own`'s (offset 5), 16-31
    /// `middle`'s (offset 60), 32-47 `leaf`'s (offset 90), 48 on `own`'s
    /// again (offset 10). Returns the Code (tagged) and where its
    /// instructions start.
    pub(crate) fn optimized_code(h: &mut FakeHeap, own: u64, middle: u64, leaf: u64) -> (u64, u64) {
        let positions = table(&[
            (0, true, position(5, None)),
            (16, false, position(60, Some(0))),
            (32, true, position(90, Some(1))),
            (48, false, position(10, None)),
        ]);
        let positions = byte_array(h, &positions);
        let mut inlining = Vec::new();
        for (call, caller, function) in [(50, None, 0u32), (80, Some(0), 1)] {
            inlining.extend_from_slice(&position(call, caller).to_ne_bytes());
            inlining.extend_from_slice(&function.to_ne_bytes());
            inlining.extend_from_slice(&[0; 4]);
        }
        let inlining = byte_array(h, &inlining);
        // The leaf is held weakly.
        let literals = array(h, fake::TRUSTED_WEAK_FIXED_ARRAY_TYPE, &[middle, leaf | 2]);
        let wrapper = h.object(fake::SFI_WRAPPER_TYPE, 1);
        h.set(wrapper, 8, own);
        let mut deopt = vec![smi(0); 9];
        deopt[1] = smi(2);
        deopt[3] = literals;
        deopt[7] = wrapper;
        deopt[8] = inlining;
        let deopt = array(h, fake::PROTECTED_FIXED_ARRAY_TYPE, &deopt);

        // Junk before the stream, some of it looking like tagged words.
        let junk = h.alloc(64);
        for i in 0..8 {
            h.put(junk + 8 * i, 0x4141_4141_0001 + 16 * i);
        }
        let stream = h.object(fake::INSTRUCTION_STREAM_TYPE, 3 + 16);
        let code = h.object(fake::CODE_TYPE, 8);
        let start = stream - 1 + 0x20;
        h.set(stream, 8, code);
        // Instructions that look like tagged words too.
        for i in 0..16 {
            h.put(start + 8 * i, 0x4242_4242_0001 + 16 * i);
        }
        h.set(code, 0x8, deopt);
        h.set(code, 0x10, positions);
        h.set(code, 0x20, stream);
        h.set(code, 0x28, start);
        h.put_u32(code - 1 + 0x38, 128);
        (code, start)
    }

    fn sfi(h: &mut FakeHeap, name: &str) -> u64 {
        let name = h.one_byte(name);
        let undefined = h.undefined;
        h.function(name, undefined).1
    }

    /// The SharedFunctionInfos of `outer`, `middle` and `leaf`.
    fn three_functions(h: &mut FakeHeap) -> (u64, u64, u64) {
        (sfi(h, "outer"), sfi(h, "middle"), sfi(h, "leaf"))
    }

    /// The Code holding `pc`, found by a new finder.
    fn fresh_code_at(h: &FakeHeap, pc: u64) -> Result<Arc<CodeInfo>, HeapError> {
        let meta: Metadata = fake::metadata(true);
        let mut types = HashMap::new();
        let mut finder = CodeFinder::new(meta.code.clone().unwrap());
        let result = finder.code_at(&mut Heap::new(h, &meta, &mut types), pc);
        result
    }

    fn word_at(h: &FakeHeap, addr: u64) -> u64 {
        u64::from_ne_bytes(
            h.bytes[(addr - fake::BASE) as usize..][..8]
                .try_into()
                .unwrap(),
        )
    }

    #[test]
    fn source_positions_decode_as_v8_packs_them() {
        assert_eq!(
            decode_source_position(position(212, None)),
            (Some(212), None)
        );
        assert_eq!(
            decode_source_position(position(0, Some(3))),
            (Some(0), Some(3))
        );
        // No position, and an external one.
        assert_eq!(decode_source_position(0), (None, None));
        assert_eq!(decode_source_position(position(7, None) | 1), (None, None));
        let bytes = table(&[
            (0, true, position(5, None)),
            (300, false, position(2, Some(1))),
        ]);
        let entries = decode_table(&bytes, PositionEncoding::Signed).unwrap();
        assert_eq!(
            entries[1],
            Entry {
                code_offset: 300,
                script_offset: Some(2),
                inlining_id: Some(1)
            }
        );
        // The start of a bytecode table as Node.js 24 wrote it: the
        // function's entry (-1, an expression), then a statement at 0.
        let start = |bytes: &[u8], encoding| -> Vec<_> {
            decode_table(bytes, encoding)
                .unwrap()
                .iter()
                .map(|e| (e.code_offset, e.script_offset))
                .collect()
        };
        assert_eq!(
            start(&[0x01, 0x30, 0x02, 0x38], PositionEncoding::Signed),
            [(-1, Some(11)), (0, Some(25))]
        );
        // The same two entries as Node.js 26 wrote them (V8 14): the code
        // offset's delta shifted by two, the entries breakable.
        assert_eq!(
            start(&[0x02, 0x2c, 0x07, 0x38], PositionEncoding::Flagged),
            [(-1, Some(10)), (0, Some(24))]
        );
        // Cut mid-number.
        assert!(decode_table(&bytes[..bytes.len() - 1], PositionEncoding::Signed).is_err());
        assert!(decode_table(&[0x80; 12], PositionEncoding::Signed).is_err());
    }

    #[test]
    fn finds_the_code_of_an_instruction_and_what_it_inlined() {
        let mut h = FakeHeap::new();
        let (own, middle, leaf) = three_functions(&mut h);
        let (code, start) = optimized_code(&mut h, own, middle, leaf);
        let meta: Metadata = fake::metadata(true);
        let mut types = HashMap::new();
        let mut finder = CodeFinder::new(meta.code.clone().unwrap());
        let mut heap = Heap::new(&h, &meta, &mut types);
        let info = finder.code_at(&mut heap, start + 40).unwrap();
        assert_eq!((info.instruction_start, info.own), (start, Some(own)));
        let at = |offset| info.at(offset).unwrap();
        assert_eq!(
            at(40),
            Inlining {
                inlined: vec![(leaf, Some(90)), (middle, Some(80))],
                own_offset: Some(50)
            }
        );
        assert_eq!(
            at(20),
            Inlining {
                inlined: vec![(middle, Some(60))],
                own_offset: Some(50)
            }
        );
        assert_eq!(
            at(0),
            Inlining {
                inlined: vec![],
                own_offset: Some(5)
            }
        );
        assert_eq!(
            at(100),
            Inlining {
                inlined: vec![],
                own_offset: Some(10)
            }
        );
        // Found again from the cache, and from another instruction.
        assert_eq!(finder.code_at(&mut heap, start + 40).unwrap(), info);
        assert_eq!(
            finder.code_at(&mut heap, start + 127).unwrap().own,
            Some(own)
        );
        // Past the instructions, before them: not this code.
        assert!(finder.code_at(&mut heap, start + 128).is_err());

        // Code freed and its stream's place reused: not named from the
        // old tables once the last check is older than the window.
        h.set(code, 0x20, 0);
        let mut heap = Heap::new(&h, &meta, &mut types);
        assert!(finder.code_at(&mut heap, start + 40).is_ok());
        finder.recheck_after = Duration::ZERO;
        assert!(finder.code_at(&mut heap, start + 40).is_err());
    }

    #[test]
    fn damaged_tables_are_errors_not_frames() {
        let mut h = FakeHeap::new();
        let (own, middle, leaf) = three_functions(&mut h);
        let (code, start) = optimized_code(&mut h, own, middle, leaf);
        let deopt = word_at(&h, code - 1 + 8);
        // An inlining that names itself as its own caller.
        let inlining = word_at(&h, deopt - 1 + 16 + 64);
        h.put(inlining - 1 + 16 + 16, position(80, Some(1)));
        let info = fresh_code_at(&h, start + 40).unwrap();
        assert!(info.at(40).unwrap_err().contains("cycle"));
        // An inlined function index past the literals.
        h.put_u32(inlining - 1 + 16 + 8, 9);
        assert!(fresh_code_at(&h, start + 40).is_err());
        // Deoptimization data of the wrong type.
        let not_deopt = h.object(fake::FIXED_ARRAY_TYPE, 2);
        h.set(code, 8, not_deopt);
        assert!(fresh_code_at(&h, start + 40).is_err());
    }

    #[test]
    fn baseline_code_keeps_no_function_of_its_own() {
        let mut h = FakeHeap::new();
        let (own, middle, leaf) = three_functions(&mut h);
        let (code, start) = optimized_code(&mut h, own, middle, leaf);
        let bytecode = h.object(fake::BYTECODE_ARRAY_TYPE, 4);
        h.set(code, 8, bytecode);
        let info = fresh_code_at(&h, start + 8).unwrap();
        assert_eq!(info.own, None);
        assert_eq!(info.at(40).unwrap(), Inlining::default());
    }

    #[test]
    fn baseline_instructions_belong_to_their_bytecode() {
        // The prologue's 10 bytes, then bytecodes of 5, 0 and 200 bytes.
        let table = [10, 5, 0, 0xc8, 0x01];
        let code = BaselineCode::decode(7, &table).unwrap();
        assert_eq!(code.ends, [10, 15, 15, 215]);
        let index = |offset| code.bytecode_index_at(offset);
        assert_eq!([index(0), index(9)], [None, None]);
        assert_eq!([index(10), index(14)], [Some(0), Some(0)]);
        // A bytecode that compiled to nothing has no instruction.
        assert_eq!([index(15), index(214)], [Some(2), Some(2)]);
        assert_eq!(index(215), None);
        assert!(BaselineCode::decode(7, &[10, 0x80]).is_err());
    }
}
