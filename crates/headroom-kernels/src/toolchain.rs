//! The compilers that turn kernel sources into artifacts (nvcc, clang, hipcc, xcrun metal):
//! finding them, reading their versions (part of every cache key), and writing the command
//! lines for one (kernel, target) pair.
//!
//! nvcc is found as torch's `cpp_extension` finds it: `$CUDA_HOME/bin/nvcc`, then
//! `$CUDA_PATH/bin/nvcc`, then PATH; clang through `HEADROOM_CLANG`, else PATH ([`LOOKUP`]).
//!
//! Command lines are built as recipes with placeholders (`{in}`, `{out}`, `{prelude}`,
//! `{air}`) so the cache key hashes what the compiler is asked to do, not where this
//! machine keeps its temp files.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::manifest::{CudaOutput, Kernel, Language};
use crate::resolve::Format;
use crate::target::{AppleTarget, Target};

/// The header clang gets with `-include` so CUDA and HIP sources compile with no vendor SDK.
pub const PRELUDE: &str = include_str!("prelude.h");

/// Placeholders substituted by the builder just before a recipe runs.
pub const INPUT: &str = "{in}";
pub const OUTPUT: &str = "{out}";
pub const PRELUDE_PATH: &str = "{prelude}";
pub const AIR: &str = "{air}";

/// How toolchains are found, for `--help`.
pub const LOOKUP: &str = "Toolchains are found as follows: nvcc is $CUDA_HOME/bin/nvcc, else \
$CUDA_PATH/bin/nvcc, else nvcc on PATH; clang is $HEADROOM_CLANG, else the first of clang-19, \
clang-20, clang-21, clang-18 and clang on PATH; hipcc and xcrun (Metal, macOS only) come from \
PATH.";

/// The variables that hold a CUDA installation, in the order they are read.
const CUDA_HOME_VARS: [&str; 2] = ["CUDA_HOME", "CUDA_PATH"];

/// A kind of toolchain a manifest can ask for (`toolchain = ["nvcc", "clang"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolchainKind {
    Nvcc,
    Clang,
    Hipcc,
    Metal,
}

impl ToolchainKind {
    pub const ALL: [ToolchainKind; 4] = [
        ToolchainKind::Nvcc,
        ToolchainKind::Clang,
        ToolchainKind::Hipcc,
        ToolchainKind::Metal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolchainKind::Nvcc => "nvcc",
            ToolchainKind::Clang => "clang",
            ToolchainKind::Hipcc => "hipcc",
            ToolchainKind::Metal => "metal",
        }
    }

    pub fn languages(self) -> &'static [Language] {
        match self {
            ToolchainKind::Nvcc => &[Language::Cuda],
            ToolchainKind::Clang => &[Language::Cuda, Language::Hip],
            ToolchainKind::Hipcc => &[Language::Hip],
            ToolchainKind::Metal => &[Language::Metal],
        }
    }

    /// What to install when the toolchain is missing.
    pub fn install_hint(self) -> &'static str {
        match self {
            ToolchainKind::Nvcc => {
                "install the CUDA toolkit and set CUDA_HOME to it, or put nvcc on PATH"
            }
            ToolchainKind::Clang => "install clang (`apt-get install clang-19 lld-19`) or point HEADROOM_CLANG at a clang binary",
            ToolchainKind::Hipcc => "install ROCm and put hipcc on PATH",
            ToolchainKind::Metal => "install Xcode on macOS so that `xcrun metal` works",
        }
    }

    /// Why this toolchain cannot exist on this operating system, when it cannot: a kernel
    /// that only it compiles is skipped here, not failed.
    pub fn impossible_here(self) -> Option<&'static str> {
        (self == ToolchainKind::Metal && !cfg!(target_os = "macos")).then_some("Metal needs macOS")
    }

    /// Program names searched on PATH, in order.
    fn program_names(self) -> &'static [&'static str] {
        match self {
            ToolchainKind::Nvcc => &["nvcc"],
            ToolchainKind::Clang => &["clang-19", "clang-20", "clang-21", "clang-18", "clang"],
            ToolchainKind::Hipcc => &["hipcc"],
            ToolchainKind::Metal => &["xcrun"],
        }
    }

    fn version_args(self) -> &'static [&'static str] {
        match self {
            ToolchainKind::Metal => &["-sdk", "macosx", "metal", "--version"],
            _ => &["--version"],
        }
    }
}

