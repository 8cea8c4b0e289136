//! The shim directory put first on `PATH`: links named like every compiler a build may call,
//! all pointing at the headroom binary, plus the launcher link for absolute compiler paths.
//!
//! It lives at a stable per-user path, so a CMake cache that recorded a shim as its compiler
//! keeps working after the build: without a governor the shim is just the compiler.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io;
use std::path::Path;

use crate::ladder::is_version_suffix;
use crate::shim::LAUNCHER_NAME;

/// Compilers shimmed whether or not they are on PATH.
const BASE_NAMES: [&str; 9] = [
    "cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "hipcc", "rustc",
];
/// Families whose versioned or target-prefixed names are shimmed too (`g++-12`,
/// `x86_64-linux-gnu-gcc-12`, `clang++-19`).
const FAMILIES: [&str; 6] = ["gcc", "g++", "clang", "clang++", "cc", "c++"];

/// The names to shim: the base names plus every versioned compiler name found on `path`.
pub fn compiler_names(path: &OsStr) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = BASE_NAMES.iter().map(|n| n.to_string()).collect();
    for dir in std::env::split_paths(path) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if let Some(name) = entry
                .file_name()
                .to_str()
                .filter(|name| is_compiler_name(name))
            {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Whether `name` is one the shim directory may hold.
pub fn is_shim_name(name: &str) -> bool {
    BASE_NAMES.contains(&name) || is_compiler_name(name)
}

/// `g++-12`, `clang-19`, `x86_64-linux-gnu-gcc`: a compiler family name, maybe prefixed by a
/// target triple, maybe followed by a version. Not `c++filt` or `clang-tidy`.
pub fn is_compiler_name(name: &str) -> bool {
    FAMILIES.iter().any(|family| {
        name.match_indices(family).any(|(at, _)| {
            let (before, after) = (&name[..at], &name[at + family.len()..]);
            (before.is_empty() || before.ends_with('-')) && is_version_suffix(after)
        })
    })
}

/// Creates or refreshes the shim directory `dir` with links to `exe`. Each link is replaced
/// atomically, so builds running at the same time always see a complete directory.
pub fn install(dir: &Path, exe: &Path, names: &BTreeSet<String>) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    for name in names.iter().map(String::as_str).chain([LAUNCHER_NAME]) {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_ok_and(|target| target == exe) {
            continue;
        }
        let temporary = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(exe, &temporary)?;
        std::fs::rename(&temporary, &link)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_compiler_names() {
        for name in [
            "gcc",
            "g++-12",
            "clang++-19",
            "x86_64-linux-gnu-g++-12",
            "cc",
            "aarch64-linux-gnu-gcc",
        ] {
            assert!(is_compiler_name(name), "{name}");
        }
        for name in [
            "c++filt",
            "clang-tidy",
            "gcc-ar",
            "ccache",
            "gccgo",
            "g++-wrapper",
            "lcc",
        ] {
            assert!(!is_compiler_name(name), "{name}");
        }
    }

    #[test]
    fn installs_links_idempotently() {
        let dir = tempfile_dir();
        let exe = std::env::current_exe().unwrap();
        let names: BTreeSet<String> = ["g++".to_string()].into();
        install(&dir, &exe, &names).unwrap();
        install(&dir, &exe, &names).unwrap();
        assert_eq!(std::fs::read_link(dir.join("g++")).unwrap(), exe);
        assert_eq!(std::fs::read_link(dir.join(LAUNCHER_NAME)).unwrap(), exe);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "no temporary links left"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("headroom-shimdir-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
