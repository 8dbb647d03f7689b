// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// Kernel side of `otel-thread-ctx profile`: on-CPU samples from a perf event
// per CPU, and off-CPU intervals from sched_switch, for the threads of one
// or more processes. Each sample carries the thread's OTEP 4947 record as read at that
// instant, and the user and kernel stacks (frame-pointer unwinding), plus
// the user registers and a copy of the user stack for unwinding with CFI
// in userspace. The record is found through `otel_thread_ctx_v1` (it points
// at the record), or through `otel_thread_ctx_nodejs_v1` (the Node.js
// schema: a walk through V8's current AsyncContextFrame to the record), or
// both.
//
// Userspace names the processes in the `targets` map, each with how to find
// each schema's variable from a thread pointer (a static-TLS offset, or a
// DTV slot and offset) and the V8 layout of the walk; it adds and removes
// entries while the program runs (one for `profile --pid`, every publishing
// process for the agent).
//
// Threadpool work: uprobes on libuv's uv__work_submit and where its worker
// loop starts an item carry the submitting thread's span to the pool thread
// that runs the item (see "libuv threadpool" below); or, for a target that
// publishes the Node.js schema, a pool thread's sample finds its running
// item and reads the span from the request (see "The running item").

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

// The record layout and the Node.js walk's constants (ABI_* macros),
// generated from the ABI crate.
#include "otel_thread_ctx_abi.h"

// The few kernel types read here, relocated against the running kernel's
// BTF at load time (CO-RE), so no generated vmlinux.h is needed.
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int __state;
	int pid;
	int tgid;
	char comm[16];
	struct thread_struct thread;
} __attribute__((preserve_access_index));

// Kernels before 5.14 name the state field `state`.
struct task_struct___pre_5_14 {
	long state;
} __attribute__((preserve_access_index));

#define MAX_FRAMES 127

enum sample_kind { KIND_CPU = 0, KIND_OFF_CPU = 1 };

enum record_status {
	RECORD_READ = 0,          // header (and attrs when valid) copied
	RECORD_NULL = 1,          // otel_thread_ctx_v1 is NULL
	RECORD_NO_TLS_BLOCK = 2,  // the thread has no TLS block for the module yet
	RECORD_UNREADABLE = 3,    // a pointer on the way could not be read
	// The Node.js walk's reasons for "no span" (schema::nodejs::Reason).
	NODE_NOT_PUBLISHED = 4,   // cped_slot is 0 (or no TLS block yet)
	NODE_NO_FRAME = 5,        // the current frame is undefined
	NODE_STORE_ABSENT = 6,    // the frame has no entry for the writer's store
	NODE_STORE_UNDEFINED = 7, // the entry's value is undefined
	NODE_CHAIN_TOO_LONG = 8,  // no match within ABI_NODE_MAX_CHAIN_HOPS entries
	NODE_WRONG_OBJECT = 9,    // not the objects the schema describes
};

enum schema { SCHEMA_RECORD = 0, SCHEMA_NODEJS = 1 };

enum tls_mode { TLS_STATIC = 0, TLS_DTV = 1, TLS_NONE = 2 };

enum sample_flags {
	// A pool thread running a work item: the record is the span of the
	// thread that queued the item, read when it queued it.
	SAMPLE_THREADPOOL = 1,
	// A pool thread running the item pool_item names, whose span could not
	// be read now (its isolate in a moving GC, or not yet seen).
	SAMPLE_POOL_UNREAD = 2,
};

// One sample as userspace receives it (laid out without implicit padding;
// the Rust side decodes the same offsets).
struct sample {
	__u32 kind;
	__u32 tid;
	__u32 record_status;
	__s32 user_stack_bytes;   // bpf_get_stack result: bytes, or a negative errno
	__u64 time_ns;            // CLOCK_MONOTONIC (bpf_ktime_get_ns)
	__u64 off_cpu_ns;         // off-CPU samples: time from switch-out to switch-in
	__s32 kernel_stack_bytes;
	__u32 tgid;               // the process: its key in `targets`
	char comm[16];
	__u8 record[ABI_RECORD_SIZE];
	__u32 schema;             // enum schema: where record_status comes from
	__u32 flags;              // enum sample_flags
	__u64 user_stack[MAX_FRAMES];
	__u64 kernel_stack[MAX_FRAMES];
	__u64 user_stack_copy_id; // the user_stack_copy sent for this sample; 0: none
	// A pool thread running an item read at sample time: the item and its
	// resource's async id (0, 0: none). Userspace gives a sample whose span
	// could not be read (inside a moving GC) the span its item's other
	// samples carry.
	__u64 pool_item;
	__u64 pool_async_id;
};

// Where one schema's TLS variable is, from a thread pointer.
struct tls_plan {
	__u32 mode;               // enum tls_mode
	__u32 reserved;
	__s64 tp_offset;          // TLS_STATIC: variable = tp + tp_offset
	__u64 module_id;          // TLS_DTV: the module's DTV slot
	__u64 module_offset;      // TLS_DTV: offset in the module's block
};

// How a pool thread's running item is found at sample time, and its span
// read from the request that queued it (see "libuv threadpool" below).
// Userspace encodes it with the rest of `struct target`.
struct pool_plan {
	__u64 return_address;       // where w->work(w) returns in libuv's worker; 0: off
	__u64 fs_work;              // the work functions' addresses: w->work of each kind
	__u64 getaddrinfo_work;
	__u64 getnameinfo_work;
	__u64 queue_work;
	__u64 thread_pool_work_cb;  // node's ThreadPoolWork callback (uv_work_t.work_cb); 0: none
	__u64 napi_work_vptr;       // the vtable pointer of N-API's async work; 0: none
	__s64 item_displacement;    // the item = the worker loop's register + this
	__u64 wq_offset;            // struct uv__work: wq
	__u64 fs_work_offset;       // uv_fs_t: work_req
	__u64 addrinfo_work_offset; // uv_getaddrinfo_t and uv_getnameinfo_t: work_req
	__u64 queue_work_offset;    // uv_work_t: work_req
	__u64 work_cb_offset;       // uv_work_t: work_cb
	__u64 thread_pool_work_offset;     // node::ThreadPoolWork: work_req_
	__u64 async_wrap_object_offset;    // node::BaseObject: its JS object's global handle
	__u64 object_frame_offset;         // that JS object (untagged): the context frame field
	__u64 async_resource_frame_offset; // node::AsyncResource: context_frame_ (a global handle)
	__u64 async_wrap_id_offset;        // node::AsyncWrap: async_id_ (a double)
	__u64 async_resource_id_offset;    // node::AsyncResource: async_context_.async_id
	__u32 item_register;        // the worker loop's register, numbered as item_register() does
	__u32 reserved;
};

// How to read one process's thread context; the value of `targets`. The
// Rust side encodes it in one place (kernel.rs, TargetPlan::encode).
struct target {
	struct tls_plan record;   // otel_thread_ctx_v1 (TLS_NONE: no such module)
	// The Node.js schema's variable in each module that defines it, in the
	// order they are tried; unused entries are TLS_NONE.
	struct tls_plan nodejs[ABI_NODE_MAX_MODULES];
	__u64 dtv_pointer_offset; // the DTV pointer's offset from the thread pointer
	// The V8 layout of the Node.js walk.
	__u64 v8_js_object_record_offset;
	__u64 v8_tagged_size;
	__u64 v8_js_map_table_offset;
	__u64 v8_ordered_hash_map_header_size;
	struct pool_plan pool;
};

