//! Temporary names that carry the id of the process that made them (`<kind><pid>-…`).
//!
//! headroom writes files whole under a temporary name and renames them into place, and keeps
//! sockets and work directories for as long as a command runs. A process killed in between
//! (SIGKILL, the OOM killer) leaves those behind; its id in the name lets the next run tell
//! them from those of a process still writing, and remove them, so nothing temporary outlives
//! the next run. Where /proc cannot be read every owner counts as alive and nothing is removed.

use std::path::Path;

/// The start of the temporary names of kind `kind` that this process makes: `<kind><pid>-`.
pub fn prefix(kind: &str) -> String {
    format!("{kind}{}-", std::process::id())
}

/// Whether `name` is a temporary name of kind `kind` whose process has ended.
pub fn is_orphaned(name: &str, kind: &str) -> bool {
    let Some((pid, _)) = name
        .strip_prefix(kind)
        .and_then(|rest| rest.split_once('-'))
    else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    let proc = Path::new("/proc");
    proc.join("self").exists() && !proc.join(pid.to_string()).exists()
}

/// Removes the entries of `dir` (files, links, sockets, whole directories) of kind `kind`
/// whose process has ended; returns how many. Errors are ignored: another run may be removing
/// the same leftovers, and a leftover that stays is tried again by the next run.
pub fn remove_orphaned(dir: &Path, kind: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !is_orphaned(&entry.file_name().to_string_lossy(), kind) {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        removed += usize::from(gone.is_ok());
    }
    removed
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A process id that has ended: a child that was waited for.
    /// The pid of a process that has ended.
    pub(crate) fn ended_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn only_names_of_ended_processes_are_orphaned() {
        let dead = ended_pid();
        assert!(is_orphaned(&format!(".tmp{dead}-x1"), ".tmp"));
        assert!(!is_orphaned(&format!("{}x1", prefix(".tmp")), ".tmp"));
        assert!(!is_orphaned(&format!(".tmp{dead}-x1"), "session-"));
        assert!(!is_orphaned(".tmpAbC123", ".tmp"), "a name without a pid");
        assert!(!is_orphaned(".tmp-12", ".tmp"));
    }

    #[test]
    fn removes_files_links_and_directories_of_ended_processes_only() {
        let dir = tempfile::tempdir().unwrap();
        let dead = ended_pid();
        let path = |name: String| dir.path().join(name);
        std::fs::write(path(format!(".tmp{dead}-file")), "half").unwrap();
        std::os::unix::fs::symlink("nowhere", path(format!(".tmp{dead}-link"))).unwrap();
        std::fs::create_dir(path(format!(".tmp{dead}-dir"))).unwrap();
        std::fs::write(path(format!(".tmp{dead}-dir/inside")), "").unwrap();
        std::fs::write(path(format!("{}mine", prefix(".tmp"))), "live").unwrap();
        std::fs::write(path("entry.json".into()), "{}").unwrap();
        assert_eq!(remove_orphaned(dir.path(), ".tmp"), 3);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [format!("{}mine", prefix(".tmp")), "entry.json".into()]
        );
    }
}
