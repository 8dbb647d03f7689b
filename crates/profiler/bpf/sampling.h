// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// The samplers: on-CPU samples from a perf event per CPU, off-CPU intervals
// from sched_switch.

#pragma once

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
	if (t)
		check_isolate(t, prev);
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

// The same switch-out, for the process's waiting pool items (read_pending),
// also where its memory is the current one. A program of its own, attached
// after off_cpu: the read runs in a bpf_loop callback, and the verifier
// bounds the stack of a program and its callbacks together, which off_cpu's
// own stack leaves no room for.
SEC("tp_btf/sched_switch")
int BPF_PROG(pending_on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 tgid = BPF_CORE_READ(prev, tgid);
	const struct target *t = bpf_map_lookup_elem(&targets, &tgid);
	if (t)
		read_pending(t, tgid);
	return 0;
}
