//! Where a target's libuv threadpool can be probed: the module (the `node`
//! executable, or a libnode/libuv it loaded) whose symbol table names
//! `uv__work_submit`, where every pool item is queued, and the work
//! functions a pool thread calls for an item. libuv keeps these functions
//! local, so only `.symtab` names them: a stripped build cannot be probed.
//!
//! Each probe sits on an instruction the kernel's x86 uprobes emulate (a
//! register push, a direct call or jump, a conditional jump, a no-op): any
//! other instruction is single-stepped out of line, a second trap, far
//! costlier than the first where debug exceptions leave a virtual machine
//! (BENCHMARKS.md).

use std::path::PathBuf;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use object::elf;
use object::read::elf::{ElfFile64, ProgramHeader, Sym};
use object::Endianness;

use crate::kernel::{ItemRead, RecordRead, RunningItemPlan, Sample};
use crate::model::lookup_address;
use crate::symbolize::Names;
use otel_thread_ctx_reader::elf::MappedFile;
use otel_thread_ctx_reader::maps::Mapping;

/// Queues a work item: `uv__work_submit(loop, w, kind, work, done)`.
/// The file system and DNS requests call it; `uv_queue_work` has its own
/// copy inlined, so it is probed too.
pub const SUBMIT: &str = "uv__work_submit";

/// `uv_queue_work(loop, req, work_cb, after_work_cb)`: crypto, zlib, N-API
/// async work and most of Node's other pool work.
pub const QUEUE_WORK: &str = "uv_queue_work";

/// Where a `uv_work_t` keeps its `struct uv__work` (`work_req`): libuv's
/// ABI, stable across 1.x on 64-bit Unix (node's `uv__queue_work` steps
/// back by the same amount to find the request).
pub const WORK_REQ_OFFSET: u64 = 88;

/// libuv's own work functions, each called as `work(w)` on a pool thread
/// with the `w` that was queued: file system requests, `uv_queue_work`'s
/// items, DNS lookups. (`uv_random` queues its own inlined, unprobed.)
pub const WORK_FUNCTIONS: [&str; 4] = [
    "uv__fs_work",
    "uv__queue_work",
    "uv__getaddrinfo_work",
    "uv__getnameinfo_work",
];

/// libuv's pool thread loop, which calls each item's work function.
pub const WORKER_LOOP: &str = "worker";

/// Where a running item's span is read at sample time (frame mode): the
/// libuv and Node layouts between a `struct uv__work` and the
/// AsyncContextFrame its request was made in. libuv's are its 1.x ABI on
/// 64-bit Unix (`uv.h` in Node's `include/node/`); Node's are those of
/// Node 24 and 26 (their `node.h`, and the objects the sample-time test
/// reads on both).
pub mod layout {
    /// `struct uv__work`: the queue link, which points at itself while the
    /// item runs.
    pub const WQ: u64 = 24;
    /// `uv_fs_t`: its `struct uv__work`.
    pub const FS_WORK_REQ: u64 = 336;
    /// `uv_getaddrinfo_t` and `uv_getnameinfo_t`: theirs.
    pub const ADDRINFO_WORK_REQ: u64 = 72;
    /// `uv_work_t`: its `work_cb`.
    pub const WORK_CB: u64 = 72;
    /// `node::ThreadPoolWork`: its `uv_work_t`, after the vtable pointer
    /// and the environment.
    pub const THREAD_POOL_WORK_REQ: u64 = 16;
    /// `node::BaseObject` (every `AsyncWrap`): the global handle of its JS
    /// object, after the vtable pointer.
    pub const ASYNC_WRAP_OBJECT: u64 = 8;
    /// That JS object (untagged): where internal field `index` is (field
    /// 0 is where the Node.js schema's default wrapper holds its record,
    /// and fields are 8 bytes apart). `AsyncWrap` keeps the context frame
    /// of its creation in one, which `AsyncWrap::AsyncReset` names.
    pub const fn internal_field(index: u32) -> u64 {
        otel_thread_ctx_abi::node_schema::DEFAULT_LAYOUT.js_object_record_offset + index as u64 * 8
    }
    /// `node::AsyncResource`: `context_frame_`, a global handle, after the
    /// vtable pointer, the environment and the resource's handle.
    pub const ASYNC_RESOURCE_FRAME: u64 = 24;
    /// `node::AsyncWrap`: `async_id_`, after the `BaseObject`, its list
    /// node and the provider.
    pub const ASYNC_WRAP_ID: u64 = 0x38;
    /// `node::AsyncResource`: `async_context_.async_id`, after
    /// `context_frame_`.
    pub const ASYNC_RESOURCE_ID: u64 = 32;
}

/// The callback node's `ThreadPoolWork` queues every item with (crypto,
/// zlib, N-API async work, ...): a lambda whose name depends on the
/// compiler (GCC's `_FUN`, Clang's `__invoke`).
const THREAD_POOL_WORK_CB_PREFIX: &str =
    "_ZZN4node14ThreadPoolWork12ScheduleWorkEvENUlP9uv_work_sE_";
const THREAD_POOL_WORK_CB_SUFFIXES: [&str; 2] = ["4_FUNES2_", "8__invokeES2_"];