// The profiled processes, by tgid. Userspace sets max_entries.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct target);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
} samples SEC(".maps");

// Switch-out state of each blocked thread until it is switched back in.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct sample);
} blocked SEC(".maps");

// Staging space: a sample is far larger than the BPF stack.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample);
} scratch SEC(".maps");

enum counter {
	LOST_RING_FULL = 0,
	LOST_BLOCKED_FULL = 1,
	POOL_QUEUED_IN_SPAN = 2,  // work items queued while the submitter was in a span
	POOL_RAN_IN_SPAN = 3,     // work items a pool thread began with their queued span
	COUNTERS = 4,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1;
}

// Finds a TLS variable from the thread pointer: at a static offset, or in
// the thread's DTV block of the module. Shared by both schemas' variables.
static __always_inline __u32 tls_variable(const struct target *t, __u64 tp,
					  const struct tls_plan *plan, __u64 *variable)
{
	if (plan->mode == TLS_STATIC) {
		*variable = tp + plan->tp_offset;
		return RECORD_READ;
	}
	__u64 module_id = plan->module_id;
	__u64 dtv = 0, slots = 0, block = 0;
	if (bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + t->dtv_pointer_offset)) || !dtv)
		return RECORD_UNREADABLE;
	// dtv[-1] holds the slot count; entries are { pointer, to_free }.
	if (bpf_probe_read_user(&slots, sizeof(slots), (void *)(dtv - 16)))
		return RECORD_UNREADABLE;
	if (module_id > slots)
		return RECORD_NO_TLS_BLOCK;
	if (bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + module_id * 16)))
		return RECORD_UNREADABLE;
	if (block == 0 || block == (__u64)-1)
		return RECORD_NO_TLS_BLOCK;
	*variable = block + plan->module_offset;
	return RECORD_READ;
}

// Copies the record at `record`: the fixed header, then attrs_data only
// when the record is valid.
static __always_inline __u32 copy_record(__u64 record, __u8 *dst)
{
	if (bpf_probe_read_user(dst, ABI_RECORD_HEADER_SIZE, (void *)record))
		return RECORD_UNREADABLE;
	if (dst[ABI_OFFSET_VALID] != ABI_VALID)
		return RECORD_READ;
	__u32 attrs = *(__u16 *)(dst + ABI_OFFSET_ATTRS_DATA_SIZE);
	if (attrs > ABI_ATTRS_CAPACITY)
		attrs = ABI_ATTRS_CAPACITY;
	if (attrs && bpf_probe_read_user(dst + ABI_OFFSET_ATTRS_DATA, attrs,
					 (void *)(record + ABI_OFFSET_ATTRS_DATA)))
		return RECORD_UNREADABLE;
	return RECORD_READ;
}

// Follows the thread pointer to the record and copies it.
static __always_inline __u32 read_record(const struct target *t, struct task_struct *task,
					 __u8 *dst)
{
	if (t->record.mode == TLS_NONE)
		return RECORD_NULL;
	__u64 tp = BPF_CORE_READ(task, thread.fsbase);
	__u64 variable = 0;
	__u32 status = tls_variable(t, tp, &t->record, &variable);
	if (status != RECORD_READ)
		return status;
	__u64 record = 0;
	if (bpf_probe_read_user(&record, sizeof(record), (void *)variable))
		return RECORD_UNREADABLE;
	if (!record)
		return RECORD_NULL;
	return copy_record(record, dst);
}

// A tagged word: heap pointers have the tag bit, Smis hold value << 32.
static __always_inline bool is_heap_object(__u64 word)
{
	return word & ABI_NODE_HEAP_OBJECT_TAG;
}

static __always_inline __s64 smi_value(__u64 word)
{
	return (__s64)word >> ABI_NODE_SMI_SHIFT;
}

static __always_inline int read_word(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_user(dst, sizeof(*dst), (void *)addr);
}

// The Node.js schema (abi/src/node_schema.rs): from the thread's block
// through the current AsyncContextFrame's OrderedHashMap to the entry of the
// writer's AsyncLocalStorage, whose value's internal field holds the record
// address; then the record, as above. Every count is bounded and the chain
// is followed at most ABI_NODE_MAX_CHAIN_HOPS times, so the verifier sees a
// bounded loop and a wrong or moved object ends as a reason, never a guess.

// The thread's published block (cped_slot != 0). Several modules may define
// the variable (a writer in use beside an addon that is loaded but idle):
// the first module whose block is published for this thread wins.
static __always_inline __u32 nodejs_block(const struct target *t, struct task_struct *task,
					  __u64 *block, __u64 *where)
{
	__u64 tp = BPF_CORE_READ(task, thread.fsbase);
	__u32 status = NODE_NOT_PUBLISHED;
	for (int i = 0; i < ABI_NODE_MAX_MODULES; i++) {
		if (t->nodejs[i].mode == TLS_NONE)
			break;
		__u64 variable = 0;
		__u32 located = tls_variable(t, tp, &t->nodejs[i], &variable);
		if (located == RECORD_NO_TLS_BLOCK)
			continue;
		if (located != RECORD_READ ||
		    bpf_probe_read_user(block, ABI_NODE_SIZE, (void *)variable)) {
			// Unreadable here: report it unless a later module publishes.
			if (status == NODE_NOT_PUBLISHED)
				status = located != RECORD_READ ? located : RECORD_UNREADABLE;
			continue;
		}
		if (block[ABI_NODE_OFFSET_CPED_SLOT / 8]) {
			*where = variable;
			return RECORD_READ;
		}
	}
	return status;
}

