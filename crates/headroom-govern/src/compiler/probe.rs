//! Probes: calls that only ask a compiler about itself. Build tools run them with short
//! timeouts (pip gives `rustc --version` half a second), so they never wait for admission.
//! The families headroom knows share one rule, which also serves a compiler of no known
//! family; a family whose probes differ gives its own in its file.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// Whether a call only asks the compiler about itself (`--version`, `-v`, `-dumpmachine`,
/// `-print-*`, rustc's `-vV` and `--print`).
pub fn asks_about_itself(args: &[OsString]) -> bool {
    let probe_flag = |arg: &[u8]| {
        matches!(
            arg,
            b"--version"
                | b"-dumpversion"
                | b"-dumpfullversion"
                | b"-dumpmachine"
                | b"-dumpspecs"
                | b"-###"
                | b"--help"
                | b"-V"
                | b"-vV"
                | b"--print"
        ) || [b"-print-".as_slice(), b"--print-", b"--print=", b"--help="]
            .iter()
            .any(|prefix| arg.starts_with(prefix))
    };
    args.iter().any(|arg| probe_flag(arg.as_bytes())) || args == [OsString::from("-v")]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<OsString> {
        text.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn probes_are_told_from_compiles() {
        for probe in [
            "--version",
            "-v",
            "-dumpversion",
            "-dumpmachine",
            "-print-file-name=libstdc++.so",
            "-print-search-dirs",
            "-vV",
            "- --crate-name ___ --print=file-names --crate-type bin",
            "-E -x c++ - -### -o /dev/null",
        ] {
            assert!(asks_about_itself(&args(probe)), "{probe}");
        }
        for compile in [
            "-c a.cpp -o a.o",
            "-v -c a.cpp",
            "-O2 a.o b.o -o app",
            "-E a.c",
        ] {
            assert!(!asks_about_itself(&args(compile)), "{compile}");
        }
    }
}
