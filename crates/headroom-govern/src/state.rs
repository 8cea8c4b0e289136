//! Where one build keeps its state: the shim directory, the interceptor and the history.
//! headroom fails open: a read-only or missing `HOME` must neither stop a build nor cost it
//! its summary and `--report`. So the user's state directory is used when it can be written,
//! else a private temporary one that lasts as long as the build, and the user is told that
//! the history is not kept for the next build. (A history that cannot be opened is the
//! governor's to replace, for the build only: it is the one process that opens it; see
//! `crate::governor::record`.)

use std::path::{Path, PathBuf};

/// The state directory of one build, and the history it writes.
pub struct BuildState {
    dir: PathBuf,
    history: PathBuf,
    /// Temporary directories in use, removed when the build's state is dropped.
    _temporary: Vec<tempfile::TempDir>,
}

impl BuildState {
    /// The user's state directory (`headroom_paths::state_dir`) and its history when they can
    /// be used, else temporary ones; each fallback is announced on stderr.
    pub fn for_build() -> BuildState {
        BuildState::in_dir(headroom_paths::state_dir())
    }

    fn in_dir(wanted: PathBuf) -> BuildState {
        let mut temporary = Vec::new();
        let dir = match writable(&wanted) {
            Ok(()) => wanted,
            Err(err) => match private_temporary("headroom-state-") {
                Some(fallback) => {
                    headroom_output::say!(
                        "headroom: warning: cannot write to {} ({err}); this build keeps its \
                         shims, interceptor and history in {} until it ends (set \
                         HEADROOM_STATE_DIR to a writable directory to keep the history)",
                        wanted.display(),
                        fallback.path().display()
                    );
                    let dir = fallback.path().to_path_buf();
                    temporary.push(fallback);
                    dir
                }
                None => wanted,
            },
        };
        let history = dir.join("history.sqlite");
        BuildState {
            dir,
            history,
            _temporary: temporary,
        }
    }

    /// Where the shims and the interceptor go.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The history this build writes and its summary is read from.
    pub fn history(&self) -> &Path {
        &self.history
    }
}

/// Whether files can be created in `dir` (created if missing): a directory that exists can
/// still be read-only, so a file is created and removed.
fn writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    tempfile::NamedTempFile::new_in(dir).map(drop)
}

/// A new directory only this user can enter, under the temporary directory.
fn private_temporary(prefix: &str) -> Option<tempfile::TempDir> {
    tempfile::Builder::new().prefix(prefix).tempdir().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_directory_that_cannot_be_written_falls_back_to_a_temporary_one() {
        let parent = tempfile::tempdir().unwrap();
        // A file where the directory should be: no user, root included, can create in it.
        let blocked = parent.path().join("not-a-dir");
        std::fs::write(&blocked, "").unwrap();
        let state = BuildState::in_dir(blocked.join("headroom"));
        assert_ne!(state.dir(), blocked.join("headroom"));
        assert!(state.dir().is_dir());
        assert_eq!(state.history(), state.dir().join("history.sqlite"));
        let kept = state.dir().to_path_buf();
        drop(state);
        assert!(!kept.exists(), "removed with the build's state");
    }

    #[test]
    fn a_usable_state_directory_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let state = BuildState::in_dir(dir.path().join("state"));
        assert_eq!(state.dir(), dir.path().join("state"));
        assert_eq!(state.history(), dir.path().join("state/history.sqlite"));
    }
}