// From an AsyncContextFrame (tagged) to the record of the writer whose
// block is `block`: steps 3 to 6 of the walk.
static __always_inline __u32 walk_frame(const struct target *t, const __u64 *block, __u64 frame,
					__u8 *dst)
{
	__u64 als_handle = block[ABI_NODE_OFFSET_ALS_HANDLE / 8];
	__u32 hash = (__u32)block[ABI_NODE_OFFSET_ALS_IDENTITY_HASH / 8];
	__u64 undefined = block[ABI_NODE_OFFSET_UNDEFINED_ADDR / 8];
	if (t->v8_tagged_size != 8)
		return NODE_WRONG_OBJECT;
	__u64 table = 0, als = 0, head = 0;
	if (frame == undefined || !is_heap_object(frame))
		return NODE_NO_FRAME;
	if (read_word(&table, frame - 1 + t->v8_js_map_table_offset))
		return RECORD_UNREADABLE;
	if (!is_heap_object(table))
		return NODE_WRONG_OBJECT;
	__u64 base = table - 1 + t->v8_ordered_hash_map_header_size;
	__u64 counts[ABI_NODE_TABLE_PREFIX_WORDS];
	if (bpf_probe_read_user(counts, sizeof(counts), (void *)base))
		return RECORD_UNREADABLE;
	if (is_heap_object(counts[0]) || is_heap_object(counts[1]) || is_heap_object(counts[2]))
		return NODE_WRONG_OBJECT;
	__s64 elements = smi_value(counts[0]);
	__s64 deleted = smi_value(counts[1]);
	__s64 buckets = smi_value(counts[2]);
	if (buckets <= 0 || buckets > ABI_NODE_MAX_BUCKETS || (buckets & (buckets - 1)))
		return NODE_WRONG_OBJECT;
	// V8 keeps at most two entries per bucket.
	if (elements < 0 || deleted < 0 || elements + deleted > 2 * buckets)
		return NODE_WRONG_OBJECT;
	__s64 used = elements + deleted;
	if (read_word(&als, als_handle))
		return RECORD_UNREADABLE;
	__u64 bucket = hash & (__u64)(buckets - 1);
	if (read_word(&head, base + (ABI_NODE_TABLE_PREFIX_WORDS + bucket) * 8))
		return RECORD_UNREADABLE;
	if (is_heap_object(head))
		return NODE_WRONG_OBJECT;
	__s64 index = smi_value(head);
	__u64 entries = base + (ABI_NODE_TABLE_PREFIX_WORDS + (__u64)buckets) * 8;
	__u64 value = 0;
	bool found = false;
	for (int hop = 0; hop < ABI_NODE_MAX_CHAIN_HOPS; hop++) {
		if (index == ABI_NODE_NOT_FOUND)
			return NODE_STORE_ABSENT;
		if (index < 0 || index >= used)
			return NODE_WRONG_OBJECT;
		__u64 entry[ABI_NODE_ENTRY_WORDS];
		if (bpf_probe_read_user(entry, sizeof(entry),
					(void *)(entries + (__u64)index * ABI_NODE_ENTRY_WORDS * 8)))
			return RECORD_UNREADABLE;
		if (entry[0] == als) {
			value = entry[1];
			found = true;
			break;
		}
		if (is_heap_object(entry[2]))
			return NODE_WRONG_OBJECT;
		index = smi_value(entry[2]);
	}
	if (!found)
		return index == ABI_NODE_NOT_FOUND ? NODE_STORE_ABSENT : NODE_CHAIN_TOO_LONG;
	if (value == undefined)
		return NODE_STORE_UNDEFINED;
	if (!is_heap_object(value))
		return NODE_WRONG_OBJECT;
	__u64 record = 0;
	if (read_word(&record, value - 1 + t->v8_js_object_record_offset))
		return RECORD_UNREADABLE;
	// A wrapper without a record, or a misaligned one: an invalid record.
	if (!record || (record & 1)) {
		dst[ABI_OFFSET_VALID] = 0;
		return RECORD_READ;
	}
	return copy_record(record, dst);
}


// The Node.js blocks seen in each target process, one per isolate (the
// main thread's and each worker's), for reading pool threads, which publish
// none: a pool item's frame belongs to the isolate that queued it, and only
// that isolate's AsyncLocalStorage is a key in it. Filled as JS threads are
// sampled; a slot is reused in turn once all are taken.
#define MAX_ISOLATES 8

struct isolate_blocks {
	__u64 block[MAX_ISOLATES][ABI_NODE_SIZE / 8];
	__u64 variable[MAX_ISOLATES]; // where each block is: its gate, read live
	__u32 next;
	__u32 reserved;
};

// Userspace sets max_entries (one per target) and deletes a target's entry.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct isolate_blocks);
} isolates SEC(".maps");

// Never written: the zeroed value a new `isolates` entry starts from (the
// value is too large for the BPF stack).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct isolate_blocks);
} no_isolates SEC(".maps");

static __always_inline void remember_isolate(struct task_struct *task, const __u64 *block,
					     __u64 where)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	struct isolate_blocks *known = bpf_map_lookup_elem(&isolates, &tgid);
	if (!known) {
		__u32 zero = 0;
		struct isolate_blocks *empty = bpf_map_lookup_elem(&no_isolates, &zero);
		if (!empty)
			return;
		bpf_map_update_elem(&isolates, &tgid, empty, BPF_NOEXIST);
		known = bpf_map_lookup_elem(&isolates, &tgid);
		if (!known)
			return;
	}
	__u64 handle = block[ABI_NODE_OFFSET_ALS_HANDLE / 8];
	for (int i = 0; i < MAX_ISOLATES; i++)
		if (known->block[i][ABI_NODE_OFFSET_ALS_HANDLE / 8] == handle &&
		    known->block[i][ABI_NODE_OFFSET_UNDEFINED_ADDR / 8] ==
			    block[ABI_NODE_OFFSET_UNDEFINED_ADDR / 8])
			return;
	// Two CPUs may store at once: a mixed entry's handle and hash then
	// disagree, and its walks end without a match, never with a wrong one.
	__u32 at = known->next % MAX_ISOLATES;
	known->next = at + 1;
	for (int w = 0; w < ABI_NODE_SIZE / 8; w++)
		known->block[at][w] = block[w];
	known->variable[at] = where;
}

// When each thread's block was last looked for at a switch.
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} isolate_checked SEC(".maps");

#define ISOLATE_CHECK_NS (50 * 1000 * 1000ULL)

// Learns the block of a target thread as it switches out, at most once per
// ISOLATE_CHECK_NS per thread: a JS thread that queues pool work and then
// waits is rarely sampled on CPU, and its items' samples need its block
// from the first one on.
static __always_inline void check_isolate(const struct target *t, struct task_struct *task)
{
	if (!t->pool.return_address || t->nodejs[0].mode == TLS_NONE)
		return;
	__u64 *at = bpf_task_storage_get(&isolate_checked, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	__u64 now = bpf_ktime_get_ns();
	if (!at || now - *at < ISOLATE_CHECK_NS)
		return;
	*at = now;
	__u64 block[ABI_NODE_SIZE / 8] = {}, where = 0;
	if (nodejs_block(t, task, block, &where) == RECORD_READ)
		remember_isolate(task, block, where);
}

static __always_inline __u32 read_nodejs_record(const struct target *t, struct task_struct *task,
						__u8 *dst)
{
	__u64 block[ABI_NODE_SIZE / 8] = {}, where = 0;
	__u32 status = nodejs_block(t, task, block, &where);
	if (status != RECORD_READ)
		return status;
	if (t->pool.return_address)
		remember_isolate(task, block, where);
	__u64 frame = 0;
	if (read_word(&frame, block[ABI_NODE_OFFSET_CPED_SLOT / 8]))
		return RECORD_UNREADABLE;
	return walk_frame(t, block, frame, dst);
}

static __always_inline bool has_span(__u32 status, const __u8 *record)
{
	return status == RECORD_READ && record[ABI_OFFSET_VALID] == ABI_VALID;
}

// The thread's span as the reader finds it: from either schema (the
// record's first), else the Node.js walk's reason when its block is
// published. Shared by the samplers and the threadpool's submit probe.
static __always_inline __u32 read_span(const struct target *t, struct task_struct *task, __u8 *dst,
				       __u32 *schema)
{
	dst[ABI_OFFSET_VALID] = 0;
	*schema = SCHEMA_RECORD;
	__u32 status = read_record(t, task, dst);
	if (t->nodejs[0].mode != TLS_NONE && !has_span(status, dst)) {
		__u32 walked = read_nodejs_record(t, task, dst);
		if (walked != NODE_NOT_PUBLISHED || t->record.mode == TLS_NONE) {
			*schema = SCHEMA_NODEJS;
			status = walked;
		}
	}
	return status;
}

// --- User stack copies, for unwinding in userspace ---------------------
//
// Frame pointers end at the first function built without them (glibc,
// most distributions' libraries), so each sample also sends the user
// registers and a copy of the stack from the user stack pointer up: an
// unwinder with the modules' CFI (.eh_frame) walks it later, as
// `perf --call-graph dwarf` does. The copy is its own ring-buffer record,
// sent before the sample that names it: a waiting thread's copy is sent at
// switch-out, so the blocked-thread table keeps only the small sample.

// Bytes of stack copied from the stack pointer up (at most).
#define USER_STACK_COPY_BYTES (64 * 1024)
#define PAGE_BYTES 4096

enum { KIND_USER_STACK = 2 };

struct user_stack_copy {
	__u32 kind;               // KIND_USER_STACK
	__u32 tid;
	__u64 id;                 // bpf_ktime_get_ns() when copied; the sample's user_stack_copy_id
	__u64 ip;                 // user registers at the sample (or at kernel entry)
	__u64 sp;
	__u64 bp;
	__s32 bytes;              // bytes copied from sp
	__u32 reserved;
	__u8 stack[USER_STACK_COPY_BYTES];
	__u8 slack[PAGE_BYTES];   // never sent: lets the verifier see a page copy fit
};

#define USER_STACK_COPY_HEADER (sizeof(struct user_stack_copy) - USER_STACK_COPY_BYTES - PAGE_BYTES)

// Staging for a copy, one slot per CPU (far larger than the BPF stack, and
// than a per-CPU map's values may be). Userspace sets max_entries to the
// number of possible CPUs.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct user_stack_copy);
} stack_scratch SEC(".maps");

