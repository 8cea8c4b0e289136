//! `headroom kernels`: build a kernel manifest for every target, keep the artifacts in the
//! content-addressed cache, ship them as bundles, and resolve the right one for a device.
//! The work lives in the `headroom-kernels` crate; this module parses flags and prints.

mod render;
mod store;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use headroom_kernels::build::{build, BuildOptions};
use headroom_kernels::exec::Launcher;

use headroom_config::BuildOverrides;
use headroom_kernels::bundle;
use headroom_kernels::cache::{Cache, Origin};
use headroom_kernels::local;
use headroom_kernels::manifest::{Manifest, ManifestError, UnknownKernel};
use headroom_kernels::resolve::{Device, PtxIsa, ResolveOptions};
use headroom_kernels::toolchain::{ToolchainKind, Toolchains, LOOKUP};

/// Exit code when the work ran but did not succeed: a pair failed or lacks a toolchain this
/// machine could have, or no artifact runs on the device.
const EXIT_INCOMPLETE: u8 = 1;

/// Arguments of `headroom kernels`.
#[derive(Args)]
pub struct KernelsArgs {
    /// The kernel manifest.
    #[arg(
        long,
        global = true,
        env = "HEADROOM_KERNEL_MANIFEST",
        default_value = "kernels.toml"
    )]
    manifest: PathBuf,
    /// The kernel cache directory [default: ~/.cache/headroom/kernels].
    #[arg(long, global = true, env = "HEADROOM_KERNEL_CACHE")]
    cache: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// The shared kernel store: s3://bucket/prefix, redis://host[:port][/db],
    /// webdav+http(s)://host/path or file:///absolute/path [default: `store` under [kernels] in
    /// headroom.toml or the user's settings].
    #[arg(
        long,
        global = true,
        env = "HEADROOM_KERNEL_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: Option<String>,
    /// Only read the kernel store: `push` is refused (as with `?read-only` in its URL).
    #[arg(
        long,
        global = true,
        env = "HEADROOM_KERNEL_STORE_READ_ONLY",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    read_only: bool,
    #[command(subcommand)]
    command: KernelsCommand,
}

#[derive(Subcommand)]
enum KernelsCommand {
    /// Build every (kernel, target) pair of the manifest that is not already cached.
    #[command(after_help = LOOKUP)]
    Build(BuildArgs),
    /// Pick the artifact of KERNEL that runs best on a device.
    Resolve(ResolveArgs),
    /// List the artifacts in the cache.
    Ls,
    /// Evict least recently used artifacts until the cache fits a size.
    Gc(CacheLimitArgs),
    /// Write one build of each kernel (the manifest's, else the newest) into one tar+zstd bundle.
    Export(ExportArgs),
    /// Verify a bundle and add its artifacts to the cache.
    Import(ImportArgs),
    /// Copy one build of each kernel (the manifest's, else the newest) to the shared kernel
    /// store (--store).
    Push(PushArgs),
    /// Copy artifacts from the shared kernel store (--store) into the cache: with --device, only
    /// the one each kernel resolves to.
    Pull(PullArgs),
    /// Show which toolchains this machine has.
    #[command(after_help = LOOKUP)]
    Toolchains,
}

#[derive(Args)]
struct BuildArgs {
    /// Compile jobs at once [default: the number of CPUs]; the memory governor may run fewer.
    #[arg(long, short = 'j', env = "HEADROOM_JOBS")]
    jobs: Option<usize>,
    /// Do not read or write the governor's build history.
    #[arg(long)]
    no_history: bool,
    /// Build what can be built when a toolchain is missing or a compile fails.
    #[arg(long)]
    keep_going: bool,
    /// Build only this kernel (repeatable).
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    #[command(flatten)]
    cache_limit: CacheLimitArgs,
}

#[derive(Args)]
struct ResolveArgs {
    /// The kernel name from the manifest. Where the manifest (--manifest) defines it, only
    /// artifacts built from its sources and flags are taken; else those of the kernel's newest
    /// build in the cache.
    kernel: String,
    /// The device: local (this machine's GPU, asked of the CUDA driver), sm_89, gfx1100,
    /// gfx90a:xnack-, apple-m3, apple9.
    #[arg(long, default_value = local::LOCAL)]
    device: String,
    /// The newest PTX ISA version the installed driver can JIT-compile, e.g. 8.4.
    #[arg(long, value_name = "VERSION")]
    driver_ptx: Option<String>,
    /// Say why each candidate was taken or rejected.
    #[arg(long)]
    explain: bool,
    /// First pull the artifact that runs best on the device from the kernel store (--store).
    #[arg(long)]
    fetch: bool,
}

