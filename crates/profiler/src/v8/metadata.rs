//! V8's postmortem metadata: the `v8dbg_*` symbols every Node.js binary
//! exports, each a 32-bit integer holding one layout constant (a frame
//! slot's offset from the frame pointer, a class field's offset, an
//! instance type, a string tag).
//!
//! Class fields are named `v8dbg_class_<Class>__<field>__<type>`, and the
//! type part changes between V8 versions (`__Object`, `__Tagged_Object_`,
//! ...): a field is looked up by class and field name, whatever its type,
//! and a field named twice with different offsets is refused rather than
//! picked from. Nothing missing is filled in from what a version is
//! believed to have: a constant the binary does not carry is an error,
//! and the caller names JavaScript frames some other way.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

/// Prefix of every metadata symbol.
const PREFIX: &str = "v8dbg_";

/// V8's own version numbers (`v8::internal::Version::major_`, `minor_`),
/// kept among the constants under these names.
const VERSION_SYMBOLS: [(&str, &str); 2] = [
    ("_ZN2v88internal7Version6major_E", "version_major"),
    ("_ZN2v88internal7Version6minor_E", "version_minor"),
];

/// Most context locals a ScopeInfo is read with: past this, its slots are
/// not read (the function is named by the perf map).
pub const MAX_CONTEXT_LOCALS: u64 = 1024;

/// The raw `v8dbg_*` constants of one binary, by name without the prefix.
#[derive(Clone, Debug, Default)]
pub struct Symbols(HashMap<String, i64>);

/// A constant the binary does not carry, or carries twice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("the binary has no V8 postmortem metadata (no v8dbg_* symbols)")]
    NoMetadata,
    #[error("v8dbg_{0} is missing")]
    Missing(String),
    #[error("v8dbg_{0} has two different values")]
    Ambiguous(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("cannot parse the binary: {0}")]
    Parse(String),
}

impl Symbols {
    /// Reads every `v8dbg_*` data symbol of an ELF file: from `.dynsym`
    /// (Node.js exports them) and `.symtab` when present. A symbol in a
    /// section without file bytes (`.bss`) is zero.
    pub fn from_elf(data: &[u8]) -> Result<Symbols, MetadataError> {
        Ok(Symbols::and_bytecode_sizes_from_elf(data)?.0)
    }

    /// from_elf(), and V8's bytecode size table from the same pass over
    /// the symbols (Err: why there is none).
    fn and_bytecode_sizes_from_elf(
        data: &[u8],
    ) -> Result<(Symbols, Result<BytecodeSizes, String>), MetadataError> {
        let file = object::File::parse(data).map_err(|e| MetadataError::Parse(e.to_string()))?;
        let mut found = HashMap::new();
        let mut sizes =
            Err("the binary has no bytecode size table (Bytecodes::kBytecodeSizes)".into());
        for symbol in file.dynamic_symbols().chain(file.symbols()) {
            let Ok(name) = symbol.name() else { continue };
            if name == BYTECODE_SIZES_SYMBOL {
                // Listed in both tables on some lines: the first good one.
                if sizes.is_err() {
                    sizes = BytecodeSizes::from_symbol(&file, &symbol);
                }
                continue;
            }
            let version = VERSION_SYMBOLS.iter().find(|(mangled, _)| *mangled == name);
            let Some(name) = name.strip_prefix(PREFIX).or(version.map(|(_, kept)| *kept)) else {
                continue;
            };
            if found.contains_key(name) {
                continue;
            }
            let Some(index) = symbol.section_index() else {
                continue;
            };
            let Ok(section) = file.section_by_index(index) else {
                continue;
            };
            let value = if section.kind() == SectionKind::UninitializedData {
                0
            } else {
                let Ok(bytes) = section.data() else { continue };
                let Some(at) = symbol.address().checked_sub(section.address()) else {
                    continue;
                };
                let Some(word) = usize::try_from(at)
                    .ok()
                    .and_then(|at| bytes.get(at..at.checked_add(4)?))
                else {
                    continue;
                };
                i64::from(i32::from_le_bytes(word.try_into().expect("four bytes")))
            };
            found.insert(name.to_string(), value);
        }
        if !found
            .keys()
            .any(|name| name.contains("__") || name.starts_with("off_"))
        {
            return Err(MetadataError::NoMetadata);
        }
        Ok((Symbols(found), sizes))
    }

    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, i64)>) -> Symbols {
        Symbols(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }

    fn require(&self, name: &str) -> Result<i64, MetadataError> {
        self.get(name)
            .ok_or_else(|| MetadataError::Missing(name.to_string()))
    }

    /// The offset of field `field` of class `class`, whatever type name
    /// the symbol carries.
    pub fn field(&self, class: &str, field: &str) -> Result<Option<u64>, MetadataError> {
        let prefix = format!("class_{class}__{field}__");
        let mut offsets = self
            .0
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, &value)| value);
        let Some(first) = offsets.next() else {
            return Ok(None);
        };
        if offsets.any(|other| other != first) {
            return Err(MetadataError::Ambiguous(format!("{prefix}*")));
        }
        u64::try_from(first)
            .map(Some)
            .map_err(|_| MetadataError::Unsupported(format!("{prefix}* is negative")))
    }

    fn require_field(&self, class: &str, field: &str) -> Result<u64, MetadataError> {
        self.field(class, field)?
            .ok_or_else(|| MetadataError::Missing(format!("class_{class}__{field}__*")))
    }

    /// The first of `fields` of `class` the binary names.
    fn require_one_of(&self, class: &str, fields: &[&str]) -> Result<u64, MetadataError> {
        for field in fields {
            if let Some(offset) = self.field(class, field)? {
                return Ok(offset);
            }
        }
        Err(MetadataError::Missing(format!(
            "class_{class}__{{{}}}__*",
            fields.join(",")
        )))
    }

    /// The instance type `v8dbg_type_<class>__<TYPE>`, one value for every
    /// symbol of that class.
    fn instance_type(&self, class: &str) -> Result<u16, MetadataError> {
        let prefix = format!("type_{class}__");
        let mut values = self
            .0
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, &value)| value);
        let first = values
            .next()
            .ok_or_else(|| MetadataError::Missing(format!("{prefix}*")))?;
        if values.any(|other| other != first) {
            return Err(MetadataError::Ambiguous(format!("{prefix}*")));
        }
        u16::try_from(first)
            .map_err(|_| MetadataError::Unsupported(format!("{prefix}* is out of range")))
    }
}