impl fmt::Display for ToolchainKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A toolchain found on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toolchain {
    pub kind: ToolchainKind,
    pub program: PathBuf,
    /// The full `--version` output: part of every cache key.
    pub version: String,
}

impl Toolchain {
    /// `kind version`, as recorded in cache entries: `clang Debian clang version 19.1.7`.
    pub fn label(&self) -> String {
        format!("{} {}", self.kind, self.short_version())
    }

    /// The line of the version output that names the version, for people.
    pub fn short_version(&self) -> &str {
        let lines = || {
            self.version
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
        };
        lines()
            .find(|line| line.contains("release") || line.contains("version"))
            .or_else(|| lines().next())
            .unwrap_or("unknown version")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    #[error("`{program} --version` failed: {reason}; check that {program} runs")]
    Version { program: PathBuf, reason: String },
}

/// Memo of `--version` outputs keyed by program path, size and mtime, so a no-op build does
/// not start every compiler just to ask its version.
#[derive(Debug, Default, Serialize, Deserialize)]
struct VersionMemo {
    versions: BTreeMap<String, String>,
}

fn memo_key(program: &Path) -> Option<String> {
    let metadata = std::fs::metadata(program).ok()?;
    let modified = metadata.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!(
        "{}|{}|{}",
        program.display(),
        metadata.len(),
        modified.as_nanos()
    ))
}

