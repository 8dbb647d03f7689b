//! `--format jsonl`: one JSON object per sample, as the kernel side saw it.

use serde_json::{json, Map, Value};

use otel_thread_ctx_profiler::kernel::{Kind, RecordRead, Sample};
use otel_thread_ctx_profiler::model::{kernel_frames, named_attributes, user_frames};
use otel_thread_ctx_profiler::symbolize::{Frame, Names};

/// The system call a kernel stack is in, from its `__x64_sys_<name>` frame,
/// or its `ksys_<name>` frame: `read`, `write`, `pread64` and others enter
/// those helpers by a tail call, so their stacks have no `__x64_sys_` frame.
fn syscall(s: &Sample, names: &Names) -> Option<String> {
    s.kernel_stack.iter().find_map(|a| {
        let name = &names.kernel.get(a)?.name;
        name.strip_prefix("__x64_sys_")
            .or_else(|| name.strip_prefix("__arm64_sys_"))
            .or_else(|| name.strip_prefix("__se_sys_"))
            .or_else(|| name.strip_prefix("ksys_"))
            .map(str::to_string)
    })
}

/// The line of one sample. `t_ns` is CLOCK_MONOTONIC (on CPU: the tick;
/// off CPU: the switch-out, and `off_cpu_ns` later the thread ran again);
/// `syscall` names the system call the thread was in, when it was in one;
/// `kernel_stack` and `user_stack` name the frames, leaf first.
pub fn line(s: &Sample, key_map: &[String], names: &Names) -> String {
    let mut o = Map::new();
    o.insert(
        "kind".into(),
        json!(if s.kind == Kind::OnCpu {
            "cpu"
        } else {
            "off_cpu"
        }),
    );
    o.insert("tid".into(), json!(s.tid));
    o.insert("t_ns".into(), json!(s.time_ns));
    if s.kind == Kind::OffCpu {
        o.insert("off_cpu_ns".into(), json!(s.off_cpu_ns));
    }
    if let Some(call) = syscall(s, names) {
        o.insert("syscall".into(), json!(call));
    }
    let named =
        |frames: Vec<Frame>| -> Vec<String> { frames.into_iter().map(|f| f.name).collect() };
    o.insert("kernel_stack".into(), json!(named(kernel_frames(s, names))));
    o.insert("user_stack".into(), json!(named(user_frames(s, names))));
    let status = match &s.record {
        RecordRead::Record { .. } => "read",
        RecordRead::Null => "null",
        RecordRead::NoTlsBlock => "no-tls-block",
        RecordRead::Unreadable => "unreadable",
        RecordRead::NoSpan(reason) => reason.as_str(),
    };
    o.insert("schema".into(), json!(s.schema));
    o.insert("record".into(), json!(status));
    let valid = s.record.valid();
    o.insert("valid".into(), json!(valid.is_some()));
    // A pool thread's work item: the span is the one that queued it.
    o.insert("threadpool".into(), json!(s.threadpool));
    if let Some((h, attrs_data)) = valid {
        o.insert("trace_id".into(), json!(h.trace_id.to_string()));
        o.insert("span_id".into(), json!(h.span_id.to_string()));
        o.insert("trace_flags".into(), json!(h.trace_flags.to_u8()));
        let attrs: Map<String, Value> = named_attributes(attrs_data, key_map)
            .into_iter()
            .map(|(key, value)| (key, Value::String(value)))
            .collect();
        o.insert("attributes".into(), Value::Object(attrs));
    }
    Value::Object(o).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_profiler::model::fixtures::{record, sample};

    #[test]
    fn lines_carry_time_span_and_named_attributes() {
        let on = sample(Kind::OnCpu, 3, record(7, &[0, 2, b'/', b'a']), &[], 0);
        let v: Value =
            serde_json::from_str(&line(&on, &["http.route".into()], &Names::default())).unwrap();
        assert_eq!(v["kind"], "cpu");
        assert_eq!(v["tid"], 3);
        assert_eq!(v["t_ns"], 1_000);
        assert_eq!(v["valid"], true);
        assert_eq!(v["span_id"], "0707070707070707");
        assert_eq!(v["attributes"]["http.route"], "/a");
        assert!(v.get("off_cpu_ns").is_none());
        assert!(v.get("syscall").is_none());
        assert_eq!(v["threadpool"], false);
        let mut pooled = on.clone();
        pooled.threadpool = true;
        let v: Value = serde_json::from_str(&line(&pooled, &[], &Names::default())).unwrap();
        assert_eq!(
            (v["threadpool"].as_bool(), v["valid"].as_bool()),
            (Some(true), Some(true))
        );
        let off = sample(Kind::OffCpu, 3, RecordRead::Null, &[], 42);
        let mut names = Names::default();
        let frame = |name: &str| otel_thread_ctx_profiler::symbolize::Frame {
            name: name.into(),
            module: "[kernel]".into(),
            line: None,
        };
        names
            .kernel
            .insert(0xffff_ffff_a000_0000, frame("schedule"));
        names
            .kernel
            .insert(0xffff_ffff_a000_0010, frame("__x64_sys_epoll_pwait"));
        let v: Value = serde_json::from_str(&line(&off, &[], &names)).unwrap();
        assert_eq!(v["syscall"], "epoll_pwait");
        assert_eq!(
            (
                v["kind"].as_str(),
                v["off_cpu_ns"].as_u64(),
                v["valid"].as_bool()
            ),
            (Some("off_cpu"), Some(42), Some(false))
        );
        assert_eq!(v["record"], "null");
        assert!(v.get("span_id").is_none());
    }

    #[test]
    fn kernel_and_user_frames_are_named_leaf_first() {
        // A user return address is looked up one byte before it (the call).
        let mut s = sample(
            Kind::OffCpu,
            3,
            RecordRead::Null,
            &[0x1000, 0x2001, 0x3000],
            42,
        );
        s.kernel_stack = vec![0x10, 0x20];
        let mut names = Names::default();
        let frame = |name: &str, module: &str| otel_thread_ctx_profiler::symbolize::Frame {
            name: name.into(),
            module: module.into(),
            line: None,
        };
        names
            .kernel
            .insert(0x10, frame("bpf_trace_run2", "[kernel]"));
        names.kernel.insert(0x20, frame("schedule", "[kernel]"));
        names.user.insert(0x1000, frame("uv_cond_wait", "node"));
        names.user.insert(0x2000, frame("worker", "node"));
        let v: Value = serde_json::from_str(&line(&s, &[], &names)).unwrap();
        assert_eq!(v["kernel_stack"], json!(["schedule"]));
        assert_eq!(v["user_stack"], json!(["uv_cond_wait", "worker", "0x2fff"]));
    }

    #[test]
    fn a_read_is_named_from_its_tail_called_helper() {
        // A thread blocked reading a FIFO: __x64_sys_read jumps to
        // ksys_read, which is on the stack in its place.
        let mut off = sample(Kind::OffCpu, 3, RecordRead::Null, &[], 42);
        off.kernel_stack = vec![0x10, 0x20, 0x30, 0x40];
        let mut names = Names::default();
        for (address, name) in [
            (0x10, "anon_pipe_read"),
            (0x20, "vfs_read"),
            (0x30, "ksys_read"),
            (0x40, "do_syscall_64"),
        ] {
            names.kernel.insert(
                address,
                otel_thread_ctx_profiler::symbolize::Frame {
                    name: name.into(),
                    module: "[kernel]".into(),
                    line: None,
                },
            );
        }
        let v: Value = serde_json::from_str(&line(&off, &[], &names)).unwrap();
        assert_eq!(v["syscall"], "read");
    }
}
