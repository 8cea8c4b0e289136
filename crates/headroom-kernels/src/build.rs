//! `headroom kernels build`: every (kernel, target) pair of a manifest, built incrementally
//! into the cache. Pairs whose key already has an intact artifact are not rebuilt; the rest
//! run in parallel through [`crate::exec::execute`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cache::{self, Cache, CacheError, Entry, KeyRecord, SCHEMA_VERSION};
use crate::exec::{self, Job, Outcome};
use crate::inspect;
use crate::manifest::{Kernel, Language, Manifest, UnknownKernel};
use crate::resolve::{Format, PtxIsa};
use crate::target::{Backend, Target};
use crate::toolchain::{self, Recipe, Toolchain, ToolchainError, ToolchainKind, Toolchains};

/// How to run a build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Compile jobs run at once.
    pub jobs: usize,
    /// Build what can be built when a toolchain is missing or a compile fails.
    pub keep_going: bool,
    /// Only these kernels (all when empty).
    pub only: Vec<String>,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Evict least recently used artifacts after the build to stay under this many bytes.
    pub max_cache_bytes: Option<u64>,
    /// Where to look for toolchains instead of `$PATH`.
    pub search_path: Option<OsString>,
    /// Run every compile through this launcher (the memory governor's), when set.
    pub launcher: Option<exec::Launcher>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            jobs: std::thread::available_parallelism().map_or(1, usize::from),
            keep_going: false,
            only: Vec::new(),
            progress: false,
            max_cache_bytes: None,
            search_path: None,
            launcher: None,
        }
    }
}

