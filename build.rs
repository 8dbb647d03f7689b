use std::path::PathBuf;

fn main() {
    napi_build::setup();

    // The TLS variable lives in C: see src/tls_shim.c for why.
    cc::Build::new()
        .file("src/tls_shim.c")
        .flag("-mtls-dialect=gnu2")
        .flag("-fno-omit-frame-pointer")
        .compile("otel_thread_ctx_tls");

    // rustc's own cdylib version script hides every non-Rust symbol; a second
    // script puts otel_thread_ctx_v1 back into .dynsym.
    let exports =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("src/exports.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        exports.display()
    );
    println!("cargo:rerun-if-changed=src/tls_shim.c");
    println!("cargo:rerun-if-changed=src/exports.map");
}
