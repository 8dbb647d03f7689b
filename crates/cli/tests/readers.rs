//! End-to-end tests of the reader against C writers built here with gcc:
//! a TLSDESC library (static and dynamic TLS), a legacy general-dynamic
//! library, both loaded with dlopen; an initial-exec library linked at build
//! time; and an executable that defines the symbol itself. Each publishes
//! known records on six threads; the reader must find every one exactly.
//! Another executable starts and ends threads all the time, then exits: the
//! reader must skip threads that are gone and end normally with the process.
//! Hostile and changing targets: a process that executes another program
//! while it is sampled, one whose main thread exits mid-run, records marked
//! valid with all-zero ids, and terminal escape sequences in what a target
//! controls.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use common::{
    build_dir, fixture_source, forward_lines, gcc, inspect_json, reader, sample_command, thread,
    Running, READER,
};

/// Builds the fixtures once per test run; returns their directory.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = build_dir("thread-ctx-fixtures");
        let writer = fixture_source("writer.c");
        let host = fixture_source("host.c");
        let churn_src = fixture_source("churn.c");
        let o = |name: &str| out.join(name).to_str().unwrap().to_string();
        let (desc, big, gd, ie) = (
            o("libdesc.so"),
            o("libbig.so"),
            o("libgd.so"),
            o("libwriter_ie.so"),
        );
        let (h_dl, h_exe, h_ie) = (o("host_dlopen"), o("host_exe"), o("host_ie"));
        let churn = o("churn");
        let (exec_target, exec_decoy) = (o("exec_target"), o("exec_decoy"));
        let exec_src = fixture_source("exec.c");
        let exec_src = exec_src.to_str().unwrap();
        let (w, h) = (writer.to_str().unwrap(), host.to_str().unwrap());
        let rpath = format!("-Wl,-rpath,{}", out.display());
        let libdir = format!("-L{}", out.display());
        let builds: Vec<Vec<&str>> = vec![
            vec!["-fPIC", "-shared", "-mtls-dialect=gnu2", "-o", &desc, w],
            vec![
                "-fPIC",
                "-shared",
                "-mtls-dialect=gnu2",
                "-DBIG_TLS",
                "-o",
                &big,
                w,
            ],
            vec!["-fPIC", "-shared", "-mtls-dialect=gnu", "-o", &gd, w],
            vec!["-fPIC", "-shared", "-ftls-model=initial-exec", "-o", &ie, w],
            vec!["-DMODE_DLOPEN", "-o", &h_dl, h, "-ldl", "-lpthread"],
            vec!["-DMODE_EXE", "-rdynamic", "-o", &h_exe, h, "-lpthread"],
            vec![
                "-DMODE_LINKED",
                "-o",
                &h_ie,
                h,
                &libdir,
                "-lwriter_ie",
                &rpath,
                "-lpthread",
            ],
            vec![
                "-rdynamic",
                "-o",
                &churn,
                churn_src.to_str().unwrap(),
                "-lpthread",
            ],
            vec!["-rdynamic", "-o", &exec_target, exec_src, "-lpthread"],
            vec![
                "-rdynamic",
                "-DSLOT=decoy_slot",
                "-o",
                &exec_decoy,
                exec_src,
                "-lpthread",
            ],
        ];
        for args in builds {
            gcc(&args);
        }
        out
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Valid {
        trace: String,
        span: String,
        flags: u64,
    },
    /// valid = 0 (the fixture's "invalid" role): the thread runs no span.
    Idle,
    Null,
    Untouched,
    Garbage,
    /// Marked valid, with all-zero ids (which ones: the role's name).
    ZeroIds(String),
}

/// A running host fixture and what it said a reader must find.
struct Fixture {
    process: Running,
    pid: i32,
    expect: HashMap<i32, Expect>,
    context_published_at: Option<u64>,
    anon_naming_unsupported: bool,
}

fn spawn(program: &str, args: &[&str]) -> Fixture {
    let process = Running::start(&fixtures().join(program), args);
    let mut f = Fixture {
        pid: process.pid,
        process,
        expect: HashMap::new(),
        context_published_at: None,
        anon_naming_unsupported: false,
    };
    f.process.until_ready(|w| match w {
        ["context", t] => f.context_published_at = Some(t.parse().unwrap()),
        ["anon-naming-unsupported"] => f.anon_naming_unsupported = true,
        ["expect", tid, "valid", trace, span, flags] => {
            f.expect.insert(
                tid.parse().unwrap(),
                Expect::Valid {
                    trace: trace.to_string(),
                    span: span.to_string(),
                    flags: flags.parse().unwrap(),
                },
            );
        }
        ["expect", tid, role] => {
            let e = match *role {
                "invalid" => Expect::Idle,
                "null" => Expect::Null,
                "untouched" => Expect::Untouched,
                "garbage" => Expect::Garbage,
                zero if zero.starts_with("zero-") => Expect::ZeroIds(zero.to_string()),
                other => panic!("unknown role {other}"),
            };
            f.expect.insert(tid.parse().unwrap(), e);
        }
        _ => panic!("unexpected fixture output {w:?}"),
    });
    assert_eq!(f.expect.len(), 6, "six threads published");
    f
}