/// V8's string instance-type bits: a string's type tells how it is stored
/// (sequential, cons, sliced, thin, external) and its width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringTags {
    /// Types below this are strings.
    pub first_nonstring_type: u16,
    pub representation_mask: u16,
    pub encoding_mask: u16,
    pub seq: u16,
    pub cons: u16,
    pub sliced: u16,
    pub thin: u16,
    pub external: u16,
    pub one_byte: u16,
    pub two_byte: u16,
}

/// Field offsets of the string classes, from an object's untagged address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringFields {
    pub length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub thin_actual: u64,
}

/// The layout constants a reader names JavaScript frames with, taken from
/// one binary's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Slots of a JavaScript frame, from its frame pointer.
    pub fp_function: i64,
    pub fp_context: i64,
    /// Interpreted frames: the bytecode array and the offset in it.
    pub fp_bytecode_array: Option<i64>,
    pub fp_bytecode_offset: Option<i64>,

    pub heap_object_map: u64,
    pub map_instance_type: u64,
    /// The type of a Map itself (every object's map has this map's map).
    pub map_type: u16,

    /// Instance types a JSFunction may have: `JS_FUNCTION_TYPE` and, where
    /// the binary says which, the subclasses (class constructors, ...).
    pub js_function_types: (u16, u16),
    pub js_function_shared: u64,

    pub shared_function_info_type: u16,
    pub sfi_name_or_scope_info: u64,
    pub sfi_script: u64,

    pub scope_info_type: u16,
    /// Slot indexes of a ScopeInfo (slot 0 follows the map word).
    pub scope_info_context_local_count: u64,
    pub scope_info_first_vars: u64,

    pub script_type: u16,
    pub script_name: u64,
    pub script_source: u64,
    pub script_line_ends: u64,

    pub fixed_array_type: u16,
    /// The type of the bytecode an interpreted frame runs, which tells
    /// such a frame from others; without it, interpreted frames are not
    /// named.
    pub bytecode_array_type: Option<u16>,
    pub fixed_array_length: u64,
    pub fixed_array_data: u64,

    pub string_tags: StringTags,
    pub string_fields: StringFields,

    /// How optimized code says which functions it inlined, or why this
    /// binary's metadata cannot tell.
    pub code: Result<CodeLayout, String>,
    /// Where an interpreted frame's bytecode finds its source position
    /// table, or why this binary's metadata cannot tell.
    pub bytecode: Result<BytecodeLayout, String>,
}

/// How a source position table writes each entry's code offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionEncoding {
    /// A signed delta whose sign says whether the entry is a statement
    /// (V8 up to 13).
    Signed,
    /// An unsigned delta shifted left by two, below it whether the entry
    /// is breakable and whether it is a statement (V8 14 on).
    Flagged,
}

