//! The shim directory: a stable per-user place holding `headroom-launch`, the launcher that
//! runs a compiler governed (`headroom-launch COMPILER ARGS…`), for `headroom kernels build`
//! and for users who set it as `CMAKE_<LANG>_COMPILER_LAUNCHER` themselves.
//!
//! Builds no longer find compilers here: the interceptor (`intercept`) catches them by any
//! path. Trees configured by earlier versions may have recorded links from this directory
//! named like compilers (`c++`); those links still lead to headroom, which acts as the
//! shim when called by a compiler's name and, without a governor, simply runs the compiler.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::intercept::TEMP_KIND;
use crate::shim::LAUNCHER_NAME;

/// The shim directory `shims` under `state_dir`, with its launcher pointing at `exe`; where
/// that cannot be made (a file in its place, a directory where the launcher goes, no room),
/// a temporary directory that lasts as long as the returned guard, after a warning: a damaged
/// state directory must not keep a build from starting. Fails only when neither can be made.
pub fn install_or_temporary(
    state_dir: &Path,
    exe: &Path,
) -> Result<(PathBuf, Option<tempfile::TempDir>), (PathBuf, io::Error)> {
    let dir = state_dir.join("shims");
    let Err(err) = install(&dir, exe) else {
        return Ok((dir, None));
    };
    let temporary = tempfile::Builder::new()
        .prefix("headroom-shims-")
        .tempdir()
        .map_err(|source| (dir.clone(), source))?;
    install(temporary.path(), exe).map_err(|source| (temporary.path().to_path_buf(), source))?;
    let _ = writeln!(
        io::stderr(),
        "headroom: warning: cannot set up the shim directory {} ({err}); this build uses {} \
         (remove or repair {} to keep the launcher in place)",
        dir.display(),
        temporary.path().display(),
        dir.display()
    );
    Ok((temporary.path().to_path_buf(), Some(temporary)))
}

/// Creates `dir` if needed and points its `headroom-launch` at `exe`. The link is replaced
/// by an atomic rename, so builds running at the same time always find a whole one.
pub fn install(dir: &Path, exe: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    // A build killed while replacing the link left its temp link: the next one removes it.
    headroom_paths::temp::remove_orphaned(dir, TEMP_KIND);
    let link = dir.join(LAUNCHER_NAME);
    if std::fs::read_link(&link).is_ok_and(|target| target == exe) {
        return Ok(());
    }
    headroom_paths::atomic::replace_symlink(exe, &link, TEMP_KIND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_shim_directory_gives_way_to_a_temporary_one() {
        let exe = std::env::current_exe().unwrap();
        let file_in_place = tempfile::tempdir().unwrap();
        std::fs::write(file_in_place.path().join("shims"), "x").unwrap();
        let dir_as_launcher = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir_as_launcher.path().join("shims/headroom-launch/x")).unwrap();
        for state in [file_in_place.path(), dir_as_launcher.path()] {
            let (dir, guard) = install_or_temporary(state, &exe).unwrap();
            assert!(guard.is_some(), "{}", dir.display());
            assert_eq!(std::fs::read_link(dir.join(LAUNCHER_NAME)).unwrap(), exe);
        }
    }

    #[test]
    fn installs_the_launcher_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let shims = dir.path().join("shims");
        let exe = std::env::current_exe().unwrap();
        install(&shims, &exe).unwrap();
        install(&shims, &exe).unwrap();
        assert_eq!(std::fs::read_link(shims.join(LAUNCHER_NAME)).unwrap(), exe);
        assert_eq!(
            std::fs::read_dir(&shims).unwrap().count(),
            1,
            "no temporary links left"
        );
    }
}
