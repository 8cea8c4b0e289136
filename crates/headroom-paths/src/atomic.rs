//! Replacing a whole file, or a symlink, so that no reader ever sees half of one and a crash
//! leaves either the old or the new one.
//!
//! Every file headroom replaces whole (the interceptor, the reports, the kernel cache's
//! records, the ledger between governors) goes through [`write`]: the bytes go to a temporary
//! file in the same directory, named by [`crate::temp`]'s rule so the next run removes what a
//! killed writer left; the file is fsynced, renamed over the final path, and the directory is
//! fsynced so the rename itself survives a power loss. [`replace_symlink`] does the same for a
//! link.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::temp;

/// Writes `bytes` to `path` whole: a temporary file of kind `kind` (see [`crate::temp`]) in
/// `path`'s directory, fsynced, renamed over `path`, then the directory fsynced. The file gets
/// a plain file's permissions (0666 less the umask). On an error nothing is left behind and
/// `path` is as it was.
pub fn write(path: &Path, bytes: &[u8], kind: &str) -> io::Result<()> {
    let temporary = write_temporary(path, bytes, kind, 0o666)?;
    finish(std::fs::rename(&temporary, path), &temporary, path)
}

/// Writes `bytes` to `path` as [`write`] does, unless a file of their length is there: for a
/// file named by its content's hash, which one version of headroom writes once and every later
/// run finds. Creates the directory, after removing what a writer killed in it left behind.
/// An `executable` file gets a program's permissions (0777 less the umask).
pub fn write_once(path: &Path, bytes: &[u8], kind: &str, executable: bool) -> io::Result<()> {
    let dir = directory_of(path);
    temp::remove_orphaned(dir, kind);
    if path.metadata().is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let mode = if executable { 0o777 } else { 0o666 };
    let temporary = write_temporary(path, bytes, kind, mode)?;
    finish(std::fs::rename(&temporary, path), &temporary, path)
}

/// Writes `bytes` to `path` whole as [`write`] does, but only where `path` does not exist:
/// an existing file is kept, and the error is `AlreadyExists`.
pub fn write_new(path: &Path, bytes: &[u8], kind: &str) -> io::Result<()> {
    let temporary = write_temporary(path, bytes, kind, 0o666)?;
    let linked = std::fs::hard_link(&temporary, path);
    let _ = std::fs::remove_file(&temporary);
    linked?;
    sync_dir(path)
}

/// Points the symlink `link` at `target`, replacing whatever link is there in one rename, so
/// that a reader always finds a whole link; the directory is fsynced after.
pub fn replace_symlink(target: &Path, link: &Path, kind: &str) -> io::Result<()> {
    let temporary = temporary_beside(link, kind);
    std::os::unix::fs::symlink(target, &temporary)?;
    finish(std::fs::rename(&temporary, link), &temporary, link)
}

/// Writes and fsyncs `bytes` in a new temporary file beside `path`, created with `mode` (less
/// the umask); removes it on an error.
fn write_temporary(path: &Path, bytes: &[u8], kind: &str, mode: u32) -> io::Result<PathBuf> {
    let temporary = temporary_beside(path, kind);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(err);
    }
    Ok(temporary)
}

/// Completes a rename of `temporary` over `path`: fsyncs the directory when it succeeded,
/// removes the temporary when it failed.
fn finish(renamed: io::Result<()>, temporary: &Path, path: &Path) -> io::Result<()> {
    if let Err(err) = renamed {
        let _ = std::fs::remove_file(temporary);
        return Err(err);
    }
    sync_dir(path)
}

/// Fsyncs the directory holding `path`, so an entry made or renamed there is on disk.
fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(directory_of(path))?.sync_all()
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// A name for a temporary entry beside `path`, unique within this process: the kind and pid
/// prefix, a counter, and the final name (which says what it was for).
fn temporary_beside(path: &Path, kind: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let count = NEXT.fetch_add(1, Ordering::Relaxed);
    directory_of(path).join(format!("{}{count}-{name}", temp::prefix(kind)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_is_replaced_whole_with_plain_permissions_and_nothing_else_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        write(&path, b"old", ".tmp").unwrap();
        write(&path, b"new", ".tmp").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["report.json"]);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), mode(&plain), "a plain file's mode, not 0600");
    }

    #[test]
    fn a_file_written_once_is_kept_and_a_killed_writers_temporary_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1").join("headroom-shim");
        write_once(&path, b"one", ".tmp", true).unwrap();
        let dead = temp::tests::ended_pid();
        let orphan = dir.path().join(format!("v1/.tmp{dead}-9-headroom-shim"));
        std::fs::write(&orphan, "half").unwrap();
        std::fs::write(&path, b"two").unwrap();
        write_once(&path, b"one", ".tmp", true).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"two",
            "a whole file is not written again"
        );
        assert_eq!(names(&dir.path().join("v1")), ["headroom-shim"]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "a program's mode, {mode:o}");
    }

    #[test]
    fn a_failed_rename_leaves_the_old_entry_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // A directory with an entry cannot be renamed over.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), "x").unwrap();
        assert!(write(&path, b"new", ".tmp").is_err());
        assert!(replace_symlink(Path::new("nowhere"), &path, ".tmp").is_err());
        assert_eq!(names(dir.path()), ["taken"]);
    }

    #[test]
    fn a_new_file_never_replaces_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.json");
        write_new(&path, b"first", ".tmp").unwrap();
        let err = write_new(&path, b"second", ".tmp").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(names(dir.path()), ["key.json"]);
    }

    #[test]
    fn a_symlink_is_replaced_in_one_rename() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("headroom-launch");
        replace_symlink(Path::new("/one"), &link, ".tmp").unwrap();
        replace_symlink(Path::new("/two"), &link, ".tmp").unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/two"));
        assert_eq!(names(dir.path()), ["headroom-launch"]);
    }

    #[test]
    fn a_killed_writers_temporary_is_one_the_next_run_removes() {
        let path = Path::new("/any/where/lib.so");
        let temporary = temporary_beside(path, "intercept-");
        let name = temporary.file_name().unwrap().to_string_lossy();
        assert!(name.starts_with(&temp::prefix("intercept-")), "{name}");
        assert_eq!(temporary.parent(), path.parent());
    }
}
