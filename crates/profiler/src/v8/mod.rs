//! Names JavaScript frames from V8's own heap, with no flag on the target:
//! a JavaScript frame keeps its JSFunction at a fixed offset from its frame
//! pointer, and the function's SharedFunctionInfo leads to its name, its
//! script and where it starts.
//!
//! The layout of those objects comes from the postmortem metadata of the
//! target's own Node.js binary ([`metadata`]); the objects are read from
//! the live process ([`heap`]) and named ([`function`]) as each sample
//! arrives, from the frame slots in the sample's stack copy. When the
//! binary lacks a constant, or an object read fails its checks, the frame
//! is left to the perf map ([`crate::perf_map`]).

pub mod bytecode;
pub mod code;
pub mod function;
pub mod heap;
pub mod metadata;

use std::collections::HashMap;
use std::sync::Arc;

use otel_thread_ctx_abi::node_schema::smi_value;

use crate::kernel::StackCopy;
use crate::process_maps::ProcessMaps;
use crate::symbolize::{Frame, NamedFrame};
use otel_thread_ctx_reader::elf::MappedFile;
use otel_thread_ctx_reader::maps::Mapping;
use otel_thread_ctx_reader::memory::{Memory, ProcessMemory};

use bytecode::BytecodePositions;
use code::{CodeFinder, CodeInfo};
pub use function::{JsFunction, Resolver};
pub use metadata::{Metadata, MetadataError};

/// Most functions whose frame is kept; emptied past it.
const MAX_CACHED_FRAMES: usize = 1 << 16;

/// The module of frames named here, as of those the perf map names.
pub const JIT_MODULE: &str = "[jit]";

/// Reads the metadata of the Node.js binary process `pid` runs: its
/// executable, else a mapped `libnode` (a Node.js embedded in another
/// program). Returns the binary's path with it.
pub fn process_metadata(pid: i32, maps: &[Mapping]) -> Result<(String, Metadata), String> {
    let exe = format!("/proc/{pid}/exe");
    let mut candidates = vec![(exe.clone(), std::fs::read_link(&exe).ok())];
    for m in maps {
        let name = m.name();
        let file = name.rsplit('/').next().unwrap_or(name);
        if m.is_file_backed()
            && file.starts_with("libnode")
            && !candidates
                .iter()
                .any(|(_, p)| p.as_deref() == Some(std::path::Path::new(name)))
        {
            // As the process sees it: a container's files are under its root.
            candidates.push((format!("/proc/{pid}/root{name}"), Some(name.into())));
        }
    }
    let mut reasons = Vec::new();
    for (open, shown) in candidates {
        let shown = shown.map_or(open.clone(), |p| p.display().to_string());
        let read = std::fs::File::open(&open)
            .and_then(|f| MappedFile::map(&f))
            .map_err(|e| e.to_string())
            .and_then(|mapped| Metadata::from_elf(mapped.bytes()).map_err(|e| e.to_string()));
        match read {
            Ok(meta) => return Ok((shown, meta)),
            Err(e) => reasons.push(format!("{shown}: {e}")),
        }
    }
    Err(reasons.join("; "))
}

/// What naming from V8 did in a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// JIT frames named from V8 by the function in their slot (baseline
    /// code, or optimized code whose tables could not be read).
    pub named: u64,
    /// JIT frames of optimized code named from its Code object, and the
    /// frames of the functions it inlined there, added to the stacks.
    pub optimized: u64,
    pub inlined: u64,
    /// Optimized code whose tables could not be read, and the first reason.
    pub not_expanded: u64,
    pub first_expand_failure: Option<String>,
    /// Frames of baseline code named in their sample (once a frame of
    /// their code showed its function), with their line where it was had;
    /// optimized code that keeps no function of its own (it cannot
    /// deoptimize) is named alike, at its function's start.
    pub baseline: u64,
    /// Interpreted frames named from V8.
    pub interpreted: u64,
    /// Interpreted frames left without a line, and the first reason seen.
    pub interpreted_without_line: u64,
    pub first_line_failure: Option<String>,
    /// Baseline frames whose line could not be had, and the first reason.
    pub baseline_without_line: u64,
    pub first_baseline_line_failure: Option<String>,
    /// JIT frames V8 could not name (left to the perf map), and the first
    /// reason seen.
    pub unnamed: u64,
    pub first_failure: Option<String>,
}

