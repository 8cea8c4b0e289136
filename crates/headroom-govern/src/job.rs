//! What makes two compiler invocations "the same job": the real compiler, the output (or
//! source), the flags with per-file noise removed, and the directory. Jobs with the same
//! compiler and flags form a group whose peaks predict each other's.

use xxhash_rust::xxh3::xxh3_64;

/// A job's names for history, prediction and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobIdentity {
    /// Stable across builds: compiler, label, normalised flags and directory.
    pub key: String,
    /// Same compiler and normalised flags.
    pub group: u64,
    /// The output file, else the crate name, else the first source, else the compiler.
    pub label: String,
    /// The command line as people read it.
    pub command: String,
    /// The file `-o` names, as given.
    pub output: Option<String>,
}

/// Flags followed by a per-file value that says nothing about the job's memory.
const FLAGS_WITH_FILE_VALUE: [&str; 4] = ["-o", "-MF", "-MT", "-MQ"];
/// Dependency-file flags: they change no code generation.
const DEPENDENCY_FLAGS: [&str; 5] = ["-M", "-MM", "-MD", "-MMD", "-MP"];
/// Extensions of inputs: the sources a job compiles and the objects it links.
const INPUT_EXTENSIONS: [&str; 16] = [
    "c", "cc", "cpp", "cxx", "c++", "C", "cu", "hip", "m", "mm", "rs", "s", "S", "o", "a", "obj",
];

impl JobIdentity {
    pub fn new(compiler: &str, args: &[String], cwd: &str) -> JobIdentity {
        let mut flags: Vec<&str> = Vec::new();
        let mut output = None;
        let mut crate_name = None;
        let mut first_input = None;
        let mut args_iter = args.iter().map(String::as_str).peekable();
        while let Some(arg) = args_iter.next() {
            if FLAGS_WITH_FILE_VALUE.contains(&arg) {
                let value = args_iter.next();
                if arg == "-o" {
                    output = value;
                }
            } else if let Some(value) = arg.strip_prefix("-o").filter(|v| !v.is_empty()) {
                output = Some(value);
            } else if arg == "--crate-name" {
                crate_name = args_iter.next();
                flags.extend(crate_name);
            } else if DEPENDENCY_FLAGS.contains(&arg) || arg.starts_with("-Wp,-M") {
            } else if is_input(arg) {
                first_input.get_or_insert(arg);
            } else {
                flags.push(arg);
            }
        }
        let label = output
            .or(crate_name)
            .or(first_input)
            .unwrap_or(compiler)
            .to_string();
        let flags_text = flags.join("\u{1f}");
        let group = xxh3_64(format!("{compiler}\u{1e}{flags_text}").as_bytes());
        let key =
            xxh3_64(format!("{compiler}\u{1e}{label}\u{1e}{flags_text}\u{1e}{cwd}").as_bytes());
        let command = std::iter::once(compiler)
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        JobIdentity {
            key: format!("{key:016x}"),
            group,
            label,
            command,
            output: output.map(String::from),
        }
    }
}

fn is_input(arg: &str) -> bool {
    !arg.starts_with('-')
        && std::path::Path::new(arg)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|ext| INPUT_EXTENSIONS.contains(&ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(args: &str, cwd: &str) -> JobIdentity {
        let args: Vec<String> = args.split(' ').map(String::from).collect();
        JobIdentity::new("/usr/bin/g++", &args, cwd)
    }

    #[test]
    fn output_and_dependency_noise_do_not_split_groups() {
        let a = identity("-O2 -g -MD -MF a.d -c a.cpp -o a.o", "/src");
        let b = identity("-O2 -g -MMD -MF b.d -c b.cpp -ob.o", "/src");
        assert_eq!(a.group, b.group);
        assert_ne!(a.key, b.key);
        assert_eq!(a.label, "a.o");
        assert_eq!(b.label, "b.o");
    }

    #[test]
    fn flags_and_directories_make_different_jobs() {
        let base = identity("-O2 -c a.cpp -o a.o", "/src");
        assert_ne!(base.group, identity("-O3 -c a.cpp -o a.o", "/src").group);
        assert_ne!(base.key, identity("-O2 -c a.cpp -o a.o", "/other").key);
        assert_eq!(
            base.key,
            identity("-O2 -c a.cpp -o a.o", "/src").key,
            "stable across calls"
        );
    }

    #[test]
    fn labels_fall_back_to_crate_then_source() {
        assert_eq!(
            identity("--crate-name serde --edition=2021 src/lib.rs", "/").label,
            "serde"
        );
        assert_eq!(identity("-c kernel.cu", "/").label, "kernel.cu");
        assert_eq!(identity("--version", "/").label, "/usr/bin/g++");
    }
}