/// The kernel cache's size limit: what `gc` evicts to, and `build` once it has built.
#[derive(Args)]
struct CacheLimitArgs {
    /// The size the cache must fit in (e.g. 2G; 0 empties it): least recently used artifacts
    /// are evicted until it does (by `build`, after building).
    #[arg(
        long,
        env = "HEADROOM_KERNEL_CACHE_MAX",
        value_name = "SIZE",
        default_value = "10G"
    )]
    max_size: String,
}

impl CacheLimitArgs {
    fn bytes(&self) -> anyhow::Result<u64> {
        headroom_size::parse_size(&self.max_size)
            .context("in --max-size (or HEADROOM_KERNEL_CACHE_MAX)")
    }
}

#[derive(Args)]
struct ExportArgs {
    /// The bundle to write (conventionally `kernels.tar.zst`).
    file: PathBuf,
    /// Export this kernel (repeatable) [default: the manifest's kernels, else every kernel in
    /// the cache].
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
}

#[derive(Args)]
struct ImportArgs {
    /// The bundle to read.
    file: PathBuf,
}

#[derive(Args)]
struct PushArgs {
    /// Push this kernel (repeatable) [default: the manifest's kernels, else every kernel in
    /// the cache].
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
}

#[derive(Args)]
struct PullArgs {
    /// Pull this kernel (repeatable) [default: the manifest's kernels and the cache's].
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    /// Pull only what runs best on this device: local, sm_89, gfx1100, gfx90a:xnack-, apple9.
    #[arg(long)]
    device: Option<String>,
    /// With --device: the newest PTX ISA version the installed driver can JIT-compile.
    #[arg(long, value_name = "VERSION", requires = "device")]
    driver_ptx: Option<String>,
}

pub fn main(args: KernelsArgs) -> anyhow::Result<u8> {
    let root = Cache::default_root(args.cache.as_deref())?;
    let open_cache = || {
        Cache::open(&root).with_context(|| format!("opening the kernel cache {}", root.display()))
    };
    match args.command {
        KernelsCommand::Build(build_args) => {
            run_build(&args.manifest, open_cache()?, build_args, args.json)
        }
        KernelsCommand::Resolve(resolve_args) => {
            let store = resolve_args
                .fetch
                .then(|| store::open_for_reading(args.store.as_deref(), args.read_only))
                .transpose()?;
            run_resolve(
                &open_cache()?,
                &args.manifest,
                store.as_ref(),
                resolve_args,
                args.json,
            )
        }
        KernelsCommand::Push(push_args) => {
            let store = store::open(args.store.as_deref(), args.read_only)?;
            let cache = open_cache()?;
            let builds = builds_to_ship(&cache, &args.manifest, push_args.kernels)?;
            store::push(&store, &cache, &builds, args.json)
        }
        KernelsCommand::Pull(pull_args) => {
            let store = store::open_for_reading(args.store.as_deref(), args.read_only)?;
            run_pull(&open_cache()?, &args.manifest, &store, pull_args, args.json)
        }
        KernelsCommand::Ls => {
            let entries = open_cache()?.entries()?;
            headroom_output::print_json_or(args.json, &entries, || render::entries(&entries))?;
            Ok(0)
        }
        KernelsCommand::Gc(cache_limit) => {
            let max = cache_limit.bytes()?;
            let report = open_cache()?.gc(max)?;
            headroom_output::print_json_or(args.json, &report, || render::gc(&report))?;
            Ok(0)
        }
        KernelsCommand::Export(export_args) => {
            headroom_output::check("export to", &export_args.file)?;
            let cache = open_cache()?;
            let builds = builds_to_ship(&cache, &args.manifest, export_args.kernels)?;
            let summary = bundle::export(&cache, &export_args.file, &builds)
                .with_context(|| format!("exporting to {}", export_args.file.display()))?;
            headroom_output::print_json_or(args.json, &summary, || {
                format!(
                    "exported {} artifacts ({} bytes) to {}\n",
                    summary.artifacts,
                    summary.bytes,
                    export_args.file.display()
                )
            })?;
            Ok(0)
        }
        KernelsCommand::Import(import_args) => {
            let summary = bundle::import(&open_cache()?, &import_args.file)
                .with_context(|| format!("importing {}", import_args.file.display()))?;
            headroom_output::print_json_or(args.json, &summary, || {
                format!(
                    "imported {} artifacts ({} bytes) into {}\n",
                    summary.artifacts,
                    summary.bytes,
                    root.display()
                )
            })?;
            Ok(0)
        }
        KernelsCommand::Toolchains => {
            let mut toolchains = Toolchains::new(None, None);
            let mut found = Vec::new();
            for kind in ToolchainKind::ALL {
                found.push((kind, toolchains.get(kind)?.cloned()));
            }
            let json: Vec<_> = found
                .iter()
                .map(
                    |(kind, toolchain)| serde_json::json!({ "kind": kind, "toolchain": toolchain }),
                )
                .collect();
            headroom_output::print_json_or(args.json, &json, || render::toolchains(&found))?;
            Ok(0)
        }
    }
}