/// Where node gives an AsyncWrap the context frame it is made in, and the
/// V8 call that stores it in an internal field of the wrap's JS object
/// (Node 24 and later; Node 22 with AsyncContextFrame keeps it in a C++
/// member instead, which the sample-time reading does not know).
const ASYNC_RESET: &str = "_ZN4node9AsyncWrap10AsyncResetEN2v85LocalINS1_6ObjectEEEd";
const SET_INTERNAL_FIELD: &str = "_ZN2v86Object16SetInternalFieldEiNS_5LocalINS_4DataEEE";

/// The vtable of N-API's async work (`uvimpl::Work`, an `AsyncResource`).
const NAPI_WORK_VTABLE: &str = "_ZTVN12_GLOBAL__N_16uvimpl4WorkE";

/// Bytes from a vtable's symbol to where objects point (past the offset to
/// top and the type info).
const VTABLE_ADDRESS_POINT: u64 = 16;

/// The registers a compiler may keep the worker loop's item in across a
/// call (the callee-saved ones), in the order the BPF program numbers them.
const ITEM_REGISTERS: [Register; 6] = [
    Register::RBX,
    Register::RBP,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// Where libuv's worker loop starts each item, whatever its kind: the
/// direct call just before `w->work(w)` (libuv unlocks the queue's mutex
/// there). One probe there replaces one per work function, and is always
/// emulated; `uv__queue_work` (every `uv_queue_work` item) begins with an
/// instruction that is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemStart {
    /// File offset of the probed call.
    pub offset: u64,
    /// The callee-saved register that holds the item across that call
    /// (an index into the BPF program's list), and what to add to it to get
    /// the `struct uv__work *` (the call through `w->work` names both).
    pub register: u8,
    pub displacement: i32,
    /// From the probed call to the return address of `w->work(w)`: the
    /// value the item's stack slot holds while the item runs.
    pub return_distance: u16,
}

impl ItemStart {
    /// The probe's BPF cookie: return distance in bits 0-15, register in
    /// bits 16-23, displacement (two's complement) in bits 32-63.
    pub fn cookie(&self) -> u64 {
        u64::from(self.return_distance)
            | u64::from(self.register) << 16
            | u64::from(self.displacement as u32) << 32
    }
}

/// Finds the item start in the code of libuv's worker loop at `ip`: the one
/// indirect call through a callee-saved register with no index (`w->work`,
/// at the start of `struct uv__work`), reached from a direct call with only
/// `lea`/`mov` into other registers between them. Returns the address of
/// that direct call with the rest of the site; `None` unless exactly one
/// such call is found.
fn item_start_in(code: &[u8], ip: u64) -> Option<(u64, u8, i32, u16)> {
    let insns: Vec<Instruction> = instructions(code, ip).collect();
    let mut found = None;
    for (i, call) in insns.iter().enumerate() {
        if call.mnemonic() != Mnemonic::Call
            || call.op0_kind() != OpKind::Memory
            || call.memory_index() != Register::None
        {
            continue;
        }
        let base = call.memory_base();
        let Some(register) = ITEM_REGISTERS.iter().position(|&r| r == base) else {
            continue;
        };
        let Ok(displacement) = i32::try_from(call.memory_displacement64() as i64) else {
            continue;
        };
        let mut site = None;
        for prior in insns[i.saturating_sub(4)..i].iter().rev() {
            if prior.mnemonic() == Mnemonic::Call && direct(prior) {
                site = Some(prior);
                break;
            }
            let moves_into_other_register =
                matches!(prior.mnemonic(), Mnemonic::Lea | Mnemonic::Mov)
                    && prior.op0_kind() == OpKind::Register
                    && ![base, Register::RSP].contains(&prior.op0_register().full_register());
            if !moves_into_other_register {
                break;
            }
        }
        let Some(site) = site else { continue };
        if found.is_some() {
            return None;
        }
        let distance = u16::try_from(call.next_ip() - site.ip()).ok()?;
        found = Some((site.ip(), register as u8, displacement, distance));
    }
    found
}

/// The internal field `AsyncWrap::AsyncReset` (its code at `ip`) stores the
/// context frame in: the index each direct call to `set_internal_field`
/// passes (`mov esi, index` before it). `None` unless there is such a call
/// and all of them pass the same index.
fn frame_field_in(code: &[u8], ip: u64, set_internal_field: u64) -> Option<u32> {
    let insns: Vec<Instruction> = instructions(code, ip).collect();
    let mut found = None;
    for (i, call) in insns.iter().enumerate() {
        if call.mnemonic() != Mnemonic::Call
            || !direct(call)
            || call.near_branch_target() != set_internal_field
        {
            continue;
        }
        // The nearest write of rsi (or a part of it) before the call is its
        // index argument.
        let index = insns[..i]
            .iter()
            .rev()
            .take(8)
            .find(|p| {
                p.op0_kind() == OpKind::Register
                    && p.op0_register().full_register() == Register::RSI
            })
            .filter(|p| p.op0_register() == Register::ESI)
            .filter(|p| p.mnemonic() == Mnemonic::Mov && p.op1_kind() == OpKind::Immediate32)
            .map(|p| p.immediate32())?;
        if found.is_some_and(|f| f != index) {
            return None;
        }
        found = Some(index);
    }
    found
}

