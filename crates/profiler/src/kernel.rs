//! What the BPF program and userspace hand each other: the samples it sends
//! through its ring buffer (decoded here, each with the copy of its user
//! stack, sent as a record of its own, when there is one), and the plan of
//! each target process it is handed (encoded here). [`crate::loader`]
//! loads and attaches it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::symbolize::Frame;

use otel_thread_ctx_abi::node_schema::{V8Layout, MAX_MODULES};

use otel_thread_ctx_reader::record::{self, Header, HEADER_SIZE, RECORD_SIZE};
use otel_thread_ctx_reader::schema::nodejs::Reason;
use otel_thread_ctx_reader::schema::Schema;
use otel_thread_ctx_reader::tls::Plan;

/// Frames per stack the program copies (its `MAX_FRAMES`).
pub const MAX_FRAMES: usize = 127;

/// Offsets of `struct sample` in bpf/maps.h.
mod layout {
    pub const KIND: usize = 0;
    pub const TID: usize = 4;
    pub const RECORD_STATUS: usize = 8;
    pub const USER_STACK_BYTES: usize = 12;
    pub const TIME_NS: usize = 16;
    pub const OFF_CPU_NS: usize = 24;
    pub const KERNEL_STACK_BYTES: usize = 32;
    pub const TGID: usize = 36;
    pub const COMM: usize = 40;
    pub const RECORD: usize = 56;
    pub const SCHEMA: usize = RECORD + super::RECORD_SIZE;
    pub const FLAGS: usize = SCHEMA + 4;
    pub const USER_STACK: usize = SCHEMA + 8;
    pub const KERNEL_STACK: usize = USER_STACK + 8 * super::MAX_FRAMES;
    pub const USER_STACK_COPY_ID: usize = KERNEL_STACK + 8 * super::MAX_FRAMES;
    pub const POOL_ITEM: usize = USER_STACK_COPY_ID + 8;
    pub const POOL_ASYNC_ID: usize = POOL_ITEM + 8;
    pub const SIZE: usize = POOL_ASYNC_ID + 8;
}

/// Bytes of user stack the program copies at most (its
/// `USER_STACK_COPY_BYTES`).
pub const USER_STACK_COPY_BYTES: usize = 64 * 1024;

/// Offsets of `struct user_stack_copy` in bpf/stack.h.
mod copy_layout {
    pub const KIND: usize = 0;
    pub const TID: usize = 4;
    pub const ID: usize = 8;
    pub const IP: usize = 16;
    pub const SP: usize = 24;
    pub const BP: usize = 32;
    pub const BYTES: usize = 40;
    pub const STACK: usize = 48;
}

/// Size of `struct isolate_blocks` in bpf/nodejs_schema.h: a process's Node.js
/// blocks (`MAX_ISOLATES`), where each is, and a cursor.
pub(crate) const ISOLATES_SIZE: usize = 8 * otel_thread_ctx_abi::node_schema::SIZE + 8 * 8 + 8;

/// `PENDING_ITEMS` in bpf/threadpool.h: how many items per process wait to
/// be read again after a GC.
const PENDING_ITEMS: usize = 32;

/// Size of `struct pending_items` in bpf/threadpool.h: a process's items
/// waiting to be read again, four words and a byte each, and a cursor.
pub(crate) const PENDING_ITEMS_SIZE: usize = 4 * 8 * PENDING_ITEMS + PENDING_ITEMS + 8;

/// Offsets of `struct item_read` in bpf/threadpool.h.
mod item_read_layout {
    pub const KIND: usize = 0;
    pub const TGID: usize = 4;
    pub const ITEM: usize = 8;
    pub const ASYNC_ID: usize = 16;
    pub const RECORD: usize = 24;
    pub const SIZE: usize = RECORD + super::RECORD_SIZE;
}

/// `flags` bit of a sample taken on a pool thread running a work item:
/// its record is the span of the thread that queued the item.
const FLAG_THREADPOOL: u32 = 1;

/// `flags` bit of a pool thread's sample whose running item was found at
/// sample time but whose span could not be read then (a moving GC).
const FLAG_POOL_UNREAD: u32 = 2;

/// The `kind` of a user stack copy record.
const KIND_USER_STACK: u32 = 2;

