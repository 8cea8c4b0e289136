//! Compiler families, one file each, in the manner of sccache's `compiler/`: every question
//! headroom asks about a compiler is answered by its family's [`Family`] value, and nowhere
//! else. Its names (with target prefixes and versions), which calls are probes, which rungs
//! of the flag ladder apply, how it reads `@file`s, whether and how a farm carries its
//! compiles, and the inner tools it runs.
//!
//! The interceptor (`intercept/compiler_names.c`) decides on each exec whether a program is a
//! compiler by the same names; a test holds its table to [`FAMILIES`]. Adding a family is a
//! file here, a line in [`FAMILIES`] and its names in that table (the test says which).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use headroom_farm::Farming;
use headroom_sched::ladder::Rung;

#[cfg(test)]
mod example;
mod gcc;
mod hipcc;
mod linker;
mod nvcc;
pub mod probe;
mod ptxas;
pub mod response;
mod rustc;

pub use response::ResponseFiles;

/// Everything headroom knows about one family of compilers.
#[derive(Debug)]
pub struct Family {
    /// How tests and messages name the family.
    pub name: &'static str,
    /// Program names that may carry a target prefix (`x86_64-linux-gnu-`) and a version
    /// suffix (`-12`, `-19.1`): `g++` stands for `x86_64-linux-gnu-g++-12` too.
    pub programs: &'static [&'static str],
    /// Program names that take a target prefix but no version (`ld.gold`).
    pub programs_without_version: &'static [&'static str],
    /// Which rungs of the lower-memory flag ladder apply to its jobs.
    pub ladder: Ladder,
    /// How it reads `@file` arguments.
    pub response_files: ResponseFiles,
    /// How a farm carries its compiles; `None`: its jobs stay on this machine.
    pub farming: Option<Farming>,
    /// The programs it runs below itself, never called by a build directly: seen outside a
    /// job, they mean their driver was not governed.
    pub inner_tools: &'static [&'static str],
    /// Whether a call only asks the compiler about itself (`--version`): such a call runs at
    /// once, neither a job nor waiting for admission.
    pub is_probe: fn(&[OsString]) -> bool,
}

/// Which rungs of the lower-memory flag ladder (`--lower-flags`) a family's jobs climb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ladder {
    /// The configured ladder, whose rungs are gcc flags (`-O2`, `-g`, `--param`).
    GccFlags,
    /// nvcc's own rung: one target at a time (`--threads 1`) for a job that builds several
    /// at once, each in a cicc of its own. The object is the same; the peak falls to one
    /// target's (`bench/build/nvcc-targets.sh`: 1.9× less at two targets, 2.9× at three).
    NvccThreads,
    /// None: no flag of the family is known to lower its memory.
    None,
}

impl Ladder {
    /// The rungs a job with `args` climbs, given the `configured` ladder (empty when the
    /// ladder is off, which turns off the family's own rungs too).
    pub fn rungs(self, args: &[String], configured: &[Rung]) -> Vec<Rung> {
        if configured.is_empty() {
            return Vec::new();
        }
        match self {
            Ladder::GccFlags => configured.to_vec(),
            Ladder::NvccThreads => nvcc::one_target_at_a_time(args).into_iter().collect(),
            Ladder::None => Vec::new(),
        }
    }
}

/// Every family headroom knows, each from its own file.
pub const FAMILIES: &[&Family] = &[
    &gcc::FAMILY,
    &nvcc::FAMILY,
    &hipcc::FAMILY,
    &rustc::FAMILY,
    &linker::FAMILY,
    &ptxas::FAMILY,
    #[cfg(test)]
    &example::FAMILY,
];

/// The family of the compiler at `program` (a path or a file name), when its file name is one
/// of a family's programs with no prefix or a target prefix (`aarch64-linux-gnu-gcc`,
/// `clang++-19`). A name with another prefix (`neuronx-cc`) is governed (see [`is_governed`])
/// but is no family's: nothing says it takes gcc's flags.
pub fn family_of(program: impl AsRef<OsStr>) -> Option<&'static Family> {
    let name = Path::new(program.as_ref()).file_name()?.as_bytes();
    FAMILIES
        .iter()
        .copied()
        .find(|family| family.names(name, |prefix| prefix.is_empty() || is_target_prefix(prefix)))
}

