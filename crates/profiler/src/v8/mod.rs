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

pub mod function;
pub mod heap;
pub mod metadata;

use std::time::{Duration, Instant};

use crate::kernel::StackCopy;
use crate::symbolize::Frame;
use otel_thread_ctx_reader::elf::MappedFile;
use otel_thread_ctx_reader::maps::{self, Mapping};
use otel_thread_ctx_reader::memory::{Memory, ProcessMemory};

pub use function::{JsFunction, Resolver};
pub use metadata::{Metadata, MetadataError};

/// How often the maps may be re-read for an address no mapping covers.
const REFRESH_EVERY: Duration = Duration::from_millis(200);

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

/// One JIT frame named from V8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedFrame {
    /// The frame's lookup address (a return address moved back into its
    /// call, as [`crate::model::lookup_address`] does).
    pub address: u64,
    pub frame: Frame,
    /// Not the stack's innermost frame: its frame pointer is its own for
    /// sure. The innermost frame may be in its function's first or last
    /// instructions, where the frame pointer is still its caller's.
    pub settled: bool,
}

/// What naming from V8 did in a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// JIT frames named from V8.
    pub named: u64,
    /// JIT frames V8 could not name (left to the perf map), and the first
    /// reason seen.
    pub unnamed: u64,
    pub first_failure: Option<String>,
}

/// Names the JIT frames of one process's samples from V8's heap.
pub struct JsFrames {
    pid: i32,
    binary: String,
    memory: Box<dyn Memory + Send>,
    resolver: Resolver,
    maps: Vec<Mapping>,
    refreshed: Instant,
    counts: Counts,
}

impl JsFrames {
    /// Sets up naming for process `pid`; an error says why V8 cannot name
    /// its frames (no metadata, a constant missing, memory unreadable).
    pub fn new(pid: i32, maps: Vec<Mapping>) -> Result<JsFrames, String> {
        let (binary, meta) = process_metadata(pid, &maps)?;
        let memory = ProcessMemory::open(pid, pid)
            .map_err(|e| format!("cannot read the memory of pid {pid}: {e}"))?;
        Ok(JsFrames::with_memory(
            pid,
            binary,
            meta,
            Box::new(memory),
            maps,
        ))
    }

    /// Names the frames of process `pid` with `meta`, reading its heap
    /// through `memory`.
    pub fn with_memory(
        pid: i32,
        binary: String,
        meta: Metadata,
        memory: Box<dyn Memory + Send>,
        maps: Vec<Mapping>,
    ) -> JsFrames {
        JsFrames {
            pid,
            binary,
            memory,
            resolver: Resolver::new(meta),
            maps,
            refreshed: Instant::now(),
            counts: Counts::default(),
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
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Whether `addr` is in anonymous executable memory (V8's code space),
    /// re-reading the maps (at most every [`REFRESH_EVERY`]) for an
    /// address none covers.
    fn in_jit_code(&mut self, addr: u64) -> bool {
        let find = |maps: &[Mapping]| {
            maps.iter()
                .find(|m| m.start <= addr && addr < m.end)
                .map(|m| {
                    let special = m.path.starts_with('[') && !m.path.starts_with("[anon");
                    !m.is_file_backed() && !special && m.perms.contains('x')
                })
        };
        if let Some(jit) = find(&self.maps) {
            return jit;
        }
        if self.refreshed.elapsed() < REFRESH_EVERY {
            return false;
        }
        self.refreshed = Instant::now();
        if let Ok(m) = maps::read(self.pid) {
            if !m.is_empty() {
                self.maps = m;
            }
        }
        find(&self.maps).unwrap_or(false)
    }

    /// Names the JIT frames of one stack: `frames` leaf first (as the
    /// sample keeps them), `frame_pointers` the frame pointer each frame
    /// had where the unwinder knew it, and `copy` the stack bytes the
    /// frame slots are read from.
    pub fn name(
        &mut self,
        copy: &StackCopy,
        frames: &[u64],
        frame_pointers: &[Option<u64>],
    ) -> Vec<NamedFrame> {
        let mut named = Vec::new();
        for (i, (&addr, &fp)) in frames.iter().zip(frame_pointers).enumerate() {
            let Some(fp) = fp else { continue };
            let address = crate::model::lookup_address(i, addr);
            if !self.in_jit_code(address) {
                continue;
            }
            match self.function_at(copy, fp) {
                Ok(function) => {
                    self.counts.named += 1;
                    named.push(NamedFrame {
                        address,
                        frame: Frame {
                            name: function.frame_name(),
                            module: JIT_MODULE.into(),
                        },
                        settled: i > 0,
                    });
                }
                Err(reason) => {
                    self.counts.unnamed += 1;
                    self.counts.first_failure.get_or_insert(reason);
                }
            }
        }
        named
    }

    /// The function of the JavaScript frame whose frame pointer is `fp`.
    fn function_at(
        &mut self,
        copy: &StackCopy,
        fp: u64,
    ) -> Result<std::sync::Arc<JsFunction>, String> {
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
        let mut js = JsFrames::with_memory(
            std::process::id() as i32,
            "node".into(),
            fake::metadata(true),
            Box::new(h),
            maps,
        );
        // JIT leaf, JIT caller in a typed frame, a file frame, a frame
        // with no frame pointer known.
        let frames = [0x1010, 0x1021, 0x5010, 0x1031];
        let fps = [Some(sp + 0x100), Some(sp + 0x200), Some(sp + 0x100), None];
        let named = js.name(&copy, &frames, &fps);
        assert_eq!(
            named,
            [NamedFrame {
                address: 0x1010,
                frame: Frame {
                    name: "JS:work".into(),
                    module: JIT_MODULE.into(),
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
        assert!(js.name(&copy, &[0x1010], &far).is_empty());
    }

    #[test]
    fn a_running_node_is_found_by_its_executable() {
        for (major, path) in super::metadata::tests::node_binaries() {
            let mut child = std::process::Command::new(&path)
                .args(["-e", "setTimeout(() => {}, 30000)"])
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let found = maps::read(pid)
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
}