/// The `kind` of an item read record.
const KIND_ITEM_READ: u32 = 3;

/// Size in bytes of one sample from the program.
pub const SAMPLE_SIZE: usize = layout::SIZE;

/// What the program found behind the thread's `otel_thread_ctx_v1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordRead {
    /// The record: its header, and attrs_data when valid.
    Record { header: Header, attrs_data: Vec<u8> },
    /// The pointer is NULL.
    Null,
    /// The thread has no TLS block for the defining module yet.
    NoTlsBlock,
    /// A pointer on the way could not be read.
    Unreadable,
    /// The Node.js walk ended without a span, for this reason.
    NoSpan(Reason),
}

impl RecordRead {
    /// The record when it is valid (the thread was in a span).
    pub fn valid(&self) -> Option<(&Header, &[u8])> {
        match self {
            RecordRead::Record { header, attrs_data } if header.is_valid() => {
                Some((header, attrs_data))
            }
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A perf-event tick while the thread ran.
    OnCpu,
    /// A wait: switch-out (stack, record) to switch-in (duration).
    OffCpu,
}

/// One decoded sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub kind: Kind,
    /// The process (its entry in the program's `targets`).
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    /// CLOCK_MONOTONIC nanoseconds (on-CPU: the tick; off-CPU: the switch-out).
    pub time_ns: u64,
    /// Off-CPU samples: nanoseconds until the thread ran again.
    pub off_cpu_ns: u64,
    /// The schema `record` comes from.
    pub schema: Schema,
    pub record: RecordRead,
    /// A libuv pool thread running a work item: `record` is the span of
    /// the thread that queued the item, as read when it queued it.
    pub threadpool: bool,
    /// A pool thread's running item as read at sample time: the work item's
    /// address and its resource's async id, which name one request for the
    /// process's life.
    pub pool_item: Option<(u64, u64)>,
    /// That item's span could not be read at this sample.
    pub pool_unread: bool,
    /// The user stack, leaf first: the instruction pointer, then return
    /// addresses. As decoded: the kernel's frame-pointer walk.
    pub user_stack: Vec<u64>,
    pub kernel_stack: Vec<u64>,
    /// The registers and stack bytes to unwind from, when the copy arrived.
    pub user_stack_copy: Option<StackCopy>,
    /// Frames of `user_stack` named as the sample arrived, by what ran in
    /// that very frame rather than by their address (an interpreted
    /// JavaScript function, whose address is V8's interpreter, shared by
    /// all of them; optimized code, with the functions it inlined there):
    /// index in `user_stack`, and the frames it stands for, innermost
    /// first.
    pub frame_names: Vec<(usize, Arc<[Frame]>)>,
}

/// A thread's user registers and a copy of its stack from the stack
/// pointer up, taken with its sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackCopy {
    pub tid: u32,
    /// Names the copy in its sample (`bpf_ktime_get_ns()` at the copy).
    pub id: u64,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The stack from `sp` up; empty when the copy failed.
    pub stack: Vec<u8>,
}

/// The span of a pool item read after samples of it could not read it
/// (a moving GC closed every gate then): the samples with the same
/// `(tgid, item, async_id)` carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemRead {
    pub tgid: u32,
    pub item: u64,
    pub async_id: u64,
    pub record: RecordRead,
}

/// One ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Sample(Sample, u64),
    StackCopy(StackCopy),
    ItemRead(ItemRead),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}

fn stack(b: &[u8], at: usize, bytes: i32) -> Vec<u64> {
    // A negative count is an error from bpf_get_stack: no frames.
    let frames = (bytes.max(0) as usize / 8).min(MAX_FRAMES);
    (0..frames)
        .map(|i| u64_at(b, at + 8 * i))
        .take_while(|&a| a != 0)
        .collect()
}

