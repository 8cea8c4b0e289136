//! Naming a job so that another machine knows it: shared history (`headroom history push` and
//! `pull`) matches peaks by keys that hold no path of the machine that measured them. The
//! compiler is named by its file name and version, not its path, and every path is written
//! relative to the places that differ between machines: the project's root, a Python
//! environment's `site-packages`, the user's home.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A compiler that does not print its version in this long is named without one.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// This machine's places, as they are spelled in compiler command lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Places {
    root: String,
    home: Option<String>,
}

impl Places {
    /// The project's root and the user's home; `/` is no place worth naming.
    pub fn new(root: &str, home: Option<&str>) -> Places {
        let place = |path: &str| {
            let path = path.trim_end_matches('/');
            (!path.is_empty()).then(|| path.to_string())
        };
        Places {
            root: place(root).unwrap_or_default(),
            home: home.and_then(place),
        }
    }

    /// `text` with the project's root written `$ROOT`, everything up to a `site-packages/` or
    /// `dist-packages/` written `$SITE/`, and the home directory written `$HOME`.
    pub fn portable(&self, text: &str) -> String {
        let mut text = if self.root.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.root, "$ROOT")
        };
        for packages in ["/site-packages/", "/dist-packages/"] {
            while let Some(at) = text.find(packages) {
                // The path starts at the first `/` after the last separator before it.
                let segment = text[..at]
                    .rfind([' ', '=', ':', ',', '"', '\''])
                    .map_or(0, |separator| separator + 1);
                let start = text[segment..at]
                    .find('/')
                    .map_or(at, |slash| segment + slash);
                text.replace_range(start..at + packages.len(), "$SITE/");
            }
        }
        match &self.home {
            Some(home) => text.replace(home.as_str(), "$HOME"),
            None => text,
        }
    }
}

/// The compiler at `path` as machines share it: its real file's name and its version
/// (`x86_64-linux-gnu-g++-12 12.2.0`, `nvcc 13.2`), from the first version-like word
/// `--version` prints. A compiler that prints none, or none in time, is named by its file
/// alone.
pub fn compiler_id(path: &str) -> String {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.into());
    let name = real
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
    match version_text(&real).as_deref().and_then(version_in) {
        Some(version) => format!("{name} {version}"),
        None => name,
    }
}

/// What `compiler --version` prints on stdout, if it prints it in time. A process it left
/// holding its output (a compile server a wrapper started) is not waited for.
fn version_text(compiler: &Path) -> Option<String> {
    let mut command = Command::new(compiler);
    command.arg("--version").stdin(Stdio::null());
    let output = headroom_process::output_of(&mut command, Some(VERSION_TIMEOUT)).ok()?;
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The first word of `text` that looks like a version: digits, a dot, digits, and perhaps
/// more of those (`12.2.0` in `g++ (Debian 12.2.0-14) 12.2.0`).
fn version_in(text: &str) -> Option<&str> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|word| word.trim_matches('.'))
        .find(|word| {
            let mut parts = word.split('.');
            parts.clone().count() >= 2 && parts.all(|p| !p.is_empty())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_named_instead_of_spelled_out() {
        let places = Places::new("/home/ana/proj/", Some("/home/ana"));
        assert_eq!(
            places.portable("-I/home/ana/proj/include"),
            "-I$ROOT/include"
        );
        assert_eq!(
            places.portable("-isystem=/home/ana/.venv/lib/python3.11/site-packages/torch/include"),
            "-isystem=$SITE/torch/include"
        );
        assert_eq!(
            places.portable("-I/usr/lib/python3/dist-packages/numpy/core/include"),
            "-I$SITE/numpy/core/include"
        );
        assert_eq!(places.portable("-I/home/ana/other"), "-I$HOME/other");
        assert_eq!(places.portable("-O2"), "-O2");
        let root_only = Places::new("/", None);
        assert_eq!(root_only.portable("-I/usr/include"), "-I/usr/include");
    }

    #[test]
    fn versions_are_found_in_what_compilers_print() {
        assert_eq!(
            version_in("g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022"),
            Some("12.2.0")
        );
        assert_eq!(
            version_in("Debian clang version 19.1.7 (3)\nTarget: x86_64-pc-linux-gnu"),
            Some("19.1.7")
        );
        assert_eq!(
            version_in("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2026 NVIDIA Corporation\nCuda compilation tools, release 13.2, V13.2.86"),
            Some("13.2")
        );
        assert_eq!(version_in("no version here. 3."), None);
    }

    #[test]
    fn a_real_compiler_is_named_by_file_and_version() {
        let Some(cc) = ["/usr/bin/cc", "/usr/bin/gcc"]
            .into_iter()
            .find(|p| Path::new(p).exists())
        else {
            headroom_testkit::skip("cc", "no C compiler at /usr/bin/cc or /usr/bin/gcc");
            return;
        };
        let id = compiler_id(cc);
        let (name, version) = id.split_once(' ').expect("a version");
        assert!(name.contains("gcc") || name.contains("clang"), "{id}");
        assert!(version.chars().next().unwrap().is_ascii_digit(), "{id}");
        assert_eq!(compiler_id("/nonexistent/cc"), "cc");
    }
}
