//! `headroom kernels`: build a kernel manifest for every target, keep the artifacts in the
//! content-addressed cache, ship them as bundles, and resolve the right one for a device.
//! The work lives in the `headroom-kernels` crate; this module parses flags and prints.

mod render;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use headroom_kernels::build::{build, BuildOptions};
use headroom_kernels::exec::Launcher;

use crate::config::BuildOverrides;
use headroom_kernels::bundle;
use headroom_kernels::cache::Cache;
use headroom_kernels::manifest::{Manifest, UnknownKernel};
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
    Gc(GcArgs),
    /// Write the cached artifacts into one tar+zstd bundle.
    Export(ExportArgs),
    /// Verify a bundle and add its artifacts to the cache.
    Import(ImportArgs),
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
    /// After building, evict least recently used artifacts while the cache exceeds this size.
    #[arg(
        long,
        env = "HEADROOM_KERNEL_CACHE_MAX",
        value_name = "SIZE",
        default_value = "10G"
    )]
    max_size: String,
}

#[derive(Args)]
struct ResolveArgs {
    /// The kernel name from the manifest.
    kernel: String,
    /// The device: sm_89, gfx1100, gfx90a:xnack-, apple-m3, apple9.
    #[arg(long)]
    device: String,
    /// The newest PTX ISA version the installed driver can JIT-compile, e.g. 8.4.
    #[arg(long, value_name = "VERSION")]
    driver_ptx: Option<String>,
    /// Say why each candidate was taken or rejected.
    #[arg(long)]
    explain: bool,
}

#[derive(Args)]
struct GcArgs {
    /// The size the cache must fit in (e.g. 2G; 0 empties it).
    #[arg(
        long,
        env = "HEADROOM_KERNEL_CACHE_MAX",
        value_name = "SIZE",
        default_value = "10G"
    )]
    max_size: String,
}

#[derive(Args)]
struct ExportArgs {
    /// The bundle to write (conventionally `kernels.tar.zst`).
    file: PathBuf,
    /// Export only this kernel (repeatable).
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
}

#[derive(Args)]
struct ImportArgs {
    /// The bundle to read.
    file: PathBuf,
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
            run_resolve(&open_cache()?, &args.manifest, resolve_args, args.json)
        }
        KernelsCommand::Ls => {
            let entries = open_cache()?.entries()?;
            print_output(args.json, &entries, || render::entries(&entries))?;
            Ok(0)
        }
        KernelsCommand::Gc(gc_args) => {
            let max = parse_size_flag(&gc_args.max_size)?;
            let report = open_cache()?.gc(max)?;
            print_output(args.json, &report, || render::gc(&report))?;
            Ok(0)
        }
        KernelsCommand::Export(export_args) => {
            headroom_output::check("export to", &export_args.file)?;
            let summary =
                bundle::export(&open_cache()?, &export_args.file, &export_args.kernels)
                    .with_context(|| format!("exporting to {}", export_args.file.display()))?;
            print_output(args.json, &summary, || {
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
            print_output(args.json, &summary, || {
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
            print_output(args.json, &json, || render::toolchains(&found))?;
            Ok(0)
        }
    }
}

fn parse_size_flag(text: &str) -> anyhow::Result<u64> {
    headroom_size::parse_size(text).context("in --max-size (or HEADROOM_KERNEL_CACHE_MAX)")
}

fn print_output<T: serde::Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", human());
    }
    Ok(())
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
    let governed = crate::build::start_session(&overrides, !args.no_history, description, false)?;
    let launcher = Launcher {
        program: governed.session.launcher(),
        env: governed.session.launcher_env(),
    };
    let options = BuildOptions {
        jobs: governed.settings.jobs,
        keep_going: args.keep_going,
        only: args.kernels,
        progress: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        max_cache_bytes: Some(parse_size_flag(&args.max_size)?),
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
    print_output(json, &report, || render::build(&report, started.elapsed()))?;
    Ok(if succeeded { 0 } else { EXIT_INCOMPLETE })
}

/// Fails when no kernel of the cache or the manifest (where it can be read) is named `name`.
fn check_kernel_exists(cache: &Cache, manifest_path: &Path, name: &str) -> anyhow::Result<()> {
    let mut known: BTreeSet<String> = cache
        .entries()?
        .into_iter()
        .map(|entry| entry.kernel)
        .collect();
    let mut place = format!("the cache {}", cache.root().display());
    // `resolve` needs no manifest (a user's machine imports a bundle), so one that cannot be
    // read only leaves its names out.
    if let Ok(manifest) = Manifest::load(manifest_path) {
        known.extend(manifest.names());
        place.push_str(&format!(" or the manifest {}", manifest.path.display()));
    }
    if known.contains(name) {
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
        known: known.into_iter().collect(),
    }
    .into())
}

fn run_resolve(
    cache: &Cache,
    manifest_path: &Path,
    args: ResolveArgs,
    json: bool,
) -> anyhow::Result<u8> {
    let device: Device = args.device.parse().context("in --device")?;
    let driver_ptx = args
        .driver_ptx
        .as_deref()
        .map(str::parse::<PtxIsa>)
        .transpose()
        .context("in --driver-ptx")?;
    let (entries, explanation) =
        cache.resolve(&args.kernel, &device, &ResolveOptions { driver_ptx })?;
    if entries.is_empty() {
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
            "device": args.device,
            "chosen": chosen.map(|entry| serde_json::json!({ "target": entry.target, "format": entry.record.format, "artifact": cache.root().join(entry.artifact_path()) })),
            "candidates": candidates,
        });
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        if args.explain {
            eprint!("{}", render::explanation(&entries, &explanation));
        }
        match chosen {
            Some(entry) => println!("{}", cache.root().join(entry.artifact_path()).display()),
            None if entries.is_empty() => eprintln!(
                "headroom: no artifacts of kernel `{}` for {} devices in {}; run `headroom kernels build` or `headroom kernels import` first",
                args.kernel,
                device.backend(),
                cache.root().display()
            ),
            None => eprintln!(
                "headroom: none of the {} artifacts of kernel `{}` runs on {}; add a compatible target to the manifest (run with --explain to see why each was rejected)",
                entries.len(),
                args.kernel,
                args.device
            ),
        }
    }
    Ok(if chosen.is_some() { 0 } else { EXIT_INCOMPLETE })
}
