//! Builds the interceptor (`intercept/intercept.c`) into the shared library that
//! `headroom build` preloads into the build's processes, and the rules it shares with the
//! Rust code (`intercept/compiler_names.c`, `intercept/preload.c`) into a static library:
//! the Rust code calls `preload.c`'s rule, and its tests hold `compiler_names.c` to the
//! compiler families (`src/compiler/`). The shared library is embedded in the binary
//! (`intercept::LIBRARY`): one `cargo install` carries everything. With the `governor`
//! feature, the binary that runs the governor also carries the compiler shim (`build/shim.rs`).

#[path = "build/shim.rs"]
mod shim;

use std::path::PathBuf;
use std::process::Command;

/// The rules both the interceptor and the Rust code (or its tests) use.
const SHARED_RULES: [&str; 2] = ["intercept/compiler_names.c", "intercept/preload.c"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=intercept");
    if std::env::var_os("CARGO_FEATURE_GOVERNOR").is_some() {
        shim::build(&out);
    }
    cc::Build::new()
        .files(SHARED_RULES)
        .warnings(true)
        .compile("headroom_intercept_rules");

    let compiler = cc::Build::new().get_compiler();
    let library = out.join("libheadroom-intercept.so");
    let status = Command::new(compiler.path())
        .args([
            "-O2",
            "-Wall",
            "-Wextra",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            // Every process of the build loads this library: two mappings instead of four
            // and no RELRO remapping halve what loading it costs per exec (BENCHMARKS.md,
            // "Cost of interception").
            "-Wl,-z,noseparate-code",
            "-Wl,-z,norelro",
            "-o",
        ])
        .arg(&library)
        .arg("intercept/intercept.c")
        .args(SHARED_RULES)
        // dlsym is in libc since glibc 2.34; older ones need libdl.
        .args(["-Wl,--as-needed", "-ldl"])
        .status()
        .unwrap_or_else(|err| panic!("cannot run the C compiler {:?}: {err}", compiler.path()));
    assert!(
        status.success(),
        "building the interceptor failed: install a C compiler (apt-get install gcc)"
    );
}