/// Decodes a user stack copy record; `None` when it is not a whole one.
fn decode_copy(b: &[u8]) -> Option<StackCopy> {
    if b.len() < copy_layout::STACK || u32_at(b, copy_layout::KIND) != KIND_USER_STACK {
        return None;
    }
    let copied = (u32_at(b, copy_layout::BYTES) as i32).max(0) as usize;
    let copied = copied
        .min(USER_STACK_COPY_BYTES)
        .min(b.len() - copy_layout::STACK);
    Some(StackCopy {
        tid: u32_at(b, copy_layout::TID),
        id: u64_at(b, copy_layout::ID),
        ip: u64_at(b, copy_layout::IP),
        sp: u64_at(b, copy_layout::SP),
        bp: u64_at(b, copy_layout::BP),
        stack: b[copy_layout::STACK..copy_layout::STACK + copied].to_vec(),
    })
}

/// Decodes one ring-buffer record: a sample (with the id of its stack
/// copy, 0 for none), a stack copy or an item read; `None` when it is
/// none of them.
pub fn decode_item(b: &[u8]) -> Option<Item> {
    if b.len() >= 4 && u32_at(b, 0) == KIND_USER_STACK {
        return decode_copy(b).map(Item::StackCopy);
    }
    if b.len() >= 4 && u32_at(b, 0) == KIND_ITEM_READ {
        return decode_item_read(b).map(Item::ItemRead);
    }
    let sample = decode(b)?;
    Some(Item::Sample(sample, u64_at(b, layout::USER_STACK_COPY_ID)))
}

/// Decodes an item read record; `None` when it is not a whole one.
fn decode_item_read(b: &[u8]) -> Option<ItemRead> {
    if b.len() < item_read_layout::SIZE || u32_at(b, item_read_layout::KIND) != KIND_ITEM_READ {
        return None;
    }
    Some(ItemRead {
        tgid: u32_at(b, item_read_layout::TGID),
        item: u64_at(b, item_read_layout::ITEM),
        async_id: u64_at(b, item_read_layout::ASYNC_ID),
        record: read_record_bytes(&b[item_read_layout::RECORD..][..RECORD_SIZE]),
    })
}

/// A record as the program copied it: its header, and attrs_data when valid.
fn read_record_bytes(bytes: &[u8]) -> RecordRead {
    let header = Header::parse(bytes[..HEADER_SIZE].try_into().unwrap());
    let attrs_data = if header.is_valid() {
        let n = (header.attrs_data_size as usize).min(record::MAX_ATTRS_DATA);
        bytes[HEADER_SIZE..HEADER_SIZE + n].to_vec()
    } else {
        Vec::new()
    };
    RecordRead::Record { header, attrs_data }
}

/// Joins samples to their stack copies, which arrive first (on CPU just
/// before; off CPU at the switch-out, the sample at the switch-in). A
/// thread has at most one copy waiting: its samples follow one another.
#[derive(Debug, Default)]
pub struct Pairing {
    waiting: HashMap<u32, StackCopy>,
}

impl Pairing {
    /// Takes one record; returns the sample it completes, if it is one.
    pub fn take(&mut self, item: Item) -> Option<Sample> {
        match item {
            Item::StackCopy(c) => {
                self.waiting.insert(c.tid, c);
                None
            }
            // Not part of a sample: [`Loaded::poll`] keeps them apart.
            Item::ItemRead(_) => None,
            Item::Sample(mut s, copy_id) => {
                if copy_id != 0 {
                    if let Some(c) = self.waiting.remove(&s.tid) {
                        if c.id == copy_id {
                            s.user_stack_copy = Some(c);
                        }
                    }
                }
                Some(s)
            }
        }
    }
}