/// Names the JIT frames of one process's samples from V8's heap.
pub struct JsFrames {
    binary: String,
    memory: Box<dyn Memory + Send>,
    resolver: Resolver,
    counts: Counts,
    /// Each function's frame, shared by the samples it names.
    frames: HashMap<usize, (Arc<JsFunction>, Arc<Frame>)>,
    /// Optimized code and what it inlined, or why the binary cannot tell.
    code: Result<CodeFinder, String>,
    /// Where interpreted frames are in their scripts, or why the binary
    /// cannot tell.
    bytecode: Result<BytecodePositions, String>,
    /// The frames one instruction of one Code stands for, by the Code,
    /// its own function and the instruction's offset.
    expansions: HashMap<(u64, u64, u64), Arc<[Frame]>>,
    /// The function of each baseline Code (by its address): V8 compiles
    /// baseline code for one function, so once a settled frame named it,
    /// its frames are named without reading their function again.
    baseline: HashMap<u64, Arc<JsFunction>>,
    /// The script offset of each instruction of baseline code seen, by
    /// the Code and the instruction's offset (None: none found).
    baseline_offsets: HashMap<(u64, u64), Option<u64>>,
}

/// What a JIT frame's Code says of it.
enum Expanded {
    /// Optimized code: the frames it stands for, innermost first.
    Frames(Arc<[Frame]>),
    /// Baseline code (no function of its own in the Code), and the
    /// instruction's offset in it.
    Baseline(Arc<CodeInfo>, u64),
}

impl JsFrames {
    /// Sets up naming for process `pid`; an error says why V8 cannot name
    /// its frames (no metadata, a constant missing, memory unreadable).
    pub fn new(pid: i32, maps: &[Mapping]) -> Result<JsFrames, String> {
        let (binary, meta) = process_metadata(pid, maps)?;
        let memory = ProcessMemory::open(pid, pid)
            .map_err(|e| format!("cannot read the memory of pid {pid}: {e}"))?;
        Ok(JsFrames::with_memory(binary, meta, Box::new(memory)))
    }

    /// Names the frames of a process running `binary` with `meta`, reading
    /// its heap through `memory`.
    pub fn with_memory(binary: String, meta: Metadata, memory: Box<dyn Memory + Send>) -> JsFrames {
        let code = meta.code.clone().map(CodeFinder::new);
        let bytecode = meta.bytecode.clone().map(BytecodePositions::new);
        JsFrames {
            binary,
            memory,
            code,
            bytecode,
            expansions: HashMap::new(),
            baseline: HashMap::new(),
            baseline_offsets: HashMap::new(),
            resolver: Resolver::new(meta),
            counts: Counts::default(),
            frames: HashMap::new(),
        }
    }

    /// The binary whose metadata is used.
    pub fn binary(&self) -> &str {
        &self.binary
    }

    /// Forgets what was read of the heap (functions, scripts, maps), for a
    /// long run where objects move and die.
    pub fn forget(&mut self) {
        self.resolver.forget();
        self.frames.clear();
        self.expansions.clear();
        self.baseline.clear();
        self.baseline_offsets.clear();
        if let Ok(code) = &mut self.code {
            code.forget();
        }
        if let Ok(bytecode) = &mut self.bytecode {
            bytecode.forget();
        }
    }

