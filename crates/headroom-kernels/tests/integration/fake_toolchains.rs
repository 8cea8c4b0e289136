//! nvcc, hipcc and xcrun metal cannot exist on a Linux CI machine without GPUs, so these
//! tests put small scripted stand-ins on the toolchain search path. The scripts parse the
//! same command lines the real tools get and write recognisable artifacts.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use headroom_kernels::build::{build, BuildError, BuildOptions, BuildReport, PairStatus};
use headroom_kernels::cache::Cache;
use headroom_kernels::manifest::Manifest;
use headroom_kernels::resolve::{Format, ResolveOptions};

const NVCC: &str = r#"#!/bin/sh
# scripted nvcc
echo "$@" >> "$(dirname "$0")/calls.log"
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release 12.4, V12.4.131"
  exit 0
fi
mode=; arch=; out=; in=
while [ $# -gt 0 ]; do
  case "$1" in
    -cubin) mode=cubin ;; -ptx) mode=ptx ;; -fatbin) mode=fatbin ;;
    -arch=*) arch=${1#-arch=} ;;
    -gencode) shift; arch=$1 ;;
    -o) shift; out=$1 ;;
    -*) ;;
    *) in=$1 ;;
  esac
  shift
done
[ -f "$in" ] || { echo "nvcc fatal: cannot find $in" >&2; exit 1; }
if grep -q FAIL_COMPILE "$in"; then echo "$in(1): error: FAIL_COMPILE" >&2; exit 2; fi
if [ "$mode" = ptx ]; then
  printf '.version 8.5\n.target %s\n.visible .entry k()\n{\n\tret;\n}\n' "$(echo "$arch" | sed s/compute_/sm_/)" > "$out"
else
  printf 'FAKE %s %s\n' "$mode" "$arch" > "$out"
fi
"#;

const HIPCC: &str = r#"#!/bin/sh
# scripted hipcc
echo "$@" >> "$(dirname "$0")/calls.log"
if [ "$1" = "--version" ]; then echo "HIP version: 6.2.41133"; exit 0; fi
arch=; out=
while [ $# -gt 0 ]; do
  case "$1" in --offload-arch=*) arch=${1#--offload-arch=} ;; -o) shift; out=$1 ;; esac
  shift
done
printf 'FAKE hsaco %s\n' "$arch" > "$out"
"#;

const XCRUN: &str = r#"#!/bin/sh
# scripted xcrun: `xcrun -sdk macosx metal|metallib ...`
echo "$@" >> "$(dirname "$0")/calls.log"
[ "$1" = "-sdk" ] && shift 2
tool=$1; shift
if [ "$1" = "--version" ]; then echo "Apple metal version 32023.155 (metalfe-32023.155)"; exit 0; fi
std=; in=; out=
while [ $# -gt 0 ]; do
  case "$1" in -std=*) std=${1#-std=} ;; -o) shift; out=$1 ;; -c) ;; -*) ;; *) in=$1 ;; esac
  shift
done
case "$tool" in
  metal) printf 'AIR %s\n' "$std" > "$out" ;;
  metallib) { printf 'METALLIB '; cat "$in"; } > "$out" ;;
  *) echo "xcrun: unknown tool $tool" >&2; exit 72 ;;
esac
"#;

/// A directory of scripted toolchains; only the named ones are installed, and scripts already
/// there (a test may have "upgraded" one) are kept.
fn fake_toolchains(dir: &Path, names: &[&str]) -> OsString {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, script) in [("nvcc", NVCC), ("hipcc", HIPCC), ("xcrun", XCRUN)] {
        let path = bin.join(name);
        if names.contains(&name) && !path.exists() {
            std::fs::write(&path, script).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    // sh, sed, grep and cat for the scripts themselves come from the system.
    std::env::join_paths([bin, PathBuf::from("/usr/bin"), PathBuf::from("/bin")]).unwrap()
}

const MANIFEST: &str = r#"
[kernel.add]
language = "cuda"
sources = ["add.cu"]
targets = ["sm_80", "sm_90a", "sm_100f", "compute_90"]
toolchain = ["nvcc"]

[kernel.add_fat]
language = "cuda"
sources = ["add.cu"]
targets = ["sm_80"]
toolchain = ["nvcc"]
cuda-output = "fatbin"

[kernel.add_hip]
language = "hip"
sources = ["add.hip"]
targets = ["gfx90a:xnack-", "gfx11-generic"]
toolchain = ["hipcc"]

[kernel.scale]
language = "metal"
sources = ["scale.metal", "extra.metal"]
targets = ["apple8", "metal3.1"]
"#;

struct Fixture {
    dir: tempfile::TempDir,
    manifest: Manifest,
    cache: Cache,
}

impl Fixture {
    fn new(manifest_text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for source in ["add.cu", "add.hip", "scale.metal", "extra.metal"] {
            std::fs::write(dir.path().join(source), format!("// {source}\n")).unwrap();
        }
        std::fs::write(dir.path().join("kernels.toml"), manifest_text).unwrap();
        let manifest = Manifest::load(&dir.path().join("kernels.toml")).unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        Fixture {
            dir,
            manifest,
            cache,
        }
    }

    fn build(&self, tools: &[&str], keep_going: bool) -> Result<BuildReport, BuildError> {
        let options = BuildOptions {
            search_path: Some(fake_toolchains(self.dir.path(), tools)),
            keep_going,
            jobs: 1,
            ..BuildOptions::default()
        };
        build(&self.manifest, &self.cache, &options)
    }

    /// The artifact `<backend>/<kernel>/<file>` of the kernel's newest build.
    fn artifact(&self, path: &str) -> String {
        let (dir, file) = path.rsplit_once('/').unwrap();
        let (backend, kernel) = dir.split_once('/').unwrap();
        let backend = match backend {
            "cuda" => headroom_kernels::target::Backend::Cuda,
            "hip" => headroom_kernels::target::Backend::Hip,
            _ => headroom_kernels::target::Backend::Metal,
        };
        let entries = self
            .cache
            .origin_entries(backend, kernel, &headroom_kernels::cache::Origin::Newest)
            .unwrap();
        let origin = &entries[0].origin;
        std::fs::read_to_string(self.cache.root().join(dir).join(origin).join(file)).unwrap()
    }
}

fn status_of<'a>(report: &'a BuildReport, kernel: &str, target: &str) -> &'a PairStatus {
    &report
        .pairs
        .iter()
        .find(|pair| pair.kernel == kernel && pair.target.to_string() == target)
        .unwrap()
        .status
}

