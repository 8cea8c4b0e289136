//! `@file` arguments, read as each family reads them: build systems pass long command lines
//! through response files, and a job's identity must key on the flags inside them, not on the
//! name of a file that changes every build.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Response files read for one command line at most (libiberty's limit), so a file that
/// names itself ends.
const MAX_FILES: usize = 2000;
/// Bytes of response files read for one command line at most.
const MAX_BYTES: u64 = 64 << 20;

/// How a family reads an `@file` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFiles {
    /// As gcc, clang, nvcc and GNU ld read them (libiberty's `expandargv`): arguments split
    /// at whitespace, with quotes and backslashes, and `@file`s inside read too.
    Libiberty,
    /// As rustc reads them: one argument per line, taken as written, and no `@file` inside.
    Lines,
}

impl ResponseFiles {
    /// `args` with their `@file`s read so; relative names are taken from `cwd`, the
    /// compiler's working directory. An argument whose file is not a readable regular file
    /// stays as it is.
    pub fn expand(self, args: &[String], cwd: &Path) -> Vec<String> {
        match self {
            ResponseFiles::Libiberty => expand_like_libiberty(args, cwd),
            ResponseFiles::Lines => expand_lines(args, cwd),
        }
    }
}

/// `args` with every `@file` argument replaced by the arguments written in `file`, nested
/// `@file`s too; relative names are taken from `cwd`, the compiler's working directory. An
/// argument whose file is not a readable regular file stays as it is, as do the `@file`s
/// left once [`MAX_FILES`] files or [`MAX_BYTES`] bytes have been read.
pub fn expand_like_libiberty(args: &[String], cwd: &Path) -> Vec<String> {
    let mut expanded = Vec::with_capacity(args.len());
    // The arguments still to look at, the next one last.
    let mut pending: Vec<String> = args.iter().rev().cloned().collect();
    let (mut files, mut bytes) = (0, 0);
    while let Some(arg) = pending.pop() {
        let contents = arg
            .strip_prefix('@')
            .filter(|_| files < MAX_FILES)
            .and_then(|name| read_regular_file(&cwd.join(name), MAX_BYTES - bytes));
        match contents {
            Some(contents) => {
                files += 1;
                bytes += contents.len() as u64;
                pending.extend(split_arguments(&contents).into_iter().rev());
            }
            None => expanded.push(arg),
        }
    }
    expanded
}

/// `args` with every `@file` argument replaced by the lines of `file` (rustc's `@path`), up
/// to [`MAX_BYTES`] bytes of files in all.
fn expand_lines(args: &[String], cwd: &Path) -> Vec<String> {
    let mut bytes = 0;
    let mut expanded = Vec::with_capacity(args.len());
    for arg in args {
        let contents = arg
            .strip_prefix('@')
            .and_then(|name| read_regular_file(&cwd.join(name), MAX_BYTES - bytes));
        match contents {
            Some(contents) => {
                bytes += contents.len() as u64;
                expanded.extend(contents.lines().map(String::from));
            }
            None => expanded.push(arg.clone()),
        }
    }
    expanded
}

/// The text of `path` when it is a regular file (never a FIFO or a device, which could block
/// or never end) of at most `limit` bytes.
fn read_regular_file(path: &Path, limit: u64) -> Option<String> {
    let file = File::open(path).ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() || metadata.len() > limit {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// libiberty's `buildargv`: arguments separated by whitespace, with `'…'` and `"…"` quoting
/// and a backslash escaping the next character anywhere; the text ends at its first NUL.
fn split_arguments(text: &str) -> Vec<String> {
    let text = text.split('\0').next().unwrap_or_default();
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r');
    let mut arguments = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|&c| is_space(c)).is_some() {}
        if chars.peek().is_none() {
            return arguments;
        }
        let mut argument = String::new();
        let mut quote = None;
        while let Some(c) = chars.next() {
            match quote {
                _ if c == '\\' => argument.extend(chars.next()),
                Some(open) if c == open => quote = None,
                Some(_) => argument.push(c),
                None if c == '\'' || c == '"' => quote = Some(c),
                None if is_space(c) => break,
                None => argument.push(c),
            }
        }
        arguments.push(argument);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| word.to_string()).collect()
    }

    #[test]
    fn splits_like_buildargv() {
        assert_eq!(
            split_arguments(" -O2\t-DA='x y'\n\"-I a\\\"b\" c\\ d '' \\\\e\r\n"),
            strings(&["-O2", "-DA=x y", "-I a\"b", "c d", "", "\\e"])
        );
        assert_eq!(split_arguments("-c\0-O3"), strings(&["-c"]));
        assert_eq!(split_arguments(" \n\t"), Vec::<String>::new());
        assert_eq!(split_arguments("'unclosed x"), strings(&["unclosed x"]));
    }

    #[test]
    fn expands_nested_files_in_place_from_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("flags.rsp"), "-O2 @sub/more.rsp -c").unwrap();
        // Nested names are relative to the working directory too, as gcc reads them.
        std::fs::write(dir.path().join("sub/more.rsp"), "'-DX=1 2'").unwrap();
        let args = strings(&["-g", "@flags.rsp", "a.cpp", "-o", "a.o"]);
        assert_eq!(
            expand_like_libiberty(&args, dir.path()),
            strings(&["-g", "-O2", "-DX=1 2", "-c", "a.cpp", "-o", "a.o"])
        );
    }

    #[test]
    fn leaves_what_it_cannot_read_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("directory")).unwrap();
        let args = strings(&["@missing.rsp", "@directory", "@", "@/dev/zero", "x@y"]);
        assert_eq!(expand_like_libiberty(&args, dir.path()), args);
    }

    #[test]
    fn a_file_that_names_itself_ends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("loop.rsp"), "-x @loop.rsp").unwrap();
        let expanded = expand_like_libiberty(&strings(&["@loop.rsp"]), dir.path());
        assert_eq!(expanded.len(), MAX_FILES + 1);
        assert_eq!(expanded.last().map(String::as_str), Some("@loop.rsp"));
    }

    #[test]
    fn rustc_reads_one_argument_per_line_as_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("args"),
            "--cfg\nfeature=\"std\"\n--crate-name\nmy crate\n@inner\n",
        )
        .unwrap();
        let args = strings(&["@args", "src/lib.rs", "@missing"]);
        assert_eq!(
            ResponseFiles::Lines.expand(&args, dir.path()),
            strings(&[
                "--cfg",
                "feature=\"std\"",
                "--crate-name",
                "my crate",
                "@inner",
                "src/lib.rs",
                "@missing"
            ])
        );
        assert_eq!(
            ResponseFiles::Libiberty.expand(&args, dir.path())[..4],
            strings(&["--cfg", "feature=std", "--crate-name", "my"]),
            "libiberty's reading, which rustc's is not"
        );
    }

    #[test]
    fn the_job_key_follows_the_file_contents() {
        let dir = tempfile::tempdir().unwrap();
        let key = |flags: &str| {
            std::fs::write(dir.path().join("a.rsp"), flags).unwrap();
            let args = expand_like_libiberty(&strings(&["@a.rsp", "-c", "a.cpp"]), dir.path());
            crate::job::JobIdentity::new("/usr/bin/g++", &args, "/src").key
        };
        assert_ne!(key("-O2"), key("-O3"));
        assert_eq!(key("-O2"), key("  -O2\n"));
    }
}