/// The host that loads the writer library `lib` with dlopen, with `options`.
fn spawn_dlopen(lib: &str, options: &[&str]) -> Fixture {
    let lib = fixtures().join(lib);
    let args: Vec<&str> = [lib.to_str().unwrap()]
        .into_iter()
        .chain(options.iter().copied())
        .collect();
    spawn("host_dlopen", &args)
}

/// Every thread of `pid` runs freely: not stopped, not traced.
fn assert_running_untraced(pid: i32) {
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid = entry.unwrap().file_name();
        let Ok(status) =
            std::fs::read_to_string(format!("/proc/{pid}/task/{}/status", tid.to_str().unwrap()))
        else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap()
                .trim()
                .to_string()
        };
        let state = field("State:");
        assert!(
            !state.starts_with('t') && !state.starts_with('T'),
            "thread {tid:?} left in state {state}"
        );
        assert_eq!(field("TracerPid:"), "0", "thread {tid:?} left traced");
    }
}

/// Checks every fixture thread in the report against what it published.
fn assert_threads(report: &Value, f: &Fixture, path: &str) {
    let threads = report["threads"].as_array().unwrap();
    assert_eq!(
        threads.len(),
        f.expect.len(),
        "one entry per thread: {threads:#?}"
    );
    let mut offsets = Vec::new();
    for (tid, expect) in &f.expect {
        let t = thread(report, *tid);
        let status = t["status"].as_str().unwrap();
        match expect {
            Expect::Valid { trace, span, flags } => {
                assert_eq!(status, "valid", "{t:#}");
                assert_eq!(t["record"]["valid"], 1);
                assert_eq!(t["record"]["trace_id"], *trace);
                assert_eq!(t["record"]["span_id"], *span);
                assert_eq!(t["record"]["trace_flags"], *flags);
            }
            Expect::Idle => {
                assert_eq!(status, "idle", "{t:#}");
                assert_eq!(t["reason"], "idle (no span)", "{t:#}");
                assert_eq!(t["record"]["valid"], 0);
                assert!(t["record"]["trace_id"].is_null());
            }
            Expect::Null => {
                assert_eq!(status, "no-record", "{t:#}");
                assert!(t["reason"].as_str().unwrap().contains("NULL"));
                assert_eq!(t["tls"]["pointer"], "0x0");
            }
            Expect::Untouched => assert_eq!(status, "no-record", "{t:#}"),
            Expect::Garbage => {
                assert_eq!(status, "error", "{t:#}");
                assert_eq!(t["tls"]["pointer"], "0x10");
            }
            Expect::ZeroIds(which) => {
                assert_eq!(status, "invalid", "{t:#}");
                assert_eq!(t["record"]["valid"], 1, "{t:#}");
                let reason = t["reason"].as_str().unwrap();
                let zeros = match which.as_str() {
                    "zero-both" => "trace_id and span_id are all zero",
                    "zero-trace" => "trace_id is all zero",
                    _ => "span_id is all zero",
                };
                assert!(reason.contains(zeros), "{t:#}");
                let all_zero = |v: &Value| v.as_str().unwrap().bytes().all(|b| b == b'0');
                assert_eq!(
                    all_zero(&t["record"]["trace_id"]),
                    which != "zero-span",
                    "{t:#}"
                );
                assert_eq!(
                    all_zero(&t["record"]["span_id"]),
                    which != "zero-trace",
                    "{t:#}"
                );
            }
        }
        assert_eq!(
            t["name"], report["threads"][0]["name"],
            "names come from comm"
        );
        assert_eq!(t["tls"]["path"], path);
        let tp = u64::from_str_radix(
            t["tls"]["thread_pointer"]
                .as_str()
                .unwrap()
                .trim_start_matches("0x"),
            16,
        )
        .unwrap();
        assert_ne!(tp, 0);
        if let (Some(var), Some(off)) = (
            t["tls"]["variable_address"].as_str(),
            t["tls"]["tp_offset"].as_i64(),
        ) {
            let var = u64::from_str_radix(var.trim_start_matches("0x"), 16).unwrap();
            assert_eq!(
                var,
                tp.wrapping_add(off as u64),
                "variable = thread pointer + offset"
            );
            offsets.push(off);
        }
    }
    if path.ends_with("-static") {
        assert_eq!(offsets.len(), f.expect.len());
        assert!(
            offsets.iter().all(|&o| o == offsets[0]),
            "one static offset for all threads"
        );
        assert_eq!(report["symbol"]["resolution"]["tp_offset"], offsets[0]);
    }
}

/// `sample --raw --json` of `pid` at `hz` for `duration` seconds.
fn sample_raw_json(pid: i32, hz: &str, duration: &str) -> Output {
    sample_command(pid, hz, duration, &["--raw", "--json"])
        .output()
        .expect("reader runs")
}