/// Decodes one ring-buffer sample; `None` when it is not a whole sample.
pub fn decode(b: &[u8]) -> Option<Sample> {
    if b.len() < SAMPLE_SIZE {
        return None;
    }
    let kind = match u32_at(b, layout::KIND) {
        0 => Kind::OnCpu,
        1 => Kind::OffCpu,
        _ => return None,
    };
    let comm = &b[layout::COMM..layout::COMM + 16];
    let comm_len = comm.iter().position(|&c| c == 0).unwrap_or(16);
    let record = match u32_at(b, layout::RECORD_STATUS) {
        0 => read_record_bytes(&b[layout::RECORD..][..RECORD_SIZE]),
        1 => RecordRead::Null,
        2 => RecordRead::NoTlsBlock,
        status => {
            Reason::from_bpf_status(status).map_or(RecordRead::Unreadable, RecordRead::NoSpan)
        }
    };
    let schema = match u32_at(b, layout::SCHEMA) {
        1 => Schema::Nodejs,
        _ => Schema::Record,
    };
    Some(Sample {
        kind,
        tgid: u32_at(b, layout::TGID),
        tid: u32_at(b, layout::TID),
        comm: String::from_utf8_lossy(&comm[..comm_len]).into_owned(),
        time_ns: u64_at(b, layout::TIME_NS),
        off_cpu_ns: u64_at(b, layout::OFF_CPU_NS),
        schema,
        record,
        threadpool: u32_at(b, layout::FLAGS) & FLAG_THREADPOOL != 0,
        pool_item: Some((
            u64_at(b, layout::POOL_ITEM),
            u64_at(b, layout::POOL_ASYNC_ID),
        ))
        .filter(|&(item, _)| item != 0),
        pool_unread: u32_at(b, layout::FLAGS) & FLAG_POOL_UNREAD != 0,
        user_stack: stack(
            b,
            layout::USER_STACK,
            u32_at(b, layout::USER_STACK_BYTES) as i32,
        ),
        kernel_stack: stack(
            b,
            layout::KERNEL_STACK,
            u32_at(b, layout::KERNEL_STACK_BYTES) as i32,
        ),
        user_stack_copy: None,
        frame_names: Vec::new(),
    })
}

/// How the program reads one process's thread context: the value of its
/// entry in the program's `targets` map (`struct target`), keyed by tgid.
/// How a thread pointer leads to `otel_thread_ctx_v1` and to
/// `otel_thread_ctx_nodejs_v1`, and the V8 layout of the Node.js walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetPlan {
    pub tgid: u32,
    /// `otel_thread_ctx_v1`'s module, if any.
    pub record: TlsPlan,
    /// One entry per module defining the Node.js schema's variable, in the
    /// order the program tries them; unused entries are [`TlsPlan::NONE`].
    pub nodejs: [TlsPlan; MAX_MODULES],
    pub dtv_pointer_offset: u64,
    pub layout: V8Layout,
    /// How a pool thread's running item is found at sample time; all zero
    /// (the default) leaves pool threads to the probes, if any.
    pub pool: RunningItemPlan,
}

/// `struct pool_plan`: where a pool thread's running item and its request's
/// context frame are, for reading them at sample time (absolute addresses
/// in the target, and the layouts in between). Built by
/// [`crate::threadpool::running_item_plan`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningItemPlan {
    /// Where `w->work(w)` returns in libuv's worker loop; 0: off.
    pub return_address: u64,
    /// The work functions: a running item's `w->work` is one of them.
    pub fs_work: u64,
    pub getaddrinfo_work: u64,
    pub getnameinfo_work: u64,
    pub queue_work: u64,
    /// Node's `ThreadPoolWork` callback; 0: `uv_queue_work` items unread.
    pub thread_pool_work_cb: u64,
    /// The vtable pointer of N-API's async work objects; 0: none.
    pub napi_work_vptr: u64,
    /// What to add to the worker loop's register to get the item.
    pub item_displacement: i64,
    pub wq_offset: u64,
    pub fs_work_offset: u64,
    pub addrinfo_work_offset: u64,
    pub queue_work_offset: u64,
    pub work_cb_offset: u64,
    pub thread_pool_work_offset: u64,
    pub async_wrap_object_offset: u64,
    pub object_frame_offset: u64,
    pub async_resource_frame_offset: u64,
    pub async_wrap_id_offset: u64,
    pub async_resource_id_offset: u64,
    /// The worker loop's register, as numbered for the item-start probe.
    pub item_register: u32,
}

/// Bytes of `struct pool_plan`.
const POOL_PLAN_SIZE: usize = 19 * 8 + 8;

impl RunningItemPlan {
    fn encode(&self, put: &mut impl FnMut(&[u8])) {
        for word in [
            self.return_address,
            self.fs_work,
            self.getaddrinfo_work,
            self.getnameinfo_work,
            self.queue_work,
            self.thread_pool_work_cb,
            self.napi_work_vptr,
            self.item_displacement as u64,
            self.wq_offset,
            self.fs_work_offset,
            self.addrinfo_work_offset,
            self.queue_work_offset,
            self.work_cb_offset,
            self.thread_pool_work_offset,
            self.async_wrap_object_offset,
            self.object_frame_offset,
            self.async_resource_frame_offset,
            self.async_wrap_id_offset,
            self.async_resource_id_offset,
        ] {
            put(&word.to_ne_bytes());
        }
        put(&self.item_register.to_ne_bytes());
        put(&0u32.to_ne_bytes());
    }
}

