//! Finds the headers a kernel source includes, so editing any of them changes the cache key.
//!
//! This scans `#include` lines recursively instead of asking the compiler (`-M`): a no-op
//! rebuild of hundreds of (kernel, target) pairs must not start a compiler per pair. Includes
//! inside `#if` blocks are all taken, which can only make the key change more often, never
//! less. Headers that cannot be found (system and SDK headers) are left out of the key; the
//! toolchain version covers those.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The `"name"` or `<name>` of an `#include` line, with whether it was quoted.
fn include_of(line: &str) -> Option<(&str, bool)> {
    let rest = line
        .trim_start()
        .strip_prefix('#')?
        .trim_start()
        .strip_prefix("include")?
        .trim_start();
    let (close, quoted) = match rest.chars().next()? {
        '"' => ('"', true),
        '<' => ('>', false),
        _ => return None,
    };
    let name = &rest[1..];
    Some((&name[..name.find(close)?], quoted))
}

/// Every file the sources include, directly or not, found next to the including file (for
/// `"…"` includes) or in `include_dirs`. Sorted, without the sources themselves.
pub fn included_files(sources: &[PathBuf], include_dirs: &[PathBuf]) -> BTreeSet<PathBuf> {
    // Canonical paths, so `inc/../a.h` and `a.h` are one file and include cycles end.
    let sources: Vec<PathBuf> = sources
        .iter()
        .map(|source| source.canonicalize().unwrap_or_else(|_| source.clone()))
        .collect();
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut pending: Vec<PathBuf> = sources.clone();
    while let Some(file) = pending.pop() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (name, quoted) in text.lines().filter_map(include_of) {
            let beside = quoted.then(|| file.parent().unwrap_or(Path::new(".")).join(name));
            let found = beside
                .into_iter()
                .chain(include_dirs.iter().map(|dir| dir.join(name)))
                .find_map(|candidate| candidate.canonicalize().ok().filter(|path| path.is_file()));
            if let Some(header) = found {
                if !sources.contains(&header) && seen.insert(header.clone()) {
                    pending.push(header);
                }
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_include_forms() {
        assert_eq!(include_of("#include \"a.h\""), Some(("a.h", true)));
        assert_eq!(
            include_of("  #  include <b/c.h> // x"),
            Some(("b/c.h", false))
        );
        assert_eq!(include_of("int include;"), None);
        assert_eq!(include_of("#include MACRO"), None);
    }

    #[test]
    fn follows_includes_recursively_and_survives_cycles() {
        let dir = tempfile::tempdir().unwrap();
        let root = &dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("inc")).unwrap();
        std::fs::write(
            root.join("k.cu"),
            "#include \"a.h\"\n#include <b.h>\n#include <cuda_runtime.h>\n",
        )
        .unwrap();
        std::fs::write(root.join("a.h"), "#include \"a.h\"\n#include \"inc/c.h\"\n").unwrap();
        std::fs::write(root.join("inc/b.h"), "").unwrap();
        std::fs::write(root.join("inc/c.h"), "#include \"../a.h\"\n").unwrap();
        let found = included_files(&[root.join("k.cu")], &[root.join("inc")]);
        let names: Vec<_> = found
            .iter()
            .map(|path| path.strip_prefix(root).unwrap().to_path_buf())
            .collect();
        assert_eq!(
            names,
            [
                PathBuf::from("a.h"),
                PathBuf::from("inc/b.h"),
                PathBuf::from("inc/c.h")
            ]
        );
    }
}