// Kernel types the copy reads; the ___stack flavour keeps them apart from
// the definitions above (CO-RE matches them to the kernel's by base name).
struct pt_regs___stack {
	unsigned long bp;
	unsigned long sp;
	unsigned long ip;
} __attribute__((preserve_access_index));

struct mm_struct___stack {
	unsigned long start_stack;
} __attribute__((preserve_access_index));

struct task_struct___stack {
	int pid;
	int tgid;
	struct mm_struct___stack *mm;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

// The highest address the copy may read: the stack of a thread that
// glibc's pthread_create made ends below its thread pointer (the TCB and
// static TLS sit at the top of the same mapping); the main thread's ends
// at the mm's start_stack (argv, environment and auxv above it). Anything
// else, or a stack pointer outside that range: 0, copy the most.
static __always_inline __u64 user_stack_top(struct task_struct___stack *task, __u64 sp)
{
	__u64 top;
	if (BPF_CORE_READ(task, pid) == BPF_CORE_READ(task, tgid))
		top = BPF_CORE_READ(task, mm, start_stack);
	else
		top = BPF_CORE_READ(task, thread.fsbase);
	return top > sp ? top : 0;
}

// Copies [src, src + len) page by page: a page never touched (the unused
// part of a large array on the stack, such as libuv's epoll event buffer)
// is not present, and the non-faulting read refuses a range that holds
// one; such a page reads as zeros (bpf_probe_read_user clears what it
// could not read), which no unwinder mistakes for a frame.
static __always_inline void copy_by_page(__u8 *dst, __u64 src, __u64 len)
{
	__u64 done = 0;
	for (int i = 0; i <= USER_STACK_COPY_BYTES / PAGE_BYTES; i++) {
		if (done >= len)
			break;
		__u64 chunk = PAGE_BYTES - ((src + done) & (PAGE_BYTES - 1));
		if (chunk > len - done)
			chunk = len - done;
		if (chunk > PAGE_BYTES)
			chunk = PAGE_BYTES;
		__u64 at = done & (USER_STACK_COPY_BYTES - 1);
		bpf_probe_read_user(dst + at, chunk, (void *)(src + done));
		done += chunk;
	}
}

// Copies the user registers of `task` (as saved at its entry into the
// kernel: the interrupt of an on-CPU tick, the system call of a wait) and
// its stack from sp, and sends them. `task` must be current or, at
// sched_switch, the task switching out (whose mm is still the current one).
// Returns the copy's id, or 0 when nothing was sent; `*copied` is the copy
// (valid until the next sample on this CPU), or NULL.
static __always_inline __u64 send_user_stack(struct task_struct *task,
					     struct user_stack_copy **copied)
{
	*copied = NULL;
	__u32 cpu = bpf_get_smp_processor_id();
	struct user_stack_copy *c = bpf_map_lookup_elem(&stack_scratch, &cpu);
	if (!c)
		return 0;
	struct pt_regs___stack *regs = (void *)bpf_task_pt_regs(task);
	if (!regs)
		return 0;
	struct task_struct___stack *t = (void *)task;
	c->kind = KIND_USER_STACK;
	c->tid = BPF_CORE_READ(t, pid);
	c->id = bpf_ktime_get_ns();
	c->ip = BPF_CORE_READ(regs, ip);
	c->sp = BPF_CORE_READ(regs, sp);
	c->bp = BPF_CORE_READ(regs, bp);
	c->reserved = 0;
	__u64 len = USER_STACK_COPY_BYTES;
	__u64 top = user_stack_top(t, c->sp);
	if (top && top - c->sp < len)
		len = top - c->sp;
	// The verifier needs the size visibly bounded and non-zero.
	len &= (USER_STACK_COPY_BYTES << 1) - 1;
	if (len == 0 || len > USER_STACK_COPY_BYTES)
		return 0;
	if (bpf_probe_read_user(c->stack, len, (void *)c->sp))
		copy_by_page(c->stack, c->sp, len);
	c->bytes = len;
	*copied = c;
	__u64 size = USER_STACK_COPY_HEADER + len;
	if (size > sizeof(*c))
		return 0;
	if (bpf_ringbuf_output(&samples, c, size, 0)) {
		count(LOST_RING_FULL);
		return 0;
	}
	return c->id;
}

// --- libuv threadpool ---------------------------------------------------
//
// libuv queues every threadpool item through uv__work_submit(loop, w, kind,
// work, done) on the submitting (JS) thread (node's build inlines it into
// uv_queue_work, probed as well); a pool thread later calls work(w). The
// submit probe copies the submitter's span (read as a sample reads it) into
// pool_items under {tgid, w}; the probe where libuv's worker loop starts
// the item (or, where that site is not found, the entry probe of the work
// functions) moves it to the pool thread's own storage. A sample of a pool
// thread without a span of its own, taken inside the item, then carries the
// queued span, marked SAMPLE_THREADPOOL.
//
// Never a wrong span: a submit without a span deletes any entry left under
// the same address (a cancelled item's, since libuv reuses requests); an
// item whose entry was evicted runs without a span. pool_items is an LRU
// table, so items that never run (cancelled) cannot fill it for good; the
// per-thread state lives in task storage, freed with the thread (a process
// that exits mid-item leaves nothing behind).
//
// The end of an item needs no probe of its own (a return probe would cost
// a third trap per item): a sample checks that the pool thread is still
// inside the work function, its stack pointer at or below the one at the
// entry and the return address there unchanged. Once the function returns,
// libuv's worker loop calls its lock and condition-variable functions from
// the same frame, which overwrites that slot.

struct pool_item_key {
	__u32 tgid;
	__u32 reserved;
	__u64 work;               // the uv__work the item was queued as
};

struct queued_span {
	__u64 work;               // the key's address again, checked after a copy
	__u32 schema;             // enum schema of the record
	__u32 state;              // running_state (pool thread storage only)
	// Pool thread storage only: the stack pointer at the work function's
	// entry, and the return address it points at (into libuv's worker).
	__u64 entry_sp;
	__u64 return_address;
	__u8 record[ABI_RECORD_SIZE];
};

// Work items queued in a span, until a pool thread picks them up.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pool_item_key);
	__type(value, struct queued_span);
} pool_items SEC(".maps");

