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
// that runs the item (threadpool.h, threadpool_probes.h); or, for a target that
// publishes the Node.js schema, a pool thread's sample finds its running
// item and reads the span from the request (threadpool.h, "The running item").

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

// The record layout and the Node.js walk's constants (ABI_* macros),
// generated from the ABI crate.
#include "otel_thread_ctx_abi.h"

// The program by concern, one compilation unit: each part uses what the
// parts before it declare.
#include "maps.h"
#include "record_schema.h"
#include "nodejs_schema.h"
#include "context.h"
#include "stack.h"
#include "threadpool.h"
#include "sampling.h"
#include "threadpool_probes.h"

char LICENSE[] SEC("license") = "GPL";