    /// Why inlined functions are not named in this process, when the
    /// binary's metadata cannot tell them.
    pub fn inlining_unavailable(&self) -> Option<&str> {
        self.code.as_ref().err().map(String::as_str)
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Where `addr` is: V8's code space (anonymous executable memory), the
    /// binary whose metadata is used (its embedded builtins, the
    /// interpreter among them), or elsewhere. The maps are re-read (as
    /// [`ProcessMaps::reread_for`] allows) for an address none covers.
    fn place(&self, maps: &mut ProcessMaps, addr: u64) -> Place {
        let Some(m) = maps.find_or_reread(addr) else {
            return Place::Elsewhere;
        };
        let special = m.path.starts_with('[') && !m.path.starts_with("[anon");
        if !m.perms.contains('x') {
            Place::Elsewhere
        } else if m.is_file_backed() {
            if m.name() == self.binary {
                Place::Binary
            } else {
                Place::Elsewhere
            }
        } else if special {
            Place::Elsewhere
        } else {
            Place::Jit
        }
    }

    /// Names the JavaScript frames of one stack: `frames` leaf first (as
    /// the sample keeps them), `frame_pointers` the frame pointer each
    /// frame had where the unwinder knew it, `copy` the stack bytes the
    /// frame slots are read from, and `maps` the process's mappings.
    pub fn name(
        &mut self,
        maps: &mut ProcessMaps,
        copy: &StackCopy,
        frames: &[u64],
        frame_pointers: &[Option<u64>],
    ) -> JsNames {
        let mut named = JsNames::default();
        for (i, (&addr, &fp)) in frames.iter().zip(frame_pointers).enumerate() {
            let Some(fp) = fp else { continue };
            let address = crate::model::lookup_address(i, addr);
            match self.place(maps, address) {
                Place::Jit if self.code.is_ok() => match self.expand(address) {
                    Ok(Expanded::Frames(frames)) => {
                        self.counts.optimized += 1;
                        self.counts.inlined += frames.len() as u64 - 1;
                        named.by_frame.push((i, frames));
                    }
                    Ok(Expanded::Baseline(info, offset)) => {
                        let function = match self.baseline.get(&info.code) {
                            Some(function) => Some(function.clone()),
                            // Only a settled frame's function slot is
                            // surely this code's function: a leaf may be
                            // in its prologue, named for the run by its
                            // slot until a settled frame names its code,
                            // unless its frame already holds the code's
                            // bytecodes (set up after the function).
                            None if i == 0 && !self.holds_bytecode_of(copy, fp, &info) => {
                                self.name_by_function(&mut named, copy, i, address, fp);
                                None
                            }
                            None => match self.function_at(copy, fp) {
                                Ok(function) => {
                                    if self.baseline.len() >= MAX_CACHED_FRAMES {
                                        self.baseline.clear();
                                    }
                                    self.baseline.insert(info.code, function.clone());
                                    Some(function)
                                }
                                Err(reason) => {
                                    self.counts.unnamed += 1;
                                    self.counts.first_failure.get_or_insert(reason);
                                    None
                                }
                            },
                        };
                        if let Some(function) = function {
                            self.counts.baseline += 1;
                            let line = self.baseline_line(&info, offset, &function);
                            let frame = Frame {
                                line,
                                ..self.frame_of(&function).as_ref().clone()
                            };
                            named.by_frame.push((i, Arc::from([frame])));
                        }
                    }
                    Err(reason) => {
                        self.counts.not_expanded += 1;
                        self.counts.first_expand_failure.get_or_insert(reason);
                        self.name_by_function(&mut named, copy, i, address, fp);
                    }
                },
                Place::Jit => {
                    self.name_by_function(&mut named, copy, i, address, fp);
                }
                // Most frames in the binary are native code: only those
                // that pass every check of an interpreted frame are named,
                // and the others are not failures.
                Place::Binary => {
                    if let Some((function, bytecode, offset)) =
                        self.interpreted_function_at(copy, fp)
                    {
                        self.counts.interpreted += 1;
                        let line = self.interpreted_line(&function, bytecode, offset);
                        let frame = Frame {
                            line,
                            ..self.frame_of(&function).as_ref().clone()
                        };
                        named.by_frame.push((i, Arc::from([frame])));
                    }
                }
                Place::Elsewhere => {}
            }
        }
        named
    }

    /// Names the JIT frame `i` (at lookup address `address`, frame
    /// pointer `fp`) by the JSFunction in its slot, for the run.
    fn name_by_function(
        &mut self,
        named: &mut JsNames,
        copy: &StackCopy,
        i: usize,
        address: u64,
        fp: u64,
    ) -> Option<Arc<Frame>> {
        match self.function_at(copy, fp) {
            Ok(function) => {
                self.counts.named += 1;
                let frame = self.frame_of(&function);
                named.by_address.push(NamedFrame {
                    address,
                    frame: Frame::clone(&frame),
                    settled: i > 0,
                });
                Some(frame)
            }
            Err(reason) => {
                self.counts.unnamed += 1;
                self.counts.first_failure.get_or_insert(reason);
                None
            }
        }
    }

    /// The frames optimized code at lookup address `address` stands for:
    /// the functions inlined there, innermost first, then the code's own
    /// function; baseline code, which keeps no function of its own, by
    /// its Code. An error when the address is not in code whose tables
    /// could be read.
    fn expand(&mut self, address: u64) -> Result<Expanded, String> {
        let Ok(finder) = &mut self.code else {
            return Err("no code layout".into());
        };
        let memory = self.memory.as_ref();
        let info = finder
            .code_at(&mut self.resolver.heap(memory), address)
            .map_err(|e| e.to_string())?;
        let offset = address - info.instruction_start;
        let Some(own) = info.own else {
            return Ok(Expanded::Baseline(info, offset));
        };
        // Keyed by the code's own function as well as the Code: code freed
        // and rebuilt at the same place is new code.
        let key = (info.code, own, offset);
        if let Some(frames) = self.expansions.get(&key) {
            return Ok(Expanded::Frames(frames.clone()));
        }
        let inlining = info.at(offset)?;
        let mut functions = Vec::with_capacity(inlining.inlined.len() + 1);
        for &(shared, _) in inlining.inlined.iter() {
            let function = self
                .resolver
                .shared(memory, shared)
                .map_err(|e| format!("an inlined function: {e}"))?;
            functions.push(function);
        }
        let function = self
            .resolver
            .shared(memory, own)
            .map_err(|e| format!("the code's own function: {e}"))?;
        functions.push(function);
        // Each frame at its own place: the inlined functions at the
        // positions the table gives, each caller at its call.
        let offsets = inlining
            .inlined
            .iter()
            .map(|&(_, offset)| offset)
            .chain(std::iter::once(inlining.own_offset));
        let frames: Vec<Frame> = functions
            .iter()
            .zip(offsets)
            .map(|(f, offset)| Frame {
                line: offset.and_then(|o| f.line_at(o)),
                ..self.frame_of(f).as_ref().clone()
            })
            .collect();
        let frames: Arc<[Frame]> = frames.into();
        if self.expansions.len() >= MAX_CACHED_FRAMES {
            self.expansions.clear();
        }
        self.expansions.insert(key, frames.clone());
        Ok(Expanded::Frames(frames))
    }

    /// The frame that names `function`, built once per function.
    fn frame_of(&mut self, function: &Arc<JsFunction>) -> Arc<Frame> {
        // Keyed by the function's allocation, which the entry keeps alive.
        let key = Arc::as_ptr(function) as usize;
        if let Some((_, frame)) = self.frames.get(&key) {
            return frame.clone();
        }
        let frame = Arc::new(Frame {
            name: function.frame_name(),
            module: JIT_MODULE.into(),
            line: None,
        });
        if self.frames.len() >= MAX_CACHED_FRAMES {
            self.frames.clear();
        }
        self.frames.insert(key, (function.clone(), frame.clone()));
        frame
    }

    /// The function of the JavaScript frame whose frame pointer is `fp`.
    fn function_at(&mut self, copy: &StackCopy, fp: u64) -> Result<Arc<JsFunction>, String> {
        let meta = self.resolver.metadata();
        let context = stack_word(copy, fp, meta.fp_context)
            .ok_or("the frame's slots are outside the stack copy")?;
        // A typed frame (stub, exit, builtin) keeps a marker there, which
        // is never a tagged pointer; a JavaScript frame keeps its context.
        if context & 1 == 0 {
            return Err("not a JavaScript frame (a frame-type marker)".into());
        }
        let function = stack_word(copy, fp, meta.fp_function)
            .ok_or("the frame's slots are outside the stack copy")?;
        self.resolver
            .function(self.memory.as_ref(), function)
            .map_err(|e| e.to_string())
    }

    /// The function of the frame whose frame pointer is `fp`, when it is
    /// an interpreted JavaScript frame: a context, a Smi bytecode offset
    /// and a BytecodeArray in their slots. Returned with the BytecodeArray
    /// (tagged) and the offset slot's value.
    fn interpreted_function_at(
        &mut self,
        copy: &StackCopy,
        fp: u64,
    ) -> Option<(Arc<JsFunction>, u64, i64)> {
        let meta = self.resolver.metadata();
        let bytecode_type = meta.bytecode_array_type?;
        let offset = stack_word(copy, fp, meta.fp_bytecode_offset?)?;
        let bytecode = stack_word(copy, fp, meta.fp_bytecode_array?)?;
        let offset = smi_value(offset).filter(|&o| o >= 0)?;
        if !self
            .resolver
            .is_of_type(self.memory.as_ref(), bytecode, bytecode_type)
        {
            return None;
        }
        let function = self.function_at(copy, fp).ok()?;
        Some((function, bytecode, offset))
    }

    /// Whether the frame at `fp` holds the BytecodeArray of the baseline
    /// code `info` in its bytecode slot.
    fn holds_bytecode_of(&self, copy: &StackCopy, fp: u64, info: &CodeInfo) -> bool {
        let Some(Ok(code)) = &info.baseline else {
            return false;
        };
        let Some(slot) = self.resolver.metadata().fp_bytecode_array else {
            return false;
        };
        stack_word(copy, fp, slot) == Some(code.bytecode)
    }

    /// The line a baseline frame runs at (`info` its Code, `offset` its
    /// instruction's offset in it): its function's first line in its
    /// prologue or where V8 has not collected the bytecode's positions;
    /// None where the walk failed (counted) or the script has no line
    /// table, and the frame is named by its function alone.
    fn baseline_line(
        &mut self,
        info: &CodeInfo,
        offset: u64,
        function: &JsFunction,
    ) -> Option<u32> {
        // No line table, no line: the bytecodes need not be read.
        function.line_ends.as_ref()?;
        let key = (info.code, offset);
        let found = match self.baseline_offsets.get(&key) {
            Some(&known) => Ok(known),
            None => {
                let found = match (&info.baseline, &mut self.bytecode) {
                    (Some(Ok(code)), Ok(positions)) => match code.bytecode_index_at(offset) {
                        Some(index) => positions
                            .baseline_script_offset(
                                &mut self.resolver.heap(self.memory.as_ref()),
                                code,
                                index,
                            )
                            .map_err(|e| e.to_string()),
                        // The prologue and what follows the last
                        // bytecode: the function's start.
                        None => Ok(None),
                    },
                    (Some(Err(reason)), _) => Err(reason.clone()),
                    (_, Err(reason)) => Err(reason.clone()),
                    // Optimized code that cannot deoptimize keeps neither
                    // its function nor positions: its function's start.
                    (None, _) => Ok(None),
                };
                if let Ok(known) = found {
                    if self.baseline_offsets.len() >= MAX_CACHED_FRAMES {
                        self.baseline_offsets.clear();
                    }
                    self.baseline_offsets.insert(key, known);
                }
                found
            }
        };
        match found {
            Ok(Some(script_offset)) => function.line_at(script_offset),
            // The prologue (V8's function entry), or no positions: its
            // function's first line.
            Ok(None) => function.position.map(|(line, _)| line),
            Err(reason) => {
                self.counts.baseline_without_line += 1;
                self.counts
                    .first_baseline_line_failure
                    .get_or_insert(reason);
                None
            }
        }
    }

    /// The line an interpreted frame of `function` is at, from its
    /// BytecodeArray and the value of its offset slot. A frame whose
    /// position could not be had is counted; one whose script has no line
    /// table (Node.js's own modules) is not: every frame of such a script
    /// goes without a line.
    fn interpreted_line(
        &mut self,
        function: &JsFunction,
        bytecode: u64,
        offset: i64,
    ) -> Option<u32> {
        // No line table, no line: the table need not be read.
        function.line_ends.as_ref()?;
        let found = match &mut self.bytecode {
            Ok(positions) => positions
                .script_offset(
                    &mut self.resolver.heap(self.memory.as_ref()),
                    bytecode,
                    offset,
                )
                .map_err(|e| e.to_string()),
            Err(reason) => Err(reason.clone()),
        };
        match found {
            Ok(Some(script_offset)) => return function.line_at(script_offset),
            Ok(None) => {}
            Err(reason) => {
                self.counts.first_line_failure.get_or_insert(reason);
            }
        }
        self.counts.interpreted_without_line += 1;
        None
    }
}

/// Where a frame's address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Jit,
    Binary,
    Elsewhere,
}

