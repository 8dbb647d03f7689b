// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// The record schema: the TLS variable `otel_thread_ctx_v1`, found from the
// thread pointer, points at the OTEP 4947 record, copied as is.

#pragma once

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