/// `sample --json` of `pid` at `hz` for `duration` seconds, running in the
/// background with its output piped.
fn spawn_sample_json(pid: i32, hz: &str, duration: &str) -> Child {
    sample_command(pid, hz, duration, &["--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("reader runs")
}

/// `inspect --json` of a host fixture, which must exit `code` and find
/// every thread as it published, along `path`. Returns the report.
fn inspect_host(f: &Fixture, code: i32, path: &str) -> Value {
    let (got, r) = inspect_json(f.pid);
    assert_eq!(got, code, "{r:#}");
    assert_threads(&r, f, path);
    r
}

fn main_thread_attributes(report: &Value, pid: i32) -> Value {
    thread(report, pid)["record"]["attributes"].clone()
}

#[test]
fn tlsdesc_library_resolved_to_static_tls_with_a_memfd_process_context() {
    let f = spawn_dlopen("libdesc.so", &["memfd"]);
    let r = inspect_host(&f, 0, "tlsdesc-static");
    assert_eq!(r["conformant"], true);
    assert_eq!(
        r["symbol"]["module"],
        fixtures().join("libdesc.so").to_str().unwrap()
    );
    assert_eq!(r["symbol"]["access_model"], "tlsdesc");
    assert!(r["symbol"]["relocations"][0]["type"]
        .as_str()
        .unwrap()
        .ends_with("_TLSDESC"));
    let pc = &r["process_context"];
    assert_eq!(pc["status"], "ok", "{pc:#}");
    assert_eq!(pc["mapping"], "/memfd:OTEL_CTX");
    assert_eq!(pc["version"], 2);
    assert_eq!(pc["published_at_ns"], f.context_published_at.unwrap());
    assert_eq!(pc["resource"]["service.name"], "fixture-svc");
    assert_eq!(pc["resource"]["process.pid"], 4242);
    assert_eq!(pc["schema_version"], "tlsdesc_v1_dev");
    assert_eq!(
        pc["attribute_key_map"],
        serde_json::json!(["http.route", "user.id"])
    );
    // key 0 appears twice (last wins); key 7 is not in the map.
    assert_eq!(
        main_thread_attributes(&r, f.pid),
        serde_json::json!([
            {"key_index": 0, "key": "http.route", "value": "/usr"},
            {"key_index": 1, "key": "user.id", "value": "42"},
            {"key_index": 7, "key": null, "value": "x"},
        ])
    );
    assert_running_untraced(f.pid);
}

#[test]
fn tlsdesc_library_resolved_through_the_dtv() {
    let f = spawn_dlopen("libbig.so", &["anon"]);
    let r = inspect_host(&f, 0, "tlsdesc-dtv");
    assert_eq!(r["symbol"]["access_model"], "tlsdesc");
    assert!(r["symbol"]["resolution"]["module_id"].as_u64().unwrap() >= 1);
    assert_eq!(
        r["symbol"]["resolution"]["module_offset"],
        r["symbol"]["st_value"]
    );
    let untouched = f
        .expect
        .iter()
        .find(|(_, e)| **e == Expect::Untouched)
        .unwrap()
        .0;
    let t = thread(&r, *untouched);
    assert!(
        t["reason"].as_str().unwrap().contains("unallocated"),
        "{t:#}"
    );
    if f.anon_naming_unsupported {
        // The kernel cannot name anonymous mappings: nothing to find.
        assert_eq!(r["process_context"]["status"], "absent");
    } else {
        assert_eq!(r["process_context"]["mapping"], "[anon:OTEL_CTX]");
        assert_eq!(r["process_context"]["schema_version"], "tlsdesc_v1_dev");
    }
    assert_running_untraced(f.pid);
}

#[test]
fn legacy_general_dynamic_library() {
    let f = spawn_dlopen("libgd.so", &["memfd"]);
    let r = inspect_host(&f, 0, "global-dynamic-dtv");
    assert_eq!(r["symbol"]["access_model"], "global-dynamic");
    assert!(r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("legacy general-dynamic")));
    assert_eq!(main_thread_attributes(&r, f.pid)[1]["value"], "42");
    assert_running_untraced(f.pid);
}

#[test]
fn executable_defining_the_symbol_uses_local_exec() {
    let f = spawn("host_exe", &["memfd"]);
    let r = inspect_host(&f, 0, "local-exec-static");
    assert_eq!(r["symbol"]["executable"], true);
    assert_eq!(r["symbol"]["access_model"], "local-exec");
    assert!(r["symbol"]["relocations"].as_array().unwrap().is_empty());
    assert_eq!(r["process_context"]["status"], "ok");
    assert_running_untraced(f.pid);
}

#[test]
fn initial_exec_library_linked_at_startup() {
    let f = spawn("host_ie", &[]);
    let r = inspect_host(&f, 0, "initial-exec-static");
    assert_eq!(r["symbol"]["access_model"], "initial-exec");
    assert_eq!(r["process_context"]["status"], "absent");
    assert_running_untraced(f.pid);
}

#[test]
fn a_wild_record_pointer_is_an_error_entry_and_exit_1() {
    let f = spawn_dlopen("libdesc.so", &["garbage"]);
    let r = inspect_host(&f, 1, "tlsdesc-static");
    assert_eq!(r["conformant"], false);
    assert!(
        r["problems"][0].as_str().unwrap().contains("cannot read"),
        "{:#}",
        r["problems"]
    );
    let human = reader(&["inspect", "--pid", &f.pid.to_string()]);
    assert_eq!(human.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&human.stdout).contains("NOT conformant"));
    assert_running_untraced(f.pid);
}