/// Whether the kernel's x86 uprobes emulate `insn` instead of
/// single-stepping it.
fn emulated(insn: &Instruction) -> bool {
    match insn.mnemonic() {
        Mnemonic::Push => insn.op0_kind() == OpKind::Register && insn.op0_register().size() == 8,
        Mnemonic::Nop => true,
        Mnemonic::Call | Mnemonic::Jmp => direct(insn),
        Mnemonic::Ja
        | Mnemonic::Jae
        | Mnemonic::Jb
        | Mnemonic::Jbe
        | Mnemonic::Je
        | Mnemonic::Jg
        | Mnemonic::Jge
        | Mnemonic::Jl
        | Mnemonic::Jle
        | Mnemonic::Jne
        | Mnemonic::Jno
        | Mnemonic::Jnp
        | Mnemonic::Jns
        | Mnemonic::Jo
        | Mnemonic::Jp
        | Mnemonic::Js => direct(insn),
        _ => false,
    }
}

/// x86-64 `code` loaded at `ip`, decoded.
fn instructions(code: &[u8], ip: u64) -> impl Iterator<Item = Instruction> + '_ {
    Decoder::with_ip(64, code, ip, DecoderOptions::NONE).into_iter()
}

/// A branch to an address encoded in the instruction itself.
fn direct(insn: &Instruction) -> bool {
    insn.op0_kind() == OpKind::NearBranch64
}

/// Where in a function's `code` (at `ip`) an entry probe goes: its first
/// instruction when the kernel emulates it, else the first emulated one
/// after leading instructions that write nothing but the flags (`endbr64`,
/// `test`, `cmp`: the arguments are still untouched there).
fn emulated_entry(code: &[u8], ip: u64) -> u64 {
    for insn in instructions(code, ip).take(4) {
        if emulated(&insn) {
            return insn.ip() - ip;
        }
        if !matches!(
            insn.mnemonic(),
            Mnemonic::Endbr64 | Mnemonic::Test | Mnemonic::Cmp
        ) {
            break;
        }
    }
    0
}

/// What libuv's worker loop calls between items, to wait for the next one
/// and to hand the finished one back: its lock, condition variable and
/// async handle wrappers, or the pthread functions they inline to (glibc's
/// names may start with underscores).
const BETWEEN_ITEMS: [&str; 5] = [
    "uv_cond_",
    "uv_mutex_",
    "uv_async_send",
    "uv_sem_",
    "pthread_",
];

/// Whether a pool thread's unwound user stack (function names, leaf first;
/// `None` for an unnamed frame) shows libuv's worker loop between items:
/// running its own code, or in one of its lock, wait or wake-up calls
/// rather than a work function. A stack that does not reach the worker loop
/// says nothing.
pub fn between_items(user_frames: &[Option<&str>]) -> bool {
    match user_frames.iter().position(|f| *f == Some(WORKER_LOOP)) {
        None => false,
        Some(0) => true,
        Some(i) => user_frames[i - 1]
            .map(|callee| callee.trim_start_matches('_'))
            .is_some_and(|callee| BETWEEN_ITEMS.iter().any(|p| callee.starts_with(p))),
    }
}

/// The kernel side tells a pool thread's item from its waits for work by a
/// stack slot; the whole stack, once unwound and named, can say so for
/// sure. Clears the queued span of pool samples taken between items, so
/// every output agrees; returns how many there were.
pub fn clear_between_items(samples: &mut [Sample], names: &Names) -> usize {
    let mut cleared = 0;
    for s in samples.iter_mut().filter(|s| s.threadpool) {
        let frames: Vec<Option<&str>> = s
            .user_stack
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                names
                    .user
                    .get(&lookup_address(i, a))
                    .map(|f| f.name.as_str())
            })
            .collect();
        if between_items(&frames) {
            s.threadpool = false;
            s.record = RecordRead::Null;
            cleared += 1;
        }
    }
    cleared
}

/// Gives each pool sample whose item's span could not be read at sample
/// time (its isolate was in a moving GC) the span that another sample of
/// the same item carries, or that the program read after the GC while the
/// item still ran (`reads`): the item's address with its resource's async
/// id names one request for the process's life, and a request keeps the
/// context it was made in. Returns how many samples it filled.
pub fn fill_from_same_item(samples: &mut [Sample], reads: &[ItemRead]) -> usize {
    let mut read: std::collections::HashMap<
        (u32, u64, u64),
        (RecordRead, otel_thread_ctx_reader::schema::Schema),
    > = samples
        .iter()
        .filter(|s| s.threadpool)
        .filter_map(|s| {
            let (item, id) = s.pool_item?;
            Some(((s.tgid, item, id), (s.record.clone(), s.schema)))
        })
        .collect();
    for r in reads.iter().filter(|r| r.record.valid().is_some()) {
        read.entry((r.tgid, r.item, r.async_id)).or_insert_with(|| {
            (
                r.record.clone(),
                otel_thread_ctx_reader::schema::Schema::Nodejs,
            )
        });
    }
    let mut filled = 0;
    for s in samples
        .iter_mut()
        .filter(|s| s.pool_unread && !s.threadpool)
    {
        let Some((item, id)) = s.pool_item else {
            continue;
        };
        if let Some((record, schema)) = read.get(&(s.tgid, item, id)) {
            s.record = record.clone();
            s.schema = *schema;
            s.threadpool = true;
            filled += 1;
        }
    }
    filled
}

