// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// Maps and the target plan: the kernel types read (CO-RE), the sample sent
// to userspace, how each target process is read (its `targets` entry), the
// maps shared by every part of the program, and the loss counters.

#pragma once

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
// read from the request that queued it (see threadpool.h).
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