#[test]
fn a_process_whose_main_thread_exited_is_read_through_its_live_threads() {
    let mut f = spawn_dlopen("libdesc.so", &["leader-exits"]);
    // Wait until the leader is a zombie.
    let status = format!("/proc/{}/status", f.pid);
    for _ in 0..200 {
        if std::fs::read_to_string(&status)
            .unwrap()
            .contains("State:\tZ")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, r) = inspect_json(f.pid);
    assert_eq!(code, 0, "{r:#}");
    let main = thread(&r, f.pid);
    assert_eq!(main["status"], "exited", "{main:#}");
    f.expect.remove(&f.pid);
    let others: Vec<Value> = r["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tid"] != f.pid)
        .cloned()
        .collect();
    let mut rest = r.clone();
    rest["threads"] = Value::Array(others);
    assert_threads(&rest, &f, "tlsdesc-static");
    assert_running_untraced(f.pid);
}

#[test]
fn sample_reports_each_threads_span_and_raw_reads() {
    let f = spawn_dlopen("libdesc.so", &[]);
    let out = sample_raw_json(f.pid, "100", "0.5");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut per_thread: HashMap<i64, usize> = HashMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        let tid = s["tid"].as_i64().unwrap();
        *per_thread.entry(tid).or_default() += 1;
        assert!(s["t_ns"].as_u64().unwrap() > 0);
        match &f.expect[&(tid as i32)] {
            Expect::Valid { trace, span, flags } => {
                assert_eq!(s["valid"], true);
                assert_eq!(s["trace_id"], *trace);
                assert_eq!(s["span_id"], *span);
                assert_eq!(s["trace_flags"], *flags);
            }
            _ => {
                assert_eq!(s["valid"], false);
                assert!(s["trace_id"].is_null());
            }
        }
    }
    assert_eq!(per_thread.len(), 6);
    let summary: Value = serde_json::from_slice(&out.stderr).unwrap();
    let rounds = summary["rounds"].as_u64().unwrap();
    assert!(
        (10..=60).contains(&rounds),
        "about 50 rounds in 0.5 s at 100 Hz, got {rounds}"
    );
    assert!(per_thread.values().all(|&n| n as u64 == rounds));
    for t in summary["threads"].as_array().unwrap() {
        match &f.expect[&(t["tid"].as_i64().unwrap() as i32)] {
            Expect::Valid { span, .. } => {
                assert_eq!(t["spans"].as_array().unwrap().len(), 1);
                assert_eq!(t["spans"][0]["span_id"], *span);
                assert_eq!(t["spans"][0]["share"], 1.0);
                assert_eq!(t["idle_share"], 0.0);
            }
            _ => assert_eq!(t["idle_share"], 1.0),
        }
    }
    assert!(summary["stop_time"]["held_median_ns"].as_u64().unwrap() > 0);
    assert_running_untraced(f.pid);
}

#[test]
fn sigterm_mid_sample_leaves_the_target_running() {
    let f = spawn_dlopen("libdesc.so", &[]);
    for delay_ms in [50, 137, 311] {
        let s = spawn_sample_json(f.pid, "5000", "30");
        std::thread::sleep(Duration::from_millis(delay_ms));
        // SAFETY: plain kill(2) of the child we just spawned.
        unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
        let out = s.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(128 + 15));
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["interrupted_by_signal"], 15);
        assert_running_untraced(f.pid);
    }
}