impl PositionEncoding {
    fn from_symbols(s: &Symbols) -> PositionEncoding {
        match s.get("version_major") {
            Some(major) if major >= 14 => PositionEncoding::Flagged,
            _ => PositionEncoding::Signed,
        }
    }
}

/// Where a BytecodeArray keeps its bytecodes and the table from a bytecode
/// offset to a script position.
///
/// The metadata names the bytecodes' start and the tagged fields before
/// three that it leaves unnamed: the constant pool, the handler table and
/// the source position table, one after the other in one order or its
/// reverse (V8 reversed it when bytecode moved to trusted space). So the
/// table is found per object: the constant pool is the fixed array at one
/// end, the handler table the byte array next to it, and the position
/// table the byte array at the other end (or nothing, where V8 has not
/// collected the positions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BytecodeLayout {
    /// Offset of the first bytecode from the object's untagged address:
    /// an interpreted frame's offset slot holds the offset from the
    /// object's tagged address.
    pub data: u64,
    /// The three unnamed slots, by address.
    pub table_slots: [u64; 3],
    pub byte_array_types: Vec<u16>,
    pub fixed_array_types: Vec<u16>,
    pub positions: PositionEncoding,
    /// Each bytecode's size at each operand scale, from the binary: what
    /// walking the bytecodes of baseline code takes. Err: why there is none.
    pub sizes: Result<BytecodeSizes, String>,
}

/// V8's table of bytecode sizes (`interpreter::Bytecodes::kBytecodeSizes`,
/// in the binary's symbol table): one row per operand scale (single,
/// double, quadruple), one byte per bytecode, its size at that scale (the
/// opcode and its operands; a scaling prefix comes on top). Bytecodes 0 to
/// 3 are the scaling prefixes (`Wide`, `ExtraWide` and their debug-break
/// forms), one byte each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BytecodeSizes {
    table: std::sync::Arc<[u8]>,
    count: usize,
}

/// The mangled name of `Bytecodes::kBytecodeSizes`.
const BYTECODE_SIZES_SYMBOL: &str = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE";

/// Fewest and most bytecodes a V8 version is taken to have.
const BYTECODE_COUNTS: std::ops::RangeInclusive<usize> = 128..=1024;

impl BytecodeSizes {
    /// Checks a table read from a binary: three rows of sizes, prefixes of
    /// one byte, every other size one byte of opcode plus operands, each
    /// row at least as large as the one before it.
    pub fn new(table: &[u8]) -> Result<BytecodeSizes, String> {
        let count = table.len() / 3;
        if !table.len().is_multiple_of(3) || !BYTECODE_COUNTS.contains(&count) {
            return Err(format!(
                "a bytecode size table of {} bytes is not three rows of bytecodes",
                table.len()
            ));
        }
        let rows: Vec<&[u8]> = table.chunks_exact(count).collect();
        for row in &rows {
            if row[..4] != [1, 1, 1, 1] || row.contains(&0) {
                return Err(
                    "the bytecode size table does not start with four one-byte prefixes".into(),
                );
            }
        }
        if (0..count).any(|b| rows[0][b] > rows[1][b] || rows[1][b] > rows[2][b]) {
            return Err("the bytecode size table has a row smaller than the one before it".into());
        }
        Ok(BytecodeSizes {
            table: table.into(),
            count,
        })
    }

    /// The size of the largest bytecode, a prefix included.
    pub fn largest(&self) -> usize {
        1 + usize::from(self.table.iter().copied().max().unwrap_or(0))
    }

    /// The size of the bytecode at the start of `bytes` (its prefix
    /// included), or None where `bytes` holds no whole bytecode.
    pub fn size_at(&self, bytes: &[u8]) -> Option<usize> {
        let (row, prefix) = match *bytes.first()? {
            0 | 2 => (1, 1),
            1 | 3 => (2, 1),
            _ => (0, 0),
        };
        let opcode = usize::from(*bytes.get(prefix)?);
        if opcode >= self.count || opcode < 4 && prefix == 1 {
            return None;
        }
        let size = prefix + usize::from(self.table[row * self.count + opcode]);
        (size <= bytes.len()).then_some(size)
    }