// Per thread: a pool thread's running item (state RUNNING_WITH_SPAN), or a
// submitter's staging space (uprobe programs may be preempted, so a per-CPU
// buffer could be shared by two of them; a thread's own storage cannot).
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct queued_span);
} thread_span SEC(".maps");

enum running_state { IDLE = 0, WRITING = 1, RUNNING_WITH_SPAN = 2 };

struct pt_regs___pool {
	unsigned long sp;
} __attribute__((preserve_access_index));

// --- The running item, found at sample time (no probe) ----------------
//
// Where the target publishes the Node.js schema, nothing runs per item: a
// sample of a pool thread finds the item the thread is running and reads
// the span from the request itself. Node keeps the AsyncContextFrame that
// was current when a request was made (AsyncWrap: in an internal field of
// its JS object; AsyncResource, which N-API's async work is: in a global
// handle), the same frame the request's callback runs in; the walk of the
// isolate's blocks (one of which owns the frame's key) then gives its span.
//
// The item: while w->work(w) runs, the stack slot just below libuv's worker
// frame holds the call's return address, and the worker keeps w (plus a
// displacement) in a callee-saved register, which is either still in that
// register or saved by a callee on the stack between the slot and the
// stack pointer. Every candidate is checked against the item's own state:
// a running item's queue link points at itself (libuv unlinks it before
// the call and relinks it after) and its work function is libuv's.

// The callee-saved registers, where a pool thread keeps its item.
struct pt_regs___item {
	unsigned long bx;
	unsigned long bp;
	unsigned long r12;
	unsigned long r13;
	unsigned long r14;
	unsigned long r15;
	unsigned long sp;
	unsigned long ip;
} __attribute__((preserve_access_index));

#define POOL_MAX_CANDIDATES 32

// The words of the thread's stack copy, searched by bpf_loop callbacks.
struct item_search {
	__u64 return_address;
	__s64 displacement;
	__u64 wq_offset;
	__u64 work[4];            // the work functions
	__u64 stack_low, stack_high; // the copied range: not heap addresses
	__u32 words;              // words in the copy
	__u32 slot;               // the return address's word; `words`: not found
	__u32 probes;             // candidates read so far
	__u32 reserved;
	__u64 item;               // the item found, 0 until then
};

static __always_inline const __u64 *copy_words(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct user_stack_copy *c = bpf_map_lookup_elem(&stack_scratch, &cpu);
	return c ? (const __u64 *)c->stack : NULL;
}

static long find_return_slot(__u64 index, struct item_search *search)
{
	const __u64 *words = copy_words();
	if (!words || index >= search->words)
		return 1;
	if (words[index & (USER_STACK_COPY_BYTES / 8 - 1)] != search->return_address)
		return 0;
	search->slot = index;
	return 1;
}

// Whether `w` is an item a pool thread runs: its queue link points at
// itself (libuv unlinks and resets it before the call, and links it into
// the loop's done queue after) and its work function is one of libuv's.
static __always_inline bool item_running(__u64 w, __u64 wq_offset, const __u64 *work_functions)
{
	__u64 link[2] = {};
	__u64 work = 0;
	if (bpf_probe_read_user(link, sizeof(link), (void *)(w + wq_offset)) ||
	    link[0] != w + wq_offset || link[1] != link[0] || read_word(&work, w))
		return false;
	return work == work_functions[0] || work == work_functions[1] ||
	       work == work_functions[2] || work == work_functions[3];
}

// Whether `value` (a register's, as the worker loop holds it) is the item
// this thread runs; then search->item is set.
static __always_inline bool running_item(struct item_search *search, __u64 value)
{
	if (value < 0x10000 || value >= 0x800000000000ULL || (value & 7) ||
	    (value >= search->stack_low && value < search->stack_high))
		return false;
	search->probes++;
	__u64 w = value + search->displacement;
	if (!item_running(w, search->wq_offset, search->work))
		return false;
	search->item = w;
	return true;
}

// From the slot down to the stack pointer: the callees' saved registers
// nearest the slot first (the work function's own pushes).
static long find_saved_item(__u64 index, struct item_search *search)
{
	if (index >= search->slot || search->probes >= POOL_MAX_CANDIDATES)
		return 1;
	const __u64 *words = copy_words();
	if (!words)
		return 1;
	__u64 at = (search->slot - 1 - index) & (USER_STACK_COPY_BYTES / 8 - 1);
	return running_item(search, words[at]) ? 1 : 0;
}

// The item the pool thread runs, or 0.
static __always_inline __u64 find_running_item(const struct pool_plan *plan,
					       struct task_struct *task,
					       const struct user_stack_copy *copy)
{
	struct item_search search = {
		.return_address = plan->return_address,
		.displacement = plan->item_displacement,
		.wq_offset = plan->wq_offset,
		.work = { plan->fs_work, plan->getaddrinfo_work, plan->getnameinfo_work,
			  plan->queue_work },
		.stack_low = copy->sp,
		.stack_high = copy->sp + (__u64)copy->bytes,
		.words = (__u32)copy->bytes / 8,
	};
	search.slot = search.words;
	bpf_loop(USER_STACK_COPY_BYTES / 8, find_return_slot, &search, 0);
	if (search.slot >= search.words)
		return 0;
	struct pt_regs___item *regs = (void *)bpf_task_pt_regs(task);
	if (!regs)
		return 0;
	__u64 saved[6] = {
		BPF_CORE_READ(regs, bx),  BPF_CORE_READ(regs, bp),  BPF_CORE_READ(regs, r12),
		BPF_CORE_READ(regs, r13), BPF_CORE_READ(regs, r14), BPF_CORE_READ(regs, r15),
	};
	// No callee saved the register: it still holds the item.
	if (running_item(&search, saved[plan->item_register < 6 ? plan->item_register : 5]))
		return search.item;
	bpf_loop(USER_STACK_COPY_BYTES / 8, find_saved_item, &search, 0);
	return search.item;
}

// The object behind a running item: its address, whether it is N-API's
// async work (an AsyncResource) rather than an AsyncWrap, and its async id
// (unique for the process's life: the key of its span between GC pauses).
// Only C++ memory is read here, which V8's GC never moves.
struct item_resource {
	__u64 object;
	__u64 async_id;
	bool napi;
};

// Reads the async id of resource `r` (its object and kind) into `id`;
// whether it could.
static __always_inline bool read_async_id(const struct pool_plan *plan,
					  const struct item_resource *r, __u64 *id)
{
	return !read_word(id, r->object + (r->napi ? plan->async_resource_id_offset :
						     plan->async_wrap_id_offset));
}

static __always_inline bool item_resource(const struct pool_plan *plan, __u64 w,
					  struct item_resource *r)
{
	__u64 work = 0;
	r->napi = false;
	if (read_word(&work, w))
		return false;
	if (work == plan->fs_work) {
		if (read_word(&r->object, w - plan->fs_work_offset))
			return false;
	} else if (work == plan->getaddrinfo_work || work == plan->getnameinfo_work) {
		if (read_word(&r->object, w - plan->addrinfo_work_offset))
			return false;
	} else {
		// uv_queue_work: only node's ThreadPoolWork (crypto, zlib, N-API, ...)
		// says where its object starts, through the vtable's offset to top.
		__u64 req = w - plan->queue_work_offset, callback = 0, vptr = 0, object_vptr = 0;
		__s64 to_top = 0;
		if (!plan->thread_pool_work_cb || read_word(&callback, req + plan->work_cb_offset) ||
		    callback != plan->thread_pool_work_cb)
			return false;
		__u64 base = req - plan->thread_pool_work_offset;
		if (read_word(&vptr, base) || read_word((__u64 *)&to_top, vptr - 16) || to_top > 0 ||
		    to_top < -4096 || (to_top & 7))
			return false;
		r->object = base + to_top;
		r->napi = plan->napi_work_vptr && !read_word(&object_vptr, r->object) &&
			  object_vptr == plan->napi_work_vptr;
	}
	return r->object && read_async_id(plan, r, &r->async_id);
}

