// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// The threadpool's uprobes: where work is submitted, where a work function
// is entered, where the worker loop starts an item.

#pragma once

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
