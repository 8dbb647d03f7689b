//! What the reader's integration tests share: the reader itself, C fixtures
//! built here with gcc, and fixture processes that say on stdout what a
//! reader must find, then "ready".

// Each integration test is a crate of its own and uses part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

pub const READER: &str = env!("CARGO_BIN_EXE_otel-thread-ctx");

/// A source file of tests/fixtures.
pub fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A directory for built fixtures, created if need be.
pub fn build_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs gcc with warnings as errors on `args`; panics if it fails.
pub fn gcc<S: AsRef<OsStr>>(args: &[S]) {
    let status = Command::new("gcc")
        .args(["-O1", "-g", "-Wall", "-Werror"])
        .args(args)
        .status()
        .expect("gcc runs");
    let args: Vec<_> = args.iter().map(|a| a.as_ref()).collect();
    assert!(status.success(), "gcc {args:?} failed");
}

/// Sends `stream`'s lines, as they come, to the receiver returned, from a
/// thread of their own (which ends with the stream, or the receiver).
pub fn forward_lines(
    stream: impl Read + Send + 'static,
) -> (mpsc::Receiver<String>, JoinHandle<()>) {
    let (tx, lines) = mpsc::channel();
    let forwarder = std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    (lines, forwarder)
}

/// A fixture process whose stdout lines arrive as they are printed.
/// Killed and reaped when dropped.
pub struct Running {
    pub child: Child,
    pub pid: i32,
    lines: mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `program` with `args`, its stdin a pipe (a line on it is a
    /// cue to some fixtures; all of them end when it closes).
    pub fn start(program: &Path, args: &[&str]) -> Running {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("fixture starts");
        let (lines, _) = forward_lines(child.stdout.take().unwrap());
        Running {
            pid: child.id() as i32,
            child,
            lines,
        }
    }

    /// Waits for the next line the fixture prints.
    pub fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(20))
            .expect("fixture prints ready")
    }

    /// Hands every line before "ready <pid>" to `line`, split into words.
    pub fn until_ready(&self, mut line: impl FnMut(&[&str])) {
        loop {
            let text = self.next_line();
            let words: Vec<&str> = text.split_whitespace().collect();
            if let ["ready", _] = words[..] {
                return;
            }
            line(&words);
        }
    }

    /// Writes a line to the fixture's stdin.
    pub fn send_line(&mut self) {
        self.child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    }
}

/// Runs the reader to its end.
pub fn reader(args: &[&str]) -> Output {
    Command::new(READER)
        .args(args)
        .output()
        .expect("reader runs")
}

/// The reader's `sample` of `pid` at `hz` for `duration` seconds, with
/// `more` arguments.
pub fn sample_command(pid: i32, hz: &str, duration: &str, more: &[&str]) -> Command {
    let mut command = Command::new(READER);
    command
        .args(["sample", "--pid", &pid.to_string()])
        .args(["--hz", hz, "--duration", duration])
        .args(more);
    command
}

/// `inspect --json` of `pid`: the exit code and the report.
pub fn inspect_json(pid: i32) -> (i32, Value) {
    let out = reader(&["inspect", "--pid", &pid.to_string(), "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), report)
}

/// The report's entry for thread `tid`.
pub fn thread(report: &Value, tid: i32) -> &Value {
    report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("thread {tid} missing: {report:#}"))
}

/// JSON lines (raw reads or samples), grouped by their thread.
pub fn by_thread(jsonl: &str) -> HashMap<i32, Vec<Value>> {
    let mut threads: HashMap<i32, Vec<Value>> = HashMap::new();
    for line in jsonl.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        threads
            .entry(v["tid"].as_i64().unwrap() as i32)
            .or_default()
            .push(v);
    }
    threads
}