    /// Reads the table at `symbol` of the ELF file `file`.
    fn from_symbol<'data>(
        file: &object::File<'data>,
        symbol: &object::Symbol<'data, '_>,
    ) -> Result<BytecodeSizes, String> {
        let section = symbol
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .ok_or("the bytecode size table is in no section")?;
        let bytes = section.data().map_err(|e| e.to_string())?;
        let at = symbol
            .address()
            .checked_sub(section.address())
            .and_then(|at| usize::try_from(at).ok())
            .ok_or("the bytecode size table lies outside its section")?;
        let size = usize::try_from(symbol.size()).map_err(|e| e.to_string())?;
        let table = at
            .checked_add(size)
            .and_then(|end| bytes.get(at..end))
            .ok_or("the bytecode size table lies outside its section")?;
        BytecodeSizes::new(table)
    }
}

impl BytecodeLayout {
    fn from_symbols(s: &Symbols, tagged_slot: u64) -> Result<BytecodeLayout, MetadataError> {
        let data = s.require_field("BytecodeArray", "data")?;
        // The last tagged field the metadata names: the wrapper (V8 12
        // on), else the length.
        let last_named = match s.field("BytecodeArray", "wrapper")? {
            Some(wrapper) => wrapper,
            None => match s.field("BytecodeArray", "length")? {
                Some(length) => length,
                None => s.require_field("FixedArrayBase", "length")?,
            },
        };
        let table_slots = [1, 2, 3].map(|i| last_named + i * tagged_slot);
        if table_slots[2] + tagged_slot > data {
            return Err(MetadataError::Unsupported(format!(
                "BytecodeArray: no room for three tagged fields between offset {last_named} and the bytecodes at {data}"
            )));
        }
        let types = |classes: &[&str]| -> Vec<u16> {
            classes
                .iter()
                .filter_map(|c| s.instance_type(c).ok())
                .collect()
        };
        let byte_array_types = types(&["ByteArray", "TrustedByteArray"]);
        let fixed_array_types = types(&["FixedArray", "TrustedFixedArray"]);
        if byte_array_types.is_empty() || fixed_array_types.is_empty() {
            return Err(MetadataError::Missing(
                "type_{,Trusted}ByteArray__* or type_{,Trusted}FixedArray__*".into(),
            ));
        }
        Ok(BytecodeLayout {
            data,
            table_slots,
            byte_array_types,
            fixed_array_types,
            positions: PositionEncoding::from_symbols(s),
            sizes: Err("the bytecode size table is read from the binary".into()),
        })
    }
}

/// Which function a slot of the deoptimization data names the code's own
/// function with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnFunction {
    /// The SharedFunctionInfo itself (before V8 12.5).
    Shared(u64),
    /// A SharedFunctionInfoWrapper of that type, and its field holding the
    /// SharedFunctionInfo (V8 12.5 on, where code lives in trusted space).
    Wrapped {
        index: u64,
        wrapper_type: u16,
        shared_info: u64,
    },
}

/// Where V8 keeps what optimized code was compiled from: from the
/// instructions back to their InstructionStream and its Code, and from the
/// Code to its source position table (an offset in the instructions to a
/// script position and the inlined function it belongs to) and its
/// deoptimization data (the inlined functions and where they were called).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub instruction_stream_type: u16,
    /// Bytes from an InstructionStream's address to its first instruction.
    pub instruction_stream_header: u64,
    pub code_type: u16,
    /// The Code's own instruction start and size, where the metadata gives
    /// them (V8 12 on); else the instructions start after the stream's
    /// header and their end is not checked.
    pub code_instruction_start: Option<u64>,
    pub code_instruction_size: Option<u64>,
    /// Slots of a Code that may hold its InstructionStream, its source
    /// position table, its deoptimization data: the field the metadata
    /// names, else the slots it may be among, told apart by type.
    pub code_stream_slots: Vec<u64>,
    pub position_table_slots: Vec<u64>,
    pub deoptimization_data_slots: Vec<u64>,
    /// Types of the byte arrays (position tables, inlining positions), of
    /// deoptimization data, of its literal array, and of what baseline
    /// code keeps where optimized code keeps its deoptimization data.
    pub byte_array_types: Vec<u16>,
    /// How the source position tables are written.
    pub positions: PositionEncoding,
    pub deoptimization_data_types: Vec<u16>,
    pub literal_array_types: Vec<u16>,
    pub baseline_data_types: Vec<u16>,
    /// Slot indexes in the deoptimization data.
    pub inlined_function_count: u64,
    pub literal_array: u64,
    pub inlining_positions: u64,
    pub own_function: OwnFunction,
}

