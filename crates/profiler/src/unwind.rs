//! Unwinds the user stack copies the kernel side sends, with framehop: the
//! CFI of each mapped module (`.eh_frame`, indexed by `.eh_frame_hdr`, or
//! `.debug_frame`) where it covers an address, frame pointers where none
//! does (V8's JIT code, which always keeps them).
//!
//! The kernel's own frame-pointer walk comes with every sample: it is kept
//! as the fallback (no copy, or a copy that ran out before the stack did)
//! and as the comparison the summary reports.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use object::{Object, ObjectSection, ObjectSegment};

use crate::kernel::{Kind, Sample, StackCopy};
use crate::process_maps::ProcessMaps;
use crate::symbolize::NamedFrame;
use crate::v8::JsFrames;
use otel_thread_ctx_reader::elf::MappedFile;
use otel_thread_ctx_reader::maps::Mapping;

/// Frames per unwound stack at most.
pub const MAX_UNWOUND_FRAMES: usize = 512;

/// A user stack, leaf first (the instruction pointer, then return addresses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stack {
    pub frames: Vec<u64>,
    /// The frame pointer (`rbp`) each frame had, as the unwinder restored
    /// it: the innermost frame's is the sampled register. Meaningful for
    /// code that keeps frame pointers (V8's JIT code), where a frame's
    /// slots sit at fixed offsets from it.
    pub frame_pointers: Vec<u64>,
    /// The unwinder found the stack's end (the thread's entry: its CFI
    /// marks no return address, or a zero frame pointer ends the chain)
    /// inside a module, rather than running out of stack bytes or rules.
    pub reached_entry: bool,
}

/// The unwind sections of one file, read once.
struct FileInfo {
    /// `(file offset, file size, virtual address)` of each `PT_LOAD`.
    loads: Vec<(u64, u64, u64)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    eh_frame: Option<(Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(Range<u64>, Arc<[u8]>)>,
    debug_frame: Option<Arc<[u8]>>,
}

impl FileInfo {
    fn read(path: &str) -> Option<FileInfo> {
        let file = File::open(path).ok()?;
        let mapped = MappedFile::map(&file).ok()?;
        let obj = object::File::parse(mapped.bytes()).ok()?;
        let section = |name: &str| {
            let s = obj.section_by_name(name)?;
            let data: Arc<[u8]> = Arc::from(s.data().ok()?);
            Some((s.address()..s.address() + s.size(), data))
        };
        let range = |name: &str| {
            obj.section_by_name(name)
                .map(|s| s.address()..s.address() + s.size())
        };
        Some(FileInfo {
            loads: obj
                .segments()
                .map(|s| {
                    let (offset, size) = s.file_range();
                    (offset, size, s.address())
                })
                .collect(),
            text: range(".text"),
            got: range(".got"),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|(_, d)| d),
        })
    }

    /// The load bias of this file when file offset `offset` is mapped at
    /// `start`.
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let &(file_offset, _, vaddr) = self
            .loads
            .iter()
            .find(|&&(o, size, _)| o <= offset && offset < o + size.max(1))?;
        Some(start.wrapping_sub(vaddr).wrapping_sub(offset - file_offset))
    }

    fn module(&self, m: &Mapping, bias: u64) -> Module<Arc<[u8]>> {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.clone(),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, d)| d.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            debug_frame: self.debug_frame.clone(),
            ..Default::default()
        };
        Module::new(m.name().to_string(), m.start..m.end, bias, info)
    }
}

/// Unwinds the stack copies of one process.
pub struct StackUnwinder {
    /// The generation of the process's maps the modules were added from.
    generation: u64,
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    cache: CacheX86_64,
    /// Start addresses of the executable mappings added as modules.
    added: HashSet<u64>,
    files: HashMap<String, Option<Arc<FileInfo>>>,
}

impl StackUnwinder {
    pub fn new(maps: &ProcessMaps) -> StackUnwinder {
        let mut u = StackUnwinder {
            generation: maps.generation(),
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            added: HashSet::new(),
            files: HashMap::new(),
        };
        u.add_modules(maps);
        u
    }

