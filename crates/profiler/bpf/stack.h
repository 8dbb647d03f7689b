// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// Stack capture: a copy of the user stack and registers, for unwinding
// with CFI in userspace where frame pointers end.

#pragma once

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
// the definitions of maps.h (CO-RE matches them to the kernel's by base name).
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