/// The names one stack's JavaScript frames got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JsNames {
    /// JIT frames: their addresses, named for the run.
    pub by_address: Vec<NamedFrame>,
    /// Frames named in this sample only: interpreted ones (their address
    /// is the interpreter's) and optimized code (what it inlined depends on
    /// the instruction, and code space is reused): index in the stack, and
    /// the frames it stands for, innermost first.
    pub by_frame: Vec<(usize, Arc<[Frame]>)>,
}

/// The word at `fp + offset` in the stack copy.
fn stack_word(copy: &StackCopy, fp: u64, offset: i64) -> Option<u64> {
    let at = fp.checked_add_signed(offset)?.checked_sub(copy.sp)?;
    let at = usize::try_from(at).ok()?;
    let word = copy.stack.get(at..at.checked_add(8)?)?;
    Some(u64::from_ne_bytes(word.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::function::fake::{self, FakeHeap};
    use super::*;

    /// A stack copy whose frames sit at `sp + 0x100` (innermost) and
    /// `sp + 0x200`, each with a context and a function in its slots.
    fn copy_with_frames(sp: u64, slots: &[(u64, u64, u64)]) -> StackCopy {
        let mut stack = vec![0u8; 0x400];
        for &(fp, context, function) in slots {
            let at = (fp - sp) as usize;
            stack[at - 8..at].copy_from_slice(&context.to_ne_bytes());
            stack[at - 16..at - 8].copy_from_slice(&function.to_ne_bytes());
        }
        StackCopy {
            tid: 1,
            id: 1,
            ip: 0,
            sp,
            bp: sp + 0x100,
            stack,
        }
    }

    fn mapping(start: u64, end: u64, inode: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            perms: "r-xp".into(),
            offset: 0,
            inode,
            path: path.into(),
        }
    }

    #[test]
    fn names_jit_frames_from_their_function_slot_and_nothing_else() {
        let mut h = FakeHeap::new();
        let name = h.one_byte("work");
        let undefined = h.undefined;
        let (function, _) = h.function(name, undefined);
        let context = h.object(fake::FIXED_ARRAY_TYPE, 2);
        let sp = 0x7ff0_0000;
        let copy = copy_with_frames(sp, &[(sp + 0x100, context, function), (sp + 0x200, 28, 0)]);
        let maps = vec![
            mapping(0x1000, 0x2000, 0, ""),
            mapping(0x5000, 0x6000, 7, "/usr/bin/node"),
        ];
        let mut maps = ProcessMaps::fixed(maps);
        let mut js = JsFrames::with_memory("node".into(), fake::metadata(true), Box::new(h));
        // JIT leaf, JIT caller in a typed frame, a file frame, a frame
        // with no frame pointer known.
        let frames = [0x1010, 0x1021, 0x5010, 0x1031];
        let fps = [Some(sp + 0x100), Some(sp + 0x200), Some(sp + 0x100), None];
        let named = js.name(&mut maps, &copy, &frames, &fps);
        assert!(named.by_frame.is_empty());
        assert_eq!(
            named.by_address,
            [NamedFrame {
                address: 0x1010,
                frame: Frame {
                    name: "JS:work".into(),
                    module: JIT_MODULE.into(),
                    line: None,
                },
                settled: false,
            }]
        );
        assert_eq!(js.counts().named, 1);
        assert_eq!(js.counts().unnamed, 1);
        assert!(js
            .counts()
            .first_failure
            .as_deref()
            .is_some_and(|r| r.contains("marker")));
        // Frame slots past the copy name nothing.
        let far = [Some(sp + 0x1000)];
        assert_eq!(
            js.name(&mut maps, &copy, &[0x1010], &far),
            JsNames::default()
        );
    }

    #[test]
    fn optimized_code_stands_for_the_functions_it_inlined() {
        let mut h = FakeHeap::new();
        let source = h.one_byte("");
        // Lines end at these offsets: 5 is on line 1, 50 on 3, 60 and 80
        // on 4, 90 on 5.
        let script = h.script("/app/x.js", source, Some(&[20, 40, 55, 85, 100]));
        let sfi = |h: &mut FakeHeap, name: &str| {
            let name = h.one_byte(name);
            h.function(name, script)
        };
        let (outer_function, outer) = sfi(&mut h, "outer");
        let (_, middle) = sfi(&mut h, "middle");
        let (_, leaf) = sfi(&mut h, "leaf");
        let (_, start) = code::tests::optimized_code(&mut h, outer, middle, leaf);
        let context = h.object(fake::FIXED_ARRAY_TYPE, 2);
        let sp = 0x7ff0_0000;
        let copy = copy_with_frames(sp, &[(sp + 0x100, context, outer_function)]);
        // The fake heap is V8's code space here.
        let maps = vec![Mapping {
            perms: "r-xp".into(),
            ..mapping(fake::BASE, fake::BASE + (1 << 20), 0, "")
        }];
        let mut maps = ProcessMaps::fixed(maps);
        let mut js = JsFrames::with_memory("node".into(), fake::metadata(true), Box::new(h));
        // In the leaf (inlined twice over), in the middle function as a
        // return address (looked up one byte before), in outer's own code.
        let frames = [start + 40, start + 21, start + 2];
        let fps = [Some(sp + 0x100); 3];
        let named = js.name(&mut maps, &copy, &frames, &fps);
        let names = |i: usize| -> Vec<(String, Option<u32>)> {
            named.by_frame[i]
                .1
                .iter()
                .map(|f| (f.name.clone(), f.line))
                .collect()
        };
        let at = |name: &str, line: u32| (format!("JS:{name} /app/x.js"), Some(line));
        assert!(named.by_address.is_empty());
        assert_eq!(
            named.by_frame.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        // Each function at its own line: the leaf where it runs, each
        // caller at its call.
        assert_eq!(names(0), [at("leaf", 5), at("middle", 4), at("outer", 3)]);
        assert_eq!(names(1), [at("middle", 4), at("outer", 3)]);
        assert_eq!(names(2), [at("outer", 1)]);
        let c = js.counts();
        assert_eq!(
            (c.optimized, c.inlined, c.named, c.not_expanded),
            (3, 3, 0, 0)
        );
    }

    #[test]
    fn baseline_code_is_named_by_the_function_a_settled_frame_of_it_had() {
        let mut h = FakeHeap::new();
        let undefined = h.undefined;
        let function = |h: &mut FakeHeap, name: &str| {
            let name = h.one_byte(name);
            h.function(name, undefined)
        };
        let (baseline_function, own) = function(&mut h, "warm");
        let (other_function, middle) = function(&mut h, "other");
        let (code, start) = code::tests::optimized_code(&mut h, own, middle, middle);
        let bytecode = h.object(fake::BYTECODE_ARRAY_TYPE, 4);
        h.set(code, 8, bytecode);
        let context = h.object(fake::FIXED_ARRAY_TYPE, 2);
        let sp = 0x7ff0_0000;
        let maps = vec![Mapping {
            perms: "r-xp".into(),
            ..mapping(fake::BASE, fake::BASE + (1 << 20), 0, "")
        }];
        let mut maps = ProcessMaps::fixed(maps);
        let mut js = JsFrames::with_memory("node".into(), fake::metadata(true), Box::new(h));
        // An innermost frame first: named by its slot, for the address only.
        let inner = copy_with_frames(sp, &[(sp + 0x100, context, other_function)]);
        let named = js.name(&mut maps, &inner, &[start + 8], &[Some(sp + 0x100)]);
        assert!(named.by_frame.is_empty());
        assert_eq!(named.by_address[0].frame.name, "JS:other");
        // A settled frame names the code, in its sample (its line depends
        // on the instruction).
        let settled = copy_with_frames(sp, &[(sp + 0x100, context, baseline_function)]);
        let named = js.name(
            &mut maps,
            &settled,
            &[0x10, start + 9],
            &[None, Some(sp + 0x100)],
        );
        assert!(named.by_address.is_empty());
        assert_eq!(named.by_frame[0].0, 1);
        assert_eq!(named.by_frame[0].1[0].name, "JS:warm");
        // From then on its frames are named by it, in their sample,
        // whatever the slot holds (here, an innermost frame in a prologue).
        let named = js.name(&mut maps, &inner, &[start + 20], &[Some(sp + 0x100)]);
        assert!(named.by_address.is_empty());
        assert_eq!(named.by_frame[0].0, 0);
        assert_eq!(named.by_frame[0].1[0].name, "JS:warm");
    }

    #[test]
    fn a_leaf_in_baseline_code_whose_frame_holds_its_bytecodes_is_named_in_its_sample() {
        let mut h = FakeHeap::new();
        let undefined = h.undefined;
        let name = h.one_byte("warm");
        let (function, own) = h.function(name, undefined);
        let (code, start) = code::tests::optimized_code(&mut h, own, own, own);
        let bytecode = h.object(fake::BYTECODE_ARRAY_TYPE, 4);
        h.set(code, 8, bytecode);
        let context = h.object(fake::FIXED_ARRAY_TYPE, 2);
        let sp = 0x7ff0_0000;
        let fp = sp + 0x100;
        let mut maps = ProcessMaps::fixed(vec![mapping(fake::BASE, fake::BASE + (1 << 20), 0, "")]);
        let mut js = JsFrames::with_memory("node".into(), fake::metadata(true), Box::new(h));
        // Its bytecode slot not yet written (a prologue): for the address.
        let mut copy = copy_with_frames(sp, &[(fp, context, function)]);
        let named = js.name(&mut maps, &copy, &[start + 8], &[Some(fp)]);
        assert!(named.by_frame.is_empty());
        assert_eq!(named.by_address[0].frame.name, "JS:warm");
        // Written: the frame is set up, its function slot is the code's.
        copy.stack[0x100 - 32..0x100 - 24].copy_from_slice(&bytecode.to_ne_bytes());
        let named = js.name(&mut maps, &copy, &[start + 8], &[Some(fp)]);
        assert!(named.by_address.is_empty());
        assert_eq!(named.by_frame[0].0, 0);
        assert_eq!(named.by_frame[0].1[0].name, "JS:warm");
        assert_eq!(js.counts.baseline, 1);
    }

    #[test]
    fn a_running_node_is_found_by_its_executable() {
        for (major, path) in super::metadata::tests::node_binaries() {
            let mut child = std::process::Command::new(&path)
                .args(["-e", "setTimeout(() => {}, 30000)"])
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let found = otel_thread_ctx_reader::maps::read(pid)
                .map_err(|e| e.to_string())
                .and_then(|m| process_metadata(pid, &m));
            child.kill().unwrap();
            child.wait().unwrap();
            let (binary, meta) = found.unwrap_or_else(|e| panic!("Node.js {major}: {e}"));
            assert_eq!(
                std::fs::canonicalize(&binary).unwrap(),
                std::fs::canonicalize(&path).unwrap(),
                "Node.js {major}"
            );
            assert_eq!(meta.fp_function, -16, "Node.js {major}");
        }
    }

    #[test]
    fn interpreted_frames_in_the_binary_are_named_in_their_sample_only() {
        let mut h = FakeHeap::new();
        let name = h.one_byte("slow");
        let undefined = h.undefined;
        let (function, _) = h.function(name, undefined);
        let context = h.object(fake::FIXED_ARRAY_TYPE, 2);
        let bytecode = h.object(fake::BYTECODE_ARRAY_TYPE, 4);
        let not_bytecode = h.object(fake::FIXED_ARRAY_TYPE, 4);
        let sp = 0x7ff0_0000;
        let mut copy = copy_with_frames(
            sp,
            &[
                (sp + 0x100, context, function),
                (sp + 0x200, context, function),
            ],
        );
        let mut put = |fp: u64, offset: i64, word: u64| {
            let at = (fp.checked_add_signed(offset).unwrap() - sp) as usize;
            copy.stack[at..at + 8].copy_from_slice(&word.to_ne_bytes());
        };
        // An interpreted frame; then one whose bytecode slot holds
        // something else (native code that happens to keep such words).
        put(sp + 0x100, -32, bytecode);
        put(sp + 0x100, -40, fake::smi(54));
        put(sp + 0x200, -32, not_bytecode);
        put(sp + 0x200, -40, fake::smi(54));
        let maps = vec![mapping(0x5000, 0x6000, 7, "/opt/node/bin/node")];
        let mut maps = ProcessMaps::fixed(maps);
        let mut js = JsFrames::with_memory(
            "/opt/node/bin/node".into(),
            fake::metadata(true),
            Box::new(h),
        );
        let named = js.name(
            &mut maps,
            &copy,
            &[0x5010, 0x5020],
            &[Some(sp + 0x100), Some(sp + 0x200)],
        );
        assert!(named.by_address.is_empty());
        assert_eq!(named.by_frame.len(), 1);
        assert_eq!(named.by_frame[0].0, 0);
        assert_eq!(named.by_frame[0].1[0].name, "JS:slow");
        assert_eq!((js.counts().interpreted, js.counts().unnamed), (1, 0));
    }
}
