//! `kernels.toml`: which kernels exist, their sources, language, targets, flags, defines and
//! toolchain preference. Every mistake is reported as `kernels.toml:LINE:COL: ...` so the user
//! can jump straight to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::target::{Backend, Target};
use crate::toolchain::ToolchainKind;

/// The source language of a kernel.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Cuda,
    Hip,
    Metal,
}

impl Language {
    pub fn backend(self) -> Backend {
        match self {
            Language::Cuda => Backend::Cuda,
            Language::Hip => Backend::Hip,
            Language::Metal => Backend::Metal,
        }
    }

    /// Toolchains tried in order when the kernel states no preference.
    fn default_toolchains(self) -> Vec<ToolchainKind> {
        match self {
            Language::Cuda => vec![ToolchainKind::Nvcc, ToolchainKind::Clang],
            Language::Hip => vec![ToolchainKind::Hipcc, ToolchainKind::Clang],
            Language::Metal => vec![ToolchainKind::Metal],
        }
    }
}

/// What nvcc emits for `sm_XX` targets (PTX targets always give PTX).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaOutput {
    #[default]
    Cubin,
    Fatbin,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    kernel: BTreeMap<String, Spanned<RawKernel>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawKernel {
    language: Language,
    sources: Vec<Spanned<String>>,
    targets: Vec<Spanned<String>>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    defines: BTreeMap<String, String>,
    #[serde(default)]
    include_dirs: Vec<String>,
    toolchain: Option<Spanned<Vec<ToolchainKind>>>,
    #[serde(default)]
    cuda_output: CudaOutput,
}

/// One kernel of the manifest, with paths made absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub language: Language,
    pub sources: Vec<PathBuf>,
    pub targets: Vec<Target>,
    pub flags: Vec<String>,
    pub defines: BTreeMap<String, String>,
    pub include_dirs: Vec<PathBuf>,
    /// Toolchains in order of preference; the first one found on this machine builds.
    pub toolchains: Vec<ToolchainKind>,
    pub cuda_output: CudaOutput,
}

/// A parsed `kernels.toml`; kernels are sorted by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub path: PathBuf,
    pub kernels: Vec<Kernel>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read the kernel manifest {path}: {source}; pass its location with --manifest or HEADROOM_KERNEL_MANIFEST")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

/// A kernel name asked for (`--kernel`, `resolve NAME`) that the manifest or cache lacks, with
/// the names it has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no kernel named {} in {place}; {}; {advice}",
    quoted(wanted),
    known_names(known)
)]
pub struct UnknownKernel {
    pub wanted: Vec<String>,
    /// Where the names were looked for: `the manifest kernels.toml`.
    pub place: String,
    pub known: Vec<String>,
    /// What to do about it: `check --kernel`.
    pub advice: &'static str,
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn known_names(known: &[String]) -> String {
    if known.is_empty() {
        "there are none".to_string()
    } else {
        format!("the kernels there are {}", quoted(known))
    }
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |newline| before.len() - newline - 1)
        + 1;
    (line, column)
}

/// Kernel names become directory names in the cache and keys in shared stores: letters,
/// digits, `_`, `-` and `.`, not leading `.`, at most 128 bytes.
pub fn is_valid_kernel_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !name.starts_with('.')
}