impl CodeLayout {
    fn from_symbols(s: &Symbols, tagged_slot: u64) -> Result<CodeLayout, MetadataError> {
        let slot_index = |name: &str| -> Result<u64, MetadataError> {
            u64::try_from(s.require(name)?)
                .map_err(|_| MetadataError::Unsupported(format!("v8dbg_{name} is negative")))
        };
        let types = |classes: &[&str]| -> Vec<u16> {
            classes
                .iter()
                .filter_map(|c| s.instance_type(c).ok())
                .collect()
        };
        let header = s.require_field("InstructionStream", "instruction_start")?;
        let code_type = s.instance_type("Code")?;
        // Before V8 12 the metadata names the Code's fields; since, only
        // the fields around them: the slots between the map and the
        // wrapper hold the position table and the deoptimization data.
        let named = |field: &str| s.field("Code", field);
        let (position_table_slots, deoptimization_data_slots) = match (
            named("source_position_table")?,
            named("deoptimization_data")?,
        ) {
            (Some(p), Some(d)) => (vec![p], vec![d]),
            _ => {
                let wrapper = s.require_field("Code", "wrapper")?;
                let slots: Vec<u64> = (1..wrapper / tagged_slot)
                    .map(|i| i * tagged_slot)
                    .collect();
                (slots.clone(), slots)
            }
        };
        let code_stream_slots = match named("instruction_stream")? {
            Some(f) => vec![f],
            None => (1..8).map(|i| i * tagged_slot).collect(),
        };
        let own_function = match (
            s.get("DeoptimizationDataSharedFunctionInfoIndex"),
            s.get("DeoptimizationDataWrappedSharedFunctionInfoIndex"),
        ) {
            (Some(index), _) => OwnFunction::Shared(
                u64::try_from(index)
                    .map_err(|_| MetadataError::Unsupported("negative index".into()))?,
            ),
            (None, Some(index)) => OwnFunction::Wrapped {
                index: u64::try_from(index)
                    .map_err(|_| MetadataError::Unsupported("negative index".into()))?,
                wrapper_type: s.instance_type("SharedFunctionInfoWrapper")?,
                shared_info: s.require_field("SharedFunctionInfoWrapper", "shared_info")?,
            },
            (None, None) => {
                return Err(MetadataError::Missing(
                    "DeoptimizationData{,Wrapped}SharedFunctionInfoIndex".into(),
                ))
            }
        };
        let byte_array_types = types(&["ByteArray", "TrustedByteArray"]);
        let deoptimization_data_types =
            types(&["FixedArray", "TrustedFixedArray", "ProtectedFixedArray"]);
        if byte_array_types.is_empty() || deoptimization_data_types.is_empty() {
            return Err(MetadataError::Missing("type_{,Trusted}ByteArray__*".into()));
        }
        Ok(CodeLayout {
            instruction_stream_type: s.instance_type("InstructionStream")?,
            instruction_stream_header: header,
            code_type,
            code_instruction_start: named("instruction_start")?,
            code_instruction_size: named("instruction_size")?,
            code_stream_slots,
            position_table_slots,
            deoptimization_data_slots,
            byte_array_types,
            positions: PositionEncoding::from_symbols(s),
            deoptimization_data_types,
            literal_array_types: types(&[
                "FixedArray",
                "WeakFixedArray",
                "TrustedFixedArray",
                "TrustedWeakFixedArray",
                "ProtectedFixedArray",
                "ProtectedWeakFixedArray",
            ]),
            baseline_data_types: types(&["BytecodeArray", "InterpreterData"]),
            inlined_function_count: slot_index("DeoptimizationDataInlinedFunctionCountIndex")?,
            literal_array: slot_index("DeoptimizationDataLiteralArrayIndex")?,
            inlining_positions: slot_index("DeoptimizationDataInliningPositionsIndex")?,
            own_function,
        })
    }
}

/// The encodings every constant here is read with: a tagged pointer is
/// `address | 1`, a Smi is `value << 32`, every slot 8 bytes (x86-64 without
/// pointer compression, as Node.js is built).
fn check_encoding(s: &Symbols) -> Result<(), MetadataError> {
    let expect = [
        ("HeapObjectTag", 1),
        ("HeapObjectTagMask", 3),
        ("SmiTag", 0),
        ("SmiTagMask", 1),
        ("SmiShiftSize", 31),
        ("TaggedSize", 8),
        ("SystemPointerSize", 8),
    ];
    for (name, want) in expect {
        let have = s.require(name)?;
        if have != want {
            return Err(MetadataError::Unsupported(format!(
                "v8dbg_{name} is {have}, not {want} (pointer compression or another tagging scheme)"
            )));
        }
    }
    Ok(())
}