/// A probe site where work is queued: the function, its file offset, and
/// what to add to its second argument to get the `struct uv__work *`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitter {
    pub function: &'static str,
    pub offset: u64,
    pub work_offset: u64,
}

/// The uprobe sites of one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probes {
    /// The module as the process maps it.
    pub module: String,
    /// The same file as this process reaches it (through the target's root).
    pub attach_path: PathBuf,
    /// What the module offers the probes.
    pub sites: Sites,
}

/// What one ELF image offers the threadpool probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sites {
    /// Where work is queued.
    pub submitters: Vec<Submitter>,
    /// Where the worker loop starts each item: probed instead of the work
    /// functions when found.
    pub item_start: Option<ItemStart>,
    /// The work functions found, with their file offsets.
    pub work: Vec<(&'static str, u64)>,
    /// File offset of node's `ThreadPoolWork` callback, if found.
    pub thread_pool_work_cb: Option<u64>,
    /// File offset of N-API's async work vtable, if found.
    pub napi_work_vtable: Option<u64>,
    /// The internal field of an AsyncWrap's JS object that holds the
    /// context frame it was made in, if `AsyncWrap::AsyncReset` shows it.
    pub async_wrap_frame_field: Option<u32>,
}

/// The probe sites in one ELF image: where work is queued (each probe on
/// its function's first emulated instruction), where the worker loop starts
/// items, and the work functions present. `None` when it defines neither
/// `uv__work_submit` nor `uv_queue_work`.
pub fn sites(data: &[u8]) -> Result<Option<Sites>, object::read::Error> {
    let file = ElfFile64::<Endianness>::parse(data)?;
    let endian = file.endian();
    let loads: Vec<(u64, u64, u64)> = file
        .elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
        .map(|ph| (ph.p_vaddr(endian), ph.p_filesz(endian), ph.p_offset(endian)))
        .collect();
    let file_offset = |vaddr: u64| {
        loads
            .iter()
            .find(|&&(start, size, _)| vaddr >= start && vaddr - start < size)
            .map(|&(start, _, offset)| vaddr - start + offset)
    };
    // A function's code as the file holds it, with its address.
    let code = |vaddr: u64, size: u64| -> Option<(&[u8], u64)> {
        let at = usize::try_from(file_offset(vaddr)?).ok()?;
        let len = usize::try_from(size).ok()?;
        Some((data.get(at..at.checked_add(len)?)?, vaddr))
    };
    let mut submitters: Vec<Submitter> = Vec::new();
    let mut work = Vec::new();
    let mut item_start = None;
    let (mut thread_pool_work_cb, mut napi_work_vtable) = (None, None);
    let (mut async_reset, mut set_internal_field) = (None, None);
    for table in [file.elf_symbol_table(), file.elf_dynamic_symbol_table()] {
        let strings = table.strings();
        for sym in table.symbols() {
            if sym.st_shndx(endian) == elf::SHN_UNDEF {
                continue;
            }
            let Ok(name) = sym.name(endian, strings) else {
                continue;
            };
            let (vaddr, size) = (sym.st_value(endian), sym.st_size(endian));
            let Some(offset) = file_offset(vaddr) else {
                continue;
            };
            if sym.st_type() == elf::STT_OBJECT && name == NAPI_WORK_VTABLE.as_bytes() {
                napi_work_vtable = Some(offset);
                continue;
            }
            if sym.st_type() != elf::STT_FUNC {
                continue;
            }
            if is_thread_pool_work_cb(name) {
                thread_pool_work_cb = Some(offset);
                continue;
            }
            if name == ASYNC_RESET.as_bytes() {
                async_reset = Some((vaddr, size));
                continue;
            }
            if name == SET_INTERNAL_FIELD.as_bytes() {
                set_internal_field = Some(vaddr);
                continue;
            }
            let submitter = match name {
                n if n == SUBMIT.as_bytes() => Some((SUBMIT, 0)),
                n if n == QUEUE_WORK.as_bytes() => Some((QUEUE_WORK, WORK_REQ_OFFSET)),
                _ => None,
            };
            if let Some((function, work_offset)) = submitter {
                if !submitters.iter().any(|s| s.function == function) {
                    let skip = code(vaddr, size).map_or(0, |(c, ip)| emulated_entry(c, ip));
                    submitters.push(Submitter {
                        function,
                        offset: offset + skip,
                        work_offset,
                    });
                }
            } else if name == WORKER_LOOP.as_bytes() && item_start.is_none() {
                item_start = code(vaddr, size)
                    .and_then(|(c, ip)| item_start_in(c, ip))
                    .and_then(|(site, register, displacement, return_distance)| {
                        Some(ItemStart {
                            offset: file_offset(site)?,
                            register,
                            displacement,
                            return_distance,
                        })
                    });
            } else if let Some(&known) = WORK_FUNCTIONS.iter().find(|f| f.as_bytes() == name) {
                if !work.iter().any(|&(n, _)| n == known) {
                    work.push((known, offset));
                }
            }
        }
    }
    let async_wrap_frame_field =
        async_reset
            .zip(set_internal_field)
            .and_then(|((vaddr, size), set)| {
                code(vaddr, size).and_then(|(c, ip)| frame_field_in(c, ip, set))
            });
    work.sort_by_key(|&(name, _)| WORK_FUNCTIONS.iter().position(|&f| f == name));
    submitters.sort_by_key(|s| s.function != SUBMIT);
    Ok((!submitters.is_empty()).then_some(Sites {
        submitters,
        item_start,
        work,
        thread_pool_work_cb,
        napi_work_vtable,
        async_wrap_frame_field,
    }))
}

