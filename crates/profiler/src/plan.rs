//! How the BPF program reads a target process (its plan), and what the
//! profiler reads of the process context.

use otel_thread_ctx_otlp::Resource;
use otel_thread_ctx_reader::maps::Mapping;
use otel_thread_ctx_reader::memory::Memory;
use otel_thread_ctx_reader::process_context::{self, Lookup};
use otel_thread_ctx_reader::schema::Schema;
use otel_thread_ctx_reader::target::Target;
use otel_thread_ctx_reader::tls;

use crate::kernel;
use crate::process_maps::ProcessMaps;
use crate::threadpool;

/// How a pool thread's running request is read at sample time in process
/// `pid`, when it can be: the process publishes the Node.js schema, and its
/// module shows what [`threadpool::running_item_plan`] needs.
pub fn pool_at_sample_time(
    pid: i32,
    maps: &[Mapping],
    memory: &dyn Memory,
) -> Option<kernel::RunningItemPlan> {
    if !process_context::lookup(maps, memory).publishes_nodejs_schema() {
        return None;
    }
    let probes = threadpool::find(pid, maps).ok()?;
    threadpool::running_item_plan(&probes, maps)
}

/// How the BPF program reads `pid`'s thread context, and what the summary
/// says about it: the record schema's first module, and every module that
/// defines the Node.js schema's variable (the program tries each in turn).
pub fn target_plan(pid: i32, target: &Target) -> (kernel::TargetPlan, Vec<String>) {
    let mut lines = Vec::new();
    let modules = target
        .module
        .iter()
        .zip(target.resolution.iter())
        .map(|(m, r)| (Schema::Record, m, r))
        .chain(target.nodejs.iter().map(|(m, r)| (Schema::Nodejs, m, r)));
    let mut record_plan = None;
    let mut nodejs_plans = Vec::new();
    for (schema, module, resolution) in modules {
        match resolution {
            Ok(r) => {
                lines.push(format!(
                    "thread context: {} {} ({})",
                    schema.symbol(),
                    r.path,
                    module.path
                ));
                match schema {
                    Schema::Record => record_plan = Some(r.plan),
                    Schema::Nodejs => nodejs_plans.push(r.plan),
                }
            }
            Err(e) => lines.push(format!(
                "thread context: {} unreadable in {} ({e})",
                schema.symbol(),
                module.path
            )),
        }
    }
    if record_plan.is_none() && nodejs_plans.is_empty() {
        lines.push(if target.module.is_none() && target.nodejs.is_empty() {
            "thread context: no module defines otel_thread_ctx_v1 or otel_thread_ctx_nodejs_v1; samples carry no span".into()
        } else {
            "thread context: unreadable; samples carry no span".into()
        });
    }
    let layout = process_context::lookup(&target.maps, &target.memory).v8_layout();
    let plan = kernel::TargetPlan::new(
        pid as u32,
        record_plan.as_ref(),
        &nodejs_plans,
        layout,
        tls::HOST.dtv_pointer_offset,
    );
    (plan, lines)
}

/// The process context's Resource (as published) and key map, if any.
pub fn process_context(maps: &[Mapping], memory: &dyn Memory) -> (Option<Resource>, Vec<String>) {
    match process_context::lookup(maps, memory) {
        Lookup::Found(d) => (d.resource, d.attribute_key_map.unwrap_or_default()),
        _ => (None, Vec::new()),
    }
}

/// Re-reads the process context of a live process from `maps` read again
/// now (the snapshot the unwinder, V8's naming and the symbolizer share, so
/// this one read of `/proc/<pid>/maps` serves them too) and its `memory`;
/// `None` when it is gone or publishes none.
pub fn current_process_context(
    maps: &mut ProcessMaps,
    memory: &dyn Memory,
) -> Option<(Option<Resource>, Vec<String>)> {
    maps.reread();
    let found = process_context(maps.mappings(), memory);
    (found.0.is_some() || !found.1.is_empty()).then_some(found)
}