/// `struct tls_plan`: where one schema's variable is from a thread pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsPlan {
    /// `enum tls_mode`: static, DTV, or none.
    pub mode: u32,
    pub tp_offset: i64,
    pub module_id: u64,
    pub module_offset: u64,
}

/// `tls_mode` for a variable that cannot be resolved: its samples then say
/// "no record".
const TLS_NONE: u32 = 2;

impl TlsPlan {
    pub const NONE: TlsPlan = TlsPlan {
        mode: TLS_NONE,
        tp_offset: 0,
        module_id: 0,
        module_offset: 0,
    };

    fn of(plan: &Plan) -> TlsPlan {
        match *plan {
            Plan::Static { tp_offset } => TlsPlan {
                mode: 0,
                tp_offset,
                ..TlsPlan::NONE
            },
            Plan::Dtv { module_id, offset } => TlsPlan {
                mode: 1,
                tp_offset: 0,
                module_id,
                module_offset: offset,
            },
        }
    }
}

/// Bytes of `struct tls_plan`.
const TLS_PLAN_SIZE: usize = 32;

/// Bytes of `struct target`: the record's plan, the Node.js modules' plans,
/// the DTV pointer's offset, four words of V8 layout and the pool plan.
pub const TARGET_SIZE: usize = TLS_PLAN_SIZE * (1 + MAX_MODULES) + 8 + 4 * 8 + POOL_PLAN_SIZE;

impl TargetPlan {
    pub fn new(
        tgid: u32,
        plan: Option<&Plan>,
        nodejs_plans: &[Plan],
        layout: V8Layout,
        dtv_pointer_offset: u64,
    ) -> TargetPlan {
        let mut nodejs = [TlsPlan::NONE; MAX_MODULES];
        // Modules past the program's bound are not read (the summary's
        // module list still names them).
        for (slot, plan) in nodejs.iter_mut().zip(nodejs_plans) {
            *slot = TlsPlan::of(plan);
        }
        TargetPlan {
            tgid,
            record: plan.map_or(TlsPlan::NONE, TlsPlan::of),
            nodejs,
            dtv_pointer_offset,
            layout,
            pool: RunningItemPlan::default(),
        }
    }