// The AsyncContextFrame (tagged) the resource was made in, or 0. Reads V8's
// heap: only while no isolate of the process moves objects.
static __always_inline __u64 item_frame(const struct pool_plan *plan, const struct item_resource *r)
{
	__u64 handle = 0, object = 0, frame = 0;
	if (r->napi) {
		if (read_word(&handle, r->object + plan->async_resource_frame_offset) || !handle ||
		    read_word(&frame, handle))
			return 0;
		return frame;
	}
	if (read_word(&handle, r->object + plan->async_wrap_object_offset) || !handle ||
	    read_word(&object, handle) || !is_heap_object(object) ||
	    read_word(&frame, object - 1 + plan->object_frame_offset))
		return 0;
	return frame;
}

// Whether isolate `i`'s gate is open: it is alive and not in a moving GC.
static __always_inline bool gate_open(const struct isolate_blocks *known, int i)
{
	__u64 gate = 0;
	return !read_word(&gate, known->variable[i] + ABI_NODE_OFFSET_CPED_SLOT) && gate;
}

enum item_span_read { ITEM_SPAN, ITEM_NO_SPAN, ITEM_UNREAD };

// The span of the request `resource` into `record`: ITEM_SPAN, or
// ITEM_NO_SPAN when it was made outside any span, or ITEM_UNREAD when no
// open isolate could tell. The frame is read only when an isolate's gate
// is open, and walked with that isolate's block: an item of an isolate in
// a moving GC (or of one that exited) finds no key of an open one in its
// frame. A walk that reaches the writer's entry (or finds the frame empty)
// is an answer; one that finds no key of an open isolate is not.
static __always_inline int item_span(const struct target *t, const struct isolate_blocks *known,
				     const struct item_resource *resource, __u8 *record)
{
	__u64 frame = 0;
	__u32 status = NODE_STORE_ABSENT;
	for (int i = 0; i < MAX_ISOLATES; i++) {
		const __u64 *block = known->block[i];
		if (!block[ABI_NODE_OFFSET_ALS_HANDLE / 8] || !gate_open(known, i))
			continue;
		if (!frame)
			frame = item_frame(&t->pool, resource);
		if (!frame)
			break;
		record[ABI_OFFSET_VALID] = 0;
		status = walk_frame(t, block, frame, record);
		if (status == RECORD_READ || status == NODE_STORE_UNDEFINED || status == NODE_NO_FRAME)
			break;
	}
	if (has_span(status, record))
		return ITEM_SPAN;
	if (status == RECORD_READ || status == NODE_STORE_UNDEFINED || status == NODE_NO_FRAME)
		return ITEM_NO_SPAN;
	return ITEM_UNREAD;
}

// --- Items read again after a GC ---------------------------------------
//
// A pool sample taken while the isolates' gates are closed cannot read its
// item's frame. The item waits here, per process, and is read again at the
// process's next sample or switch-out (where its memory is the current
// one) for as long as its request is not done: the same request (its
// resource's async id, unique for the process's life) and its item either
// still running (as above) or finished on the pool thread but still waiting
// in a queue for the loop thread, which runs its completion (and frees the
// request) only after taking it off that queue. A GC pause of the loop's
// isolate holds the completion back, so an item that ends in the pause is
// still there after it. Checked before and after the read, so a request
// whose completion started meanwhile is never read. Userspace gives the
// span found to the samples of that item, and creates and deletes each
// process's entry.
#define PENDING_ITEMS 8
// Retries of one item at most this often: one whose isolate is not known
// yet stays unreadable until its block is learned or the item ends.
#define PENDING_RETRY_NS (500 * 1000ULL)

struct pending_items {
	__u64 item[PENDING_ITEMS];
	__u64 async_id[PENDING_ITEMS];
	__u64 object[PENDING_ITEMS];  // the resource (struct item_resource)
	__u64 tried[PENDING_ITEMS];
	__u8 napi[PENDING_ITEMS];
	__u32 next;
	__u32 reserved;
};

// Userspace sets max_entries (one per target).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct pending_items);
} unread_items SEC(".maps");

enum { KIND_ITEM_READ = 3 };

// The span of an item read after its samples (a ring-buffer record).
struct item_read {
	__u32 kind;               // KIND_ITEM_READ
	__u32 tgid;
	__u64 item;
	__u64 async_id;
	__u8 record[ABI_RECORD_SIZE];
};

static __always_inline void keep_unread(__u32 tgid, __u64 w, const struct item_resource *r)
{
	struct pending_items *p = bpf_map_lookup_elem(&unread_items, &tgid);
	if (!p)
		return;
	for (int i = 0; i < PENDING_ITEMS; i++)
		if (p->item[i] == w && p->async_id[i] == r->async_id)
			return;
	// Two CPUs may store at once: a slot whose item, resource and async id
	// disagree names no live request, and is dropped at its first read.
	__u32 at = p->next % PENDING_ITEMS;
	p->next = at + 1;
	p->item[at] = 0;
	p->async_id[at] = r->async_id;
	p->object[at] = r->object;
	p->napi[at] = r->napi;
	p->tried[at] = bpf_ktime_get_ns();
	p->item[at] = w;
}

// Whether item `w` finished its work but its completion has not started:
// libuv clears its work function when the work returns, then links it into
// the loop's done queue, from which the loop thread unlinks it before
// calling its completion. Linked: both neighbours point back at it.
static __always_inline bool item_awaiting_completion(__u64 w, __u64 wq_offset)
{
	__u64 work = 1, link[2] = {}, back = 0;
	__u64 self = w + wq_offset;
	if (read_word(&work, w) || work ||
	    bpf_probe_read_user(link, sizeof(link), (void *)self))
		return false;
	if (link[0] == self && link[1] == self)
		return true; // between the two: cleared, not yet linked
	return !read_word(&back, link[0] + 8) && back == self && !read_word(&back, link[1]) &&
	       back == self;
}

// Whether the request `kept` (item `w`, as a sample found it) is not done:
// the same resource with the same async id, and its item running it or
// awaiting its completion.
static __always_inline bool request_not_done(const struct pool_plan *plan, __u64 w,
					     const struct item_resource *kept)
{
	__u64 work[4] = { plan->fs_work, plan->getaddrinfo_work, plan->getnameinfo_work,
			  plan->queue_work };
	struct item_resource now = {};
	if (item_running(w, plan->wq_offset, work))
		return item_resource(plan, w, &now) && now.object == kept->object &&
		       now.async_id == kept->async_id;
	return item_awaiting_completion(w, plan->wq_offset) &&
	       read_async_id(plan, kept, &now.async_id) && now.async_id == kept->async_id;
}

