//! Links `headroom-shim` statically where it is built for glibc (where Rust's musl target is
//! missing, see `headroom-govern`'s `build/shim.rs`; a musl build is static already). Every
//! compiler call of a governed build starts the shim, and loading a dynamic program's
//! libraries is about half of what starting one costs on our VMs (BENCHMARKS.md, "Cost of
//! interception").
//!
//! Cargo cannot give one binary `-C target-feature=+crt-static`, so the shim gets what that
//! flag would give it: a `-static-pie` link in which every C library that Rust's standard
//! library asks for resolves to its static archive. Where an archive is missing (no static
//! glibc installed), the shim stays dynamic, works the same, and the build says so.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries the standard library links on `*-linux-gnu`, and the archive each one
/// becomes in a static link: the unwinder `gcc_s` is `libgcc_eh.a` there.
const STATIC_ARCHIVES: [(&str, &str); 7] = [
    ("c", "libc.a"),
    ("m", "libm.a"),
    ("dl", "libdl.a"),
    ("rt", "librt.a"),
    ("pthread", "libpthread.a"),
    ("util", "libutil.a"),
    ("gcc_s", "libgcc_eh.a"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let gnu_linux = env("CARGO_CFG_TARGET_OS") == "linux" && env("CARGO_CFG_TARGET_ENV") == "gnu";
    if !gnu_linux || env("CARGO_CFG_TARGET_FEATURE").contains("crt-static") {
        return;
    }
    let dir = PathBuf::from(env("OUT_DIR")).join("static-shim-libs");
    if let Err(missing) = link_archives(&dir) {
        println!(
            "cargo::warning=headroom-shim is linked dynamically, so each compiler call costs \
about 0.3 ms more: {missing} was not found (install libc6-dev for a static glibc)"
        );
        return;
    }
    // The linker looks in this directory before the system's, and finds only archives there.
    for arg in ["-static-pie".to_string(), format!("-L{}", dir.display())]
        .into_iter()
        // GNU ld reads archives once, in order: libc.a needs libgcc's routines after it.
        .chain(["-lgcc_eh", "-lgcc", "-lc"].map(String::from))
    {
        println!("cargo::rustc-link-arg-bin=headroom-shim={arg}");
    }
}

/// Fills `dir` with `lib<name>.a` links to the C compiler's static archives; the name of the
/// first archive the compiler does not have is the error.
fn link_archives(dir: &Path) -> Result<(), &'static str> {
    std::fs::create_dir_all(dir).expect("OUT_DIR is writable");
    for (name, archive) in STATIC_ARCHIVES {
        let found = Command::new("cc")
            .arg(format!("-print-file-name={archive}"))
            .output()
            .ok()
            .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
            // Without the archive, the compiler prints the bare name back.
            .filter(|path| path.is_absolute() && path.exists())
            .ok_or(archive)?;
        let link = dir.join(format!("lib{name}.a"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&found, &link).expect("OUT_DIR is writable");
    }
    Ok(())
}