    /// Adds every executable file mapping not added yet.
    fn add_modules(&mut self, maps: &ProcessMaps) {
        self.generation = maps.generation();
        for m in maps.mappings() {
            if !m.is_file_backed() || !m.perms.contains('x') || self.added.contains(&m.start) {
                continue;
            }
            self.added.insert(m.start);
            let info = self
                .files
                .entry(m.name().to_string())
                .or_insert_with(|| FileInfo::read(m.name()).map(Arc::new));
            if let Some(info) = info {
                if let Some(bias) = info.bias(m.start, m.offset) {
                    self.unwinder.add_module(info.module(m, bias));
                }
            }
        }
    }

    /// Adds the modules of mappings the maps gained since last seen (their
    /// other users re-read them too).
    fn follow(&mut self, maps: &ProcessMaps) {
        if maps.generation() != self.generation {
            self.add_modules(maps);
        }
    }

    /// Unwinds one copy of the process `maps` describe. An address in no
    /// mapping has the maps re-read (as [`ProcessMaps::reread_for`]
    /// allows): code loaded since (dlopen) gets its module, and the copy
    /// is unwound again.
    pub fn unwind(&mut self, maps: &mut ProcessMaps, copy: &StackCopy) -> Stack {
        self.follow(maps);
        let stack = self.walk(maps, copy);
        let changed = stack
            .frames
            .iter()
            .any(|&a| maps.find(a).is_none() && maps.reread_for(a));
        if !changed {
            return stack;
        }
        self.follow(maps);
        self.walk(maps, copy)
    }

    fn walk(&mut self, maps: &ProcessMaps, copy: &StackCopy) -> Stack {
        let (sp, bytes) = (copy.sp, &copy.stack);
        let mut read_stack = |addr: u64| {
            let at = addr.checked_sub(sp).ok_or(())? as usize;
            let word = bytes.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_ne_bytes(word.try_into().map_err(|_| ())?))
        };
        // Frame by frame rather than through framehop's iterator, to keep
        // the registers each frame had.
        let mut regs = UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp);
        let mut frames = vec![copy.ip];
        let mut frame_pointers = vec![copy.bp];
        let mut address = FrameAddress::InstructionPointer(copy.ip);
        let mut ended = false;
        while frames.len() < MAX_UNWOUND_FRAMES {
            match self
                .unwinder
                .unwind_frame(address, &mut regs, &mut self.cache, &mut read_stack)
            {
                Ok(Some(return_address)) => {
                    // A null return address ends nothing: the walk failed.
                    let Some(next) = FrameAddress::from_return_address(return_address) else {
                        break;
                    };
                    frames.push(return_address);
                    frame_pointers.push(regs.bp());
                    address = next;
                }
                Ok(None) => {
                    ended = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let reached_entry = ended
            && frames
                .last()
                .and_then(|&a| maps.find(a))
                .is_some_and(Mapping::is_file_backed);
        Stack {
            frames,
            frame_pointers,
            reached_entry,
        }
    }
}

/// The stack a sample gets: the unwound one, continued with the
/// frame-pointer walk when it stopped at a return address that walk also
/// found (the copy ran out above it, but the frame-pointer chain went on);
/// the frame-pointer walk alone when there is no unwound stack worth more.
pub fn choose(unwound: &Stack, frame_pointers: &[u64]) -> Vec<u64> {
    let u = &unwound.frames;
    if unwound.reached_entry {
        return u.clone();
    }
    if u.len() < 2 {
        return if u.len() >= frame_pointers.len() {
            u.clone()
        } else {
            frame_pointers.to_vec()
        };
    }
    let last = u[u.len() - 1];
    // Where the frame-pointer walk has the unwound stack's last return
    // address (never its first frame: that is the same instruction pointer).
    match frame_pointers[1.min(frame_pointers.len())..]
        .iter()
        .position(|&a| a == last)
    {
        Some(i) => u.iter().chain(&frame_pointers[i + 2..]).copied().collect(),
        // The frame-pointer walk holds every unwound return address and more.
        None if frame_pointers.len() > u.len()
            && u[1..].iter().all(|a| frame_pointers.contains(a)) =>
        {
            frame_pointers.to_vec()
        }
        None => u.clone(),
    }
}

/// The frame pointer of each frame of `chosen` (a stack [`choose`] gave)
/// as far as it is the unwound stack; `None` from where it is not (frames
/// only the kernel's frame-pointer walk found).
pub fn chosen_frame_pointers(unwound: &Stack, chosen: &[u64]) -> Vec<Option<u64>> {
    let common = chosen
        .iter()
        .zip(&unwound.frames)
        .take_while(|(a, b)| a == b)
        .count()
        .min(unwound.frame_pointers.len());
    (0..chosen.len())
        .map(|i| (i < common).then(|| unwound.frame_pointers[i]))
        .collect()
}

/// How many samples (or how much time) had a whole user stack, and how
/// many would have with the frame-pointer walk alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wholeness {
    pub total: u64,
    pub truncated: u64,
    pub truncated_frame_pointers: u64,
}