    /// The `struct target` value, in the program's layout (native endian,
    /// no padding: every field is naturally aligned).
    pub fn encode(&self) -> [u8; TARGET_SIZE] {
        let mut out = [0u8; TARGET_SIZE];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        for plan in std::iter::once(&self.record).chain(&self.nodejs) {
            put(&plan.mode.to_ne_bytes());
            put(&0u32.to_ne_bytes());
            put(&plan.tp_offset.to_ne_bytes());
            put(&plan.module_id.to_ne_bytes());
            put(&plan.module_offset.to_ne_bytes());
        }
        put(&self.dtv_pointer_offset.to_ne_bytes());
        put(&self.layout.js_object_record_offset.to_ne_bytes());
        put(&self.layout.tagged_size.to_ne_bytes());
        put(&self.layout.js_map_table_offset.to_ne_bytes());
        put(&self.layout.ordered_hash_map_header_size.to_ne_bytes());
        self.pool.encode(&mut put);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_bytes(
        kind: u32,
        status: u32,
        record: &[u8],
        user: &[u64],
        kernel: &[u64],
    ) -> Vec<u8> {
        let mut b = vec![0u8; SAMPLE_SIZE];
        b[layout::KIND..][..4].copy_from_slice(&kind.to_ne_bytes());
        b[layout::TID..][..4].copy_from_slice(&4242u32.to_ne_bytes());
        b[layout::TGID..][..4].copy_from_slice(&4200u32.to_ne_bytes());
        b[layout::RECORD_STATUS..][..4].copy_from_slice(&status.to_ne_bytes());
        b[layout::USER_STACK_BYTES..][..4]
            .copy_from_slice(&((user.len() * 8) as i32).to_ne_bytes());
        b[layout::KERNEL_STACK_BYTES..][..4]
            .copy_from_slice(&((kernel.len() * 8) as i32).to_ne_bytes());
        b[layout::TIME_NS..][..8].copy_from_slice(&7u64.to_ne_bytes());
        b[layout::OFF_CPU_NS..][..8].copy_from_slice(&1_500u64.to_ne_bytes());
        b[layout::COMM..][..4].copy_from_slice(b"node");
        b[layout::RECORD..][..record.len()].copy_from_slice(record);
        for (i, a) in user.iter().enumerate() {
            b[layout::USER_STACK + 8 * i..][..8].copy_from_slice(&a.to_ne_bytes());
        }
        for (i, a) in kernel.iter().enumerate() {
            b[layout::KERNEL_STACK + 8 * i..][..8].copy_from_slice(&a.to_ne_bytes());
        }
        b
    }

    fn record(valid: u8, attrs: &[u8]) -> Vec<u8> {
        let mut r: Vec<u8> = (1..=24).collect();
        r.push(valid);
        r.push(1);
        r.extend_from_slice(&(attrs.len() as u16).to_ne_bytes());
        r.extend_from_slice(attrs);
        r
    }

    #[test]
    fn layout_matches_the_c_struct() {
        // struct sample: 56 bytes of fields, the 640-byte record, the
        // schema and the flags, two stacks, the copy's id.
        assert_eq!(SAMPLE_SIZE, 56 + 640 + 8 + 2 * 8 * 127 + 8 + 16);
        assert_eq!(SAMPLE_SIZE % 8, 0);
    }

    #[test]
    fn decodes_a_valid_record_with_its_attrs_and_stacks() {
        let attrs = [0, 2, b'/', b'a'];
        let s = decode(&sample_bytes(
            1,
            0,
            &record(1, &attrs),
            &[0x10, 0x20],
            &[0xffff_0001],
        ))
        .unwrap();
        assert_eq!(s.kind, Kind::OffCpu);
        assert_eq!((s.tgid, s.tid), (4200, 4242));
        assert_eq!(s.comm, "node");
        assert_eq!(s.off_cpu_ns, 1_500);
        assert_eq!(s.user_stack, vec![0x10, 0x20]);
        assert_eq!(s.kernel_stack, vec![0xffff_0001]);
        let (h, a) = s.record.valid().unwrap();
        assert_eq!(h.span_id.to_string(), "1112131415161718");
        assert_eq!(a, attrs);
        assert!(!s.threadpool);
    }

    #[test]
    fn the_threadpool_flag_marks_a_queued_span() {
        let mut b = sample_bytes(0, 0, &record(1, &[]), &[], &[]);
        b[layout::FLAGS..][..4].copy_from_slice(&FLAG_THREADPOOL.to_ne_bytes());
        let s = decode(&b).unwrap();
        assert!(s.threadpool);
        assert!(s.record.valid().is_some());
        // Other bits are not the threadpool's.
        b[layout::FLAGS..][..4].copy_from_slice(&2u32.to_ne_bytes());
        assert!(!decode(&b).unwrap().threadpool);
    }

    #[test]
    fn invalid_or_missing_records_are_not_spans() {
        let s = decode(&sample_bytes(0, 0, &record(0, &[1, 1, 1]), &[], &[])).unwrap();
        assert_eq!(s.kind, Kind::OnCpu);
        assert!(s.record.valid().is_none());
        assert_eq!(
            decode(&sample_bytes(0, 1, &[], &[], &[])).unwrap().record,
            RecordRead::Null
        );
        assert_eq!(
            decode(&sample_bytes(0, 2, &[], &[], &[])).unwrap().record,
            RecordRead::NoTlsBlock
        );
        assert_eq!(
            decode(&sample_bytes(0, 3, &[], &[], &[])).unwrap().record,
            RecordRead::Unreadable
        );
        let walk = decode(&sample_bytes(0, 8, &[], &[], &[])).unwrap();
        assert_eq!(walk.record, RecordRead::NoSpan(Reason::ChainTooLong));
        assert_eq!(walk.schema, Schema::Record);
        let mut b = sample_bytes(0, 9, &[], &[], &[]);
        b[layout::SCHEMA..][..4].copy_from_slice(&1u32.to_ne_bytes());
        let walk = decode(&b).unwrap();
        assert_eq!(walk.record, RecordRead::NoSpan(Reason::WrongObject));
        assert_eq!(walk.schema, Schema::Nodejs);
        assert!(decode(&sample_bytes(9, 0, &[], &[], &[])).is_none());
        assert!(decode(&[0u8; 16]).is_none());
    }

    #[test]
    fn a_failed_stack_walk_has_no_frames() {
        let mut b = sample_bytes(0, 1, &[], &[0x10], &[]);
        b[layout::USER_STACK_BYTES..][..4].copy_from_slice(&(-14i32).to_ne_bytes());
        assert!(decode(&b).unwrap().user_stack.is_empty());
    }

    fn copy_bytes(tid: u32, id: u64, copied: i32, stack: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; copy_layout::STACK + stack.len()];
        b[copy_layout::KIND..][..4].copy_from_slice(&KIND_USER_STACK.to_ne_bytes());
        b[copy_layout::TID..][..4].copy_from_slice(&tid.to_ne_bytes());
        b[copy_layout::ID..][..8].copy_from_slice(&id.to_ne_bytes());
        b[copy_layout::IP..][..8].copy_from_slice(&0x1000u64.to_ne_bytes());
        b[copy_layout::SP..][..8].copy_from_slice(&0x7000u64.to_ne_bytes());
        b[copy_layout::BP..][..8].copy_from_slice(&0x7010u64.to_ne_bytes());
        b[copy_layout::BYTES..][..4].copy_from_slice(&copied.to_ne_bytes());
        b[copy_layout::STACK..].copy_from_slice(stack);
        b
    }