impl Manifest {
    /// Reads and parses the manifest at `path`, made absolute so that its kernels' paths are.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, &path)
    }

    /// The kernel names, in order.
    pub fn names(&self) -> Vec<String> {
        self.kernels
            .iter()
            .map(|kernel| kernel.name.clone())
            .collect()
    }

    /// Parses manifest text; relative paths are taken from the directory of `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ManifestError> {
        let invalid = |offset: usize, message: String| {
            let (line, column) = line_column(text, offset);
            ManifestError::Invalid {
                path: path.to_path_buf(),
                line,
                column,
                message,
            }
        };
        let raw: RawManifest = toml::from_str(text).map_err(|err| {
            let offset = err.span().map_or(0, |span| span.start);
            invalid(offset, err.message().to_string())
        })?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut kernels = Vec::with_capacity(raw.kernel.len());
        for (name, spanned) in raw.kernel {
            let span_start = spanned.span().start;
            let raw_kernel = spanned.into_inner();
            if !is_valid_kernel_name(&name) {
                return Err(invalid(span_start, format!("kernel name `{name}` may use only letters, digits, `_`, `-` and `.` (it names a cache directory)")));
            }
            if raw_kernel.sources.is_empty() {
                return Err(invalid(
                    span_start,
                    format!("kernel `{name}` lists no sources; add `sources = [\"{name}.cu\"]`"),
                ));
            }
            if raw_kernel.targets.is_empty() {
                return Err(invalid(
                    span_start,
                    format!("kernel `{name}` lists no targets; add e.g. `targets = [\"sm_80\"]`"),
                ));
            }
            let mut targets = Vec::with_capacity(raw_kernel.targets.len());
            for spanned_target in &raw_kernel.targets {
                let target: Target = spanned_target.get_ref().parse().map_err(
                    |err: crate::target::TargetError| {
                        invalid(spanned_target.span().start, err.to_string())
                    },
                )?;
                if target.backend() != raw_kernel.language.backend() {
                    return Err(invalid(
                        spanned_target.span().start,
                        format!("target `{target}` is a {} target but kernel `{name}` is written in {:?}; move it to a {} kernel", target.backend(), raw_kernel.language, target.backend()),
                    ));
                }
                if targets.contains(&target) {
                    return Err(invalid(
                        spanned_target.span().start,
                        format!("target `{target}` is listed twice"),
                    ));
                }
                targets.push(target);
            }
            let toolchains = match raw_kernel.toolchain {
                None => raw_kernel.language.default_toolchains(),
                Some(spanned_toolchains) => {
                    for kind in spanned_toolchains.get_ref() {
                        if !kind.languages().contains(&raw_kernel.language) {
                            return Err(invalid(
                                spanned_toolchains.span().start,
                                format!(
                                    "toolchain `{kind}` cannot compile {:?} kernels",
                                    raw_kernel.language
                                ),
                            ));
                        }
                    }
                    spanned_toolchains.into_inner()
                }
            };
            kernels.push(Kernel {
                sources: raw_kernel
                    .sources
                    .into_iter()
                    .map(|source| dir.join(source.into_inner()))
                    .collect(),
                include_dirs: raw_kernel
                    .include_dirs
                    .into_iter()
                    .map(|include| dir.join(include))
                    .collect(),
                name,
                language: raw_kernel.language,
                targets,
                flags: raw_kernel.flags,
                defines: raw_kernel.defines,
                toolchains,
                cuda_output: raw_kernel.cuda_output,
            });
        }
        Ok(Manifest {
            path: path.to_path_buf(),
            kernels,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("proj/kernels.toml"))
    }

    fn error_of(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_a_full_kernel() {
        let manifest = parse(
            r#"
[kernel.vector_add]
language = "cuda"
sources = ["src/vector_add.cu"]
targets = ["sm_80", "sm_90a", "compute_90"]
flags = ["-O3"]
defines = { BLOCK = "256" }
include-dirs = ["include"]
toolchain = ["clang"]
cuda-output = "fatbin"
"#,
        )
        .unwrap();
        let kernel = &manifest.kernels[0];
        assert_eq!(kernel.name, "vector_add");
        assert_eq!(kernel.sources, [PathBuf::from("proj/src/vector_add.cu")]);
        assert_eq!(kernel.targets.len(), 3);
        assert_eq!(kernel.defines["BLOCK"], "256");
        assert_eq!(kernel.toolchains, [ToolchainKind::Clang]);
        assert_eq!(kernel.cuda_output, CudaOutput::Fatbin);
    }

    #[test]
    fn defaults_prefer_the_vendor_toolchain() {
        let manifest = parse(
            "[kernel.k]\nlanguage = \"hip\"\nsources = [\"k.hip\"]\ntargets = [\"gfx90a\"]\n",
        )
        .unwrap();
        assert_eq!(
            manifest.kernels[0].toolchains,
            [ToolchainKind::Hipcc, ToolchainKind::Clang]
        );
    }

    #[test]
    fn an_unknown_target_names_its_line_and_column() {
        let err = error_of("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"k.cu\"]\ntargets = [\"sm_80\", \"sm_8\"]\n");
        assert!(
            err.starts_with("proj/kernels.toml:4:21: unknown target `sm_8`"),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_key_names_its_line() {
        let err = error_of("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"k.cu\"]\ntargets = [\"sm_80\"]\noptimise = true\n");
        assert!(
            err.starts_with("proj/kernels.toml:5:1: unknown field `optimise`"),
            "{err}"
        );
        let err = error_of("[kernels.k]\n");
        assert!(
            err.starts_with("proj/kernels.toml:1:2: unknown field `kernels`"),
            "{err}"
        );
    }

    #[test]
    fn a_target_of_the_wrong_vendor_is_an_error() {
        let err = error_of(
            "[kernel.k]\nlanguage = \"hip\"\nsources = [\"k.hip\"]\ntargets = [\"sm_80\"]\n",
        );
        assert!(
            err.starts_with("proj/kernels.toml:4:12: target `sm_80` is a cuda target"),
            "{err}"
        );
    }

    #[test]
    fn a_toolchain_that_cannot_compile_the_language_is_an_error() {
        let err = error_of("[kernel.k]\nlanguage = \"metal\"\nsources = [\"k.metal\"]\ntargets = [\"apple9\"]\ntoolchain = [\"nvcc\"]\n");
        assert!(
            err.contains(":5:13: toolchain `nvcc` cannot compile Metal kernels"),
            "{err}"
        );
    }

    #[test]
    fn kernel_names_cannot_escape_the_cache() {
        let err = error_of("[kernel.\"../evil\"]\nlanguage = \"cuda\"\nsources = [\"k.cu\"]\ntargets = [\"sm_80\"]\n");
        assert!(err.contains("kernel name `../evil` may use only"), "{err}");
    }

    #[test]
    fn a_missing_file_says_which_flag_to_pass() {
        let err = Manifest::load(Path::new("no/such/kernels.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--manifest"), "{err}");
    }

    #[test]
    fn an_unknown_kernel_lists_the_known_ones() {
        let unknown = |known: &[&str]| {
            UnknownKernel {
                wanted: vec!["zz".into()],
                place: "the cache c".into(),
                known: known.iter().map(|name| name.to_string()).collect(),
                advice: "check --kernel",
            }
            .to_string()
        };
        assert_eq!(
            unknown(&["add", "mul"]),
            "no kernel named `zz` in the cache c; the kernels there are `add`, `mul`; check --kernel"
        );
        assert_eq!(
            unknown(&[]),
            "no kernel named `zz` in the cache c; there are none; check --kernel"
        );
    }
}
