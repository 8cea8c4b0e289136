//! The interceptor that makes `headroom build` see every compiler, however the build names it.
//!
//! `intercept/intercept.c` is built into a small shared library (see `build.rs`) that the
//! build's processes load through `LD_PRELOAD`. Its `execve`, `execvp`, `posix_spawn`… send
//! every compiler exec through the launcher (`HEADROOM_LAUNCHER`), including compilers
//! called by absolute path from a CMake cache configured before headroom ran or from torch's
//! `$CUDA_HOME/bin/nvcc`. Any other program starts untouched. The library is embedded in
//! this crate and written to the state directory under a name that changes with its content.

use std::ffi::{c_char, OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The interceptor, as the C compiler built it.
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libheadroom-intercept.so"));
/// File names of the interceptor start so, whatever its version (`HEADROOM_INTERCEPTOR_PREFIX`
/// in `preload.h`).
const FILE_PREFIX: &str = "libheadroom-intercept";
/// Temporary files of the state directory start so (see `headroom_paths::temp`).
pub const TEMP_KIND: &str = ".tmp";
/// The program the interceptor runs instead of a compiler, as `headroom-launch COMPILER ARGS…`.
pub const LAUNCHER_ENV: &str = "HEADROOM_LAUNCHER";
const PRELOAD_ENV: &str = "LD_PRELOAD";

extern "C" {
    fn headroom_preload_without_interceptor(
        value: *const c_char,
        len: usize,
        out: *mut c_char,
    ) -> usize;
}

/// Writes the interceptor into `dir` (once per version; each file appears by an atomic rename)
/// and returns its path.
pub fn install(dir: &Path) -> io::Result<PathBuf> {
    let hash = xxhash_rust::xxh3::xxh3_64(LIBRARY);
    let path = dir.join(format!("{FILE_PREFIX}-{hash:016x}.so"));
    if path
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|b| b" :".contains(b))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "LD_PRELOAD cannot hold a path with a space or a colon",
        ));
    }
    headroom_paths::atomic::write_once(&path, LIBRARY, TEMP_KIND, false)?;
    Ok(path)
}

/// `LD_PRELOAD` with `library` first, keeping what the user preloads.
pub fn preload_with(library: &Path, existing: Option<&OsStr>) -> OsString {
    let mut value = library.as_os_str().to_os_string();
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}

/// `LD_PRELOAD` without headroom's interceptor, for a job's own processes (nvcc's cicc, gcc's
/// cc1plus): `None` when nothing else is left. The rule the interceptor applies, from the same
/// C code.
pub fn preload_without_interceptor(existing: &OsStr) -> Option<OsString> {
    let value = existing.as_bytes();
    let mut kept = vec![0u8; value.len()];
    // SAFETY: the C function reads `value.len()` bytes of `value`, writes at most as many
    // into `kept` and keeps no pointer.
    let len = unsafe {
        headroom_preload_without_interceptor(
            value.as_ptr().cast(),
            value.len(),
            kept.as_mut_ptr().cast(),
        )
    };
    kept.truncate(len);
    (!kept.is_empty()).then(|| OsString::from_vec(kept))
}

/// The `LD_PRELOAD` a job's processes get: `None` when it is to be removed.
pub fn job_preload() -> Option<Option<OsString>> {
    let existing = std::env::var_os(PRELOAD_ENV)?;
    Some(preload_without_interceptor(&existing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_keeps_the_users_libraries_and_jobs_lose_only_ours() {
        let ours = Path::new("/state/lib/libheadroom-intercept-0123.so");
        assert_eq!(preload_with(ours, None), ours.as_os_str());
        let both = preload_with(ours, Some(OsStr::new("libjemalloc.so.2")));
        assert_eq!(
            both,
            OsStr::new("/state/lib/libheadroom-intercept-0123.so:libjemalloc.so.2")
        );
        assert_eq!(
            preload_without_interceptor(&both),
            Some(OsString::from("libjemalloc.so.2"))
        );
        assert_eq!(preload_without_interceptor(ours.as_os_str()), None);
    }

    #[test]
    fn installs_once_per_version_with_no_temporary_left() {
        let dir = tempfile::tempdir().unwrap();
        let first = install(dir.path()).unwrap();
        let second = install(dir.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!(std::fs::read(&first).unwrap(), LIBRARY);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