#[test]
fn nvcc_hipcc_and_metal_build_every_format() {
    let fixture = Fixture::new(MANIFEST);
    let report = fixture.build(&["nvcc", "hipcc", "xcrun"], false).unwrap();
    assert!(report.all_succeeded(), "{report:#?}");
    assert_eq!(
        fixture.artifact("cuda/add/sm_90a.cubin"),
        "FAKE cubin sm_90a\n"
    );
    assert_eq!(
        fixture.artifact("cuda/add/sm_100f.cubin"),
        "FAKE cubin sm_100f\n"
    );
    assert!(fixture
        .artifact("cuda/add/compute_90.ptx")
        .starts_with(".version 8.5\n.target sm_90\n"));
    assert_eq!(
        fixture.artifact("cuda/add_fat/sm_80.fatbin"),
        "FAKE fatbin arch=compute_80,code=[sm_80,compute_80]\n"
    );
    assert_eq!(
        fixture.artifact("hip/add_hip/gfx90a_xnack-.hsaco"),
        "FAKE hsaco gfx90a:xnack-\n"
    );
    assert_eq!(
        fixture.artifact("hip/add_hip/gfx11-generic.hsaco"),
        "FAKE hsaco gfx11-generic\n"
    );
    assert_eq!(
        fixture.artifact("metal/scale/metal3.1.metallib"),
        "METALLIB AIR metal3.1\n"
    );
    // Two sources compile as one unity translation unit.
    let calls = std::fs::read_to_string(fixture.dir.path().join("bin/calls.log")).unwrap();
    assert!(calls.contains("scale.unity.metal"), "{calls}");
}

#[test]
fn the_resolver_reads_the_ptx_isa_the_build_recorded() {
    let fixture = Fixture::new(MANIFEST);
    fixture.build(&["nvcc", "hipcc", "xcrun"], false).unwrap();
    let blackwell = "sm_100".parse().unwrap();
    let pick = |driver: &str| {
        let options = ResolveOptions {
            driver_ptx: Some(driver.parse().unwrap()),
        };
        let (entries, explanation) = fixture.cache.resolve("add", &blackwell, &options).unwrap();
        explanation.chosen.map(|index| {
            (
                entries[index].target.to_string(),
                entries[index].record.format,
            )
        })
    };
    assert_eq!(pick("8.7"), Some(("sm_100f".to_string(), Format::Cubin)));
    let hopper = "sm_90".parse().unwrap();
    let (entries, explanation) = fixture
        .cache
        .resolve("add", &hopper, &ResolveOptions::default())
        .unwrap();
    assert_eq!(
        entries[explanation.chosen.unwrap()].target.to_string(),
        "sm_90a"
    );
    let consumer_blackwell = "sm_120".parse().unwrap();
    let (entries, explanation) = fixture
        .cache
        .resolve(
            "add",
            &consumer_blackwell,
            &ResolveOptions {
                driver_ptx: Some("8.4".parse().unwrap()),
            },
        )
        .unwrap();
    assert_eq!(
        explanation.chosen, None,
        "PTX ISA 8.5 is too new for an 8.4 driver: {entries:?}"
    );
}

#[test]
fn a_missing_toolchain_says_what_to_install_and_what_it_skips() {
    let fixture = Fixture::new(MANIFEST);
    let err = fixture.build(&["hipcc"], false).unwrap_err().to_string();
    assert!(err.contains("no toolchain for kernel `add`: nvcc (install the CUDA toolkit and set CUDA_HOME to it, or put nvcc on PATH); skipping its targets sm_80, sm_90a, sm_100f, compute_90"), "{err}");
    assert!(err.contains("--keep-going"), "{err}");
    assert!(
        fixture.cache.entries().unwrap().is_empty(),
        "nothing is built without --keep-going"
    );

    let report = fixture.build(&["hipcc"], true).unwrap();
    assert!(
        matches!(status_of(&report, "add", "sm_80"), PairStatus::Skipped { error } if error.contains("install the CUDA toolkit"))
    );
    assert_eq!(
        status_of(&report, "add_hip", "gfx11-generic"),
        &PairStatus::Built
    );
    assert!(!report.all_succeeded());
}