fn is_thread_pool_work_cb(name: &[u8]) -> bool {
    name.strip_prefix(THREAD_POOL_WORK_CB_PREFIX.as_bytes())
        .is_some_and(|rest| {
            THREAD_POOL_WORK_CB_SUFFIXES
                .iter()
                .any(|s| rest == s.as_bytes())
        })
}

/// Where `pid` maps `offset` of `module`, if it does.
fn runtime_address(maps: &[Mapping], module: &str, offset: u64) -> Option<u64> {
    maps.iter()
        .find(|m| m.name() == module && offset >= m.offset && offset - m.offset < m.len())
        .map(|m| m.start + (offset - m.offset))
}

/// The plan for reading a pool thread's running item at sample time, when
/// the module offers the worker loop's item start, the work functions and
/// the AsyncWrap's frame field (`uv_queue_work` items need node's
/// `ThreadPoolWork` callback as well).
pub fn running_item_plan(probes: &Probes, maps: &[Mapping]) -> Option<RunningItemPlan> {
    let sites = &probes.sites;
    let start = sites.item_start?;
    let frame_field = sites.async_wrap_frame_field?;
    let at = |offset: u64| runtime_address(maps, &probes.module, offset);
    let work = |name: &str| {
        sites
            .work
            .iter()
            .find(|&&(n, _)| n == name)
            .and_then(|&(_, offset)| at(offset))
            .unwrap_or(0)
    };
    let plan = RunningItemPlan {
        return_address: at(start.offset + u64::from(start.return_distance))?,
        fs_work: work(WORK_FUNCTIONS[0]),
        queue_work: work(WORK_FUNCTIONS[1]),
        getaddrinfo_work: work(WORK_FUNCTIONS[2]),
        getnameinfo_work: work(WORK_FUNCTIONS[3]),
        thread_pool_work_cb: sites.thread_pool_work_cb.and_then(at).unwrap_or(0),
        napi_work_vptr: sites
            .napi_work_vtable
            .and_then(|vtable| at(vtable + VTABLE_ADDRESS_POINT))
            .unwrap_or(0),
        item_displacement: i64::from(start.displacement),
        item_register: u32::from(start.register),
        wq_offset: layout::WQ,
        fs_work_offset: layout::FS_WORK_REQ,
        addrinfo_work_offset: layout::ADDRINFO_WORK_REQ,
        queue_work_offset: WORK_REQ_OFFSET,
        work_cb_offset: layout::WORK_CB,
        thread_pool_work_offset: layout::THREAD_POOL_WORK_REQ,
        async_wrap_object_offset: layout::ASYNC_WRAP_OBJECT,
        object_frame_offset: layout::internal_field(frame_field),
        async_resource_frame_offset: layout::ASYNC_RESOURCE_FRAME,
        async_wrap_id_offset: layout::ASYNC_WRAP_ID,
        async_resource_id_offset: layout::ASYNC_RESOURCE_ID,
    };
    (plan.fs_work != 0 && plan.queue_work != 0).then_some(plan)
}

/// The modules of `pid` that may hold libuv: its executable, then any
/// mapped libnode or libuv, each once.
fn candidates(pid: i32, maps: &[Mapping]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        out.push(exe.to_string_lossy().into_owned());
    }
    for m in maps.iter().filter(|m| m.is_file_backed()) {
        let name = m.name();
        let base = name.rsplit('/').next().unwrap_or(name);
        if (base.starts_with("libnode") || base.starts_with("libuv"))
            && !out.iter().any(|o| o == name)
        {
            out.push(name.to_string());
        }
    }
    out
}

