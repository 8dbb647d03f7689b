//! From a JSFunction to what names it: its SharedFunctionInfo's name, its
//! script's URL, and the line and column where the function starts (the
//! same place V8's perf map names).

use std::collections::HashMap;
use std::sync::Arc;

use otel_thread_ctx_abi::node_schema::smi_value;
use otel_thread_ctx_reader::memory::Memory;

use super::heap::{Heap, HeapError, Object, MAX_NAME_UNITS};
use super::metadata::{Metadata, MAX_CONTEXT_LOCALS};

/// Bytes of one tagged slot (checked against the metadata).
const SLOT: u64 = 8;

/// Slots after a ScopeInfo's context locals that may hold the function's
/// name: the receiver's slot, the function variable (name and slot), and
/// the inferred name.
const NAME_SLOTS: u64 = 4;

/// Slots after the context locals searched for the start and end
/// positions where the ScopeInfo keeps them after its variable part.
const POSITION_SLOTS: u64 = 8;

/// Longest script source whose line ends are computed here (in UTF-16
/// code units) when V8 has not computed them itself.
pub const MAX_SOURCE_UNITS: u64 = 16 << 20;

/// Most lines a script's line ends are kept for (V8's own table or the
/// source's), and most kept for all scripts together: a target's memory
/// decides what is read, so what is kept is bounded.
pub const MAX_LINES: u64 = 1 << 20;
const MAX_CACHED_LINES: usize = 4 << 20;

/// Most functions and scripts remembered; each cache is emptied past it.
const MAX_CACHED_FUNCTIONS: usize = 1 << 16;
const MAX_CACHED_SCRIPTS: usize = 4096;

/// What names a JavaScript function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsFunction {
    /// `(anonymous)` when V8 has neither a name nor an inferred one.
    pub name: String,
    /// The script's name (a path, a `file:` or `node:` URL); empty when it
    /// has none (eval'd code).
    pub url: String,
    /// 1-based line and column of the function's start, when known.
    pub position: Option<(u32, u32)>,
    /// Its script's line ends, when they could be read: the line of a
    /// position in the function ([`JsFunction::line_at`]).
    pub line_ends: Option<Arc<[u32]>>,
}

impl JsFunction {
    /// The 1-based line of `offset` (UTF-16 code units from the start of
    /// the function's script).
    pub fn line_at(&self, offset: u64) -> Option<u32> {
        line_and_column(self.line_ends.as_deref()?, offset).map(|(line, _)| line)
    }

    /// The frame's name in the form the perf map's entries are read in
    /// (see [`crate::perf_map::function_name`]): `JS:name url:line:column`.
    pub fn frame_name(&self) -> String {
        let mut s = format!("JS:{}", self.name);
        if !self.url.is_empty() || self.position.is_some() {
            s.push(' ');
            s.push_str(&self.url);
        }
        if let Some((line, column)) = self.position {
            s.push_str(&format!(":{line}:{column}"));
        }
        s
    }
}

/// A script: its name and, when they could be read, its line ends (the
/// position of each line's terminator).
struct Script {
    url: String,
    line_ends: Option<Arc<[u32]>>,
}

/// Names JavaScript functions of one process, remembering what it read:
/// SharedFunctionInfos (by their address) and scripts.
pub struct Resolver {
    meta: Metadata,
    map_types: HashMap<u64, u16>,
    functions: HashMap<u64, Arc<JsFunction>>,
    scripts: HashMap<u64, Arc<Script>>,
}

impl Resolver {
    pub fn new(meta: Metadata) -> Resolver {
        Resolver {
            meta,
            map_types: HashMap::new(),
            functions: HashMap::new(),
            scripts: HashMap::new(),
        }
    }

    /// Forgets every object read.
    pub fn forget(&mut self) {
        self.map_types.clear();
        self.functions.clear();
        self.scripts.clear();
    }