/// Whether the file name `name` is a compiler, linker or driver that headroom governs: some
/// family's program after any prefix that ends in `-` (`neuronx-cc`, `g++-12`), but not
/// `c++filt`, `clang-tidy` or `gcc-ar`. The interceptor's rule (`headroom_is_compiler_name`
/// in `intercept/compiler_names.c`), which a test holds to this one.
pub fn is_governed(name: &str) -> bool {
    FAMILIES.iter().any(|family| {
        family.names(name.as_bytes(), |prefix| {
            prefix.is_empty() || prefix.ends_with(b"-")
        })
    })
}

/// Whether the kernel's command name `comm` is a compiler, a linker or one of their inner
/// tools (`cc1plus`, `cicc`).
pub fn is_compiler_like(comm: &str) -> bool {
    is_governed(comm)
        || FAMILIES
            .iter()
            .any(|family| family.inner_tools.contains(&comm))
}

/// Whether a call of the compiler at `program` with `args` is a probe, by its family's rule,
/// or by the rule most families share for a compiler of no known family.
pub fn is_probe(program: impl AsRef<OsStr>, args: &[OsString]) -> bool {
    let is_probe =
        family_of(program).map_or(probe::asks_about_itself as fn(_) -> _, |f| f.is_probe);
    is_probe(args)
}

/// `args` with their `@file`s read as the compiler at `program` reads them (libiberty's way
/// for a compiler of no known family).
pub fn expand_response_files(
    program: impl AsRef<OsStr>,
    args: &[String],
    cwd: &Path,
) -> Vec<String> {
    family_of(program)
        .map_or(ResponseFiles::Libiberty, |family| family.response_files)
        .expand(args, cwd)
}

impl Family {
    /// Whether the file name `name` is PREFIX PROGRAM SUFFIX for one of this family's
    /// programs, with a PREFIX that `prefix_allowed` takes and a version SUFFIX (or none, for
    /// a program without versions). Every place the program occurs is tried, as the
    /// interceptor tries them.
    fn names(&self, name: &[u8], prefix_allowed: impl Fn(&[u8]) -> bool) -> bool {
        let versioned = self.programs.iter().map(|program| (program, true));
        let fixed = self.programs_without_version.iter().map(|p| (p, false));
        versioned.chain(fixed).any(|(program, takes_version)| {
            let program = program.as_bytes();
            (0..=name.len().saturating_sub(program.len()))
                .filter(|&at| name[at..].starts_with(program))
                .any(|at| {
                    let suffix = &name[at + program.len()..];
                    let suffix_fits = if takes_version {
                        is_version_suffix(suffix)
                    } else {
                        suffix.is_empty()
                    };
                    suffix_fits && prefix_allowed(&name[..at])
                })
        })
    }
}

/// `""`, or a version such as `-12` or `-19.1` that packages append to compiler names.
fn is_version_suffix(suffix: &[u8]) -> bool {
    match suffix {
        [] => true,
        [b'-', first, rest @ ..] => {
            first.is_ascii_digit() && rest.iter().all(|c| c.is_ascii_digit() || *c == b'.')
        }
        _ => false,
    }
}

/// Whether `prefix` (ending in `-`) is a target triple, as cross compilers are named: two
/// words or more (`x86_64-linux-gnu-`, `arm-none-eabi-`), so `neuronx-` is not one.
fn is_target_prefix(prefix: &[u8]) -> bool {
    let Some(triple) = prefix.strip_suffix(b"-") else {
        return false;
    };
    let words: Vec<&[u8]> = triple.split(|c| *c == b'-').collect();
    words.len() >= 2
        && words.iter().all(|word| {
            !word.is_empty()
                && word
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.'))
        })
}

#[cfg(test)]
mod tests;
