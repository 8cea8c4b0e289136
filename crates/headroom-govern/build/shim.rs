//! Builds the compiler shim (`crates/headroom-shim`) that the governor's binary carries and
//! writes out for each build (`src/shim_binary.rs`).
//!
//! Every compiler call of a governed build starts the shim, so it is built where it starts
//! fastest: for the target's musl variant, a static program that needs no glibc. glibc's own
//! start-up probes the CPU with CPUID instructions, which a hypervisor traps: on our VMs that
//! is 0.6 ms of every process's start, against 0.1 ms for the whole musl shim (BENCHMARKS.md,
//! "Cost of interception"). Where Rust's musl standard library is not installed, or the musl
//! build fails (no musl C compiler), the shim is built for the target itself (static glibc,
//! see its build.rs) and the build says how to get the faster one.
//!
//! The shim is its own package, built by a second cargo into a target directory of its own
//! under `OUT_DIR`. It depends on this crate without the `governor` feature, so that build
//! does not come back here.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set for the shim's build, which must not come back here.
const NESTED: &str = "HEADROOM_BUILDING_SHIM";

/// Builds the shim and tells the crate where it is (`HEADROOM_SHIM_BINARY`) and what it was
/// built for (`HEADROOM_SHIM_TARGET`).
pub fn build(out: &Path) {
    assert!(
        std::env::var_os(NESTED).is_none(),
        "the shim's own build came back to build the shim: headroom-shim must depend on \
         headroom-govern without its `governor` feature"
    );
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let musl_build = musl_variant(&target).map(|musl| {
        let built = if has_standard_library(&musl) {
            cargo_build(&musl, out)
        } else {
            Err("Rust's musl standard library is not installed".to_string())
        };
        built.map(|shim| (shim, musl.clone())).map_err(|why| {
            // musl's C compiler builds the C rules the shim links (`intercept/`).
            println!(
                "cargo::warning=the compiler shim is built with glibc, so each compiler call \
                 costs about 0.6 ms more on a VM (`rustup target add {musl}` and `apt-get \
                 install musl-tools` give the faster one):"
            );
            for line in why.lines() {
                println!("cargo::warning=  {line}");
            }
        })
    });
    let (shim, built_for) = match musl_build {
        Some(Ok(built)) => built,
        _ => (
            cargo_build(&target, out).unwrap_or_else(|err| panic!("{err}")),
            target,
        ),
    };
    println!("cargo::rustc-env=HEADROOM_SHIM_BINARY={}", shim.display());
    println!("cargo::rustc-env=HEADROOM_SHIM_TARGET={built_for}");
}

/// `x86_64-unknown-linux-musl` for `x86_64-unknown-linux-gnu`; `None` off glibc Linux.
fn musl_variant(target: &str) -> Option<String> {
    target
        .strip_suffix("-linux-gnu")
        .map(|stem| format!("{stem}-linux-musl"))
}

/// Whether rustc has the standard library for `target`.
fn has_standard_library(target: &str) -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    Command::new(rustc)
        .args(["--print", "target-libdir", "--target", target])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .is_some_and(|mut entries| {
            entries.any(|entry| {
                entry.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
            })
        })
}

/// Builds the shim for `target` in release mode, into a target directory under `out`, and
/// returns the binary; the error carries the end of cargo's output. Every workspace file the
/// binary was built from is declared, so a change to one builds it again.
fn cargo_build(target: &str, out: &Path) -> Result<PathBuf, String> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set"));
    let shim_manifest = manifest_dir.join("../headroom-shim/Cargo.toml");
    let target_dir = out.join("shim");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--locked", "--manifest-path"])
        .arg(&shim_manifest)
        .args(["--target", target, "--target-dir"])
        .arg(&target_dir)
        .env(NESTED, "1");
    // What this cargo set for its own build is not the shim's: its target, its flags, clippy
    // as the compiler, and above all this script's features (`CARGO_FEATURE_GOVERNOR` would
    // bring the second build back here). The jobserver (CARGO_MAKEFLAGS) is kept: both builds
    // share its slots.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let own = ["CARGO_FEATURE_", "CARGO_CFG_"]
            .iter()
            .any(|prefix| name.starts_with(prefix));
        if own
            || [
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_TARGET",
                "CARGO_BUILD_TARGET_DIR",
                "CARGO_ENCODED_RUSTFLAGS",
                "CARGO_BUILD_RUSTFLAGS",
                "RUSTFLAGS",
                "RUSTC_WORKSPACE_WRAPPER",
            ]
            .contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
    let output = command
        .output()
        .map_err(|err| format!("cannot run cargo to build the compiler shim: {err}"))?;
    if !output.status.success() {
        let log = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "building the compiler shim for {target} failed:\n{}",
            tail.join("\n")
        ));
    }
    let release = target_dir.join(target).join("release");
    println!(
        "cargo::rerun-if-changed={}",
        manifest_dir.join("../headroom-shim").display()
    );
    declare_sources(&release.join("headroom-shim.d"), &manifest_dir);
    Ok(release.join("headroom-shim"))
}

/// Declares the workspace's files in the dep-info file cargo wrote beside the binary
/// (`binary: source source…`, spaces in names escaped), and the lock file.
fn declare_sources(dep_info: &Path, manifest_dir: &Path) {
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("crates/headroom-govern sits two levels below the workspace");
    println!(
        "cargo::rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );
    let text = std::fs::read_to_string(dep_info).unwrap_or_default();
    let Some((_, sources)) = text.split_once(": ") else {
        return;
    };
    let mut source = String::new();
    let mut escaped = false;
    for c in sources.chars().chain([' ']) {
        match c {
            '\\' if !escaped => escaped = true,
            ' ' | '\n' if !escaped => {
                let path = Path::new(OsStr::new(&source));
                if path.starts_with(workspace) {
                    println!("cargo::rerun-if-changed={}", path.display());
                }
                source.clear();
            }
            c => {
                source.push(c);
                escaped = false;
            }
        }
    }
}