    /// Whether the tagged word `word` points to an object of type `t`.
    pub fn is_of_type(&mut self, memory: &dyn Memory, word: u64, t: u16) -> bool {
        Heap::new(memory, &self.meta, &mut self.map_types)
            .typed("object", word, (t, t))
            .is_ok()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// Names the JSFunction the tagged word `js_function` points to.
    pub fn function(
        &mut self,
        memory: &dyn Memory,
        js_function: u64,
    ) -> Result<Arc<JsFunction>, HeapError> {
        let mut heap = Heap::new(memory, &self.meta, &mut self.map_types);
        let function = heap.typed("JSFunction", js_function, self.meta.js_function_types)?;
        let shared = heap.field(function, self.meta.js_function_shared)?;
        self.shared(memory, shared)
    }

    /// A reader of the heap behind `memory` with this binary's layout.
    pub fn heap<'a>(&'a mut self, memory: &'a dyn Memory) -> Heap<'a> {
        Heap::new(memory, &self.meta, &mut self.map_types)
    }

    /// Names the SharedFunctionInfo the tagged word `shared` points to.
    pub fn shared(
        &mut self,
        memory: &dyn Memory,
        shared: u64,
    ) -> Result<Arc<JsFunction>, HeapError> {
        let mut heap = Heap::new(memory, &self.meta, &mut self.map_types);
        let sfi_type = self.meta.shared_function_info_type;
        let sfi = heap.typed("SharedFunctionInfo", shared, (sfi_type, sfi_type))?;
        if let Some(known) = self.functions.get(&shared) {
            return Ok(known.clone());
        }
        let named = Arc::new(read_function(&mut heap, sfi, &mut self.scripts)?);
        if self.functions.len() >= MAX_CACHED_FUNCTIONS {
            self.functions.clear();
        }
        self.functions.insert(shared, named.clone());
        Ok(named)
    }
}

/// What a ScopeInfo says of its function.
#[derive(Debug, Default, PartialEq, Eq)]
struct ScopeFacts {
    name: Option<String>,
    /// Start and end, in UTF-16 code units from the script's start.
    positions: Option<(u64, u64)>,
}

fn read_function(
    heap: &mut Heap<'_>,
    sfi: Object,
    scripts: &mut HashMap<u64, Arc<Script>>,
) -> Result<JsFunction, HeapError> {
    let meta = heap.meta;
    let name_or_scope = heap.field(sfi, meta.sfi_name_or_scope_info)?;
    let facts = if smi_value(name_or_scope).is_some() {
        // No shared name (the sentinel Smi).
        ScopeFacts::default()
    } else {
        let o = heap.object("SharedFunctionInfo name", name_or_scope)?;
        if heap.is_string(o) {
            ScopeFacts {
                name: Some(heap.string(name_or_scope, MAX_NAME_UNITS)?),
                positions: None,
            }
        } else if o.instance_type == meta.scope_info_type {
            read_scope_info(heap, o)?
        } else {
            return Err(HeapError::WrongType {
                what: "SharedFunctionInfo name",
                found: o.instance_type,
            });
        }
    };
    let script_word = heap.field(sfi, meta.sfi_script)?;
    // Functions without a script (builtins' own, API functions) have
    // `undefined` there.
    let script = match heap.object("script", script_word) {
        Ok(o) if o.instance_type == meta.script_type => {
            Some(read_script(heap, o, script_word, scripts)?)
        }
        _ => None,
    };
    let position = match (&script, facts.positions) {
        (Some(script), Some((start, _))) => script
            .line_ends
            .as_deref()
            .and_then(|ends| line_and_column(ends, start)),
        _ => None,
    };
    let name = facts.name.filter(|n| !n.is_empty());
    Ok(JsFunction {
        name: name.unwrap_or_else(|| "(anonymous)".to_string()),
        url: script.as_ref().map(|s| s.url.clone()).unwrap_or_default(),
        line_ends: script.and_then(|s| s.line_ends.clone()),
        position,
    })
}

/// Reads a function's name (its own, else the one V8 inferred) and its
/// positions from its ScopeInfo.
///
/// The slots after the fixed ones: the context locals' names (inline, or
/// one hash table when there are many) and their Smi infos; then, for a
/// function, the receiver's and the function variable's slots, the
/// inferred name (a string, or `undefined`), and before V8 12.8 the start
/// and end positions. Which optional slots are there is coded in flag bits
/// the metadata does not describe, so they are recognized by their kinds:
/// every step checks what it reads and fails rather than guesses.
fn read_scope_info(heap: &mut Heap<'_>, scope: Object) -> Result<ScopeFacts, HeapError> {
    let meta = heap.meta;
    let base = scope.address + SLOT;
    let count_slot = meta.scope_info_context_local_count;
    let locals = heap.smi_field("ScopeInfo", scope, SLOT + count_slot * SLOT)?;
    let locals = u64::try_from(locals)
        .ok()
        .filter(|&n| n <= MAX_CONTEXT_LOCALS)
        .ok_or_else(|| HeapError::Invalid {
            what: "ScopeInfo",
            detail: format!("{locals} context locals"),
        })?;
    let first_vars = meta.scope_info_first_vars;
    // The slots past the ScopeInfo's end belong to the next object, or
    // to no page at all at the end of its page: then fewer are read.
    let mut slots_read = first_vars + 2 * locals + NAME_SLOTS + POSITION_SLOTS;
    let mut bytes = vec![0u8; (slots_read * SLOT) as usize];
    if heap.memory.read(base, &mut bytes).is_err() {
        slots_read = first_vars + 2 * locals + NAME_SLOTS;
        bytes.truncate((slots_read * SLOT) as usize);
        heap.memory.read(base, &mut bytes)?;
    }
    let slot = |i: u64| -> u64 {
        let at = (i * SLOT) as usize;
        u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
    };
    // Inline names are strings; a hash table of names is not.
    let inline_names = locals > 0 && {
        let first = slot(first_vars);
        heap.object("context local name", first)
            .is_ok_and(|o| heap.is_string(o))
    };
    let after_locals = if inline_names {
        first_vars + 2 * locals
    } else if locals > 0 {
        first_vars + 1 + locals
    } else {
        first_vars
    };
    if (after_locals - locals..after_locals).any(|i| smi_value(slot(i)).is_none()) {
        return Err(HeapError::Invalid {
            what: "ScopeInfo",
            detail: "context local infos are not Smis".into(),
        });
    }
    let mut facts = ScopeFacts::default();
    // The function's own name, else the inferred one: the first string
    // that is not empty.
    for i in after_locals..after_locals + NAME_SLOTS {
        let word = slot(i);
        if smi_value(word).is_some() {
            continue;
        }
        let Ok(o) = heap.object("function name", word) else {
            continue;
        };
        if heap.is_string(o) {
            let name = heap.string(word, MAX_NAME_UNITS)?;
            if !name.is_empty() {
                facts.name = Some(name);
                break;
            }
        }
    }
    facts.positions = if meta.scope_info_has_fixed_positions() {
        positions(
            smi_value(slot(count_slot + 1)),
            smi_value(slot(count_slot + 2)),
        )
    } else {
        // Two Smis right after the inferred name (a string, or
        // `undefined`: an object either way).
        (after_locals..slots_read - 2)
            .filter(|&i| smi_value(slot(i)).is_none())
            .find_map(|i| positions(smi_value(slot(i + 1)), smi_value(slot(i + 2))))
    };
    Ok(facts)
}

fn positions(start: Option<i64>, end: Option<i64>) -> Option<(u64, u64)> {
    let start = u64::try_from(start?).ok()?;
    let end = u64::try_from(end?).ok()?;
    (start <= end).then_some((start, end))
}

fn read_script(
    heap: &mut Heap<'_>,
    script: Object,
    tagged: u64,
    scripts: &mut HashMap<u64, Arc<Script>>,
) -> Result<Arc<Script>, HeapError> {
    if let Some(known) = scripts.get(&tagged) {
        return Ok(known.clone());
    }
    let meta = heap.meta;
    let name = heap.field(script, meta.script_name)?;
    let url = heap.string(name, MAX_NAME_UNITS).unwrap_or_default();
    let line_ends = read_line_ends(heap, script).ok().map(Arc::from);
    let read = Arc::new(Script { url, line_ends });
    let cached_lines: usize = scripts
        .values()
        .filter_map(|s| s.line_ends.as_ref().map(|e| e.len()))
        .sum();
    let lines = read.line_ends.as_ref().map_or(0, |e| e.len());
    if scripts.len() >= MAX_CACHED_SCRIPTS || cached_lines + lines > MAX_CACHED_LINES {
        scripts.clear();
    }
    scripts.insert(tagged, read.clone());
    Ok(read)
}

/// The script's line ends: V8's own table when it computed one, else
/// computed from the source.
fn read_line_ends(heap: &mut Heap<'_>, script: Object) -> Result<Vec<u32>, HeapError> {
    let meta = heap.meta;
    let table = heap.field(script, meta.script_line_ends)?;
    if let Ok(array) = heap.object("line ends", table) {
        if array.instance_type == meta.fixed_array_type {
            let n = heap.smi_field("line ends", array, meta.fixed_array_length)?;
            let n = u64::try_from(n)
                .ok()
                .filter(|&n| n <= MAX_LINES)
                .ok_or_else(|| HeapError::Invalid {
                    what: "line ends",
                    detail: format!("{n} entries"),
                })?;
            let mut bytes = vec![0u8; (n * SLOT) as usize];
            heap.memory
                .read(array.address + meta.fixed_array_data, &mut bytes)?;
            return bytes
                .chunks_exact(8)
                .map(|w| {
                    let w = u64::from_ne_bytes(w.try_into().expect("eight bytes"));
                    smi_value(w)
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| HeapError::Invalid {
                            what: "line ends",
                            detail: format!("{w:#x} is not a position"),
                        })
                })
                .collect();
        }
    }
    let source = heap.field(script, meta.script_source)?;
    let source = heap.object("source", source)?;
    if !heap.is_string(source) {
        return Err(HeapError::WrongType {
            what: "source",
            found: source.instance_type,
        });
    }
    let len = heap.string_length(source)?;
    if len > MAX_SOURCE_UNITS {
        return Err(HeapError::Invalid {
            what: "source",
            detail: format!("{len} units"),
        });
    }
    let mut ends = LineEnds::default();
    heap.visit(source, 0, len, 0, &mut |chunk| ends.feed(chunk))?;
    if ends.ends.len() as u64 > MAX_LINES {
        return Err(HeapError::Invalid {
            what: "source",
            detail: format!("more than {MAX_LINES} lines"),
        });
    }
    Ok(ends.ends)
}