impl Wholeness {
    pub fn add(&mut self, weight: u64, whole: bool, whole_frame_pointers: bool) {
        self.total += weight;
        if !whole {
            self.truncated += weight;
        }
        if !whole_frame_pointers {
            self.truncated_frame_pointers += weight;
        }
    }

    fn percent(part: u64, total: u64) -> f64 {
        if total == 0 {
            0.0
        } else {
            100.0 * part as f64 / total as f64
        }
    }

    pub fn truncated_percent(&self) -> f64 {
        Self::percent(self.truncated, self.total)
    }

    pub fn truncated_frame_pointers_percent(&self) -> f64 {
        Self::percent(self.truncated_frame_pointers, self.total)
    }
}

/// Thread entries seen in a run: the outermost frames of the stacks the
/// unwinder saw end. A stack whose outermost frame is one of them is whole.
#[derive(Debug, Default)]
pub struct Entries(HashSet<u64>);

impl Entries {
    pub fn note(&mut self, unwound: &Stack) {
        if unwound.reached_entry {
            if let Some(&a) = unwound.frames.last() {
                self.0.insert(a);
            }
        }
    }

    /// Whether a stack whose outermost frame is `outermost` is whole.
    pub fn ends(&self, outermost: Option<u64>) -> bool {
        outermost.is_some_and(|a| self.0.contains(&a))
    }
}

/// The user stacks of one run: unwinds each sample's copy as it arrives
/// (while the process and its maps are there), names its JIT frames from
/// V8 when it can, and keeps what the truncated shares need.
pub struct Stacks {
    unwinder: StackUnwinder,
    entries: Entries,
    /// Naming from V8's heap, or why there is none.
    js_frames: Result<JsFrames, String>,
    /// Per sample: kind, weight (1 on CPU, nanoseconds off CPU), and the
    /// outermost frames of the frame-pointer walk and of the stack kept.
    outermost: Vec<(Kind, u64, Option<u64>, Option<u64>)>,
}

impl Stacks {
    /// The stacks of process `pid`, whose maps are `maps`.
    pub fn new(pid: i32, maps: &ProcessMaps) -> Stacks {
        Stacks {
            unwinder: StackUnwinder::new(maps),
            entries: Entries::default(),
            js_frames: JsFrames::new(pid, maps.mappings()),
            outermost: Vec::new(),
        }
    }

    /// Naming from V8's heap, or why there is none.
    pub fn js_frames(&self) -> Result<&JsFrames, &str> {
        self.js_frames.as_ref().map_err(String::as_str)
    }

    /// Replaces the sample's user stack by the unwound one where that is
    /// worth more, and drops the copy. Returns the JIT frames V8 named.
    pub fn take(&mut self, maps: &mut ProcessMaps, s: &mut Sample) -> Vec<NamedFrame> {
        let frame_pointers = s.user_stack.last().copied();
        let mut named = Vec::new();
        if let Some(copy) = s.user_stack_copy.take() {
            let unwound = self.unwinder.unwind(maps, &copy);
            self.entries.note(&unwound);
            s.user_stack = choose(&unwound, &s.user_stack);
            if let Ok(js) = &mut self.js_frames {
                let fps = chosen_frame_pointers(&unwound, &s.user_stack);
                let names = js.name(maps, &copy, &s.user_stack, &fps);
                s.frame_names = names.by_frame;
                named = names.by_address;
            }
        }
        let weight = match s.kind {
            Kind::OnCpu => 1,
            Kind::OffCpu => s.off_cpu_ns,
        };
        self.outermost
            .push((s.kind, weight, frame_pointers, s.user_stack.last().copied()));
        named
    }

