//! The compiler shim the governor's binary carries (`build/shim.rs` builds it, for musl where
//! it can, so that it starts without glibc's start-up), written out for each build: every
//! compiler call of a governed build starts it.
//!
//! It goes into the state directory under a directory named by its content, so that builds by
//! different versions of headroom each find their own, and keeps the name `headroom-shim`,
//! by which the governor tells shims from the processes they start (`crate::outside`).

use std::io;
use std::path::{Path, PathBuf};

use crate::intercept::TEMP_KIND;

/// The shim, as cargo built it.
pub const SHIM: &[u8] = include_bytes!(env!("HEADROOM_SHIM_BINARY"));
/// The target the shim was built for: `x86_64-unknown-linux-musl` where it needs no glibc.
pub const TARGET: &str = env!("HEADROOM_SHIM_TARGET");
/// The shim's file name.
pub const NAME: &str = "headroom-shim";

/// Writes the shim into `dir` (once per version; the file appears by an atomic rename) and
/// returns its path.
pub fn install(dir: &Path) -> io::Result<PathBuf> {
    let hash = xxhash_rust::xxh3::xxh3_64(SHIM);
    let path = dir.join(format!("shim-{hash:016x}")).join(NAME);
    headroom_paths::atomic::write_once(&path, SHIM, TEMP_KIND, true)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn installs_once_per_version_as_an_executable_named_headroom_shim() {
        let dir = tempfile::tempdir().unwrap();
        let first = install(dir.path()).unwrap();
        let second = install(dir.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!(first.file_name().unwrap(), NAME);
        assert_eq!(std::fs::read(&first).unwrap(), SHIM);
        let mode = first.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "mode {mode:o}");
        assert_eq!(
            std::fs::read_dir(first.parent().unwrap()).unwrap().count(),
            1
        );
    }

    /// The shim starts without the Rust runtime's start-up, so it must read its arguments
    /// from `main`'s own on every C library: without a governor it becomes the compiler with
    /// exactly those.
    #[test]
    fn the_carried_shim_runs_its_compiler_with_its_arguments() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let shim = install(dir.path()).unwrap();
        let status = std::process::Command::new(&shim)
            .arg0(crate::shim::LAUNCHER_NAME)
            .args(["/bin/sh", "-c", "exit $#", "sh", "one", "two words"])
            .env_remove(crate::shim::SOCKET_ENV)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(2), "{TARGET}");
    }

    #[test]
    fn the_shim_is_built_without_glibc() {
        if !TARGET.ends_with("-musl") {
            headroom_testkit::skip(
                "musl-shim",
                format_args!(
                    "the shim was built for {TARGET}, with glibc: `rustup target add` its musl \
                     variant and install musl-tools, then build again"
                ),
            );
            return;
        }
        // glibc's start-up reads its tunables from this variable, static or dynamic.
        let glibc_start = b"GLIBC_TUNABLES";
        assert!(!SHIM.windows(glibc_start.len()).any(|w| w == glibc_start));
    }
}