static long read_pending_item(__u64 index, __u32 *tgid)
{
	const struct target *t = bpf_map_lookup_elem(&targets, tgid);
	struct pending_items *p = bpf_map_lookup_elem(&unread_items, tgid);
	const struct isolate_blocks *known = bpf_map_lookup_elem(&isolates, tgid);
	if (!t || !p || !known || index >= PENDING_ITEMS)
		return 1;
	__u32 at = index & (PENDING_ITEMS - 1);
	__u64 w = p->item[at], now = bpf_ktime_get_ns();
	if (!w || now - p->tried[at] < PENDING_RETRY_NS)
		return 0;
	p->tried[at] = now;
	struct item_resource resource = {
		.object = p->object[at],
		.async_id = p->async_id[at],
		.napi = p->napi[at],
	};
	if (!request_not_done(&t->pool, w, &resource)) {
		p->item[at] = 0;
		return 0;
	}
	struct item_read *out = bpf_ringbuf_reserve(&samples, sizeof(*out), 0);
	if (!out)
		return 1;
	int found = item_span(t, known, &resource, out->record);
	if (found == ITEM_UNREAD) {
		bpf_ringbuf_discard(out, 0);
		return 0;
	}
	p->item[at] = 0;
	// The request is still not done after the walk: it was alive all
	// along, and its frame (set when it was made) was the one read.
	if (found != ITEM_SPAN || !request_not_done(&t->pool, w, &resource)) {
		bpf_ringbuf_discard(out, 0);
		return 0;
	}
	out->kind = KIND_ITEM_READ;
	out->tgid = *tgid;
	out->item = w;
	out->async_id = resource.async_id;
	bpf_ringbuf_submit(out, 0);
	return 0;
}

// Reads the process's waiting items again; called where its memory is the
// current one.
static __always_inline void read_pending(const struct target *t, __u32 tgid)
{
	if (!t->pool.return_address)
		return;
	const struct pending_items *p = bpf_map_lookup_elem(&unread_items, &tgid);
	if (!p)
		return;
	__u64 any = 0;
	for (int i = 0; i < PENDING_ITEMS; i++)
		any |= p->item[i];
	if (any)
		bpf_loop(PENDING_ITEMS, read_pending_item, &tgid, 0);
}

// The span of the item a pool thread runs, into the sample; whether found.
static __always_inline bool read_running_item(const struct target *t, struct task_struct *task,
					      const struct user_stack_copy *copy, struct sample *s)
{
	if (!t->pool.return_address || !copy)
		return false;
	__u64 id = copy->id;
	__u64 w = find_running_item(&t->pool, task, copy);
	// The copy is per CPU: a sample that interrupted this one may have
	// replaced it while it was searched.
	struct item_resource resource = {};
	if (!w || copy->id != id || !item_resource(&t->pool, w, &resource))
		return false;
	s->pool_item = w;
	s->pool_async_id = resource.async_id;
	__u32 tgid = s->tgid;
	const struct isolate_blocks *known = bpf_map_lookup_elem(&isolates, &tgid);
	int found = known ? item_span(t, known, &resource, s->record) : ITEM_UNREAD;
	if (found == ITEM_UNREAD) {
		s->flags |= SAMPLE_POOL_UNREAD;
		keep_unread(tgid, w, &resource);
	}
	if (found != ITEM_SPAN)
		return false;
	s->schema = SCHEMA_NODEJS;
	s->record_status = RECORD_READ;
	s->flags = SAMPLE_THREADPOOL;
	return true;
}

// Copies a pool thread's queued span into its sample while the thread is
// inside the work item. The storage is only written by the thread itself
// (in its probe), and samples of a thread are taken on that thread (a
// perf-event interrupt) or at its switch-out (its memory still current):
// a sample that interrupts the probe mid-write sees WRITING, and drops it.
static __always_inline void take_pool_span(struct task_struct *pool_task, struct sample *s)
{
	struct queued_span *q = bpf_task_storage_get(&thread_span, pool_task, 0, 0);
	if (!q || q->state != RUNNING_WITH_SPAN)
		return;
	struct pt_regs___pool *regs = (void *)bpf_task_pt_regs(pool_task);
	if (!regs)
		return;
	__u64 sp = BPF_CORE_READ(regs, sp), slot = 0;
	if (sp > q->entry_sp || bpf_probe_read_user(&slot, sizeof(slot), (void *)q->entry_sp) ||
	    slot != q->return_address)
		return;
	if (bpf_probe_read_kernel(s->record, sizeof(s->record), q->record))
		return;
	s->schema = q->schema;
	s->record_status = RECORD_READ;
	s->flags = SAMPLE_THREADPOOL;
}

static __always_inline void fill(void *ctx, struct sample *s, const struct target *t,
				 struct task_struct *task, struct task_struct *pool_task,
				 const struct user_stack_copy *copy, __u32 kind)
{
	s->kind = kind;
	s->tid = BPF_CORE_READ(task, pid);
	s->tgid = BPF_CORE_READ(task, tgid);
	s->time_ns = bpf_ktime_get_ns();
	s->off_cpu_ns = 0;
	BPF_CORE_READ_STR_INTO(&s->comm, task, comm);
	s->record_status = read_span(t, task, s->record, &s->schema);
	s->flags = 0;
	s->pool_item = 0;
	s->pool_async_id = 0;
	// A thread that publishes no block of its own may be a pool thread.
	if (!has_span(s->record_status, s->record) && pool_task) {
		__u32 status = s->record_status;
		bool unpublished = status == NODE_NOT_PUBLISHED || status == RECORD_NULL ||
				   status == RECORD_NO_TLS_BLOCK;
		if (!unpublished || !read_running_item(t, pool_task, copy, s))
			take_pool_span(pool_task, s);
	}
	s->user_stack_bytes = bpf_get_stack(ctx, s->user_stack, sizeof(s->user_stack), BPF_F_USER_STACK);
	s->kernel_stack_bytes = bpf_get_stack(ctx, s->kernel_stack, sizeof(s->kernel_stack), 0);
}

SEC("perf_event")
int on_cpu(void *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	const struct target *t = bpf_map_lookup_elem(&targets, &tgid);
	if (!t)
		return 0;
	// The copy goes first: the ring keeps records in reservation order.
	struct user_stack_copy *copy;
	__u64 copy_id = send_user_stack((struct task_struct *)bpf_get_current_task_btf(), &copy);
	struct sample *s = bpf_ringbuf_reserve(&samples, sizeof(*s), 0);
	if (!s) {
		count(LOST_RING_FULL);
		return 0;
	}
	struct task_struct *current = bpf_get_current_task_btf();
	fill(ctx, s, t, (struct task_struct *)bpf_get_current_task(), current, copy, KIND_CPU);
	s->user_stack_copy_id = copy_id;
	bpf_ringbuf_submit(s, 0);
	read_pending(t, tgid);
	return 0;
}

