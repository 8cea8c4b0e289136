//! Real compilations with the machine's clang: CUDA -> PTX and HIP -> AMDGPU code objects for
//! the example manifest, checked by the `.target` lines and ELF `e_flags` the compiler wrote;
//! then incremental rebuilds, header edits and a corrupted blob.

use std::path::{Path, PathBuf};

use headroom_kernels::build::{build, BuildOptions, BuildReport, PairStatus};
use headroom_kernels::cache::Cache;
use headroom_kernels::inspect::{amd_code_object, ptx_target, ptx_version};
use headroom_kernels::manifest::{Language, Manifest};
use headroom_kernels::target::FeatureSetting;
use headroom_kernels::toolchain::{ToolchainKind, Toolchains};

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
}

/// The example's CUDA and HIP kernels, copied into `dir` and forced onto clang.
fn clang_manifest(dir: &Path) -> Manifest {
    copy_dir(&example_dir(), dir);
    let mut manifest = Manifest::load(&dir.join("kernels.toml")).unwrap();
    manifest
        .kernels
        .retain(|kernel| kernel.language != Language::Metal);
    for kernel in &mut manifest.kernels {
        kernel.toolchains = vec![ToolchainKind::Clang];
    }
    manifest
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn have_clang() -> bool {
    let found = Toolchains::new(None, None)
        .get(ToolchainKind::Clang)
        .ok()
        .flatten()
        .is_some();
    if !found {
        headroom_testkit::skip(
            "clang",
            "no clang on PATH (install clang-19 or set HEADROOM_CLANG)",
        );
    }
    found
}

fn statuses(report: &BuildReport) -> Vec<(String, String, &'static str)> {
    report
        .pairs
        .iter()
        .map(|pair| {
            let status = match &pair.status {
                PairStatus::UpToDate => "up-to-date",
                PairStatus::Reused => "reused",
                PairStatus::Built => "built",
                PairStatus::Failed { error } => {
                    panic!("{} {} failed: {error}", pair.kernel, pair.target)
                }
                PairStatus::Skipped { error: why } | PairStatus::Unsupported { reason: why } => {
                    panic!("{} {} skipped: {why}", pair.kernel, pair.target)
                }
            };
            (pair.kernel.clone(), pair.target.to_string(), status)
        })
        .collect()
}

fn count(report: &BuildReport, wanted: &str) -> usize {
    statuses(report)
        .iter()
        .filter(|(_, _, status)| *status == wanted)
        .count()
}

#[test]
fn clang_builds_ptx_and_code_objects_for_every_target() {
    if !have_clang() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let manifest = clang_manifest(project.path());
    let cache = Cache::open(cache_dir.path()).unwrap();
    let report = build(&manifest, &cache, &BuildOptions::default()).unwrap();
    assert_eq!(count(&report, "built"), report.pairs.len());

    for pair in &report.pairs {
        let bytes = std::fs::read(cache_dir.path().join(pair.artifact.as_ref().unwrap())).unwrap();
        let target = pair.target.to_string();
        if let Some(cuda_arch) = target
            .strip_prefix("sm_")
            .or_else(|| target.strip_prefix("compute_"))
        {
            let ptx = String::from_utf8(bytes).unwrap();
            assert_eq!(
                ptx_target(&ptx),
                Some(format!("sm_{cuda_arch}").as_str()),
                "{target}"
            );
            assert!(ptx_version(&ptx).is_some(), "{target} has no .version");
            assert!(ptx.contains(".entry"), "{target} has no kernel entry");
        } else {
            let object = amd_code_object(&bytes).unwrap();
            let processor = target.split(':').next().unwrap();
            assert_eq!(
                object.processor,
                Some(processor),
                "{target}: e_flags {:#x}",
                object.e_flags
            );
            let expected_xnack = if target.contains("xnack-") {
                FeatureSetting::Off
            } else {
                FeatureSetting::Any
            };
            assert_eq!(object.xnack, expected_xnack, "{target}");
        }
    }
    // The layout is browsable and the entry records the PTX ISA the resolver needs.
    let newest = |backend, kernel| {
        cache
            .origin_entries(backend, kernel, &headroom_kernels::cache::Origin::Newest)
            .unwrap()
    };
    let entries = newest(headroom_kernels::target::Backend::Cuda, "vector_add");
    assert_eq!(entries.len(), 7);
    assert!(entries.iter().all(|entry| entry.record.ptx_isa.is_some()));
    let hip = newest(headroom_kernels::target::Backend::Hip, "vector_add_hip");
    assert!(cache_dir
        .path()
        .join("hip/vector_add_hip")
        .join(&hip[0].origin)
        .join("gfx90a_xnack-.hsaco")
        .is_file());
}

#[test]
fn rebuilds_are_incremental_and_follow_header_edits() {
    if !have_clang() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let mut manifest = clang_manifest(project.path());
    manifest
        .kernels
        .retain(|kernel| kernel.name == "vector_add" || kernel.name == "softmax");
    let cache = Cache::open(cache_dir.path()).unwrap();
    let total = build(&manifest, &cache, &BuildOptions::default())
        .unwrap()
        .pairs
        .len();

    let again = build(&manifest, &cache, &BuildOptions::default()).unwrap();
    assert_eq!(count(&again, "up-to-date"), total);

    // Both kernels include common.h: editing it rebuilds everything.
    let header = project.path().join("include/common.h");
    let text = std::fs::read_to_string(&header).unwrap();
    std::fs::write(&header, format!("{text}\n// edited\n")).unwrap();
    assert_eq!(
        count(
            &build(&manifest, &cache, &BuildOptions::default()).unwrap(),
            "built"
        ),
        total
    );

    // Going back finds the old build still in place (each build keeps its own entries),
    // without compiling.
    std::fs::write(&header, text).unwrap();
    assert_eq!(
        count(
            &build(&manifest, &cache, &BuildOptions::default()).unwrap(),
            "up-to-date"
        ),
        total
    );

    // A changed define changes only that kernel's keys.
    manifest
        .kernels
        .iter_mut()
        .find(|kernel| kernel.name == "softmax")
        .unwrap()
        .defines
        .insert("BLOCK".into(), "512".into());
    let report = build(&manifest, &cache, &BuildOptions::default()).unwrap();
    let rebuilt: Vec<_> = statuses(&report)
        .into_iter()
        .filter(|(_, _, status)| *status == "built")
        .map(|(kernel, _, _)| kernel)
        .collect();
    assert_eq!(rebuilt, ["softmax"; 3]);
}

#[test]
fn a_flipped_byte_in_a_blob_is_detected_and_rebuilt() {
    if !have_clang() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let mut manifest = clang_manifest(project.path());
    manifest
        .kernels
        .retain(|kernel| kernel.name == "vector_add");
    let cache = Cache::open(cache_dir.path()).unwrap();
    build(&manifest, &cache, &BuildOptions::default()).unwrap();

    let origin = cache
        .origin_entries(
            headroom_kernels::target::Backend::Cuda,
            "vector_add",
            &headroom_kernels::cache::Origin::Newest,
        )
        .unwrap()[0]
        .origin
        .clone();
    let artifact = cache_dir
        .path()
        .join("cuda/vector_add")
        .join(origin)
        .join("sm_75.ptx");
    let blob = std::fs::canonicalize(&artifact).unwrap();
    assert!(blob.starts_with(std::fs::canonicalize(cache_dir.path().join("blobs")).unwrap()));
    let good = std::fs::read(&blob).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x20;
    std::fs::write(&blob, bad).unwrap();

    let report = build(&manifest, &cache, &BuildOptions::default()).unwrap();
    let built: Vec<_> = statuses(&report)
        .into_iter()
        .filter(|(_, _, status)| *status == "built")
        .map(|(_, target, _)| target)
        .collect();
    // sm_75 shares its blob with no other target, so only it rebuilds.
    assert_eq!(built, ["sm_75"]);
    assert_eq!(std::fs::read(&artifact).unwrap(), good);
}
