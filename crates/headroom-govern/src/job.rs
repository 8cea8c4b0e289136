//! What makes two compiler invocations "the same job": the real compiler, the output (or
//! source), the flags with per-file noise removed, and the directory. Jobs with the same
//! compiler and flags form a group whose peaks predict each other's. The same ingredients,
//! with this machine's paths taken out, make the portable key that other machines know the
//! job by ([`crate::portable`]).

use std::sync::LazyLock;

use memchr::memmem::Finder;
use xxhash_rust::xxh3::xxh3_64;

use crate::portable::Places;

/// A job's names for history, prediction and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobIdentity {
    /// Stable across builds: compiler, label, normalised flags and directory.
    pub key: String,
    /// Same compiler and normalised flags.
    pub group: u64,
    /// The output file, else the crate name, else the first source, else the compiler; for
    /// a job that only preprocesses (`-E`), the first source first.
    pub label: String,
    /// The command line as people read it.
    pub command: String,
    /// The file `-o` names, as given.
    pub output: Option<String>,
    /// The normalised flags, as the key hashes them.
    flags: Vec<String>,
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
        let mut preprocess_only = false;
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
                preprocess_only |= arg == "-E";
                flags.push(arg);
            }
        }
        // Tools that preprocess before they compile (ccache, distcc) write the preprocessed
        // source to a temporary file of a new name each time: named by it, the job would be
        // a new one in every build.
        let named_by = if preprocess_only {
            first_input.or(output)
        } else {
            output.or(crate_name).or(first_input)
        };
        let label = named_by.unwrap_or(compiler).to_string();
        let flags: Vec<String> = flags.into_iter().map(without_temporary_names).collect();
        let group = xxh3_64(format!("{compiler}\u{1e}{}", flags.join("\u{1f}")).as_bytes());
        let key = hash_key(
            compiler,
            &without_temporary_names(&label),
            &flags,
            &without_temporary_names(cwd),
        );
        let command = std::iter::once(compiler)
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        JobIdentity {
            key,
            group,
            label,
            command,
            output: output.map(String::from),
            flags,
        }
    }

    /// The key another machine knows this job by: the compiler by name and version
    /// (`compiler_id`, from [`crate::portable::compiler_id`]) instead of its path, and the
    /// label, flags and directory with this machine's places (`places`) named instead of
    /// spelled out.
    pub fn portable_key(&self, compiler_id: &str, cwd: &str, places: &Places) -> String {
        let flags: Vec<String> = self.flags.iter().map(|f| places.portable(f)).collect();
        hash_key(
            compiler_id,
            &places.portable(&self.label),
            &flags,
            &places.portable(cwd),
        )
    }
}

/// The key of the job `compiler` runs with `flags` in `cwd` to make `label`.
fn hash_key(compiler: &str, label: &str, flags: &[String], cwd: &str) -> String {
    let flags_text = flags.join("\u{1f}");
    let key = xxh3_64(format!("{compiler}\u{1e}{label}\u{1e}{flags_text}\u{1e}{cwd}").as_bytes());
    format!("{key:016x}")
}

/// Prefixes of directories and files that tools name anew each time, followed by the random
/// part: pip's build directories, isolated build environments and unpacked sdists, and
/// CMake's try-compile projects (`TryCompile-a1B2c3/CMakeFiles/cmTC_4d5e6.dir`).
const TEMPORARY_PREFIXES: [&str; 7] = [
    "pip-req-build-",
    "pip-install-",
    "pip-build-env-",
    "pip-wheel-",
    "pip-modern-metadata-",
    "TryCompile-",
    "cmTC_",
];

/// What every temporary name below contains: text without any of them is left as it is
/// without looking further, which is most flags (this runs on every compiler call).
static TEMPORARY_MARKERS: LazyLock<[Finder<'static>; 5]> =
    LazyLock::new(|| ["tmp", "pip-", "TryCompile-", "cmTC_", "sdists-v"].map(Finder::new));

/// `text` (a directory, a flag, an output) with the random part of each temporary name
/// replaced by `*`, so that a job run from a directory made anew in every build (`pip
/// install` of an sdist, Python's `tempfile`, `mktemp`, CMake's checks) is the same job
/// in the next one. The names are those the tools make: a known prefix, or `tmp` and 8 of
/// Python's letters, `.tmp` and 6 of Rust's `tempfile`, `tmp.` and 10 of `mktemp`, the
/// sdist pip unpacked in its `pip-install-*` (`flash_attn_0123…`, 32 hex digits), and the
/// one uv unpacked in its cache (`sdists-vN/…/<16 random letters>/src`).
fn without_temporary_names(text: &str) -> String {
    if !TEMPORARY_MARKERS
        .iter()
        .any(|marker| marker.find(text.as_bytes()).is_some())
    {
        return text.to_string();
    }
    let parts: Vec<&str> = text.split('/').collect();
    let mut in_uv_sdists = false;
    let stable: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(index, part)| {
            in_uv_sdists |= part.starts_with("sdists-v");
            let unpacked_by_uv = in_uv_sdists
                && parts.get(index + 1) == Some(&"src")
                && part.len() == 16
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            let below_pip_install = index > 0 && parts[index - 1].starts_with("pip-install-");
            let unpacked_by_pip = part
                .rsplit_once('_')
                .filter(|(_, hash)| {
                    below_pip_install
                        && hash.len() == 32
                        && hash.chars().all(|c| c.is_ascii_hexdigit())
                })
                .map(|(name, _)| name);
            if unpacked_by_uv {
                "*".to_string()
            } else if let Some(name) = unpacked_by_pip {
                format!("{name}_*")
            } else {
                stable_part(part)
            }
        })
        .collect();
    stable.join("/")
}