#[test]
fn exit_codes_for_missing_symbol_and_missing_process() {
    let mut plain = Command::new("sleep").arg("30").spawn().unwrap();
    let out = reader(&["inspect", "--pid", &plain.id().to_string()]);
    let _ = plain.kill();
    let _ = plain.wait();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no module defines otel_thread_ctx_v1"));
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap();
    let out = reader(&["inspect", "--pid", pid_max.trim()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such process"));
    let out = reader(&["sample", "--pid", "1", "--hz", "0", "--duration", "1"]);
    assert_eq!(out.status.code(), Some(2), "bad --hz is a usage error");
}

/// Runs `command --pid <pid> rest...` as a user who may not read `pid`:
/// nobody when the tests run as root (the target is root's), else the
/// tests' user on pid 1.
fn reader_without_permission(command: &str, pid: i32, rest: &[&str]) -> Output {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let pid = if root { pid.to_string() } else { "1".into() };
    let args: Vec<&str> = [command, "--pid", &pid]
        .into_iter()
        .chain(rest.iter().copied())
        .collect();
    if root {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", READER])
            .args(&args)
            .output()
            .expect("setpriv runs")
    } else {
        reader(&args)
    }
}

fn assert_permission_denied(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");
}

#[test]
fn permission_denied_exits_2() {
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let out = reader_without_permission("inspect", target.id() as i32, &[]);
    let _ = target.kill();
    let _ = target.wait();
    assert_permission_denied(&out);
}

/// The churn fixture: threads that come and go for a while, then an exit.
struct Churn {
    _process: Running,
    pid: i32,
    main_ids: (String, String),
    worker_ids: (String, String),
}

/// Starts the churn fixture for `seconds` and waits until it runs.
fn spawn_churn(seconds: &str) -> Churn {
    let process = Running::start(&fixtures().join("churn"), &[seconds]);
    let line = process.next_line();
    let w: Vec<String> = line.split_whitespace().map(String::from).collect();
    assert_eq!(w.len(), 5, "unexpected fixture output {line:?}");
    assert_eq!(w[0], "ready");
    Churn {
        pid: process.pid,
        _process: process,
        main_ids: (w[1].clone(), w[2].clone()),
        worker_ids: (w[3].clone(), w[4].clone()),
    }
}

/// The first JSON value of `bytes` (a summary may be followed by notes).
fn first_json(bytes: &[u8]) -> Value {
    serde_json::Deserializer::from_slice(bytes)
        .into_iter::<Value>()
        .next()
        .unwrap_or_else(|| panic!("no JSON in {}", String::from_utf8_lossy(bytes)))
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

#[test]
fn sample_skips_threads_that_come_and_go_and_ends_when_the_target_exits() {
    // The target lives 1 s; the run asks for 60, and ends with the target
    // long before (the margin is wide: the machine may be loaded). The
    // process is not reaped until the fixture is dropped, so the reader
    // sees it turn into a zombie.
    let f = spawn_churn("1");
    let started = std::time::Instant::now();
    let out = sample_raw_json(f.pid, "500", "60");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the run ends with the process, took {:?}",
        started.elapsed()
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (mut main_reads, mut worker_reads) = (0, 0);
    let mut tids = std::collections::HashSet::new();
    for line in stdout.lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        assert!(s.get("error").is_none(), "a read failed: {line}");
        let tid = s["tid"].as_i64().unwrap() as i32;
        tids.insert(tid);
        if tid == f.pid {
            main_reads += 1;
            assert_eq!(s["valid"], true, "{line}");
            assert_eq!(s["trace_id"], f.main_ids.0);
            assert_eq!(s["span_id"], f.main_ids.1);
        } else if s["valid"] == true {
            worker_reads += 1;
            assert_eq!(s["trace_id"], f.worker_ids.0, "{line}");
            assert_eq!(s["span_id"], f.worker_ids.1, "{line}");
        }
    }
    assert!(
        main_reads > 50,
        "the main thread was read in most rounds: {main_reads}"
    );
    assert!(
        tids.len() > 2,
        "threads that came and went were read: {tids:?}"
    );
    assert!(worker_reads > 0, "some worker was read inside its span");
    let summary = first_json(&out.stderr);
    assert_eq!(summary["target_exited"], true, "{summary:#}");
    assert_eq!(summary["interrupted_by_signal"], Value::Null);
    assert!(summary["elapsed_s"].as_f64().unwrap() < 30.0, "{summary:#}");
    assert_eq!(
        summary["reads"].as_u64().unwrap() as usize,
        stdout.lines().count(),
        "one raw line per read"
    );
    assert!(summary["threads"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["errors"] == 0));
    assert!(
        stderr
            .trim_end()
            .lines()
            .last()
            .unwrap()
            .contains(&format!("pid {} exited after", f.pid)),
        "{stderr}"
    );
}

#[test]
fn sample_ends_normally_when_the_target_is_killed_mid_run() {
    // Killed and left a zombie, then killed and reaped at once.
    for reap in [false, true] {
        let mut f = spawn_dlopen("libdesc.so", &[]);
        let started = std::time::Instant::now();
        let s = spawn_sample_json(f.pid, "500", "60");
        std::thread::sleep(Duration::from_millis(300));
        f.process.child.kill().unwrap();
        if reap {
            f.process.child.wait().unwrap();
        }
        let out = s.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "reap {reap}: {stderr}");
        // Asked for 60 s: it ended with the target, long before.
        assert!(started.elapsed() < Duration::from_secs(30), "reap {reap}");
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["target_exited"], true, "{summary:#}");
        assert!(summary["rounds"].as_u64().unwrap() > 10, "{summary:#}");
        let threads = summary["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 6, "{summary:#}");
        for t in threads {
            assert!(t["samples"].as_u64().unwrap() > 10, "{t:#}");
            assert_eq!(t["errors"], 0, "{t:#}");
        }
        assert!(
            stderr.contains(&format!("pid {} exited after", f.pid)),
            "{stderr}"
        );
    }
}

#[test]
fn inspect_reports_threads_that_exit_as_exited_not_as_errors() {
    let f = spawn_churn("2");
    for _ in 0..5 {
        let (code, r) = inspect_json(f.pid);
        assert_eq!(code, 0, "{r:#}");
        assert!(r["problems"].as_array().unwrap().is_empty(), "{r:#}");
        for t in r["threads"].as_array().unwrap() {
            let status = t["status"].as_str().unwrap();
            assert!(["valid", "no-record", "exited"].contains(&status), "{t:#}");
            if t["tid"] == f.pid {
                assert_eq!(status, "valid", "{t:#}");
                assert_eq!(t["record"]["trace_id"], f.main_ids.0);
                assert_eq!(t["record"]["span_id"], f.main_ids.1);
            } else if status == "valid" {
                assert_eq!(t["record"]["trace_id"], f.worker_ids.0);
                assert_eq!(t["record"]["span_id"], f.worker_ids.1);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sample_of_a_process_it_may_not_trace_exits_2() {
    let f = spawn("host_exe", &[]);
    let out = reader_without_permission("sample", f.pid, &["--hz", "500", "--duration", "1"]);
    assert_permission_denied(&out);
    assert_running_untraced(f.pid);
}

/// A `sample --raw --json` run in the background: its raw lines arrive as
/// they are printed.
struct Sampler {
    child: Child,
    lines: mpsc::Receiver<String>,
    collector: std::thread::JoinHandle<()>,
}

fn start_sample(pid: i32, hz: &str, duration: &str) -> Sampler {
    // A loaded machine can take long to schedule a thread into its stop;
    // these runs are about what is read, not how fast.
    let more = ["--raw", "--json", "--stop-timeout-ms", "2000"];
    let mut child = sample_command(pid, hz, duration, &more)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("reader runs");
    let (lines, collector) = forward_lines(child.stdout.take().unwrap());
    Sampler {
        child,
        lines,
        collector,
    }
}

impl Sampler {
    /// Waits for `n` raw lines and returns them.
    fn take(&self, n: usize) -> Vec<Value> {
        (0..n)
            .map(|_| {
                let line = self
                    .lines
                    .recv_timeout(Duration::from_secs(20))
                    .expect("the sampler prints reads");
                serde_json::from_str(&line).unwrap()
            })
            .collect()
    }

    /// Waits for the run to end: exit status, the remaining raw lines,
    /// stderr (the summary, then notes).
    fn finish(self) -> (Option<i32>, Vec<Value>, Vec<u8>) {
        let out = self.child.wait_with_output().unwrap();
        self.collector.join().unwrap();
        let rest = self
            .lines
            .try_iter()
            .map(|l| serde_json::from_str(&l).unwrap())
            .collect();
        (out.status.code(), rest, out.stderr)
    }
}

/// Starts the exec fixture: a program that publishes one record on two
/// threads and, on a line on stdin, executes another.
fn start_exec_target(args: &[&str]) -> Running {
    let t = Running::start(&fixtures().join("exec_target"), args);
    exec_target_ready(&t);
    t
}

/// Waits for the running program's "ready" line; returns its ids.
fn exec_target_ready(t: &Running) -> (String, String) {
    let line = t.next_line();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w.len(), 4, "unexpected fixture output {line:?}");
    assert_eq!(w[..2], ["ready", &t.pid.to_string()]);
    (w[2].to_string(), w[3].to_string())
}

/// Samples `pid` (`sample --raw --json` at 200 Hz for `duration` seconds):
/// `first` reads, then `meanwhile()`, then to the end of the run, which
/// must exit 0 without a failed read. Returns every read, the summary and
/// stderr as text.
fn sample_around(
    pid: i32,
    duration: &str,
    first: usize,
    meanwhile: impl FnOnce(),
) -> (Vec<Value>, Value, String) {
    let s = start_sample(pid, "200", duration);
    let mut lines = s.take(first);
    meanwhile();
    let (code, rest, stderr) = s.finish();
    let text = String::from_utf8_lossy(&stderr).into_owned();
    assert_eq!(code, Some(0), "{text}");
    lines.extend(rest);
    for l in &lines {
        assert!(l.get("error").is_none(), "a read of pid {pid} failed: {l}");
    }
    (lines, first_json(&stderr), text)
}

/// The one exec a summary reports, of `executable`.
fn only_exec<'a>(summary: &'a Value, executable: &Path) -> &'a Value {
    let execs = summary["execs"].as_array().unwrap();
    assert_eq!(execs.len(), 1, "{summary:#}");
    assert_eq!(execs[0]["executable"], executable.to_str().unwrap());
    &execs[0]
}

fn ids(trace: u8, span: u8) -> (String, String) {
    (
        format!("{trace:02x}").repeat(16),
        format!("{span:02x}").repeat(8),
    )
}

fn line_ids(s: &Value) -> Option<(String, String)> {
    (s["valid"] == true).then(|| {
        (
            s["trace_id"].as_str().unwrap().to_string(),
            s["span_id"].as_str().unwrap().to_string(),
        )
    })
}

#[test]
fn sample_reads_nothing_of_a_program_executed_without_the_symbol() {
    // The decoy has the same TLS layout under another name: reading it at
    // the old offset would report its record (dede…/baba…).
    let decoy = fixtures().join("exec_decoy");
    let mut f = start_exec_target(&["11", "22", decoy.to_str().unwrap(), "de", "ba"]);
    let (lines, summary, text) = sample_around(f.pid, "2", 20, || {
        f.send_line();
        assert_eq!(exec_target_ready(&f), ids(0xde, 0xba), "the decoy runs");
    });
    for l in &lines {
        assert_eq!(line_ids(l), Some(ids(0x11, 0x22)), "{l}");
    }
    assert_eq!(summary["target_exited"], false, "{summary:#}");
    let exec = only_exec(&summary, &decoy);
    assert!(exec["resolution_path"].is_null(), "{summary:#}");
    assert!(exec["resumed_at_s"].is_null(), "{summary:#}");
    assert!(
        exec["error"]
            .as_str()
            .unwrap()
            .contains("no module defines otel_thread_ctx_v1"),
        "{summary:#}"
    );
    assert_eq!(summary["reads"].as_u64().unwrap() as usize, lines.len());
    for t in summary["threads"].as_array().unwrap() {
        assert_eq!(t["errors"], 0, "{t:#}");
        assert_eq!(t["spans"][0]["trace_id"], ids(0x11, 0x22).0, "{t:#}");
    }
    assert!(
        text.contains(&format!("pid {} executed {}", f.pid, decoy.display()))
            && text.contains("no thread read since"),
        "{text}"
    );
    assert_running_untraced(f.pid);
}

#[test]
fn sample_finds_the_thread_context_of_the_program_executed_again() {
    // The same executable again: the same file, a new address space.
    let again = fixtures().join("exec_target");
    let mut f = start_exec_target(&["11", "22", again.to_str().unwrap(), "33", "44"]);
    let (lines, summary, text) = sample_around(f.pid, "2", 20, || {
        f.send_line();
        assert_eq!(
            exec_target_ready(&f),
            ids(0x33, 0x44),
            "the new program runs"
        );
    });
    let (old, new) = (ids(0x11, 0x22), ids(0x33, 0x44));
    let mut seen_new = false;
    let mut new_on_main = 0;
    for l in &lines {
        match line_ids(l) {
            Some(x) if x == new => {
                seen_new = true;
                new_on_main += usize::from(l["tid"] == f.pid);
            }
            Some(x) if x == old => assert!(!seen_new, "an old record after the exec: {l}"),
            // The new program's threads before they publish.
            None => assert!(seen_new || l["tid"] != f.pid, "{l}"),
            other => panic!("unexpected ids {other:?} in {l}"),
        }
    }
    assert!(new_on_main > 0, "the new program's records were read");
    let exec = only_exec(&summary, &again);
    assert_eq!(exec["resolution_path"], "local-exec-static", "{summary:#}");
    assert!(exec["error"].is_null(), "{summary:#}");
    let resumed = exec["resumed_at_s"].as_f64().unwrap();
    assert!(resumed >= exec["elapsed_s"].as_f64().unwrap());
    assert!(text.contains("reads resumed after"), "{text}");
    assert_running_untraced(f.pid);
}

#[test]
fn sample_follows_an_exec_into_a_program_that_loads_its_writer_with_dlopen() {
    let host = fixtures().join("host_dlopen");
    let lib = fixtures().join("libdesc.so");
    let mut f = start_exec_target(&["11", "22", host.to_str().unwrap(), lib.to_str().unwrap()]);
    let (lines, summary, _) = sample_around(f.pid, "2", 20, || f.send_line());
    // host_dlopen's main thread publishes this record once the library is loaded.
    let main_ids = (
        "0102030405060708090a0b0c0d0e0f10".to_string(),
        "a0a1a2a3a4a5a6a7".to_string(),
    );
    let old = ids(0x11, 0x22);
    let mut seen_new = false;
    for l in &lines {
        match line_ids(l) {
            Some(x) if x == old => assert!(!seen_new, "an old record after the exec: {l}"),
            Some(x) => {
                seen_new = true;
                if l["tid"] == f.pid {
                    assert_eq!(x, main_ids, "{l}");
                }
            }
            None => {}
        }
    }
    assert!(seen_new, "the new program's records were read");
    let exec = only_exec(&summary, &host);
    assert_eq!(exec["resolution_path"], "tlsdesc-static", "{summary:#}");
    assert!(exec["resumed_at_s"].as_f64().is_some(), "{summary:#}");
    assert_running_untraced(f.pid);
}

#[test]
fn sample_keeps_reading_the_other_threads_after_the_main_thread_exits() {
    let mut f = spawn_dlopen("libdesc.so", &["leader-exits-on-line"]);
    let (lines, summary, _) = sample_around(f.pid, "1.5", 60, || f.process.send_line());
    let status = std::fs::read_to_string(format!("/proc/{}/status", f.pid)).unwrap();
    assert!(
        status.contains("State:\tZ"),
        "the main thread exited: {status}"
    );
    let last_main = lines
        .iter()
        .filter(|l| l["tid"] == f.pid)
        .map(|l| l["t_ns"].as_u64().unwrap())
        .max()
        .unwrap();
    let mut after: HashMap<i64, usize> = HashMap::new();
    for l in &lines {
        let tid = l["tid"].as_i64().unwrap();
        if l["t_ns"].as_u64().unwrap() > last_main {
            *after.entry(tid).or_default() += 1;
        }
        match &f.expect[&(tid as i32)] {
            Expect::Valid { trace, span, .. } => {
                assert_eq!(line_ids(l), Some((trace.clone(), span.clone())), "{l}")
            }
            _ => assert_eq!(l["valid"], false, "{l}"),
        }
    }
    assert_eq!(
        after.len(),
        5,
        "every other thread read after the exit: {after:?}"
    );
    assert!(after.values().all(|&n| n >= 10), "{after:?}");
    assert_eq!(summary["target_exited"], false, "{summary:#}");
    let rounds = summary["rounds"].as_u64().unwrap();
    for t in summary["threads"].as_array().unwrap() {
        assert_eq!(t["errors"], 0, "{t:#}");
        if t["tid"] == f.pid {
            assert!(t["samples"].as_u64().unwrap() < rounds, "{t:#}");
        } else {
            assert_eq!(t["samples"].as_u64().unwrap(), rounds, "{t:#}");
        }
    }
    assert_running_untraced(f.pid);
}

/// What the hostile fixture puts in thread names (window title, clear
/// screen, the one-character CSI, DEL) and in an attribute value and the
/// process context (the same, a colour, and a forged report line).
const HOSTILE_NAME: &str = "\u{1b}]0;pw\u{7}\u{1b}[2J\u{9b}\u{7f}";
const HOSTILE_TEXT: &str =
    "\u{1b}]0;owned\u{7}\u{1b}[2J\u{1b}[31mred\u{9b}2J\u{7f}\r\nproblem: forged";

/// Characters a terminal acts on (everything but the newlines ending lines).
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| c != '\n' && c.is_control())
        .collect()
}

#[test]
fn human_output_escapes_what_the_target_controls_and_json_keeps_it_exact() {
    let f = spawn_dlopen("libdesc.so", &["hostile", "memfd"]);
    let human = reader(&["inspect", "--pid", &f.pid.to_string()]);
    let sampled = reader(&[
        "sample",
        "--pid",
        &f.pid.to_string(),
        "--hz",
        "100",
        "--duration",
        "0.3",
    ]);
    for out in [&human, &sampled] {
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        for text in [&out.stdout, &out.stderr] {
            let text = String::from_utf8(text.clone()).unwrap();
            assert_eq!(raw_controls(&text), Vec::<char>::new(), "{text}");
            assert!(
                text.lines().all(|l| !l.starts_with("problem: forged")),
                "{text}"
            );
        }
    }
    let inspect_text = String::from_utf8(human.stdout).unwrap();
    let name = r"\x1b]0;pw\x07\x1b[2J\u{9b}\x7f";
    let value = r"\x1b]0;owned\x07\x1b[2J\x1b[31mred\u{9b}2J\x7f\x0d\x0aproblem: forged";
    for shown in [
        name.to_string(),
        format!("user.id{name}={value}"),
        format!("service.name=svc{value}"),
    ] {
        assert!(inspect_text.contains(&shown), "{shown} in {inspect_text}");
    }
    let sample_text = String::from_utf8(sampled.stdout).unwrap();
    assert!(sample_text.contains(name), "{sample_text}");

    let (code, r) = inspect_json(f.pid);
    assert_eq!(code, 0, "{r:#}");
    for t in r["threads"].as_array().unwrap() {
        assert_eq!(t["name"], HOSTILE_NAME, "{t:#}");
    }
    assert_eq!(main_thread_attributes(&r, f.pid)[1]["value"], HOSTILE_TEXT);
    let pc = &r["process_context"];
    assert_eq!(pc["resource"]["service.name"], format!("svc{HOSTILE_TEXT}"));
    assert_eq!(pc["attribute_key_map"][1], format!("user.id{HOSTILE_NAME}"));
    assert_running_untraced(f.pid);
}

#[test]
fn records_marked_valid_with_all_zero_ids_are_not_conformant_and_name_no_span() {
    let f = spawn_dlopen("libdesc.so", &["zero-ids"]);
    let r = inspect_host(&f, 1, "tlsdesc-static");
    assert_eq!(r["conformant"], false);
    let zero_tids: Vec<i32> = f
        .expect
        .iter()
        .filter(|(_, e)| matches!(e, Expect::ZeroIds(_)))
        .map(|(tid, _)| *tid)
        .collect();
    assert_eq!(zero_tids.len(), 3);
    for tid in &zero_tids {
        assert!(
            r["problems"].as_array().unwrap().iter().any(|p| {
                let p = p.as_str().unwrap();
                p.starts_with(&format!("thread {tid}: ")) && p.contains("all zero")
            }),
            "{:#}",
            r["problems"]
        );
    }
    let out = sample_raw_json(f.pid, "100", "0.3");
    assert_eq!(out.status.code(), Some(0));
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        let tid = s["tid"].as_i64().unwrap() as i32;
        match &f.expect[&tid] {
            Expect::ZeroIds(_) => {
                assert_eq!(s["valid"], false, "{line}");
                assert!(s["trace_id"].is_null() && s["span_id"].is_null(), "{line}");
                assert!(
                    s["problem"].as_str().unwrap().contains("all zero"),
                    "{line}"
                );
            }
            Expect::Valid { trace, span, .. } => {
                assert_eq!(line_ids(&s), Some((trace.clone(), span.clone())), "{line}")
            }
            _ => assert_eq!(s["valid"], false, "{line}"),
        }
    }
    let summary: Value = serde_json::from_slice(&out.stderr).unwrap();
    for t in summary["threads"].as_array().unwrap() {
        let tid = t["tid"].as_i64().unwrap() as i32;
        if zero_tids.contains(&tid) {
            assert!(t["samples"].as_u64().unwrap() > 0, "{t:#}");
            assert_eq!(t["zero_ids"], t["samples"], "{t:#}");
            assert_eq!(t["idle"], t["samples"], "{t:#}");
            assert!(t["spans"].as_array().unwrap().is_empty(), "{t:#}");
        } else {
            assert_eq!(t["zero_ids"], 0, "{t:#}");
        }
    }
    assert_running_untraced(f.pid);
}