    fn with_copy_id(mut b: Vec<u8>, id: u64) -> Vec<u8> {
        b[layout::USER_STACK_COPY_ID..][..8].copy_from_slice(&id.to_ne_bytes());
        b
    }

    #[test]
    fn item_reads_decode_apart_from_samples() {
        let attrs = [0, 2, b'/', b'a'];
        let mut b = vec![0u8; item_read_layout::SIZE];
        b[item_read_layout::KIND..][..4].copy_from_slice(&KIND_ITEM_READ.to_ne_bytes());
        b[item_read_layout::TGID..][..4].copy_from_slice(&4200u32.to_ne_bytes());
        b[item_read_layout::ITEM..][..8].copy_from_slice(&0x7f00_1000u64.to_ne_bytes());
        b[item_read_layout::ASYNC_ID..][..8].copy_from_slice(&77f64.to_bits().to_ne_bytes());
        let r = record(1, &attrs);
        b[item_read_layout::RECORD..][..r.len()].copy_from_slice(&r);
        let Some(Item::ItemRead(read)) = decode_item(&b) else {
            panic!("not an item read")
        };
        assert_eq!(
            (read.tgid, read.item, read.async_id),
            (4200, 0x7f00_1000, 77f64.to_bits())
        );
        let (h, a) = read.record.valid().unwrap();
        assert_eq!(h.span_id.to_string(), "1112131415161718");
        assert_eq!(a, attrs);
        // A short one is not decoded; the pairing lets one pass untouched.
        assert!(decode_item(&b[..item_read_layout::SIZE - 1]).is_none());
        assert!(Pairing::default().take(Item::ItemRead(read)).is_none());
    }

    #[test]
    fn stack_copies_decode_and_join_their_sample() {
        let mut pairing = Pairing::default();
        let copy = decode_item(&copy_bytes(4242, 77, 16, &[7; 16])).unwrap();
        let Item::StackCopy(c) = &copy else {
            panic!("{copy:?}")
        };
        assert_eq!(
            (c.ip, c.sp, c.bp, c.stack.len()),
            (0x1000, 0x7000, 0x7010, 16)
        );
        assert!(pairing.take(copy).is_none());
        let sample = decode_item(&with_copy_id(sample_bytes(0, 1, &[], &[0x10], &[]), 77)).unwrap();
        let s = pairing.take(sample).unwrap();
        assert_eq!(s.user_stack_copy.unwrap().stack, vec![7; 16]);
        // A sample whose copy was lost (or is another's) gets none.
        pairing.take(decode_item(&copy_bytes(4242, 78, 8, &[1; 8])).unwrap());
        let sample = decode_item(&with_copy_id(sample_bytes(0, 1, &[], &[0x10], &[]), 79)).unwrap();
        assert!(pairing.take(sample).unwrap().user_stack_copy.is_none());
    }

