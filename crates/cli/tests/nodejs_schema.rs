//! End-to-end tests of the Node.js schema `nodejs_v1_dev` against a C host
//! that builds the V8 objects the reader walks, one thread per role: a good
//! walk, and hostile ones (a corrupted cped_slot, a cycle in the chain, a
//! wrapper without its field, a bucket count that is not a power of two, a
//! frame without the store, ...). `inspect` and `sample` must report the
//! good thread's span exactly and every other thread as "no span" with the
//! right reason; a second build also publishes an OTEP 4947 record on one
//! more thread, so both schemas are read in one process. With root and the
//! BPF build, `profile` must find the same at the sample (threads spinning).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use common::{
    build_dir, by_thread, fixture_source, gcc, inspect_json, reader, sample_command, thread,
    Running,
};

/// Builds the two hosts once per test run; returns their directory.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = fixture_source("v8heap.c");
        let out = build_dir("v8heap-fixtures");
        for (name, define) in [("v8heap", None), ("v8heap_both", Some("-DWITH_RECORD"))] {
            let exe = out.join(name);
            let mut args = vec!["-rdynamic"];
            args.extend(define);
            args.extend([
                "-o",
                exe.to_str().unwrap(),
                src.to_str().unwrap(),
                "-lpthread",
            ]);
            gcc(&args);
        }
        out
    })
}

/// What a thread must read as.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Span { trace: String, span: String },
    NoSpan(String),
}

struct Host {
    _process: Running,
    pid: i32,
    /// tid -> (role, expectation)
    expect: HashMap<i32, (String, Expect)>,
}

fn spawn(program: &str) -> Host {
    spawn_with(program, &[])
}

fn spawn_with(program: &str, args: &[&str]) -> Host {
    let process = Running::start(&fixtures().join(program), args);
    let mut expect = HashMap::new();
    process.until_ready(|w| match w {
        ["expect", tid, role, "valid", trace, span] => {
            expect.insert(
                tid.parse().unwrap(),
                (
                    role.to_string(),
                    Expect::Span {
                        trace: trace.to_string(),
                        span: span.to_string(),
                    },
                ),
            );
        }
        ["expect", tid, role, reason] => {
            expect.insert(
                tid.parse().unwrap(),
                (role.to_string(), Expect::NoSpan(reason.to_string())),
            );
        }
        _ => panic!("unexpected host output {w:?}"),
    });
    Host {
        pid: process.pid,
        _process: process,
        expect,
    }
}

fn check_inspect(host: &Host, with_record: bool) {
    let (_, report) = inspect_json(host.pid);
    let modules = report["modules"].as_array().unwrap();
    let schemas: Vec<&str> = modules
        .iter()
        .map(|m| m["schema"].as_str().unwrap())
        .collect();
    let expected: &[&str] = if with_record {
        &["tlsdesc_v1_dev", "nodejs_v1_dev"]
    } else {
        &["nodejs_v1_dev"]
    };
    assert_eq!(schemas, expected, "{report:#}");
    assert_eq!(report["nodejs_symbol"]["st_size"], 32);
    assert_eq!(report["symbol"].is_null(), !with_record);
    for (tid, (role, expect)) in &host.expect {
        let t = thread(&report, *tid);
        match expect {
            Expect::Span { trace, span } => {
                assert_eq!(t["status"], "valid", "{role}: {t:#}");
                assert_eq!(t["record"]["trace_id"], *trace, "{role}");
                assert_eq!(t["record"]["span_id"], *span, "{role}");
                assert_eq!(t["record"]["attributes"][0]["value"], *role);
                let schema = if role == "record-schema" {
                    "tlsdesc_v1_dev"
                } else {
                    "nodejs_v1_dev"
                };
                assert_eq!(t["schema"], schema, "{role}: {t:#}");
            }
            // Where the process also publishes the record schema, a thread
            // that publishes neither reads as the record schema's NULL.
            Expect::NoSpan(reason) if reason == "not-published" && with_record => {
                assert_eq!(t["status"], "no-record", "{role}: {t:#}");
                assert_eq!(t["schema"], "tlsdesc_v1_dev");
            }
            Expect::NoSpan(reason) => {
                assert_eq!(t["status"], "no-span", "{role}: {t:#}");
                assert_eq!(t["no_span_reason"], *reason, "{role}: {t:#}");
                assert_eq!(t["schema"], "nodejs_v1_dev");
                assert!(t["record"].is_null(), "{role}: {t:#}");
            }
        }
    }
    // The main thread never touched its block.
    let main = thread(&report, host.pid);
    assert!(
        main["no_span_reason"] == "not-published" || main["status"] == "no-record",
        "{main:#}"
    );
    let walk = &thread(&report, role_tid(host, "good"))["walk"];
    assert_eq!(walk["bucket_count"], 2);
    assert_eq!(walk["hops"], 2, "the writer's entry is second in its chain");
    assert_eq!(thread(&report, role_tid(host, "cycle"))["walk"]["hops"], 8);
    // Anomalies are warnings, not problems: the process publishes context.
    assert_eq!(report["conformant"], true, "{report:#}");
    let warnings = report["warnings"].to_string();
    for role in ["cycle", "no-field", "corrupt-cped", "buckets-not-pow2"] {
        let tid = role_tid(host, role);
        assert!(
            warnings.contains(&format!("thread {tid}:")),
            "{role}: {warnings}"
        );
    }
}

