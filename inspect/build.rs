//! Compiles the `profile` command's BPF program with clang when it can.
//!
//! Without clang (or libbpf's headers) the reader still builds: the program
//! is left out and `profile` explains how to get it. The outcome is handed to
//! the crate as the `profile_bpf` cfg, or the reason in
//! `PROFILE_BPF_UNAVAILABLE`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/profile.bpf.c";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(profile_bpf)");
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("profile.bpf.o");
    match compile(&out) {
        Ok(()) => println!("cargo:rustc-cfg=profile_bpf"),
        Err(reason) => {
            println!("cargo:warning=`otel-thread-ctx profile` is left out: {reason}");
            println!("cargo:rustc-env=PROFILE_BPF_UNAVAILABLE={reason}");
        }
    }
}

fn compile(out: &PathBuf) -> Result<(), String> {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // The program reads the thread pointer from `thread.fsbase`: x86-64 only.
    match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => {}
        Ok(other) => return Err(format!("the BPF program supports x86-64 only, not {other}")),
        Err(_) => return Err("unknown target architecture".into()),
    }
    let mut cmd = Command::new(&clang);
    cmd.args([
        "-O2",
        "-g",
        "-target",
        "bpf",
        "-Wall",
        "-Werror",
        "-D__TARGET_ARCH_x86",
    ]);
    // <linux/bpf.h> includes <asm/...>, which Debian-style systems keep in a
    // per-architecture directory that clang's BPF target does not search.
    let multiarch = "/usr/include/x86_64-linux-gnu";
    if std::path::Path::new(multiarch).is_dir() {
        cmd.arg(format!("-I{multiarch}"));
    }
    cmd.args(["-c", SOURCE, "-o"]).arg(out);
    match cmd.output() {
        Err(e) => Err(format!(
            "{clang} was not found when it was built ({e})"
        )),
        Ok(o) if !o.status.success() => Err(format!(
            "{clang} could not compile {SOURCE} when it was built (are libbpf's headers missing?): {}",
            String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("").replace('\n', " ")
        )),
        Ok(_) => Ok(()),
    }
}