    #[test]
    fn a_failed_or_short_copy_has_only_the_bytes_it_holds() {
        let Some(Item::StackCopy(c)) = decode_item(&copy_bytes(1, 2, -14, &[1; 8])) else {
            panic!()
        };
        assert!(c.stack.is_empty());
        // A length beyond the record is cut to the record.
        let Some(Item::StackCopy(c)) = decode_item(&copy_bytes(1, 2, 4096, &[1; 8])) else {
            panic!()
        };
        assert_eq!(c.stack.len(), 8);
        assert!(decode_item(&[2, 0, 0, 0]).is_none());
    }

    #[test]
    fn target_plans_follow_the_resolution_plan() {
        use otel_thread_ctx_abi::node_schema::DEFAULT_LAYOUT;
        let dtv = Plan::Dtv {
            module_id: 3,
            offset: 0x18,
        };
        let g = TargetPlan::new(
            9,
            Some(&Plan::Static { tp_offset: -440 }),
            &[],
            DEFAULT_LAYOUT,
            8,
        );
        assert_eq!((g.record.mode, g.record.tp_offset), (0, -440));
        assert_eq!(g.nodejs, [TlsPlan::NONE; MAX_MODULES]);
        let g = TargetPlan::new(9, Some(&dtv), &[dtv], DEFAULT_LAYOUT, 8);
        assert_eq!(
            (g.record.mode, g.record.module_id, g.record.module_offset),
            (1, 3, 0x18)
        );
        assert_eq!(g.nodejs[0], g.record);
        assert_eq!(g.nodejs[1..], [TlsPlan::NONE; MAX_MODULES - 1]);
        let g = TargetPlan::new(
            9,
            None,
            &[Plan::Static { tp_offset: -632 }, dtv],
            DEFAULT_LAYOUT,
            8,
        );
        assert_eq!(g.record.mode, TLS_NONE);
        assert_eq!((g.nodejs[0].mode, g.nodejs[0].tp_offset), (0, -632));
        assert_eq!((g.nodejs[1].mode, g.nodejs[1].module_id), (1, 3));
    }

    #[test]
    fn a_target_plan_encodes_as_struct_target() {
        use otel_thread_ctx_abi::node_schema::DEFAULT_LAYOUT;
        let plan = TargetPlan::new(
            9,
            Some(&Plan::Static { tp_offset: -440 }),
            &[Plan::Dtv {
                module_id: 3,
                offset: 0x18,
            }],
            DEFAULT_LAYOUT,
            8,
        );
        let b = plan.encode();
        let i64_at = |o: usize| i64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        // record: mode, reserved, tp_offset, module_id, module_offset.
        assert_eq!((u32_at(&b, 0), i64_at(8)), (0, -440));
        // nodejs[0] follows at 32: DTV slot 3, offset 0x18.
        assert_eq!(
            (u32_at(&b, 32), u64_at(&b, 48), u64_at(&b, 56)),
            (1, 3, 0x18)
        );
        // nodejs[1..] are TLS_NONE.
        assert_eq!(u32_at(&b, 64), TLS_NONE);
        assert_eq!(u32_at(&b, 64 + 2 * 32), TLS_NONE);
        // Then the DTV pointer's offset and the V8 layout.
        let tail = TLS_PLAN_SIZE * (1 + MAX_MODULES);
        assert_eq!(u64_at(&b, tail), 8);
        assert_eq!(u64_at(&b, tail + 8), DEFAULT_LAYOUT.js_object_record_offset);
        assert_eq!(
            u64_at(&b, tail + 32),
            DEFAULT_LAYOUT.ordered_hash_map_header_size
        );
        // Then the pool plan: off by default.
        assert!(b[tail + 40..].iter().all(|&byte| byte == 0));
        assert_eq!(TARGET_SIZE, tail + 40 + POOL_PLAN_SIZE);
    }
}