fn role_tid(host: &Host, role: &str) -> i32 {
    *host
        .expect
        .iter()
        .find(|(_, (r, _))| r == role)
        .unwrap_or_else(|| panic!("no {role} thread"))
        .0
}

/// `sample` of `pid` at 20 Hz for `duration` seconds, printing `output`
/// (`--raw` reads or the `--json` summary).
fn sample(pid: i32, duration: &str, output: &str) -> std::process::Output {
    sample_command(pid, "20", duration, &[output])
        .output()
        .expect("reader runs")
}

fn check_sample(host: &Host, with_record: bool) {
    let out = sample(host.pid, "0.5", "--raw");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = by_thread(&String::from_utf8(out.stdout).unwrap());
    for (tid, (role, expect)) in &host.expect {
        let reads = &lines[tid];
        assert!(!reads.is_empty(), "{role}");
        for r in reads {
            assert!(r.get("error").is_none(), "{role}: {r}");
            match expect {
                Expect::Span { trace, span } => {
                    assert_eq!(r["valid"], true, "{role}: {r}");
                    assert_eq!(r["trace_id"], *trace);
                    assert_eq!(r["span_id"], *span);
                    assert_eq!(r["attributes"]["#0"], *role);
                }
                Expect::NoSpan(reason) if reason == "not-published" && with_record => {
                    assert_eq!(r["valid"], false, "{role}: {r}");
                    assert_eq!(r["schema"], "tlsdesc_v1_dev");
                }
                Expect::NoSpan(reason) => {
                    assert_eq!(r["valid"], false, "{role}: {r}");
                    assert_eq!(r["no_span_reason"], *reason, "{role}: {r}");
                    assert_eq!(r["schema"], "nodejs_v1_dev");
                }
            }
        }
    }
    // The summary counts the reasons per thread.
    let out = sample(host.pid, "0.3", "--json");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cycle = thread(&summary, role_tid(host, "cycle"));
    assert_eq!(
        cycle["no_span"]["chain-too-long"], cycle["samples"],
        "{cycle:#}"
    );
    assert_eq!(cycle["idle"], cycle["samples"]);
    assert_eq!(summary["nodejs_resolution_path"], "local-exec-static");
}

#[test]
fn hostile_v8_objects_end_as_no_span_with_a_reason() {
    let host = spawn("v8heap");
    assert_eq!(host.expect.len(), 10);
    check_inspect(&host, false);
    check_sample(&host, false);
}

#[test]
fn both_schemas_in_one_process() {
    let host = spawn("v8heap_both");
    assert_eq!(host.expect.len(), 11);
    check_inspect(&host, true);
    check_sample(&host, true);
}

/// Why `profile` cannot run here, if it cannot.
fn profile_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("profile loads BPF programs: run as root".into());
    }
    let probe = reader(&["profile", "--pid", "2147483647", "--duration", "1"]);
    let stderr = String::from_utf8_lossy(&probe.stderr).into_owned();
    stderr.contains("no kernel sampler").then_some(stderr)
}

#[test]
fn profile_walks_the_same_objects_at_the_sample() {
    if let Some(why) = profile_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let host = spawn_with("v8heap_both", &["spin"]);
    let out = build_dir("v8heap-profile").join(format!("{}.jsonl", host.pid));
    let run = reader(&[
        "profile",
        "--pid",
        &host.pid.to_string(),
        "--duration",
        "2",
        "--format",
        "jsonl",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let samples = by_thread(&std::fs::read_to_string(&out).unwrap());
    let _ = std::fs::remove_file(&out);
    let mut sampled = 0;
    for (tid, (role, expect)) in &host.expect {
        // Eleven spinning threads on a shared machine: a thread may go
        // unsampled in two seconds, but every sample taken must be right.
        let Some(list) = samples.get(tid) else {
            continue;
        };
        sampled += 1;
        for s in list {
            match expect {
                Expect::Span { trace, span } => {
                    assert_eq!(s["valid"], true, "{role}: {s}");
                    assert_eq!(s["trace_id"], *trace);
                    assert_eq!(s["span_id"], *span);
                    assert_eq!(s["attributes"]["attr.0"], *role, "{role}: {s}");
                }
                Expect::NoSpan(reason) if reason == "not-published" => {
                    assert_eq!(s["valid"], false, "{role}: {s}");
                    assert_eq!(s["schema"], "tlsdesc_v1_dev");
                    assert_eq!(s["record"], "null", "{role}: {s}");
                }
                Expect::NoSpan(reason) => {
                    assert_eq!(s["valid"], false, "{role}: {s}");
                    assert_eq!(s["schema"], "nodejs_v1_dev", "{role}: {s}");
                    // The kernel side reports an invalid record as a read
                    // record whose valid byte is not 1.
                    let want = if reason == "record-invalid" {
                        "read"
                    } else {
                        reason.as_str()
                    };
                    assert_eq!(s["record"], want, "{role}: {s}");
                }
            }
        }
    }
    assert!(sampled >= 6, "most spinning threads sampled: {sampled}");
}