/// What happened to one (kernel, target) pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PairStatus {
    /// The layout already held an intact artifact for this key.
    UpToDate,
    /// Another kernel or an earlier build made the same artifact; it was linked in.
    Reused,
    Built,
    Failed {
        error: String,
    },
    /// No toolchain for it on this machine, though one could be installed: the build is
    /// incomplete, as with a failure.
    Skipped {
        error: String,
    },
    /// Its toolchain cannot exist on this operating system (Metal off macOS): shown as skipped,
    /// with the reason, and no failure.
    #[serde(rename = "skipped")]
    Unsupported {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairReport {
    pub kernel: String,
    pub target: Target,
    #[serde(flatten)]
    pub status: PairStatus,
    /// The artifact relative to the cache root, when there is one.
    pub artifact: Option<PathBuf>,
    pub toolchain: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildReport {
    pub cache: PathBuf,
    pub pairs: Vec<PairReport>,
    pub evicted_blobs: usize,
}

impl BuildReport {
    pub fn count(&self, matches: impl Fn(&PairStatus) -> bool) -> usize {
        self.pairs
            .iter()
            .filter(|pair| matches(&pair.status))
            .count()
    }

    pub fn all_succeeded(&self) -> bool {
        self.count(|status| {
            matches!(
                status,
                PairStatus::Failed { .. } | PairStatus::Skipped { .. }
            )
        }) == 0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Toolchain(#[from] ToolchainError),
    #[error("{0}\npass --keep-going to build the other kernels anyway")]
    MissingToolchains(String),
    #[error(transparent)]
    UnknownKernel(#[from] UnknownKernel),
    #[error("kernel `{kernel}`: cannot read its source {path}: {source}; fix its `sources` entry in {manifest}")]
    Source {
        kernel: String,
        path: PathBuf,
        manifest: PathBuf,
        source: std::io::Error,
    },
    #[error("kernel `{kernel}`: cannot read {path}, which its sources include: {source}; make it readable")]
    Header {
        kernel: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot prepare a build directory in the kernel cache: {0}; check that the cache is writable or move it with --cache or HEADROOM_KERNEL_CACHE"
    )]
    TempDir(std::io::Error),
}

fn missing_toolchain_message(kernel: &Kernel) -> String {
    let tried = kernel
        .toolchains
        .iter()
        .map(|kind| format!("{kind} ({})", kind.install_hint()))
        .collect::<Vec<_>>()
        .join(", or ");
    let targets = kernel
        .targets
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "no toolchain for kernel `{}`: {tried}; skipping its targets {targets}",
        kernel.name
    )
}

/// Why none of the kernel's toolchains can exist on this operating system, when none can.
fn impossible_here(kernel: &Kernel) -> Option<&'static str> {
    let reasons: Option<Vec<&str>> = kernel
        .toolchains
        .iter()
        .map(|kind| kind.impossible_here())
        .collect();
    reasons?.first().copied()
}

/// Hashes the sources of a kernel (listed in `manifest`) and every header they include.
fn hash_inputs(kernel: &Kernel, manifest: &Path) -> Result<blake3::Hash, BuildError> {
    let mut hasher = blake3::Hasher::new();
    for source in &kernel.sources {
        hasher.update(b"source\0");
        hasher.update(&std::fs::read(source).map_err(|err| BuildError::Source {
            kernel: kernel.name.clone(),
            path: source.clone(),
            manifest: manifest.to_path_buf(),
            source: err,
        })?);
    }
    for header in crate::deps::included_files(&kernel.sources, &kernel.include_dirs) {
        hasher.update(b"header\0");
        hasher.update(
            header
                .file_name()
                .map(|name| name.as_encoded_bytes())
                .unwrap_or_default(),
        );
        hasher.update(
            &std::fs::read(&header).map_err(|source| BuildError::Header {
                kernel: kernel.name.clone(),
                path: header.clone(),
                source,
            })?,
        );
    }
    Ok(hasher.finalize())
}

/// What built a kernel's artifacts, the same for all its targets and toolchains: the blake3
/// hash of its language, its sources and the headers they include, its flags, defines and CUDA
/// output kind. Paths of this machine are left out, so CI and a user's machine agree. The cache
/// keeps each origin's artifacts apart, and a project resolves those of its own kernels only.
pub fn origin(kernel: &Kernel, manifest: &Path) -> Result<String, BuildError> {
    Ok(origin_of(kernel, &hash_inputs(kernel, manifest)?))
}

fn origin_of(kernel: &Kernel, inputs: &blake3::Hash) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(format!("headroom-kernels origin {SCHEMA_VERSION}\0").as_bytes());
    hasher.update(inputs.as_bytes());
    hasher.update(format!("{:?}\0{:?}\0", kernel.language, kernel.cuda_output).as_bytes());
    for flag in &kernel.flags {
        hasher.update(format!("flag\0{flag}\0").as_bytes());
    }
    for (name, value) in &kernel.defines {
        hasher.update(format!("define\0{name}\0{value}\0").as_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

/// The cache key of one pair: schema, inputs, target, the recipe (flags included) and the
/// toolchain's identity and version. Paths of this machine are left out so that machines
/// with the same toolchain share keys.
fn cache_key(
    inputs: &blake3::Hash,
    target: &Target,
    toolchain: &Toolchain,
    recipe: &Recipe,
    manifest_dir: &str,
) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(format!("headroom-kernels schema {SCHEMA_VERSION}\0").as_bytes());
    hasher.update(inputs.as_bytes());
    hasher.update(format!("{target}\0{}\0{}\0", toolchain.kind, toolchain.version).as_bytes());
    for step in &recipe.steps {
        for (position, arg) in step.iter().enumerate() {
            let portable = if position == 0 {
                toolchain.kind.as_str().to_string()
            } else if manifest_dir.is_empty() {
                arg.clone()
            } else {
                arg.replace(manifest_dir, "{manifest}")
            };
            hasher.update(portable.as_bytes());
            hasher.update(b"\0");
        }
        hasher.update(b"\n");
    }
    if toolchain.kind == ToolchainKind::Clang {
        hasher.update(toolchain::PRELUDE.as_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

/// A pair that needs compiling.
struct Pending {
    report_index: usize,
    backend: Backend,
    origin: String,
    key: String,
    format: Format,
    toolchain: Toolchain,
    output: PathBuf,
}

fn source_extension(language: Language) -> &'static str {
    match language {
        Language::Cuda => "cu",
        Language::Hip => "hip",
        Language::Metal => "metal",
    }
}

/// The translation unit to compile: the source itself, or a unity file including them all.
fn translation_unit(kernel: &Kernel, build_dir: &Path) -> std::io::Result<PathBuf> {
    if let [source] = kernel.sources.as_slice() {
        return Ok(source.clone());
    }
    let unity = build_dir.join(format!(
        "{}.unity.{}",
        kernel.name,
        source_extension(kernel.language)
    ));
    let text: String = kernel
        .sources
        .iter()
        .map(|source| format!("#include \"{}\"\n", source.display()))
        .collect();
    std::fs::write(&unity, text)?;
    Ok(unity)
}

/// Where one build keeps its translation units and compiler outputs: in the cache's work
/// directory, made only when something needs compiling (a no-op rebuild must not create and
/// delete files: on ext4 that dominated its time) and removed with it, also by the next run
/// when this one is killed.
struct Scratch<'a> {
    cache: &'a Cache,
    root: Option<PathBuf>,
}

impl Scratch<'_> {
    fn root(&mut self) -> std::io::Result<&Path> {
        if self.root.is_none() {
            let root = self
                .cache
                .work_dir()
                .map_err(|err| std::io::Error::other(err.to_string()))?
                .to_path_buf();
            let prelude = root.join("headroom_prelude.h");
            std::fs::write(&prelude, toolchain::PRELUDE).map_err(|err| {
                std::io::Error::new(err.kind(), format!("{}: {err}", prelude.display()))
            })?;
            self.root = Some(root);
        }
        Ok(self.root.as_deref().unwrap_or(Path::new(".")))
    }

    fn prelude(&self) -> PathBuf {
        self.root
            .as_ref()
            .map(|root| root.join("headroom_prelude.h"))
            .unwrap_or_default()
    }

    /// The kernel's translation unit and its output directory.
    fn for_kernel(&mut self, kernel: &Kernel) -> std::io::Result<(PathBuf, PathBuf)> {
        let root = self.root()?.to_path_buf();
        let kernel_dir = root.join(&kernel.name);
        std::fs::create_dir_all(&kernel_dir)?;
        Ok((translation_unit(kernel, &root)?, kernel_dir))
    }
}

fn substitute(recipe: &Recipe, input: &Path, output: &Path, prelude: &Path) -> Vec<Vec<OsString>> {
    let air = output.with_extension("air");
    recipe
        .steps
        .iter()
        .map(|step| {
            step.iter()
                .map(|arg| match arg.as_str() {
                    toolchain::INPUT => input.as_os_str().to_owned(),
                    toolchain::OUTPUT => output.as_os_str().to_owned(),
                    toolchain::PRELUDE_PATH => prelude.as_os_str().to_owned(),
                    toolchain::AIR => air.as_os_str().to_owned(),
                    _ => OsString::from(arg),
                })
                .collect()
        })
        .collect()
}

fn progress_bar(total: usize, visible: bool) -> ProgressBar {
    if !visible || total == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} building kernels [{bar:30}] {pos}/{len} {wide_msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The PTX ISA of the PTX in an nvcc fatbin (the newest, if several), read from the entry
/// headers because the PTX itself is compressed (zstd in CUDA 13). Without it the resolver would
/// offer a fatbin's PTX to a driver too old to JIT it. Layout, as nvcc 13.2 writes it: a
/// 16-byte header (u32 magic `0xba55ed50`, u16 version, u16 header size, u64 size of the
/// entries), then entries, each a header (u16 kind, 1 = PTX and 2 = ELF, at 0; u32 header size
/// at 4; u64 padded payload size at 8; u16 PTX ISA minor and major at 24 and 26) and a payload.
fn fatbin_ptx_isa(bytes: &[u8]) -> Option<PtxIsa> {
    let field = |at: usize, width: usize| -> Option<u64> {
        let field = bytes.get(at..at.checked_add(width)?)?;
        Some(
            field
                .iter()
                .rev()
                .fold(0, |value, byte| (value << 8) | u64::from(*byte)),
        )
    };
    if field(0, 4)? != 0xba55_ed50 {
        return None;
    }
    let mut at = usize::try_from(field(6, 2)?).ok()?;
    let end = at
        .checked_add(usize::try_from(field(8, 8)?).ok()?)?
        .min(bytes.len());
    let mut newest = None;
    while at < end {
        let header = usize::try_from(field(at + 4, 4)?).ok()?;
        if header < 28 {
            break;
        }
        if field(at, 2)? == 1 {
            newest = newest.max(Some(PtxIsa {
                major: u8::try_from(field(at + 26, 2)?).ok()?,
                minor: u8::try_from(field(at + 24, 2)?).ok()?,
            }));
        }
        at = at
            .checked_add(header)?
            .checked_add(usize::try_from(field(at + 8, 8)?).ok()?)?;
    }
    newest
}

/// Turns a finished job into the pair's status, publishing its artifact when it built.
fn finish_pair(
    cache: &Cache,
    pending: &Pending,
    kernel: &str,
    target: &Target,
    outcome: Outcome,
) -> Result<(PairStatus, Option<PathBuf>), CacheError> {
    let failed = |error: String| Ok((PairStatus::Failed { error }, None));
    match outcome {
        Outcome::Succeeded => match std::fs::read(&pending.output) {
            Ok(bytes) => {
                let ptx_isa = match pending.format {
                    Format::Ptx => inspect::ptx_version(&String::from_utf8_lossy(&bytes)),
                    Format::Fatbin => fatbin_ptx_isa(&bytes),
                    _ => None,
                };
                let blob = cache.store_blob(&bytes)?;
                let record = KeyRecord {
                    blob,
                    size: bytes.len() as u64,
                    format: pending.format,
                    ptx_isa,
                    toolchain: pending.toolchain.label(),
                };
                let entry = cache.publish(&Entry {
                    kernel: kernel.to_string(),
                    backend: pending.backend,
                    origin: pending.origin.clone(),
                    target: target.clone(),
                    key: pending.key.clone(),
                    record,
                })?;
                Ok((PairStatus::Built, Some(entry.artifact_path())))
            }
            Err(err) => failed(format!(
                "the compiler succeeded but its output {} is unreadable: {err}",
                pending.output.display()
            )),
        },
        Outcome::Failed {
            command,
            code,
            stderr,
        } => failed(format!(
            "`{command}` exited with {}:\n{stderr}",
            code.map_or("a signal".to_string(), |code| format!("code {code}"))
        )),
        Outcome::NotStarted { command, error } => {
            failed(format!("could not start `{command}`: {error}"))
        }
        Outcome::Cancelled => failed(
            "not built: an earlier compile failed (pass --keep-going to build the rest anyway)"
                .into(),
        ),
    }
}

/// Builds every (kernel, target) pair of the manifest into the cache.
pub fn build(
    manifest: &Manifest,
    cache: &Cache,
    options: &BuildOptions,
) -> Result<BuildReport, BuildError> {
    let unknown: Vec<&str> = options
        .only
        .iter()
        .filter(|name| !manifest.kernels.iter().any(|kernel| &kernel.name == *name))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(UnknownKernel {
            wanted: unknown.into_iter().map(String::from).collect(),
            place: format!("the manifest {}", manifest.path.display()),
            known: manifest.names(),
            advice: "check --kernel",
        }
        .into());
    }
    let kernels: Vec<&Kernel> = manifest
        .kernels
        .iter()
        .filter(|kernel| options.only.is_empty() || options.only.contains(&kernel.name))
        .collect();
    let mut toolchains = Toolchains::new(
        Some(cache.root().join("toolchains.json")),
        options.search_path.clone(),
    );
    let manifest_dir = manifest
        .path
        .parent()
        .map(|dir| dir.display().to_string())
        .unwrap_or_default();
    let mut scratch = Scratch { cache, root: None };

    let mut pairs = Vec::new();
    let mut pending = Vec::new();
    let mut jobs = Vec::new();
    let mut missing = Vec::new();
    for kernel in kernels {
        let inputs = hash_inputs(kernel, &manifest.path)?;
        let origin = origin_of(kernel, &inputs);
        let Some(toolchain) = toolchains.pick(&kernel.toolchains)? else {
            let status = match impossible_here(kernel) {
                Some(reason) => PairStatus::Unsupported {
                    reason: reason.to_string(),
                },
                None => {
                    let error = missing_toolchain_message(kernel);
                    missing.push(error.clone());
                    PairStatus::Skipped { error }
                }
            };
            pairs.extend(kernel.targets.iter().map(|target| PairReport {
                kernel: kernel.name.clone(),
                target: target.clone(),
                status: status.clone(),
                artifact: None,
                toolchain: None,
            }));
            continue;
        };
        // (translation unit, output directory), made when the kernel's first job is queued.
        let mut kernel_scratch: Option<(PathBuf, PathBuf)> = None;
        for target in &kernel.targets {
            let backend = target.backend();
            let recipe = toolchain::recipe(&toolchain, kernel, target);
            let key = cache_key(&inputs, target, &toolchain, &recipe, &manifest_dir);
            let mut report = PairReport {
                kernel: kernel.name.clone(),
                target: target.clone(),
                status: PairStatus::UpToDate,
                artifact: None,
                toolchain: Some(toolchain.label()),
            };
            let current = cache
                .entry(backend, &kernel.name, &origin, target)?
                .filter(|entry| entry.key == key);
            if let Some(entry) = current {
                if matches!(
                    cache.check_blob(&entry.record.blob)?,
                    cache::BlobCheck::Valid
                ) {
                    report.artifact = Some(entry.artifact_path());
                    pairs.push(report);
                    continue;
                }
            }
            if let Some(record) = cache.lookup_key(&key)? {
                let entry = Entry {
                    kernel: kernel.name.clone(),
                    backend,
                    origin: origin.clone(),
                    target: target.clone(),
                    key,
                    record,
                };
                cache.publish(&entry)?;
                report.status = PairStatus::Reused;
                report.artifact = Some(entry.artifact_path());
                pairs.push(report);
                continue;
            }
            let (input, kernel_dir) = match &kernel_scratch {
                Some(made) => made,
                None => {
                    kernel_scratch.insert(scratch.for_kernel(kernel).map_err(BuildError::TempDir)?)
                }
            };
            let output = kernel_dir.join(format!(
                "{}.{}",
                target.file_stem(),
                recipe.format.extension()
            ));
            jobs.push(Job {
                label: format!("{} {target}", kernel.name),
                steps: substitute(&recipe, input, &output, &scratch.prelude()),
            });
            pending.push(Pending {
                report_index: pairs.len(),
                backend,
                origin: origin.clone(),
                key,
                format: recipe.format,
                toolchain: toolchain.clone(),
                output,
            });
            pairs.push(report);
        }
    }
    toolchains.save_memo();
    if !missing.is_empty() && !options.keep_going {
        return Err(BuildError::MissingToolchains(missing.join("\n")));
    }

    let progress = progress_bar(jobs.len(), options.progress);
    let finished = exec::execute(
        &jobs,
        options.jobs,
        !options.keep_going,
        options.launcher.as_ref(),
        &progress,
        |index, outcome| {
            let pending = &pending[index];
            let report = &pairs[pending.report_index];
            finish_pair(cache, pending, &report.kernel, &report.target, outcome)
        },
    );
    progress.finish_and_clear();
    for (pending, result) in pending.iter().zip(finished) {
        let (status, artifact) = result?;
        let report = &mut pairs[pending.report_index];
        report.status = status;
        report.artifact = artifact;
    }
    let evicted_blobs = match options.max_cache_bytes {
        // Listing blob sizes is cheap; the full gc sweep runs only when over the cap.
        Some(max) if cache.blob_bytes()? > max => cache.gc(max)?.blobs_removed,
        _ => 0,
    };
    Ok(BuildReport {
        cache: cache.root().to_path_buf(),
        pairs,
        evicted_blobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fatbin laid out as nvcc 13.2 writes one: an ELF entry, then a PTX 9.2 entry.
    fn fatbin() -> Vec<u8> {
        let entry = |kind: u16, minor: u16, major: u16, payload: &[u8]| {
            let mut header = vec![0u8; 64];
            header[..2].copy_from_slice(&kind.to_le_bytes());
            header[4..8].copy_from_slice(&64u32.to_le_bytes());
            header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            header[24..26].copy_from_slice(&minor.to_le_bytes());
            header[26..28].copy_from_slice(&major.to_le_bytes());
            [header, payload.to_vec()].concat()
        };
        let entries = [entry(2, 8, 1, b"\x7fELF...."), entry(1, 2, 9, b"ptx.")].concat();
        let mut bytes = 0xba55_ed50u32.to_le_bytes().to_vec();
        bytes.extend([1, 0, 16, 0]);
        bytes.extend((entries.len() as u64).to_le_bytes());
        [bytes, entries].concat()
    }

    #[test]
    fn reads_the_ptx_isa_of_a_fatbin() {
        let bytes = fatbin();
        assert_eq!(fatbin_ptx_isa(&bytes), Some(PtxIsa { major: 9, minor: 2 }));
        assert_eq!(fatbin_ptx_isa(&bytes[..100]), None, "truncated");
        assert_eq!(fatbin_ptx_isa(b"not a fatbin at all"), None);
        let mut zero_header = bytes.clone();
        zero_header[20..24].fill(0);
        assert_eq!(fatbin_ptx_isa(&zero_header), None, "stops, no endless loop");
    }
}
