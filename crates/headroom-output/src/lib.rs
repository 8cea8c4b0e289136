//! Files the commands write when asked (`--report`, `--json`, `--html`, `--mprof`, `--out`).
//! Each path is checked before any work starts, so that a mistyped directory fails at once
//! and not after an hour of building or training; each file is written whole, through a
//! temporary file renamed into place, so an interruption never leaves half of one; and it
//! gets the permissions any plain file would (0666 less the umask), not a temporary file's
//! 0600.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Fails when `path`, given with `flag`, cannot be written: its directory is missing, or it
/// is a directory itself.
pub fn check(flag: &str, path: &Path) -> Result<()> {
    let dir = dir_of(path);
    if !dir.is_dir() {
        bail!(
            "{flag} {}: there is no directory {}; create it, or write the file elsewhere",
            path.display(),
            dir.display()
        );
    }
    if path.is_dir() {
        bail!(
            "{flag} {}: that is a directory; name a file in it",
            path.display()
        );
    }
    Ok(())
}

/// Checks every path that was given.
pub fn check_all<'a>(paths: impl IntoIterator<Item = (&'a str, Option<&'a Path>)>) -> Result<()> {
    for (flag, path) in paths {
        if let Some(path) = path {
            check(flag, path)?;
        }
    }
    Ok(())
}

/// Writes `contents` to `path` (given with `flag`) whole, or not at all.
pub fn write(flag: &str, path: &Path, contents: &[u8]) -> Result<()> {
    let cannot = || format!("cannot write the {flag} file {}", path.display());
    let mut file = tempfile::Builder::new()
        .prefix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir_of(path))
        .with_context(cannot)?;
    file.write_all(contents).with_context(cannot)?;
    file.persist(path).with_context(cannot)?;
    Ok(())
}

/// The directory a file at `path` goes to.
fn dir_of(path: &Path) -> &Path {
    path.parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_checked_for_its_directory_and_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere/out.json");
        let err = check("--json", &missing).unwrap_err().to_string();
        assert!(
            err.starts_with("--json ") && err.contains("there is no directory"),
            "{err}"
        );
        let err = check("--html", dir.path()).unwrap_err().to_string();
        assert!(err.contains("that is a directory"), "{err}");
        let file = dir.path().join("out.json");
        check("--json", &file).unwrap();
        write("--json", &file, b"{}\n").unwrap();
        write("--json", &file, b"[]\n").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"[]\n");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }
}
