// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// The Node.js schema: the TLS variable `otel_thread_ctx_nodejs_v1` holds a
// block from which the walk goes through V8's current AsyncContextFrame to
// the record; the isolates seen are remembered for the threadpool.

#pragma once

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
// address; then the record, as in record_schema.h. Every count is bounded and the chain
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

// A thread's published block, and a record's bytes, as the walk's
// arguments: sized types, so the verifier checks each caller's memory
// against them.
struct node_block {
	__u64 word[ABI_NODE_SIZE / 8];
};
struct record_bytes {
	__u8 byte[ABI_RECORD_SIZE];
};

// From an AsyncContextFrame (tagged) to the record of the writer whose
// block is `node`: steps 3 to 6 of the walk. A global function: the
// verifier checks it once, for any arguments, not once per path of each
// caller (the samplers, the pool's loop over isolates), which keeps
// loading the programs fast.
__attribute__((noinline)) __u32 walk_frame(const struct target *t, const struct node_block *node,
					   __u64 frame, struct record_bytes *out)
{
	if (!t || !node || !out)
		return NODE_WRONG_OBJECT;
	const __u64 *block = node->word;
	__u8 *dst = out->byte;
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
	return walk_frame(t, (const struct node_block *)block, frame, (struct record_bytes *)dst);
}
