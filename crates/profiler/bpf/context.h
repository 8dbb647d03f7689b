// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// The span a thread is in, whichever schema its process publishes.

#pragma once

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