/// Line terminators as V8 counts them: `\n`, `\r` not followed by `\n`,
/// U+2028 and U+2029.
#[derive(Default)]
struct LineEnds {
    ends: Vec<u32>,
    at: u32,
    pending_cr: bool,
}

impl LineEnds {
    fn feed(&mut self, units: &[u16]) {
        if self.ends.len() as u64 > MAX_LINES {
            return;
        }
        for &u in units {
            if self.pending_cr {
                self.pending_cr = false;
                if u != u16::from(b'\n') {
                    self.ends.push(self.at - 1);
                }
            }
            match u {
                0x0a | 0x2028 | 0x2029 => self.ends.push(self.at),
                0x0d => self.pending_cr = true,
                _ => {}
            }
            self.at = self.at.wrapping_add(1);
        }
    }
}

/// 1-based line and column of `position` given the line ends.
fn line_and_column(ends: &[u32], position: u64) -> Option<(u32, u32)> {
    let position = u32::try_from(position).ok()?;
    let line = ends.partition_point(|&end| end < position);
    let line_start = match line {
        0 => 0,
        _ => ends[line - 1] + 1,
    };
    let column = position.checked_sub(line_start)?;
    Some((u32::try_from(line).ok()? + 1, column + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_count_from_one() {
        let mut ends = LineEnds::default();
        ends.feed(&"ab\ncd\r\nef\rg".encode_utf16().collect::<Vec<_>>());
        assert_eq!(ends.ends, [2, 6, 9]);
        assert_eq!(line_and_column(&ends.ends, 0), Some((1, 1)));
        assert_eq!(line_and_column(&ends.ends, 1), Some((1, 2)));
        assert_eq!(line_and_column(&ends.ends, 3), Some((2, 1)));
        assert_eq!(line_and_column(&ends.ends, 7), Some((3, 1)));
        assert_eq!(line_and_column(&ends.ends, 10), Some((4, 1)));
    }

    #[test]
    fn frame_names_read_like_the_perf_map() {
        let f = JsFunction {
            name: "burnCpuHot".into(),
            url: "/app/hot.js".into(),
            position: Some((1, 20)),
            line_ends: None,
        };
        assert_eq!(f.frame_name(), "JS:burnCpuHot /app/hot.js:1:20");
        let anonymous = JsFunction {
            name: "(anonymous)".into(),
            url: "node:internal/main/run_main_module".into(),
            position: None,
            line_ends: None,
        };
        assert_eq!(
            anonymous.frame_name(),
            "JS:(anonymous) node:internal/main/run_main_module"
        );
    }
}

/// A V8 heap laid out in a buffer, for the tests of this module and its
/// callers.
#[cfg(test)]
pub(crate) mod fake {
    use super::super::metadata::{
        BytecodeLayout, CodeLayout, OwnFunction, PositionEncoding, StringFields, StringTags,
    };
    use super::*;
    use otel_thread_ctx_reader::memory::MemoryError;

    pub const BASE: u64 = 0x10_0000;
    const SIZE: usize = 1 << 20;

    pub const MAP_TYPE: u16 = 272;
    pub const JS_FUNCTION_TYPE: u16 = 2065;
    pub const SFI_TYPE: u16 = 282;
    pub const SCOPE_INFO_TYPE: u16 = 280;
    pub const SCRIPT_TYPE: u16 = 167;
    pub const FIXED_ARRAY_TYPE: u16 = 205;
    pub const BYTECODE_ARRAY_TYPE: u16 = 186;
    pub const ODDBALL_TYPE: u16 = 131;
    pub const SEQ_ONE_BYTE_TYPE: u16 = 8;
    pub const CODE_TYPE: u16 = 187;
    pub const INSTRUCTION_STREAM_TYPE: u16 = 192;
    pub const PROTECTED_FIXED_ARRAY_TYPE: u16 = 193;
    pub const SFI_WRAPPER_TYPE: u16 = 195;
    pub const TRUSTED_BYTE_ARRAY_TYPE: u16 = 196;
    pub const TRUSTED_WEAK_FIXED_ARRAY_TYPE: u16 = 199;
    pub const SEQ_TWO_BYTE_TYPE: u16 = 0;
    pub const CONS_ONE_BYTE_TYPE: u16 = 9;

    /// The layout of Node.js 24's metadata (positions in fixed ScopeInfo
    /// slots) or, with `fixed_positions` false, Node.js 22's.
    pub fn metadata(fixed_positions: bool) -> Metadata {
        Metadata {
            fp_function: -16,
            fp_context: -8,
            fp_bytecode_array: Some(-32),
            fp_bytecode_offset: Some(-40),
            heap_object_map: 0,
            map_instance_type: 12,
            map_type: MAP_TYPE,
            js_function_types: (JS_FUNCTION_TYPE, JS_FUNCTION_TYPE + 16),
            js_function_shared: 32,
            shared_function_info_type: SFI_TYPE,
            sfi_name_or_scope_info: 24,
            sfi_script: 40,
            scope_info_type: SCOPE_INFO_TYPE,
            scope_info_context_local_count: 2,
            scope_info_first_vars: if fixed_positions { 5 } else { 3 },
            script_type: SCRIPT_TYPE,
            script_name: 16,
            script_source: 8,
            script_line_ends: 56,
            fixed_array_type: FIXED_ARRAY_TYPE,
            bytecode_array_type: Some(BYTECODE_ARRAY_TYPE),
            fixed_array_length: 8,
            fixed_array_data: 16,
            string_tags: StringTags {
                first_nonstring_type: 128,
                representation_mask: 7,
                encoding_mask: 8,
                seq: 0,
                cons: 1,
                sliced: 3,
                thin: 5,
                external: 2,
                one_byte: 8,
                two_byte: 0,
            },
            string_fields: StringFields {
                length: 12,
                seq_one_byte_chars: 16,
                seq_two_byte_chars: 16,
                cons_first: 16,
                cons_second: 24,
                sliced_parent: 16,
                sliced_offset: 24,
                thin_actual: 16,
            },
            code: Ok(code_layout()),
            bytecode: Ok(BytecodeLayout {
                data: 64,
                table_slots: [24, 32, 40],
                byte_array_types: vec![TRUSTED_BYTE_ARRAY_TYPE],
                fixed_array_types: vec![FIXED_ARRAY_TYPE],
                positions: PositionEncoding::Signed,
                sizes: Err("no table".into()),
            }),
        }
    }

    /// Node.js 24's code layout.
    pub fn code_layout() -> CodeLayout {
        CodeLayout {
            instruction_stream_type: INSTRUCTION_STREAM_TYPE,
            instruction_stream_header: 0x20,
            code_type: CODE_TYPE,
            code_instruction_start: Some(0x28),
            code_instruction_size: Some(0x38),
            code_stream_slots: vec![0x20],
            position_table_slots: vec![0x8, 0x10],
            deoptimization_data_slots: vec![0x8, 0x10],
            byte_array_types: vec![TRUSTED_BYTE_ARRAY_TYPE],
            positions: PositionEncoding::Signed,
            deoptimization_data_types: vec![PROTECTED_FIXED_ARRAY_TYPE],
            literal_array_types: vec![TRUSTED_WEAK_FIXED_ARRAY_TYPE],
            baseline_data_types: vec![BYTECODE_ARRAY_TYPE],
            inlined_function_count: 1,
            literal_array: 3,
            inlining_positions: 8,
            own_function: OwnFunction::Wrapped {
                index: 7,
                wrapper_type: SFI_WRAPPER_TYPE,
                shared_info: 8,
            },
        }
    }

    pub fn smi(v: i64) -> u64 {
        (v as u64) << 32
    }

    /// Objects allocated upwards from [`BASE`]; every object's first word
    /// is its map (tagged).
    pub struct FakeHeap {
        pub bytes: Vec<u8>,
        next: u64,
        maps: HashMap<u16, u64>,
        pub undefined: u64,
    }

    impl FakeHeap {
        pub fn new() -> FakeHeap {
            let mut h = FakeHeap {
                bytes: vec![0; SIZE],
                next: BASE,
                maps: HashMap::new(),
                undefined: 0,
            };
            // The meta map: its own map.
            let meta = h.alloc(16);
            h.put(meta, meta | 1);
            h.put_u16(meta + 12, MAP_TYPE);
            h.maps.insert(MAP_TYPE, meta | 1);
            let undefined = h.object(ODDBALL_TYPE, 2);
            h.undefined = undefined;
            h
        }

        pub fn alloc(&mut self, bytes: u64) -> u64 {
            let at = self.next;
            self.next += bytes.div_ceil(8) * 8 + 8;
            at
        }

        pub fn put(&mut self, addr: u64, word: u64) {
            let at = (addr - BASE) as usize;
            self.bytes[at..at + 8].copy_from_slice(&word.to_ne_bytes());
        }

        pub fn put_u16(&mut self, addr: u64, v: u16) {
            let at = (addr - BASE) as usize;
            self.bytes[at..at + 2].copy_from_slice(&v.to_ne_bytes());
        }

        pub fn put_u32(&mut self, addr: u64, v: u32) {
            let at = (addr - BASE) as usize;
            self.bytes[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        }

        /// The (tagged) map of instance type `t`.
        pub fn map(&mut self, t: u16) -> u64 {
            if let Some(&m) = self.maps.get(&t) {
                return m;
            }
            let meta = self.maps[&MAP_TYPE];
            let m = self.alloc(16);
            self.put(m, meta);
            self.put_u16(m + 12, t);
            self.maps.insert(t, m | 1);
            m | 1
        }

        /// A new object of type `t` with `slots` words after its map;
        /// returns it tagged.
        pub fn object(&mut self, t: u16, slots: u64) -> u64 {
            let map = self.map(t);
            let o = self.alloc(8 * (slots + 1));
            self.put(o, map);
            o | 1
        }

        pub fn set(&mut self, tagged: u64, offset: u64, word: u64) {
            self.put(tagged - 1 + offset, word);
        }

        pub fn one_byte(&mut self, s: &str) -> u64 {
            let o = self.object(SEQ_ONE_BYTE_TYPE, 2 + s.len() as u64 / 8);
            self.put_u32(o - 1 + 12, s.len() as u32);
            let at = (o - 1 + 16 - BASE) as usize;
            self.bytes[at..at + s.len()].copy_from_slice(s.as_bytes());
            o
        }

        pub fn two_byte(&mut self, s: &str) -> u64 {
            let units: Vec<u16> = s.encode_utf16().collect();
            let o = self.object(SEQ_TWO_BYTE_TYPE, 2 + units.len() as u64 / 4);
            self.put_u32(o - 1 + 12, units.len() as u32);
            for (i, u) in units.iter().enumerate() {
                self.put_u16(o - 1 + 16 + 2 * i as u64, *u);
            }
            o
        }

        pub fn cons(&mut self, first: &str, second: &str) -> u64 {
            let (a, b) = (self.one_byte(first), self.one_byte(second));
            let o = self.object(CONS_ONE_BYTE_TYPE, 3);
            self.put_u32(o - 1 + 12, (first.len() + second.len()) as u32);
            self.set(o, 16, a);
            self.set(o, 24, b);
            o
        }

        /// A script named `url` whose source is `source`, with V8's line
        /// ends table when `with_line_ends`.
        pub fn script(&mut self, url: &str, source: u64, line_ends: Option<&[u32]>) -> u64 {
            let script = self.object(SCRIPT_TYPE, 12);
            let name = self.one_byte(url);
            self.set(script, 16, name);
            self.set(script, 8, source);
            let ends = match line_ends {
                Some(ends) => {
                    let array = self.object(FIXED_ARRAY_TYPE, 1 + ends.len() as u64);
                    self.set(array, 8, smi(ends.len() as i64));
                    for (i, &e) in ends.iter().enumerate() {
                        self.set(array, 16 + 8 * i as u64, smi(e as i64));
                    }
                    array
                }
                None => self.undefined,
            };
            self.set(script, 56, ends);
            script
        }

        /// A JSFunction whose SharedFunctionInfo holds `name_or_scope` and
        /// `script`; returns (function, shared function info), tagged.
        pub fn function(&mut self, name_or_scope: u64, script: u64) -> (u64, u64) {
            let sfi = self.object(SFI_TYPE, 8);
            self.set(sfi, 24, name_or_scope);
            self.set(sfi, 40, script);
            let f = self.object(JS_FUNCTION_TYPE, 8);
            self.set(f, 32, sfi);
            (f, sfi)
        }

        /// A ScopeInfo: `slots` after the map word.
        pub fn scope_info(&mut self, slots: &[u64]) -> u64 {
            let o = self.object(SCOPE_INFO_TYPE, slots.len() as u64 + 16);
            for (i, &w) in slots.iter().enumerate() {
                self.set(o, 8 + 8 * i as u64, w);
            }
            o
        }
    }

    impl Memory for FakeHeap {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
            let fail = || MemoryError {
                addr,
                len: buf.len(),
                reason: "unmapped".into(),
            };
            let at =
                usize::try_from(addr.checked_sub(BASE).ok_or_else(fail)?).map_err(|_| fail())?;
            let src = self.bytes.get(at..at + buf.len()).ok_or_else(fail)?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }
}

#[cfg(test)]
mod heap_tests {
    use super::fake::*;
    use super::*;

    /// Counts the reads made through it.
    struct Counted<'a>(&'a FakeHeap, std::cell::Cell<u32>);

    impl Memory for Counted<'_> {
        fn read(
            &self,
            addr: u64,
            buf: &mut [u8],
        ) -> Result<(), otel_thread_ctx_reader::memory::MemoryError> {
            self.1.set(self.1.get() + 1);
            self.0.read(addr, buf)
        }
    }

    #[test]
    fn a_tagged_word_into_the_first_page_is_no_object_and_costs_no_read() {
        let h = FakeHeap::new();
        let memory = Counted(&h, Default::default());
        let mut r = Resolver::new(metadata(true));
        for word in [1, 5, 4095] {
            assert!(matches!(
                r.heap(&memory).object("x", word),
                Err(HeapError::NotAnObject { .. })
            ));
        }
        assert_eq!(memory.1.get(), 0);
        // An object past it is read as ever.
        assert!(r.heap(&memory).object("undefined", h.undefined).is_ok());
        assert!(memory.1.get() > 0);
    }

    #[test]
    fn names_a_function_from_its_scope_info_and_script() {
        let mut h = FakeHeap::new();
        let source = h.one_byte("// hot\n\nfunction hot(n) {\n  return n;\n}\n");
        let script = h.script("/app/hot.js", source, Some(&[6, 7, 25, 37, 39]));
        // Node.js 24: flags, parameters, 1 context local, start, end; then
        // the local's name and info; receiver info; the function variable
        // (name, slot); the inferred name.
        let local = h.one_byte("n");
        let name = h.one_byte("hot");
        let undefined = h.undefined;
        let scope = h.scope_info(&[
            smi(0),
            smi(1),
            smi(1),
            smi(20),
            smi(39),
            local,
            smi(3),
            smi(0),
            name,
            smi(2),
            undefined,
        ]);
        let (f, _) = h.function(scope, script);
        let mut r = Resolver::new(metadata(true));
        let named = r.function(&h, f).unwrap();
        assert_eq!(named.frame_name(), "JS:hot /app/hot.js:3:13");
        // Remembered by its SharedFunctionInfo.
        assert_eq!(r.functions.len(), 1);
        assert_eq!(r.function(&h, f).unwrap(), named);
    }

    #[test]
    fn node_22_positions_follow_the_inferred_name_and_lines_come_from_the_source() {
        let mut h = FakeHeap::new();
        let source = h.cons("const o = {};\n", "o.run = () => 1;\n");
        let script = h.script("file:///app/o.mjs", source, None);
        let inferred = h.one_byte("o.run");
        // No context locals, no function variable name (the sentinel Smi),
        // then the inferred name and the positions.
        let scope = h.scope_info(&[
            smi(0),
            smi(0),
            smi(0),
            smi(0),
            smi(-1),
            inferred,
            smi(22),
            smi(30),
        ]);
        let (f, _) = h.function(scope, script);
        let named = Resolver::new(metadata(false)).function(&h, f).unwrap();
        assert_eq!(named.frame_name(), "JS:o.run file:///app/o.mjs:2:9");
    }

    #[test]
    fn a_shared_name_string_and_a_two_byte_name() {
        let mut h = FakeHeap::new();
        let name = h.two_byte("grüße");
        let undefined = h.undefined;
        let (f, _) = h.function(name, undefined);
        let named = Resolver::new(metadata(true)).function(&h, f).unwrap();
        assert_eq!(named.frame_name(), "JS:grüße");
        let (anonymous, _) = h.function(smi(0), undefined);
        let named = Resolver::new(metadata(true))
            .function(&h, anonymous)
            .unwrap();
        assert_eq!(named.frame_name(), "JS:(anonymous)");
    }

    #[test]
    fn objects_of_the_wrong_type_or_unreadable_are_errors() {
        let mut h = FakeHeap::new();
        let name = h.one_byte("f");
        let undefined = h.undefined;
        let (f, sfi) = h.function(name, undefined);
        let mut r = Resolver::new(metadata(true));
        // The shared function info is not a function.
        assert!(matches!(
            r.function(&h, sfi),
            Err(HeapError::WrongType {
                what: "JSFunction",
                ..
            })
        ));
        // A Smi, and a pointer to nowhere.
        assert!(matches!(
            r.function(&h, smi(5)),
            Err(HeapError::NotAnObject { .. })
        ));
        assert!(matches!(
            r.function(&h, 0x7777_0001),
            Err(HeapError::Unreadable(_))
        ));
        // A function whose shared info is a string.
        h.set(f, 32, name);
        assert!(matches!(
            r.function(&h, f),
            Err(HeapError::WrongType {
                what: "SharedFunctionInfo",
                ..
            })
        ));
        // An object whose map's map is not the meta map.
        let bogus_map = h.object(FIXED_ARRAY_TYPE, 2);
        let bogus = h.object(JS_FUNCTION_TYPE, 8);
        h.set(bogus, 0, bogus_map);
        assert!(matches!(
            r.function(&h, bogus),
            Err(HeapError::WrongType {
                what: "the map's map",
                ..
            })
        ));
    }

    #[test]
    fn a_line_table_past_the_bound_leaves_the_function_named_without_a_line() {
        let mut h = FakeHeap::new();
        let source = h.one_byte("function f() {}\n");
        let script = h.script("/a.js", source, Some(&[15]));
        let table = h.object(FIXED_ARRAY_TYPE, 2);
        h.set(table, 8, smi(MAX_LINES as i64 + 1));
        h.set(script, 56, table);
        let name = h.one_byte("f");
        let undefined = h.undefined;
        let scope = h.scope_info(&[
            smi(0),
            smi(0),
            smi(0),
            smi(10),
            smi(15),
            smi(0),
            name,
            smi(2),
            undefined,
        ]);
        let (f, _) = h.function(scope, script);
        let named = Resolver::new(metadata(true)).function(&h, f).unwrap();
        assert_eq!(named.frame_name(), "JS:f /a.js");
    }

    #[test]
    fn strings_are_bounded() {
        let mut h = FakeHeap::new();
        let long = h.one_byte(&"x".repeat(5000));
        let undefined = h.undefined;
        let (f, _) = h.function(long, undefined);
        assert!(matches!(
            Resolver::new(metadata(true)).function(&h, f),
            Err(HeapError::Invalid { what: "string", .. })
        ));
        // A cons string whose first part claims more than the whole.
        let cons = h.cons("ab", "cd");
        let first = h.one_byte("abcdefgh");
        h.set(cons, 16, first);
        let (f, _) = h.function(cons, undefined);
        assert!(Resolver::new(metadata(true)).function(&h, f).is_err());
    }
}
