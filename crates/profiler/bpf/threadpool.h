// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// libuv threadpool: the state the probes keep, the running item found at
// sample time, the items read again after a GC, and the span a pool
// thread's sample takes from them.

#pragma once

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
		status = walk_frame(t, (const struct node_block *)block, frame,
				    (struct record_bytes *)record);
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
//
// Slots are reused oldest first, so an item is lost when this many others
// became unreadable after it and before it was read again: a long pause
// while every pool thread runs short items (compression chunks, small
// reads) fills many. A power of two (slots are indexed by a mask).
#define PENDING_ITEMS 32
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
	// Read again at the first chance once a gate opens: the loop thread
	// runs the completions an item that ended in the pause was waiting for
	// soon after it, and a completed request can no longer be read.
	p->tried[at] = 0;
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
	const struct isolate_blocks *known = bpf_map_lookup_elem(&isolates, &tgid);
	if (!p || !known)
		return;
	__u64 any = 0;
	for (int i = 0; i < PENDING_ITEMS; i++)
		any |= p->item[i];
	if (!any)
		return;
	// While every gate is closed no item can be read: no try is spent (nor
	// counted against the retry interval) until one opens.
	bool open = false;
	for (int i = 0; i < MAX_ISOLATES; i++)
		if (known->block[i][ABI_NODE_OFFSET_ALS_HANDLE / 8] && gate_open(known, i))
			open = true;
	if (open)
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