fn run_version(kind: ToolchainKind, program: &Path) -> Result<String, ToolchainError> {
    let error = |reason: String| ToolchainError::Version {
        program: program.to_path_buf(),
        reason,
    };
    let mut command = Command::new(program);
    command.args(kind.version_args()).stdin(Stdio::null());
    let output =
        headroom_process::output_of(&mut command, None).map_err(|err| error(err.to_string()))?;
    if !output.status.success() {
        return Err(error(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Ok(text.trim().to_string())
}

/// Which toolchains this machine has. Detection is lazy: a kind is looked up the first time a
/// kernel asks for it.
pub struct Toolchains {
    found: BTreeMap<ToolchainKind, Option<Toolchain>>,
    memo_path: Option<PathBuf>,
    memo: VersionMemo,
    memo_dirty: bool,
    search_path: Option<OsString>,
}

impl Toolchains {
    /// `memo_path` is where `--version` outputs are remembered between runs (inside the cache);
    /// `search_path`, when given, is the only place searched (tests put scripted toolchains
    /// there): it replaces `$PATH`, and `$CUDA_HOME` and `$CUDA_PATH` are not read.
    pub fn new(memo_path: Option<PathBuf>, search_path: Option<OsString>) -> Self {
        let memo = memo_path
            .as_deref()
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Toolchains {
            found: BTreeMap::new(),
            memo_path,
            memo,
            memo_dirty: false,
            search_path,
        }
    }

    fn locate(&self, kind: ToolchainKind) -> Option<PathBuf> {
        let search_path = self
            .search_path
            .clone()
            .or_else(|| std::env::var_os("PATH"));
        let cwd = std::env::current_dir().ok()?;
        let find = |program: &OsStr| which::which_in(program, search_path.as_ref(), &cwd).ok();
        match kind {
            ToolchainKind::Clang => {
                if let Some(program) = std::env::var_os("HEADROOM_CLANG") {
                    return find(&program);
                }
            }
            ToolchainKind::Nvcc if self.search_path.is_none() => {
                // A path with a separator is checked as it is, not searched.
                let installed = CUDA_HOME_VARS
                    .iter()
                    .filter_map(std::env::var_os)
                    .filter(|home| !home.is_empty())
                    .find_map(|home| find(Path::new(&home).join("bin/nvcc").as_os_str()));
                if installed.is_some() {
                    return installed;
                }
            }
            _ => {}
        }
        kind.program_names()
            .iter()
            .find_map(|name| find(OsStr::new(name)))
    }

    /// The toolchain of this kind, or `None` when the machine lacks it.
    pub fn get(&mut self, kind: ToolchainKind) -> Result<Option<&Toolchain>, ToolchainError> {
        if !self.found.contains_key(&kind) {
            let detected = match self.locate(kind) {
                None => None,
                Some(program) => {
                    let key = memo_key(&program);
                    let version = match key.as_ref().and_then(|key| self.memo.versions.get(key)) {
                        Some(version) => version.clone(),
                        None => {
                            let version = run_version(kind, &program)?;
                            if let Some(key) = key {
                                self.memo.versions.insert(key, version.clone());
                                self.memo_dirty = true;
                            }
                            version
                        }
                    };
                    Some(Toolchain {
                        kind,
                        program,
                        version,
                    })
                }
            };
            self.found.insert(kind, detected);
        }
        Ok(self.found.get(&kind).and_then(Option::as_ref))
    }

    /// The first toolchain of the kernel's preference list that this machine has.
    pub fn pick(
        &mut self,
        preference: &[ToolchainKind],
    ) -> Result<Option<Toolchain>, ToolchainError> {
        for kind in preference {
            if let Some(toolchain) = self.get(*kind)? {
                return Ok(Some(toolchain.clone()));
            }
        }
        Ok(None)
    }

    /// Writes the version memo back; losing it only costs a `--version` call next time.
    pub fn save_memo(&mut self) {
        if let (true, Some(path)) = (self.memo_dirty, &self.memo_path) {
            if let Ok(bytes) = serde_json::to_vec_pretty(&self.memo) {
                if crate::cache::write_atomic(path, &bytes).is_ok() {
                    self.memo_dirty = false;
                }
            }
        }
    }
}

/// The commands that build one (kernel, target) pair, with placeholders, and what they emit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recipe {
    /// Each step is an argv; steps run in order and each must succeed.
    pub steps: Vec<Vec<String>>,
    pub format: Format,
}

fn common_args(kernel: &Kernel, args: &mut Vec<String>) {
    args.extend(
        kernel
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    args.extend(
        kernel
            .include_dirs
            .iter()
            .map(|dir| format!("-I{}", dir.display())),
    );
    args.extend(kernel.flags.iter().cloned());
}

fn cuda_arch(target: &Target) -> String {
    // `compute_90` and `sm_90` share the digits; nvcc and clang spell both with the sm_ prefix
    // in `-arch`/`--cuda-gpu-arch` for real targets.
    target.to_string().replace("compute_", "sm_")
}

/// Writes the recipe for `target` with this toolchain.
pub fn recipe(toolchain: &Toolchain, kernel: &Kernel, target: &Target) -> Recipe {
    let program = toolchain.program.display().to_string();
    let mut args = vec![program.clone()];
    let format = match (toolchain.kind, target) {
        (ToolchainKind::Nvcc, Target::CudaPtx { .. }) => {
            args.extend(["-ptx".to_string(), format!("-arch={target}")]);
            Format::Ptx
        }
        (ToolchainKind::Nvcc, _) if kernel.cuda_output == CudaOutput::Fatbin => {
            let virtual_arch = target.to_string().replace("sm_", "compute_");
            args.extend([
                "-fatbin".to_string(),
                "-gencode".to_string(),
                format!("arch={virtual_arch},code=[{target},{virtual_arch}]"),
            ]);
            Format::Fatbin
        }
        (ToolchainKind::Nvcc, _) => {
            args.extend(["-cubin".to_string(), format!("-arch={target}")]);
            Format::Cubin
        }
        (ToolchainKind::Clang, Target::CudaSm { .. } | Target::CudaPtx { .. }) => {
            args.extend(
                [
                    "-x",
                    "cuda",
                    "--cuda-device-only",
                    "-nocudainc",
                    "-nocudalib",
                    "-S",
                    "-include",
                    PRELUDE_PATH,
                ]
                .map(String::from),
            );
            args.push(format!("--cuda-gpu-arch={}", cuda_arch(target)));
            Format::Ptx
        }
        (ToolchainKind::Clang, _) => {
            args.extend(
                [
                    "-x",
                    "hip",
                    "--cuda-device-only",
                    "--no-gpu-bundle-output",
                    "-nogpulib",
                    "-nogpuinc",
                    // The default compilation-unit ID hashes this build's temp paths into
                    // the code object; without it the output is reproducible.
                    "-fuse-cuid=none",
                    "-include",
                    PRELUDE_PATH,
                ]
                .map(String::from),
            );
            args.push(format!("--offload-arch={target}"));
            if matches!(target, Target::AmdGeneric { .. }) {
                // Generic targets exist only from code object version 6 on.
                args.push("-mcode-object-version=6".to_string());
            }
            Format::CodeObject
        }
        (ToolchainKind::Hipcc, _) => {
            args.extend(["--genco".to_string(), format!("--offload-arch={target}")]);
            Format::CodeObject
        }
        (ToolchainKind::Metal, _) => {
            args.extend(["-sdk", "macosx", "metal"].map(String::from));
            match target {
                Target::Apple(AppleTarget::MetalVersion { major, minor }) => {
                    args.push(format!("-std=metal{major}.{minor}"))
                }
                Target::Apple(AppleTarget::Family(family)) => {
                    args.push(format!("-DHEADROOM_APPLE_FAMILY={family}"))
                }
                _ => {}
            }
            common_args(kernel, &mut args);
            args.extend(["-c", INPUT, "-o", AIR].map(String::from));
            let link = [
                program.as_str(),
                "-sdk",
                "macosx",
                "metallib",
                AIR,
                "-o",
                OUTPUT,
            ]
            .map(String::from)
            .to_vec();
            return Recipe {
                steps: vec![args, link],
                format: Format::Metallib,
            };
        }
    };
    common_args(kernel, &mut args);
    args.extend([INPUT, "-o", OUTPUT].map(String::from));
    Recipe {
        steps: vec![args],
        format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;

    fn kernel(language: &str, target: &str, extra: &str) -> Kernel {
        let text = format!("[kernel.k]\nlanguage = \"{language}\"\nsources = [\"k\"]\ntargets = [\"{target}\"]\n{extra}");
        Manifest::parse(&text, Path::new("kernels.toml"))
            .unwrap()
            .kernels
            .remove(0)
    }

    fn toolchain(kind: ToolchainKind) -> Toolchain {
        Toolchain {
            kind,
            program: PathBuf::from(kind.as_str()),
            version: "v1".into(),
        }
    }

    fn first_step(kind: ToolchainKind, kernel: &Kernel) -> (String, Format) {
        let recipe = recipe(&toolchain(kind), kernel, &kernel.targets[0]);
        (recipe.steps[0].join(" "), recipe.format)
    }

    #[test]
    fn nvcc_emits_cubin_ptx_or_fatbin() {
        assert_eq!(
            first_step(ToolchainKind::Nvcc, &kernel("cuda", "sm_90a", "")),
            (
                "nvcc -cubin -arch=sm_90a {in} -o {out}".into(),
                Format::Cubin
            )
        );
        assert_eq!(
            first_step(ToolchainKind::Nvcc, &kernel("cuda", "compute_90", "")),
            (
                "nvcc -ptx -arch=compute_90 {in} -o {out}".into(),
                Format::Ptx
            )
        );
        assert_eq!(
            first_step(
                ToolchainKind::Nvcc,
                &kernel(
                    "cuda",
                    "sm_80",
                    "cuda-output = \"fatbin\"\ndefines = { N = \"4\" }"
                )
            ),
            (
                "nvcc -fatbin -gencode arch=compute_80,code=[sm_80,compute_80] -DN=4 {in} -o {out}"
                    .into(),
                Format::Fatbin
            )
        );
    }

    #[test]
    fn clang_needs_no_vendor_sdk() {
        let (cuda, format) = first_step(ToolchainKind::Clang, &kernel("cuda", "compute_86", ""));
        assert!(
            cuda.contains("-nocudainc -nocudalib -S -include {prelude} --cuda-gpu-arch=sm_86"),
            "{cuda}"
        );
        assert_eq!(format, Format::Ptx);
        let (hip, format) = first_step(ToolchainKind::Clang, &kernel("hip", "gfx11-generic", ""));
        assert!(hip.contains("-nogpulib -nogpuinc -fuse-cuid=none -include {prelude} --offload-arch=gfx11-generic -mcode-object-version=6"), "{hip}");
        assert_eq!(format, Format::CodeObject);
    }

    #[test]
    fn metal_compiles_then_links() {
        let kernel = kernel("metal", "metal3.1", "");
        let recipe = recipe(
            &toolchain(ToolchainKind::Metal),
            &kernel,
            &kernel.targets[0],
        );
        assert_eq!(
            recipe.steps[0].join(" "),
            "metal -sdk macosx metal -std=metal3.1 -c {in} -o {air}"
        );
        assert_eq!(
            recipe.steps[1].join(" "),
            "metal -sdk macosx metallib {air} -o {out}"
        );
    }

    #[test]
    fn short_version_picks_the_version_line() {
        let nvcc = Toolchain { kind: ToolchainKind::Nvcc, program: "nvcc".into(), version: "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131".into() };
        assert_eq!(
            nvcc.short_version(),
            "Cuda compilation tools, release 12.4, V12.4.131"
        );
    }
}