/// Finds the probe sites of `pid`'s threadpool, or says why there are none.
pub fn find(pid: i32, maps: &[Mapping]) -> Result<Probes, String> {
    let modules = candidates(pid, maps);
    if modules.is_empty() {
        return Err("the target's executable is unknown".into());
    }
    let mut looked = Vec::new();
    for module in modules {
        // The file as the target sees it, even from another mount namespace.
        let attach_path = PathBuf::from(format!("/proc/{pid}/root{module}"));
        let found = std::fs::File::open(&attach_path)
            .and_then(|f| MappedFile::map(&f))
            .map_err(|e| e.to_string())
            .and_then(|m| sites(m.bytes()).map_err(|e| e.to_string()));
        match found {
            Ok(Some(found)) if found.work.is_empty() && found.item_start.is_none() => looked.push(
                format!("no libuv work function in the symbol table of {module}"),
            ),
            Ok(Some(found)) => {
                return Ok(Probes {
                    module,
                    attach_path,
                    sites: found,
                })
            }
            Ok(None) => looked.push(format!("no {SUBMIT} in the symbol table of {module}")),
            Err(e) => looked.push(format!("{module}: {e}")),
        }
    }
    Err(format!("{} (a stripped build?)", looked.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Kind;
    use crate::model::fixtures::{names, record, sample};
    use crate::symbolize::Frame;

    fn stack(names: &[&'static str]) -> Vec<Option<&'static str>> {
        names.iter().map(|n| Some(*n)).collect()
    }

    #[test]
    fn a_worker_waiting_or_locking_is_between_items() {
        for callee in [
            "uv_cond_wait",
            "uv_mutex_lock",
            "uv_async_send",
            "___pthread_cond_wait",
            "__pthread_mutex_lock",
        ] {
            let frames = stack(&["futex_wait", callee, "worker", "start_thread"]);
            assert!(between_items(&frames), "{callee}");
        }
        assert!(between_items(&stack(&["worker", "start_thread"])));
    }

    #[test]
    fn a_worker_in_a_work_function_or_an_unknown_stack_is_not() {
        // A work function, or the callback a tail call left in its place.
        assert!(!between_items(&stack(&[
            "read",
            "uv__fs_work",
            "worker",
            "start_thread"
        ])));
        assert!(!between_items(&stack(&[
            "pthread_mutex_lock",
            "DoThreadPoolWork",
            "worker"
        ])));
        // Truncated before the worker loop: nothing to say.
        assert!(!between_items(&stack(&["futex_wait", "uv_cond_wait"])));
        // An unnamed callee (JIT code, a stripped library) proves nothing.
        assert!(!between_items(&[None, Some("worker")]));
    }

    #[test]
    fn an_async_wraps_internal_field_2_is_at_0x30() {
        // Node 24 and 26's AsyncWrap::AsyncReset store the frame in field 2.
        assert_eq!(layout::internal_field(2), 0x30);
    }

    #[test]
    fn the_frame_field_is_the_index_every_set_internal_field_call_passes() {
        const IP: u64 = 0x1000;
        // mov esi, imm32; call rel32 (to `target`), as AsyncReset does.
        let store = |at: u64, index: u32, target: u64| {
            let mut code = vec![0xbe];
            code.extend_from_slice(&index.to_le_bytes());
            code.push(0xe8);
            code.extend_from_slice(&((target as i64 - (at as i64 + 10)) as i32).to_le_bytes());
            code
        };
        let set = 0x9000;
        let one = store(IP, 2, set);
        assert_eq!(frame_field_in(&one, IP, set), Some(2));
        let mut twice = store(IP, 2, set);
        twice.extend(store(IP + 10, 2, set));
        assert_eq!(frame_field_in(&twice, IP, set), Some(2));
        // Two indices, or calls to another function only: not known.
        let mut differ = store(IP, 2, set);
        differ.extend(store(IP + 10, 3, set));
        assert_eq!(frame_field_in(&differ, IP, set), None);
        assert_eq!(frame_field_in(&one, IP, 0x8000), None);
        // A later write of all of rsi hides the immediate.
        let mut overwritten = vec![0xbe, 2, 0, 0, 0, 0x48, 0x89, 0xc6]; // mov esi, 2; mov rsi, rax
        overwritten.push(0xe8);
        overwritten.extend_from_slice(&((set as i64 - (IP as i64 + 13)) as i32).to_le_bytes());
        assert_eq!(frame_field_in(&overwritten, IP, set), None);
        // An index that is not an immediate.
        let mut computed = vec![0x89, 0xc6]; // mov esi, eax
        computed.push(0xe8);
        computed.extend_from_slice(&((set as i64 - (IP as i64 + 7)) as i32).to_le_bytes());
        assert_eq!(frame_field_in(&computed, IP, set), None);
    }

    #[test]
    fn a_sample_unread_in_a_gc_takes_the_span_of_its_items_other_samples() {
        let read = |item, id| {
            let mut s = sample(Kind::OnCpu, 3, record(7, &[]), &[0x50], 0);
            s.threadpool = true;
            s.pool_item = Some((item, id));
            s
        };
        let unread = |item, id| {
            let mut s = sample(Kind::OnCpu, 4, RecordRead::Null, &[0x50], 0);
            s.pool_item = Some((item, id));
            s.pool_unread = true;
            s
        };
        // Same item and async id: filled. The same address reused by
        // another request (another async id), or no other sample: not.
        let mut samples = [
            unread(0x1000, 5),
            read(0x1000, 5),
            unread(0x1000, 6),
            unread(0x2000, 5),
        ];
        assert_eq!(fill_from_same_item(&mut samples, &[]), 1);
        assert!(samples[0].threadpool && samples[0].record == samples[1].record);
        assert!(!samples[2].threadpool && samples[2].record == RecordRead::Null);
        assert!(!samples[3].threadpool);
    }

    #[test]
    fn a_sample_unread_in_a_gc_takes_the_span_read_after_it() {
        let unread = |tgid, item, id| {
            let mut s = sample(Kind::OffCpu, 4, RecordRead::Null, &[0x50], 0);
            s.tgid = tgid;
            s.pool_item = Some((item, id));
            s.pool_unread = true;
            s
        };
        let after = |tgid, item, async_id, record| ItemRead {
            tgid,
            item,
            async_id,
            record,
        };
        let mut samples = [
            unread(9, 0x1000, 5),
            unread(9, 0x1000, 6),
            unread(8, 0x1000, 5),
            unread(9, 0x2000, 7),
        ];
        let reads = [
            after(9, 0x1000, 5, record(7, &[])),
            // A read with no valid span fills nothing.
            after(9, 0x2000, 7, RecordRead::Null),
        ];
        assert_eq!(fill_from_same_item(&mut samples, &reads), 1);
        assert!(samples[0].threadpool && samples[0].record == record(7, &[]));
        assert_eq!(
            samples[0].schema,
            otel_thread_ctx_reader::schema::Schema::Nodejs
        );
        // Another request at the same address, another process, no span.
        assert!(samples[1..].iter().all(|s| !s.threadpool));
    }

    #[test]
    fn pool_samples_taken_while_the_worker_loop_waits_lose_their_queued_span() {
        let mut n = names();
        let f = |name: &str| Frame {
            name: name.into(),
            module: "/usr/bin/node".into(),
            line: None,
        };
        n.user.insert(0x40, f("uv_cond_wait"));
        n.user.insert(0x4f, f("worker"));
        n.user.insert(0x50, f("uv__fs_work"));
        let mut waiting = sample(Kind::OffCpu, 3, record(7, &[]), &[0x40, 0x50], 4_000);
        waiting.threadpool = true;
        let mut working = sample(Kind::OnCpu, 3, record(7, &[]), &[0x50, 0x50], 0);
        working.threadpool = true;
        let mut samples = [waiting, working];
        assert_eq!(clear_between_items(&mut samples, &n), 1);
        assert!(!samples[0].threadpool && samples[0].record.valid().is_none());
        assert!(samples[1].threadpool && samples[1].record.valid().is_some());
    }

    use std::process::Command;

    /// Builds a program whose local functions carry libuv's names and
    /// distinct first bytes; `None` when no C compiler is there.
    fn build(dir: &std::path::Path, with_submit: bool) -> Option<PathBuf> {
        let mut asm = String::from(".text\n");
        let mut names: Vec<&str> = vec!["uv__fs_work", "uv__queue_work"];
        if with_submit {
            names.push(SUBMIT);
            names.push(QUEUE_WORK);
        }
        for (i, name) in names.iter().enumerate() {
            asm.push_str(&format!(
                ".type {name},@function\n{name}:\n.byte 0x0f,0x0b,0x{:02x},0xc3\n.size {name},4\n",
                0x40 + i
            ));
        }
        let src = dir.join("uv.c");
        std::fs::write(
            &src,
            format!("__asm__({asm:?});\nint main(void) {{ return 0; }}\n"),
        )
        .unwrap();
        let out = dir.join(if with_submit { "uv" } else { "no-submit" });
        let ok = Command::new("cc")
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .ok()?
            .success();
        ok.then_some(out)
    }

    #[test]
    fn finds_local_functions_by_name_at_their_file_offsets() {
        let dir = std::env::temp_dir().join(format!("threadpool-sites-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let Some(exe) = build(&dir, true) else {
            eprintln!("no C compiler: skipped");
            return;
        };
        let data = std::fs::read(&exe).unwrap();
        let Sites {
            submitters,
            item_start,
            work,
            ..
        } = sites(&data).unwrap().expect("uv__work_submit found");
        // No `worker` here, and `ud2` is not emulated: probes at offset 0.
        assert_eq!(item_start, None);
        let at = |o: u64| &data[o as usize..o as usize + 3];
        assert_eq!(submitters.len(), 2);
        assert_eq!(
            (submitters[0].function, submitters[0].work_offset),
            (SUBMIT, 0)
        );
        assert_eq!(at(submitters[0].offset), [0x0f, 0x0b, 0x42]);
        assert_eq!(
            (submitters[1].function, submitters[1].work_offset),
            (QUEUE_WORK, WORK_REQ_OFFSET)
        );
        assert_eq!(at(submitters[1].offset), [0x0f, 0x0b, 0x43]);
        let names: Vec<&str> = work.iter().map(|&(n, _)| n).collect();
        assert_eq!(names, ["uv__fs_work", "uv__queue_work"]);
        assert_eq!(at(work[0].1), [0x0f, 0x0b, 0x40]);
        assert_eq!(at(work[1].1), [0x0f, 0x0b, 0x41]);
        // Stripped, the local symbols are gone.
        let stripped = dir.join("stripped");
        let strip = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&exe)
            .status();
        if strip.is_ok_and(|s| s.success()) {
            assert_eq!(sites(&std::fs::read(&stripped).unwrap()).unwrap(), None);
        }
        let without = build(&dir, false).unwrap();
        assert_eq!(sites(&std::fs::read(&without).unwrap()).unwrap(), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn finds_the_sites_of_this_process_node_when_there_is_one() {
        // The test runs without node on some machines; where node is on the
        // PATH, its executable is what `profile` probes.
        let Ok(out) = Command::new("node")
            .arg("-p")
            .arg("process.execPath")
            .output()
        else {
            return;
        };
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let Ok(mapped) = std::fs::File::open(&path).and_then(|f| MappedFile::map(&f)) else {
            return;
        };
        if let Some(Sites {
            submitters,
            item_start,
            work,
            ..
        }) = sites(mapped.bytes()).unwrap()
        {
            // libuv's worker loop calls `w->work(w)` right after unlocking.
            let start = item_start.expect("the worker loop's item start");
            let code = &mapped.bytes()[start.offset as usize..];
            assert_eq!(code[0], 0xe8, "a direct call: {:x?}", &code[..8]);
            assert_eq!(start.displacement, -0x18, "w->work through &w->wq");
            for s in &submitters {
                let at = &mapped.bytes()[s.offset as usize..s.offset as usize + 16];
                let insn = Decoder::new(64, at, DecoderOptions::NONE).decode();
                assert!(emulated(&insn), "{}: {insn:?}", s.function);
            }
            assert!(work.iter().any(|&(n, _)| n == "uv__fs_work"), "{work:?}");
            assert!(work.iter().any(|&(n, _)| n == "uv__queue_work"), "{work:?}");
            assert_eq!(submitters.len(), 2, "{submitters:?}");
            // uv__queue_work finds its request WORK_REQ_OFFSET bytes before
            // the work item: `lea -0x58(%rdi), ...` or `add $-0x58, %rdi`.
            let (_, at) = work.iter().find(|&&(n, _)| n == "uv__queue_work").unwrap();
            let code = &mapped.bytes()[*at as usize..*at as usize + 16];
            let back = (WORK_REQ_OFFSET as i8).wrapping_neg() as u8;
            assert!(code.contains(&back), "{code:x?}");
        }
    }

    /// libuv's worker loop around `w->work(w)` as Node 20 (item in rbx)
    /// and Node 26 (in r12) build it: the queue's mutex is unlocked, then
    /// `lea -0x18(%reg),%rdi; call *-0x18(%reg)`.
    const WORKER_RBX: [u8; 17] = [
        0xbf, 0x60, 0xf9, 0x66, 0x05, // mov $0x566f960,%edi
        0xe8, 0x77, 0x33, 0x01, 0x00, // call uv_mutex_unlock
        0x48, 0x8d, 0x7b, 0xe8, // lea -0x18(%rbx),%rdi
        0xff, 0x53, 0xe8, // call *-0x18(%rbx)
    ];
    const WORKER_R12: [u8; 20] = [
        0xbf, 0xa0, 0x1b, 0x3a, 0x07, // mov $0x73a1ba0,%edi
        0xe8, 0xbc, 0x15, 0x01, 0x00, // call uv_mutex_unlock
        0x49, 0x8d, 0x7c, 0x24, 0xe8, // lea -0x18(%r12),%rdi
        0x41, 0xff, 0x54, 0x24, 0xe8, // call *-0x18(%r12)
    ];

    #[test]
    fn the_item_start_is_the_direct_call_before_the_call_through_the_item() {
        let at = 0x1000;
        assert_eq!(item_start_in(&WORKER_RBX, at), Some((at + 5, 0, -0x18, 12)));
        assert_eq!(item_start_in(&WORKER_R12, at), Some((at + 5, 2, -0x18, 15)));
        let start = ItemStart {
            offset: 0,
            register: 2,
            displacement: -0x18,
            return_distance: 15,
        };
        assert_eq!(start.cookie(), 0xffff_ffe8_0002_000f);
    }

    #[test]
    fn no_item_start_where_the_register_may_change_or_the_call_is_not_unique() {
        // The register itself reloaded between the probe and the call.
        let mut reloaded = WORKER_RBX;
        reloaded[10..14].copy_from_slice(&[0x48, 0x8d, 0x5b, 0xe8]); // lea -0x18(%rbx),%rbx
        assert_eq!(item_start_in(&reloaded, 0), None);
        // A caller-saved register does not survive the unlock.
        let mut caller_saved = WORKER_RBX;
        caller_saved[10..17].copy_from_slice(&[0x48, 0x8d, 0x79, 0xe8, 0xff, 0x51, 0xe8]);
        assert_eq!(item_start_in(&caller_saved, 0), None);
        // Two candidate calls: which one runs items is unknown.
        let twice = [WORKER_RBX, WORKER_RBX].concat();
        assert_eq!(item_start_in(&twice, 0), None);
        assert_eq!(item_start_in(&[0xc3], 0), None);
    }

    #[test]
    fn entry_probes_go_on_the_first_emulated_instruction() {
        // push %rbp: emulated at the entry itself.
        assert_eq!(emulated_entry(&[0x55, 0x48, 0x89, 0xe5], 0), 0);
        // Node 24's uv_queue_work: test %rdx,%rdx; je ...
        assert_eq!(
            emulated_entry(&[0x48, 0x85, 0xd2, 0x0f, 0x84, 0, 0, 0, 0], 0),
            3
        );
        // endbr64; push %r15
        assert_eq!(emulated_entry(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57], 0), 4);
        // Node 20's uv__queue_work: lea -0x58(%rdi),%r8 writes a register
        // before anything emulated: the entry itself, single-stepped.
        assert_eq!(
            emulated_entry(&[0x4c, 0x8d, 0x47, 0xa8, 0x48, 0x8b, 0x47, 0xf0], 0),
            0
        );
    }

    #[test]
    fn not_elf_is_an_error() {
        assert!(sites(b"#!/bin/sh\n").is_err());
    }
}