fn small(name: &str, value: i64) -> Result<u16, MetadataError> {
    u16::try_from(value)
        .map_err(|_| MetadataError::Unsupported(format!("v8dbg_{name} = {value} is out of range")))
}

impl Metadata {
    pub fn from_symbols(s: &Symbols) -> Result<Metadata, MetadataError> {
        check_encoding(s)?;
        let js_function = s.instance_type("JSFunction")?;
        let js_function_types = match (s.get("FirstJSFunctionType"), s.get("LastJSFunctionType")) {
            (Some(first), Some(last)) => {
                let (first, last) = (
                    small("FirstJSFunctionType", first)?,
                    small("LastJSFunctionType", last)?,
                );
                if !(first..=last).contains(&js_function) {
                    return Err(MetadataError::Unsupported(format!(
                        "JS_FUNCTION_TYPE {js_function} is outside {first}..={last}"
                    )));
                }
                (first, last)
            }
            // Without the range, only plain functions: class constructors
            // and the like are left to the perf map.
            _ => (js_function, js_function),
        };
        let tag = |name: &str| -> Result<u16, MetadataError> { small(name, s.require(name)?) };
        let string_tags = StringTags {
            first_nonstring_type: tag("FirstNonstringType")?,
            representation_mask: tag("StringRepresentationMask")?,
            encoding_mask: tag("StringEncodingMask")?,
            seq: tag("SeqStringTag")?,
            cons: tag("ConsStringTag")?,
            sliced: tag("SlicedStringTag")?,
            thin: tag("ThinStringTag")?,
            external: tag("ExternalStringTag")?,
            one_byte: tag("OneByteStringTag")?,
            two_byte: tag("TwoByteStringTag")?,
        };
        let string_fields = StringFields {
            length: s.require_field("String", "length")?,
            seq_one_byte_chars: s.require_field("SeqOneByteString", "chars")?,
            seq_two_byte_chars: s.require_field("SeqTwoByteString", "chars")?,
            cons_first: s.require_field("ConsString", "first")?,
            cons_second: s.require_field("ConsString", "second")?,
            sliced_parent: s.require_field("SlicedString", "parent")?,
            sliced_offset: s.require_field("SlicedString", "offset")?,
            thin_actual: s.require_field("ThinString", "actual")?,
        };
        let slot_index = |name: &str| -> Result<u64, MetadataError> {
            u64::try_from(s.require(name)?)
                .map_err(|_| MetadataError::Unsupported(format!("v8dbg_{name} is negative")))
        };
        Ok(Metadata {
            fp_function: s.require("off_fp_function")?,
            fp_context: s.require("off_fp_context")?,
            fp_bytecode_array: s.get("off_fp_bytecode_array"),
            fp_bytecode_offset: s.get("off_fp_bytecode_offset"),
            heap_object_map: s.require_field("HeapObject", "map")?,
            map_instance_type: s.require_field("Map", "instance_type")?,
            map_type: s.instance_type("Map")?,
            js_function_types,
            js_function_shared: s.require_field("JSFunction", "shared")?,
            shared_function_info_type: s.instance_type("SharedFunctionInfo")?,
            sfi_name_or_scope_info: s.require_field("SharedFunctionInfo", "name_or_scope_info")?,
            // Named `script_or_debug_info` up to V8 11, `script` since.
            sfi_script: s
                .require_one_of("SharedFunctionInfo", &["script", "script_or_debug_info"])?,
            scope_info_type: s.instance_type("ScopeInfo")?,
            scope_info_context_local_count: slot_index("scopeinfo_idx_ncontextlocals")?,
            scope_info_first_vars: slot_index("scopeinfo_idx_first_vars")?,
            script_type: s.instance_type("Script")?,
            script_name: s.require_field("Script", "name")?,
            script_source: s.require_field("Script", "source")?,
            script_line_ends: s.require_field("Script", "line_ends")?,
            fixed_array_type: s.instance_type("FixedArray")?,
            bytecode_array_type: s.instance_type("BytecodeArray").ok(),
            fixed_array_length: s.require_field("FixedArrayBase", "length")?,
            fixed_array_data: s.require_field("FixedArray", "data")?,
            string_tags,
            string_fields,
            code: CodeLayout::from_symbols(s, s.require("TaggedSize")? as u64)
                .map_err(|e| e.to_string()),
            bytecode: BytecodeLayout::from_symbols(s, s.require("TaggedSize")? as u64)
                .map_err(|e| e.to_string()),
        })
    }