fn run_build(
    manifest_path: &Path,
    cache: Cache,
    args: BuildArgs,
    json: bool,
) -> anyhow::Result<u8> {
    let manifest = Manifest::load(manifest_path)?;
    // Compiles run under the same memory governor as `headroom build`: nvcc and ptxas are
    // memory hogs, and the governor's history learns what each (kernel, target) needs.
    let overrides = BuildOverrides {
        jobs: args.jobs,
        ..BuildOverrides::default()
    };
    let description = format!(
        "headroom kernels build --manifest {}",
        manifest_path.display()
    );
    let governed = headroom_govern::start::start_session(
        headroom_config::session_settings(&overrides)?,
        !args.no_history,
        description,
        None,
        None,
        None,
    )?;
    let launcher = Launcher {
        program: governed.session.launcher(),
        env: governed.session.launcher_env(),
    };
    let options = BuildOptions {
        jobs: governed.settings.build.jobs,
        keep_going: args.keep_going,
        only: args.kernels,
        progress: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        max_cache_bytes: Some(args.cache_limit.bytes()?),
        search_path: None,
        launcher: Some(launcher),
    };
    let started = std::time::Instant::now();
    let built = build(&manifest, &cache, &options);
    let succeeded = built.as_ref().is_ok_and(|report| report.all_succeeded());
    governed
        .session
        .finish(Some(if succeeded { 0 } else { 1 }), false);
    let report = built?;
    headroom_output::print_json_or(json, &report, || render::build(&report, started.elapsed()))?;
    Ok(if succeeded { 0 } else { EXIT_INCOMPLETE })
}

/// The kernel names of the cache and of the manifest (where it can be read), and where they
/// were looked for.
fn known_kernels(cache: &Cache, manifest_path: &Path) -> anyhow::Result<(Vec<String>, String)> {
    let mut known: BTreeSet<String> = cache
        .entries()?
        .into_iter()
        .map(|entry| entry.kernel)
        .collect();
    let mut place = format!("the cache {}", cache.root().display());
    // `resolve` and `pull` need no manifest (a user's machine imports a bundle), so one that
    // cannot be read only leaves its names out.
    if let Ok(manifest) = Manifest::load(manifest_path) {
        known.extend(manifest.names());
        place.push_str(&format!(" or the manifest {}", manifest.path.display()));
    }
    Ok((known.into_iter().collect(), place))
}

/// Fails when no kernel of the cache or the manifest (where it can be read) is named `name`.
fn check_kernel_exists(cache: &Cache, manifest_path: &Path, name: &str) -> anyhow::Result<()> {
    let (known, place) = known_kernels(cache, manifest_path)?;
    if known.iter().any(|known| known == name) {
        return Ok(());
    }
    Err(UnknownKernel {
        wanted: vec![name.to_string()],
        place,
        advice: if known.is_empty() {
            "run `headroom kernels build` or `headroom kernels import` first"
        } else {
            "check the name"
        },
        known,
    }
    .into())
}

