//! Where the commands' output goes, for every crate of headroom.
//!
//! Files the commands write when asked (`--report`, `--json`, `--html`, `--mprof`, `--out`):
//! each path is checked before any work starts, so that a mistyped directory fails at once
//! and not after an hour of building or training; each file is written whole, through a
//! temporary file renamed into place, so an interruption never leaves half of one; and it
//! gets the permissions any plain file would (0666 less the umask), not a temporary file's
//! 0600. The path `-` means stdout, for every such flag.
//!
//! Output to a reader that has gone (`| head`) is no failure of the command, and a message
//! on stderr never panics (see [`say`]).

mod say;

use std::io::{self, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The kind of the temporary names output files are written under (`headroom_paths::temp`).
const TEMP_KIND: &str = ".tmp";

pub use say::say;

/// The path that means stdout.
const STDOUT: &str = "-";

/// Whether `path` is `-`, which means stdout.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == STDOUT
}

/// Fails when `path`, given with `flag`, cannot be written: its directory is missing, or it
/// is a directory itself. `-` (stdout) can always be written.
pub fn check(flag: &str, path: &Path) -> Result<()> {
    if is_stdout(path) {
        return Ok(());
    }
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

/// Checks every path that was given, and that at most one of them is stdout.
pub fn check_all<'a>(paths: impl IntoIterator<Item = (&'a str, Option<&'a Path>)>) -> Result<()> {
    let mut to_stdout: Option<&str> = None;
    for (flag, path) in paths {
        let Some(path) = path else { continue };
        check(flag, path)?;
        if is_stdout(path) {
            if let Some(first) = to_stdout {
                bail!(
                    "{first} - and {flag} -: only one output can go to stdout; give the other \
a file"
                );
            }
            to_stdout = Some(flag);
        }
    }
    Ok(())
}

/// Writes `contents` to `path` (given with `flag`) whole, or not at all; to stdout for `-`.
pub fn write(flag: &str, path: &Path, contents: &[u8]) -> Result<()> {
    if is_stdout(path) {
        return print(contents)
            .with_context(|| format!("cannot write the {flag} output to stdout"));
    }
    headroom_paths::atomic::write(path, contents, TEMP_KIND)
        .with_context(|| format!("cannot write the {flag} file {}", path.display()))
}

/// Writes `contents` to stdout and flushes it. A reader that has gone (`| head`) chose to
/// read no more: that is no error, and the rest is dropped.
pub fn print(contents: &[u8]) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(contents).and_then(|()| stdout.flush()) {
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
}

/// Prints `value` on stdout as JSON when `json` (for scripts), else the text `human` makes
/// (for people). A reader that has gone (`| head`) is no error.
pub fn print_json_or<T: serde::Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> Result<()> {
    let text = if json {
        serde_json::to_string_pretty(value)? + "\n"
    } else {
        human()
    };
    print(text.as_bytes())?;
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

    #[test]
    fn a_dash_is_stdout_and_only_one_output_may_take_it() {
        let dash = Path::new("-");
        check("--json", dash).unwrap();
        check_all([("--json", Some(dash)), ("--html", None)]).unwrap();
        let err = check_all([("--json", Some(dash)), ("--trace", Some(dash))])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--json - and --trace -: only one output"),
            "{err}"
        );
    }
}