/// One part of a path, with its random part as `*` where it is a temporary name.
fn stable_part(part: &str) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for prefix in TEMPORARY_PREFIXES {
        if let Some(rest) = part.strip_prefix(prefix) {
            let random = rest.find(|c: char| !word(c)).unwrap_or(rest.len());
            if random >= 5 {
                return format!("{prefix}*{}", &rest[random..]);
            }
        }
    }
    // Whole names: a prefix, then exactly so many random letters.
    let made_by = |prefix: &str, length: usize, letters: &dyn Fn(char) -> bool| {
        part.strip_prefix(prefix)
            .is_some_and(|rest| rest.len() == length && rest.chars().all(letters))
    };
    let python = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let alphanumeric = |c: char| c.is_ascii_alphanumeric();
    for (prefix, length, letters) in [
        ("tmp", 8, &python as &dyn Fn(char) -> bool),
        ("tmp.", 10, &alphanumeric),
        (".tmp", 6, &alphanumeric),
    ] {
        if made_by(prefix, length, letters) {
            return format!("{prefix}*");
        }
    }
    part.to_string()
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
    fn preprocessing_to_a_temporary_file_is_the_same_job_in_every_build() {
        // As ccache runs it, with a new temporary file each time.
        let first = identity(
            "-E -o /home/ana/.cache/ccache/tmp/cpp_stdout.tmp.JpBJX7.ii a.cpp",
            "/src",
        );
        let next = identity(
            "-E -o /home/ana/.cache/ccache/tmp/cpp_stdout.tmp.RIQ70p.ii a.cpp",
            "/src",
        );
        assert_eq!(first.label, "a.cpp");
        assert_eq!(first.key, next.key);
        assert_ne!(first.group, identity("-c -o a.o a.cpp", "/src").group);
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
    fn the_portable_key_is_the_same_for_the_same_job_in_another_checkout() {
        let here = Places::new("/home/ana/proj", Some("/home/ana"));
        let there = Places::new("/builds/ci/proj", Some("/root"));
        let job = |root: &str, site: &str| {
            let args = format!(
                "-O2 -I{root}/include -isystem {site}/lib/python3.11/site-packages/torch/include -c {root}/src/a.cpp -o src/a.o"
            );
            let args: Vec<String> = args.split(' ').map(String::from).collect();
            JobIdentity::new("/usr/bin/c++", &args, &format!("{root}/build"))
        };
        let mine = job("/home/ana/proj", "/home/ana/.venv");
        let theirs = job("/builds/ci/proj", "/opt/venv");
        assert_ne!(mine.key, theirs.key, "local keys name this machine's paths");
        let portable = |identity: &JobIdentity, root: &str, places: &Places| {
            identity.portable_key("g++ 12.2.0", &format!("{root}/build"), places)
        };
        assert_eq!(
            portable(&mine, "/home/ana/proj", &here),
            portable(&theirs, "/builds/ci/proj", &there)
        );
        assert_ne!(
            mine.portable_key("g++ 12.2.0", "/home/ana/proj/build", &here),
            mine.portable_key("g++ 13.1.0", "/home/ana/proj/build", &here),
            "another compiler version is another job"
        );
    }

    #[test]
    fn a_job_in_a_directory_made_anew_each_build_is_the_same_job() {
        // `pip install` of an sdist, with build isolation, twice.
        let pip = |random: &str| {
            identity(
                &format!("-O2 -I/tmp/pip-build-env-{random}/overlay/lib/python3.11/site-packages/numpy/core/include -c src/a.c -o build/temp/a.o"),
                &format!("/tmp/pip-req-build-{random}"),
            )
        };
        assert_eq!(pip("ittkzkuk").key, pip("hq14909f").key);
        assert_eq!(pip("ittkzkuk").group, pip("hq14909f").group);
        assert_eq!(pip("ittkzkuk").label, "build/temp/a.o");
        for (made, stable) in [
            (
                "/tmp/pip-install-3k_9x0qa/flash-attn_0a1b2c3d4e5f60718293a4b5c6d7e8f9",
                "/tmp/pip-install-*/flash-attn_*",
            ),
            (
                "/b/CMakeFiles/CMakeScratch/TryCompile-Ab3dE9",
                "/b/CMakeFiles/CMakeScratch/TryCompile-*",
            ),
            (
                "CMakeFiles/cmTC_4d5e6.dir/src.c.o",
                "CMakeFiles/cmTC_*.dir/src.c.o",
            ),
            (
                "/src/build/meson-private/tmpa1b2_c3d",
                "/src/build/meson-private/tmp*",
            ),
            ("/tmp/tmp.Xy12AbC9qZ/a.o", "/tmp/tmp.*/a.o"),
            (
                "/home/ana/.cache/uv/builds-v0/.tmpAb12Cd",
                "/home/ana/.cache/uv/builds-v0/.tmp*",
            ),
            (
                "/home/ana/.cache/uv/sdists-v11/path/f4a8b8100d6f8974/-y49QAbFyDH60X7x/src",
                "/home/ana/.cache/uv/sdists-v11/path/f4a8b8100d6f8974/*/src",
            ),
        ] {
            assert_eq!(without_temporary_names(made), stable, "{made}");
        }
        // Names that only look a little like those stay as they are.
        for kept in [
            "/src/tmp",
            "/src/tmpfiles/a.o",
            "/src/pip-install-me",
            "-DNAME_1",
            "/src/cmTC_",
        ] {
            assert_eq!(without_temporary_names(kept), kept);
        }
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