static __always_inline int still_runnable(struct task_struct *task)
{
	if (bpf_core_field_exists(task->__state))
		return BPF_CORE_READ(task, __state) == 0;
	struct task_struct___pre_5_14 *old = (void *)task;
	return BPF_CORE_READ(old, state) == 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(off_cpu, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 zero = 0;
	// Switch-out of a target thread that waits (not one merely preempted):
	// its stack and record now, the time when it comes back.
	__u32 prev_tgid = BPF_CORE_READ(prev, tgid);
	const struct target *t = bpf_map_lookup_elem(&targets, &prev_tgid);
	if (t && !still_runnable(prev)) {
		struct sample *s = bpf_map_lookup_elem(&scratch, &zero);
		if (s) {
			struct user_stack_copy *copy;
			__u64 copy_id = send_user_stack(prev, &copy);
			fill(ctx, s, t, prev, prev, copy, KIND_OFF_CPU);
			s->user_stack_copy_id = copy_id;
			__u32 tid = s->tid;
			if (bpf_map_update_elem(&blocked, &tid, s, BPF_ANY))
				count(LOST_BLOCKED_FULL);
		}
	}
	// Switched out, waiting or preempted: its memory is still the current
	// one (not so for `next`, whose mm is not yet switched in).
	if (t) {
		check_isolate(t, prev);
		read_pending(t, prev_tgid);
	}
	__u32 next_tgid = BPF_CORE_READ(next, tgid);
	if (bpf_map_lookup_elem(&targets, &next_tgid)) {
		__u32 tid = BPF_CORE_READ(next, pid);
		struct sample *s = bpf_map_lookup_elem(&blocked, &tid);
		if (s) {
			s->off_cpu_ns = bpf_ktime_get_ns() - s->time_ns;
			if (bpf_ringbuf_output(&samples, s, sizeof(*s), 0))
				count(LOST_RING_FULL);
			bpf_map_delete_elem(&blocked, &tid);
		}
	}
	return 0;
}

// The argument registers a uprobe reads (x86-64 System V).
struct pt_regs___args {
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long sp;
} __attribute__((preserve_access_index));

// On the submitting thread, before the item is queued (so before any pool
// thread can take it): uv__work_submit(loop, w, kind, work, done), whose
// cookie is 0, and uv_queue_work(loop, req, work_cb, after_work_cb), whose
// cookie is where req keeps its uv__work (libuv fails the call without a
// work_cb, so nothing is queued then).
SEC("uprobe")
int pool_submit(struct pt_regs___args *regs)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	const struct target *t = bpf_map_lookup_elem(&targets, &tgid);
	if (!t)
		return 0;
	__u64 work_offset = bpf_get_attach_cookie(regs);
	if (work_offset && !regs->dx)
		return 0;
	struct pool_item_key key = { .tgid = tgid, .work = regs->si + work_offset };
	struct task_struct *current = bpf_get_current_task_btf();
	struct queued_span *q = bpf_task_storage_get(&thread_span, current, 0,
						     BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!q) {
		bpf_map_delete_elem(&pool_items, &key);
		return 0;
	}
	q->work = key.work;
	q->state = IDLE;
	__u32 status = read_span(t, (struct task_struct *)bpf_get_current_task(), q->record, &q->schema);
	if (!has_span(status, q->record)) {
		bpf_map_delete_elem(&pool_items, &key);
		return 0;
	}
	if (bpf_map_update_elem(&pool_items, &key, q, BPF_ANY) == 0)
		count(POOL_QUEUED_IN_SPAN);
	return 0;
}

// The pool thread's own state and the item queued under `key` (NULL when
// it was not queued in a span). The state is created only for such an
// item; without it, the item is dropped and NULL returned.
static __always_inline struct queued_span *pool_thread_state(struct pool_item_key *key,
							      struct queued_span **item)
{
	*item = bpf_map_lookup_elem(&pool_items, key);
	struct queued_span *mine = bpf_task_storage_get(&thread_span, bpf_get_current_task_btf(), 0,
							*item ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!mine && *item)
		bpf_map_delete_elem(&pool_items, key);
	return mine;
}

// The pool thread `mine` begins `item` (NULL: not queued in a span): moves
// its span into the thread's storage with the stack slot that holds the
// item's return address while it runs, or marks the thread idle.
static __always_inline void begin_item(struct pool_item_key *key, struct queued_span *item,
				       struct queued_span *mine, __u64 entry_sp,
				       __u64 return_address)
{
	mine->state = WRITING;
	// ORDER: WRITING is visible before the copy starts and RUNNING_WITH_SPAN
	// only after it ends, for a sample that interrupts this thread; the
	// barriers keep the compiler from moving the stores (the reader is on
	// the same CPU, so no hardware fence is needed).
	asm volatile("" ::: "memory");
	if (!item || bpf_probe_read_kernel(mine->record, sizeof(mine->record), item->record))
		goto idle;
	mine->schema = item->schema;
	mine->work = item->work;
	mine->entry_sp = entry_sp;
	mine->return_address = return_address;
	bpf_map_delete_elem(&pool_items, key);
	// An entry recycled under us (another key's) is not this item's.
	if (mine->work != key->work)
		goto idle;
	asm volatile("" ::: "memory");
	mine->state = RUNNING_WITH_SPAN;
	count(POOL_RAN_IN_SPAN);
	return;
idle:
	asm volatile("" ::: "memory");
	mine->state = IDLE;
	if (item)
		bpf_map_delete_elem(&pool_items, key);
}

// Entry of a work function (uv__fs_work, uv__queue_work, ...): work(w) on
// a pool thread.
SEC("uprobe")
int pool_work_enter(struct pt_regs___args *regs)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	struct pool_item_key key = { .tgid = tgid, .work = regs->di };
	struct queued_span *item;
	struct queued_span *mine = pool_thread_state(&key, &item);
	if (!mine)
		return 0;
	if (!item) {
		// A work function called inside the running item (a synchronous
		// uv_fs_* call runs uv__fs_work in place, as node's fs.readFile
		// does in its pool item) leaves the item's span: the stack is
		// below the item's entry, whose return address is still there. A
		// new item from libuv's worker starts at the entry's own depth.
		__u64 slot = 0;
		if (mine->state == RUNNING_WITH_SPAN && regs->sp < mine->entry_sp &&
		    !bpf_probe_read_user(&slot, sizeof(slot), (void *)mine->entry_sp) &&
		    slot == mine->return_address)
			return 0;
		mine->state = IDLE;
		return 0;
	}
	__u64 return_address = 0;
	if (bpf_probe_read_user(&return_address, sizeof(return_address), (void *)regs->sp)) {
		mine->state = IDLE;
		bpf_map_delete_elem(&pool_items, &key);
		return 0;
	}
	begin_item(&key, item, mine, regs->sp, return_address);
	return 0;
}

// Where libuv's worker loop starts an item, of any kind: the direct call
// (the unlock of the queue's mutex) just before it calls w->work(w), with
// w held across that call in a callee-saved register. The cookie, built by
// userspace from the decoded loop, says which register and what to add to
// it, and how far past this call w->work's return address is. A direct
// call is emulated by the kernel (no single step), and one probe here
// replaces the entry probes of every work function.

// Each register is loaded at its fixed context offset (the verifier refuses
// a context load at a computed one), then chosen.
static __always_inline __u64 item_register(const struct pt_regs___item *regs, __u32 which)
{
	__u64 saved[6] = { regs->bx, regs->bp, regs->r12, regs->r13, regs->r14, regs->r15 };
	return saved[which < 6 ? which : 5];
}

SEC("uprobe")
int pool_item_start(struct pt_regs___item *regs)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	__u64 cookie = bpf_get_attach_cookie(regs);
	__s32 displacement = (__s32)(cookie >> 32);
	struct pool_item_key key = {
		.tgid = tgid,
		.work = item_register(regs, (cookie >> 16) & 0xff) + (__s64)displacement,
	};
	struct queued_span *item;
	struct queued_span *mine = pool_thread_state(&key, &item);
	if (!mine)
		return 0;
	// The regs are those at this call, before it pushes anything: the call
	// through w->work pushes its return address just below this stack
	// pointer, where it stays while the item runs.
	begin_item(&key, item, mine, regs->sp - 8, regs->ip + (cookie & 0xffff));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