/// A `--device` value: `local` asks the CUDA driver for this machine's GPU, anything else
/// names the device.
fn device_flag(text: &str) -> anyhow::Result<Device> {
    if text == local::LOCAL {
        return Ok(local::local_device()?);
    }
    text.parse().context("in --device")
}

/// The project's manifest, `None` where there is none. One that exists but cannot be read
/// is an error: it says which build of each kernel is the project's, and without it another
/// project's artifacts would be taken for this one's.
fn project_manifest(path: &Path) -> anyhow::Result<Option<Manifest>> {
    match Manifest::load(path) {
        Ok(manifest) => Ok(Some(manifest)),
        Err(ManifestError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(err) => Err(err).context(
            "the manifest says which build of each kernel is this project's: fix it, or pass the project's manifest with --manifest",
        ),
    }
}

/// Which build of `kernel` is this project's: where the manifest defines the kernel, the one
/// of its current sources and flags; else the newest in the cache.
fn project_origin(manifest: Option<&Manifest>, kernel: &str) -> anyhow::Result<Origin> {
    let defined = manifest.and_then(|manifest| {
        let definition = manifest.kernels.iter().find(|each| each.name == kernel)?;
        Some((manifest, definition))
    });
    Ok(match defined {
        Some((manifest, definition)) => {
            Origin::Exactly(headroom_kernels::build::origin(definition, &manifest.path)?)
        }
        None => Origin::Newest,
    })
}

/// Each kernel with the build of it this project takes ([`project_origin`]).
fn with_origins(
    manifest: Option<&Manifest>,
    kernels: Vec<String>,
) -> anyhow::Result<Vec<(String, Origin)>> {
    kernels
        .into_iter()
        .map(|kernel| {
            let origin = project_origin(manifest, &kernel)?;
            Ok((kernel, origin))
        })
        .collect()
}

/// What `export` and `push` ship: one build of each named kernel, else of each kernel of the
/// manifest that the cache holds (Metal's, say, is never built off macOS), else of every
/// kernel of the cache; the manifest's build where it defines the kernel, else the newest.
fn builds_to_ship(
    cache: &Cache,
    manifest_path: &Path,
    named: Vec<String>,
) -> anyhow::Result<Vec<(String, Origin)>> {
    let manifest = project_manifest(manifest_path)?;
    if !named.is_empty() {
        return with_origins(manifest.as_ref(), named);
    }
    let Some(manifest) = manifest else {
        return Ok(Vec::new());
    };
    let cached: BTreeSet<String> = cache
        .entries()?
        .into_iter()
        .map(|entry| entry.kernel)
        .collect();
    let names: Vec<String> = manifest
        .names()
        .into_iter()
        .filter(|name| cached.contains(name))
        .collect();
    anyhow::ensure!(
        !names.is_empty(),
        "none of the kernels of the manifest {} is in the cache {}; run `headroom kernels build` first, or name kernels with --kernel",
        manifest.path.display(),
        cache.root().display()
    );
    with_origins(Some(&manifest), names)
}

fn resolve_options(driver_ptx: Option<&str>) -> anyhow::Result<ResolveOptions> {
    let driver_ptx = driver_ptx
        .map(str::parse::<PtxIsa>)
        .transpose()
        .context("in --driver-ptx")?;
    Ok(ResolveOptions { driver_ptx })
}

/// Pulls the named kernels, else those of the manifest and the cache.
fn run_pull(
    cache: &Cache,
    manifest_path: &Path,
    store: &store::Reading,
    args: PullArgs,
    json: bool,
) -> anyhow::Result<u8> {
    let names = if args.kernels.is_empty() {
        known_kernels(cache, manifest_path)?.0
    } else {
        args.kernels
    };
    let kernels = with_origins(project_manifest(manifest_path)?.as_ref(), names)?;
    anyhow::ensure!(
        !kernels.is_empty(),
        "nothing to pull: name kernels with --kernel (there is no manifest {} and the cache {} is empty)",
        manifest_path.display(),
        cache.root().display()
    );
    let options = resolve_options(args.driver_ptx.as_deref())?;
    let device = args.device.as_deref().map(device_flag).transpose()?;
    store::pull(
        store,
        cache,
        &kernels,
        device.as_ref().map(|device| (device, &options)),
        json,
    )
}

/// Resolves against the cache, after pulling from `store` with `--fetch`.
fn run_resolve(
    cache: &Cache,
    manifest_path: &Path,
    store: Option<&store::Reading>,
    args: ResolveArgs,
    json: bool,
) -> anyhow::Result<u8> {
    let device = device_flag(&args.device)?;
    let options = resolve_options(args.driver_ptx.as_deref())?;
    let manifest = project_manifest(manifest_path)?;
    let origin = project_origin(manifest.as_ref(), &args.kernel)?;
    if let Some(store) = store {
        store::fetch(store, cache, (&args.kernel, &origin), &device, &options)?;
    }
    let (entries, explanation) = cache.resolve_origin(&args.kernel, &origin, &device, &options)?;
    // Entries of an older headroom show that the kernel exists; the message below names them.
    if entries.is_empty() && cache.legacy_entries(device.backend(), &args.kernel)? == 0 {
        check_kernel_exists(cache, manifest_path, &args.kernel)?;
    }
    let chosen = explanation.chosen.map(|index| &entries[index]);
    if json {
        let candidates: Vec<_> = entries
            .iter()
            .zip(&explanation.verdicts)
            .map(|(entry, verdict)| serde_json::json!({ "target": entry.target, "format": entry.record.format, "artifact": cache.root().join(entry.artifact_path()), "verdict": verdict.to_string() }))
            .collect();
        let output = serde_json::json!({
            "kernel": args.kernel,
            "device": device.to_string(),
            "origin": match &origin { Origin::Exactly(origin) => Some(origin), Origin::Newest => None },
            "chosen": chosen.map(|entry| serde_json::json!({ "target": entry.target, "format": entry.record.format, "artifact": cache.root().join(entry.artifact_path()) })),
            "candidates": candidates,
        });
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        if args.explain {
            let explained = render::explanation(&entries, &explanation);
            headroom_output::say!("{}", explained.strip_suffix('\n').unwrap_or(&explained));
        }
        match chosen {
            Some(entry) => println!("{}", cache.root().join(entry.artifact_path()).display()),
            None if entries.is_empty() => headroom_output::say!(
                "headroom: {}",
                no_artifacts(cache, &args.kernel, &device, &origin, manifest.as_ref())?
            ),
            None => headroom_output::say!(
                "headroom: none of the {} artifacts of kernel `{}` runs on {device}; add a compatible target to the manifest (run with --explain to see why each was rejected)",
                entries.len(),
                args.kernel,
            ),
        }
    }
    Ok(if chosen.is_some() { 0 } else { EXIT_INCOMPLETE })
}

/// Why a resolve found no artifacts of `kernel` at all, and what to run: with the project's
/// manifest, the cache may hold other builds of that name (another project's, or this one's
/// before an edit), which are not this project's; without, entries an older headroom wrote,
/// which do not say which project built them.
fn no_artifacts(
    cache: &Cache,
    kernel: &str,
    device: &Device,
    origin: &Origin,
    manifest: Option<&Manifest>,
) -> anyhow::Result<String> {
    let backend = device.backend();
    let mut message = match (origin, manifest) {
        (Origin::Exactly(_), Some(manifest)) => format!(
            "no artifacts of kernel `{kernel}` built from its sources and flags in {} for {backend} devices are in {}; run `headroom kernels build`",
            manifest.path.display(),
            cache.root().display()
        ),
        _ => format!(
            "no artifacts of kernel `{kernel}` for {backend} devices in {}; run `headroom kernels build` or `headroom kernels import` first",
            cache.root().display()
        ),
    };
    let others = cache.builds(backend, kernel)?.len();
    if others > 0 {
        message.push_str(&format!(
            " (the cache holds {others} other build{} of `{kernel}`, from other sources or flags: another project's, or this one's before an edit; {} not used)",
            if others == 1 { "" } else { "s" },
            if others == 1 { "it is" } else { "they are" },
        ));
    }
    let legacy = cache.legacy_entries(backend, kernel)?;
    if legacy > 0 {
        message.push_str(&format!(
            " (the cache holds {legacy} artifact{} of `{kernel}` from an older headroom, which did not record which project built {}, so {} not used; `headroom kernels gc` removes them)",
            if legacy == 1 { "" } else { "s" },
            if legacy == 1 { "it" } else { "them" },
            if legacy == 1 { "it is" } else { "they are" },
        ));
    }
    Ok(message)
}