#[test]
fn a_metal_kernel_off_macos_is_skipped_not_failed() {
    if cfg!(target_os = "macos") {
        headroom_testkit::skip(
            "linux",
            "on macOS a missing xcrun could be installed, so it is a failure",
        );
        return;
    }
    let fixture = Fixture::new(MANIFEST);
    // Without --keep-going: only the missing nvcc is an error, not the missing xcrun.
    let err = fixture.build(&["hipcc"], false).unwrap_err().to_string();
    assert!(!err.contains("scale"), "{err}");
    let only_metal = BuildOptions {
        only: vec!["scale".into()],
        search_path: Some(fake_toolchains(fixture.dir.path(), &[])),
        ..BuildOptions::default()
    };
    let report = build(&fixture.manifest, &fixture.cache, &only_metal).unwrap();
    assert_eq!(
        status_of(&report, "scale", "apple8"),
        &PairStatus::Unsupported {
            reason: "Metal needs macOS".into()
        }
    );
    assert!(report.all_succeeded(), "{report:#?}");
    // A scripted xcrun still builds it: only a toolchain that is absent is impossible.
    let report = fixture.build(&["xcrun"], true).unwrap();
    assert_eq!(status_of(&report, "scale", "apple8"), &PairStatus::Built);
}

#[test]
fn a_failed_compile_stops_the_build_unless_keep_going() {
    let fixture = Fixture::new(MANIFEST);
    std::fs::write(fixture.dir.path().join("add.cu"), "FAIL_COMPILE\n").unwrap();
    let report = fixture.build(&["nvcc", "hipcc", "xcrun"], false).unwrap();
    assert!(
        matches!(status_of(&report, "add", "sm_80"), PairStatus::Failed { error } if error.contains("exited with code 2") && error.contains("FAIL_COMPILE"))
    );
    assert!(
        matches!(status_of(&report, "scale", "apple8"), PairStatus::Failed { error } if error.contains("--keep-going"))
    );

    let report = fixture.build(&["nvcc", "hipcc", "xcrun"], true).unwrap();
    assert!(matches!(
        status_of(&report, "add", "sm_80"),
        PairStatus::Failed { .. }
    ));
    assert_eq!(status_of(&report, "scale", "apple8"), &PairStatus::Built);
}

#[test]
fn a_new_toolchain_version_rebuilds() {
    let fixture = Fixture::new(MANIFEST);
    fixture.build(&["nvcc", "hipcc", "xcrun"], false).unwrap();
    let report = fixture.build(&["nvcc", "hipcc", "xcrun"], false).unwrap();
    assert!(report
        .pairs
        .iter()
        .all(|pair| pair.status == PairStatus::UpToDate));

    let nvcc = fixture.dir.path().join("bin/nvcc");
    std::fs::write(
        &nvcc,
        NVCC.replace("release 12.4, V12.4.131", "release 12.8, V12.8.93"),
    )
    .unwrap();
    let report = fixture.build(&["nvcc", "hipcc", "xcrun"], false).unwrap();
    assert_eq!(status_of(&report, "add", "sm_80"), &PairStatus::Built);
    assert_eq!(
        status_of(&report, "add_hip", "gfx90a:xnack-"),
        &PairStatus::UpToDate
    );
    let entry = fixture
        .cache
        .origin_entries(
            headroom_kernels::target::Backend::Cuda,
            "add",
            &headroom_kernels::cache::Origin::Newest,
        )
        .unwrap()
        .into_iter()
        .find(|entry| entry.target.to_string() == "sm_80")
        .unwrap();
    assert_eq!(
        entry.record.toolchain,
        "nvcc Cuda compilation tools, release 12.8, V12.8.93"
    );
}

#[test]
fn a_build_over_the_size_cap_evicts_least_recently_used_artifacts() {
    let fixture = Fixture::new(MANIFEST);
    let options = BuildOptions {
        search_path: Some(fake_toolchains(
            fixture.dir.path(),
            &["nvcc", "hipcc", "xcrun"],
        )),
        max_cache_bytes: Some(60),
        ..BuildOptions::default()
    };
    let report = build(&fixture.manifest, &fixture.cache, &options).unwrap();
    assert!(report.evicted_blobs > 0, "{report:#?}");
    assert!(fixture.cache.blob_bytes().unwrap() <= 60);
    // What was evicted is rebuilt next time; nothing dangles meanwhile.
    for entry in fixture.cache.entries().unwrap() {
        assert!(
            fixture
                .cache
                .read_blob(&entry.record.blob)
                .unwrap()
                .is_some(),
            "{entry:?}"
        );
    }
}