    /// Reads the metadata of the ELF file `data`.
    pub fn from_elf(data: &[u8]) -> Result<Metadata, MetadataError> {
        let (symbols, sizes) = Symbols::and_bytecode_sizes_from_elf(data)?;
        let mut metadata = Metadata::from_symbols(&symbols)?;
        if let Ok(bytecode) = &mut metadata.bytecode {
            bytecode.sizes = sizes;
        }
        Ok(metadata)
    }

    /// Whether the ScopeInfo keeps a function's start and end positions in
    /// the two fixed slots after its context-local count (V8 12.8 on): the
    /// metadata puts the first variable slot two slots further than the
    /// count then. Before, the positions follow the variable slots.
    pub fn scope_info_has_fixed_positions(&self) -> bool {
        self.scope_info_first_vars == self.scope_info_context_local_count + 3
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The Node.js executables to test against, with their major version:
    /// `/usr/bin/node` and those listed (colon separated) in
    /// `OTEL_THREAD_CTX_TEST_NODES`. One that does not exist or does not
    /// run is skipped, saying so.
    pub(crate) fn node_binaries() -> Vec<(u32, std::path::PathBuf)> {
        let listed = std::env::var("OTEL_THREAD_CTX_TEST_NODES").unwrap_or_default();
        let mut found = Vec::new();
        for path in std::iter::once("/usr/bin/node").chain(listed.split(':')) {
            if path.is_empty() {
                continue;
            }
            let version = std::process::Command::new(path)
                .arg("--version")
                .output()
                .ok()
                .and_then(|o| String::from_utf8(o.stdout).ok());
            let major = version.as_deref().and_then(|v| {
                v.trim()
                    .strip_prefix('v')?
                    .split('.')
                    .next()?
                    .parse::<u32>()
                    .ok()
            });
            match major {
                Some(major) => found.push((major, std::path::PathBuf::from(path))),
                None => eprintln!("skipped {path}: not a Node.js that runs here"),
            }
        }
        found
    }

    fn read(path: &std::path::Path) -> Symbols {
        let file = std::fs::File::open(path).unwrap();
        let mapped = otel_thread_ctx_reader::elf::MappedFile::map(&file).unwrap();
        Symbols::from_elf(mapped.bytes()).unwrap()
    }

    #[test]
    fn every_installed_node_carries_what_naming_needs() {
        for (major, path) in node_binaries() {
            let symbols = read(&path);
            assert!(symbols.len() > 400, "Node.js {major}: {}", symbols.len());
            let m = Metadata::from_symbols(&symbols)
                .unwrap_or_else(|e| panic!("Node.js {major} ({}): {e}", path.display()));
            // The standard frame layout of x86-64: context, then function.
            assert_eq!((m.fp_context, m.fp_function), (-8, -16), "Node.js {major}");
            assert_eq!(m.heap_object_map, 0, "Node.js {major}");
            assert_eq!(m.string_fields.length, 12, "Node.js {major}");
            assert!(m.bytecode_array_type.is_some(), "Node.js {major}");
            let bytecode = Metadata::from_elf(&std::fs::read(&path).unwrap())
                .unwrap()
                .bytecode
                .unwrap();
            let sizes = bytecode
                .sizes
                .unwrap_or_else(|e| panic!("Node.js {major}: {e}"));
            // V8 has about two hundred bytecodes.
            assert!(sizes.count > 180, "Node.js {major}: {}", sizes.count);
            assert_eq!(
                (m.fp_bytecode_array, m.fp_bytecode_offset),
                (Some(-32), Some(-40)),
                "Node.js {major}"
            );
            assert!(
                m.js_function_types.0 <= m.js_function_types.1,
                "Node.js {major}"
            );
            // V8 12.8 moved a function's positions to fixed ScopeInfo slots:
            // Node.js 24 on.
            assert_eq!(
                m.scope_info_has_fixed_positions(),
                major >= 24,
                "Node.js {major}"
            );
            // Only Node.js 20 lacks the JSFunction subclass range.
            assert_eq!(
                m.js_function_types.0 < m.js_function_types.1,
                major >= 22,
                "Node.js {major}"
            );
            // What optimized code inlined: Node.js 20's metadata names the
            // Code's tables; later ones leave them to be told apart by type
            // among the slots before the wrapper, and wrap the code's own
            // function from V8 12.5 (Node.js 24) on.
            let code = m
                .code
                .as_ref()
                .unwrap_or_else(|e| panic!("Node.js {major}: {e}"));
            let expected_slots: &[u64] = if major >= 22 { &[8, 16] } else { &[24] };
            assert_eq!(code.position_table_slots, expected_slots, "Node.js {major}");
            assert_eq!(
                matches!(code.own_function, OwnFunction::Wrapped { .. }),
                major >= 24,
                "Node.js {major}"
            );
            assert_eq!(
                code.code_instruction_size.is_some(),
                major >= 22,
                "Node.js {major}"
            );
            // Bytecode: the three unnamed slots follow the length (Node.js
            // 20) or the wrapper (22 on), and precede the bytecodes.
            let bytecode = m
                .bytecode
                .as_ref()
                .unwrap_or_else(|e| panic!("Node.js {major}: {e}"));
            let expected_slots = if major >= 22 {
                [24, 32, 40]
            } else {
                [16, 24, 32]
            };
            assert_eq!(bytecode.table_slots, expected_slots, "Node.js {major}");
            assert!(bytecode.data >= 48, "Node.js {major}: {}", bytecode.data);
            // V8 14 (Node.js 25 on) writes position tables with flag bits.
            let positions = if major >= 25 {
                PositionEncoding::Flagged
            } else {
                PositionEncoding::Signed
            };
            assert_eq!((bytecode.positions, code.positions), (positions, positions));
        }
    }

    #[test]
    fn a_bytecode_size_table_must_be_three_rows_of_sizes() {
        let mut table = vec![1u8; 3 * 200];
        table[200 + 10] = 3;
        table[400 + 10] = 5;
        let sizes = BytecodeSizes::new(&table).unwrap();
        assert_eq!(sizes.largest(), 6);
        assert_eq!(sizes.size_at(&[10, 0, 0]), Some(1));
        assert_eq!(sizes.size_at(&[0, 10, 0, 0]), Some(4));
        assert_eq!(sizes.size_at(&[1, 10, 0, 0, 0, 0]), Some(6));
        // Cut short, past the table, a prefix before a prefix.
        assert_eq!(sizes.size_at(&[1, 10, 0]), None);
        assert_eq!(sizes.size_at(&[250]), None);
        assert_eq!(sizes.size_at(&[0, 1, 10]), None);
        assert_eq!(sizes.size_at(&[]), None);

        assert!(BytecodeSizes::new(&table[..599]).is_err());
        assert!(BytecodeSizes::new(&[1; 30]).is_err());
        let mut zero = table.clone();
        zero[7] = 0;
        assert!(BytecodeSizes::new(&zero).is_err());
        let mut wide_prefix = table.clone();
        wide_prefix[200 + 2] = 2;
        assert!(BytecodeSizes::new(&wide_prefix).is_err());
        let mut shrinking = table;
        shrinking[400 + 10] = 2;
        assert!(BytecodeSizes::new(&shrinking).is_err());
    }

    #[test]
    fn a_field_is_found_whatever_its_type_name() {
        let s = Symbols::from_pairs([
            (
                "class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_",
                16,
            ),
            ("class_SharedFunctionInfo__script__Tagged_HeapObject_", 32),
            ("class_SharedFunctionInfo__raw_script__Tagged_Object_", 32),
            ("class_Script__name__Object", 16),
            ("class_Script__name__Tagged_Object_", 24),
        ]);
        assert_eq!(
            s.field("SharedFunctionInfo", "name_or_scope_info"),
            Ok(Some(16))
        );
        // `raw_script` is another field, not a type of `script`.
        assert_eq!(s.field("SharedFunctionInfo", "script"), Ok(Some(32)));
        assert_eq!(s.field("SharedFunctionInfo", "nothing"), Ok(None));
        assert!(matches!(
            s.field("Script", "name"),
            Err(MetadataError::Ambiguous(_))
        ));
    }

    #[test]
    fn another_tagging_scheme_is_refused() {
        let mut pairs = vec![
            ("HeapObjectTag", 1),
            ("HeapObjectTagMask", 3),
            ("SmiTag", 0),
            ("SmiTagMask", 1),
            ("SmiShiftSize", 0),
            ("TaggedSize", 4),
            ("SystemPointerSize", 8),
        ];
        let err = Metadata::from_symbols(&Symbols::from_pairs(pairs.clone())).unwrap_err();
        assert!(matches!(err, MetadataError::Unsupported(_)), "{err}");
        pairs.retain(|(n, _)| *n != "TaggedSize");
        let err = Metadata::from_symbols(&Symbols::from_pairs(pairs)).unwrap_err();
        assert!(matches!(
            err,
            MetadataError::Unsupported(_) | MetadataError::Missing(_)
        ));
    }

    #[test]
    fn a_binary_without_metadata_says_so() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(
            Symbols::from_elf(&me).unwrap_err(),
            MetadataError::NoMetadata
        );
    }
}