    /// Truncated shares on CPU (by samples) and off CPU (by time).
    pub fn wholeness(&self) -> (Wholeness, Wholeness) {
        let (mut on, mut off) = (Wholeness::default(), Wholeness::default());
        for &(kind, weight, fp, kept) in &self.outermost {
            let w = if kind == Kind::OnCpu {
                &mut on
            } else {
                &mut off
            };
            w.add(weight, self.entries.ends(kept), self.entries.ends(fp));
        }
        (on, off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwound_stack_that_ran_out_continues_with_the_frame_pointer_walk() {
        let unwound = Stack {
            frames: vec![0x10, 0x20, 0x30],
            reached_entry: false,
            ..Default::default()
        };
        // The frame-pointer walk lost 0x20 (libc without frame pointers)
        // but went on above 0x30.
        assert_eq!(
            choose(&unwound, &[0x10, 0x30, 0x40, 0x50]),
            [0x10, 0x20, 0x30, 0x40, 0x50]
        );
        // Nothing in common: the unwound stack stands.
        assert_eq!(choose(&unwound, &[0x10, 0x99]), [0x10, 0x20, 0x30]);
        let whole = Stack {
            frames: vec![0x10, 0x20],
            reached_entry: true,
            ..Default::default()
        };
        assert_eq!(choose(&whole, &[0x10, 0x20, 0x77]), [0x10, 0x20]);
        // No copy: the frame-pointer walk.
        assert_eq!(choose(&Stack::default(), &[0x10, 0x20]), [0x10, 0x20]);
    }

    #[test]
    fn frame_pointers_follow_the_chosen_stack() {
        let unwound = Stack {
            frames: vec![0x10, 0x20, 0x30],
            frame_pointers: vec![0x100, 0x200, 0x300],
            reached_entry: false,
        };
        let chosen = choose(&unwound, &[0x10, 0x30, 0x40]);
        assert_eq!(
            chosen_frame_pointers(&unwound, &chosen),
            [Some(0x100), Some(0x200), Some(0x300), None]
        );
        // From where the stacks part, no frame pointer is known.
        assert_eq!(
            chosen_frame_pointers(&unwound, &[0x10, 0x99, 0x30]),
            [Some(0x100), None, None]
        );
    }

    #[test]
    fn wholeness_counts_by_weight() {
        let mut w = Wholeness::default();
        w.add(3, true, false);
        w.add(1, false, false);
        assert_eq!(w.truncated_percent(), 25.0);
        assert_eq!(w.truncated_frame_pointers_percent(), 100.0);
        assert_eq!(Wholeness::default().truncated_percent(), 0.0);
    }

    #[inline(never)]
    fn innermost(out: &mut Option<StackCopy>) {
        // The registers and stack of this very thread, as the BPF program
        // would copy them.
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers into locals; touches no memory.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
            )
        };
        // Up to 64 KiB above the stack pointer, as far as it is mapped.
        let mut stack = vec![0u8; 64 * 1024];
        let mem = File::open("/proc/self/mem").unwrap();
        let n = std::os::unix::fs::FileExt::read_at(&mem, &mut stack, sp).unwrap();
        stack.truncate(n);
        *out = Some(StackCopy {
            tid: 0,
            id: 1,
            ip,
            sp,
            bp,
            stack,
        });
    }

    #[inline(never)]
    fn middle(out: &mut Option<StackCopy>) {
        innermost(out);
        std::hint::black_box(());
    }

    #[test]
    fn unwinds_this_thread_to_its_entry() {
        let mut copy = None;
        middle(&mut copy);
        let copy = copy.unwrap();
        let pid = std::process::id() as i32;
        let mut maps = ProcessMaps::new(pid, otel_thread_ctx_reader::maps::read(pid).unwrap());
        let mut u = StackUnwinder::new(&maps);
        let stack = u.unwind(&mut maps, &copy);
        assert!(stack.reached_entry, "{stack:?}");
        assert_eq!(stack.frames.len(), stack.frame_pointers.len());
        assert_eq!(stack.frame_pointers[0], copy.bp);
        let me = unwinds_this_thread_to_its_entry as *const () as usize as u64;
        // The caller of `middle` is this test function: some return address
        // lands shortly after its start.
        assert!(
            stack.frames.iter().any(|&a| a > me && a < me + 4096),
            "{stack:x?}"
        );
    }
}
