//! `headroom kernels` end to end through the real binary: many processes building into one
//! cache at once, corruption recovery, and the exit codes and messages users see.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use headroom_kernels::cache::Cache;
use headroom_kernels::manifest::Manifest;
use support::{assert_not_said, assert_printed, assert_said, stderr, stdout, HEADROOM};

/// A CUDA and a HIP kernel for a few targets each, built with clang.
const MANIFEST: &str = r#"
[kernel.vector_add]
language = "cuda"
sources = ["vector_add.cu"]
targets = ["sm_75", "sm_80", "sm_89", "sm_90a", "compute_90"]
toolchain = ["clang"]

[kernel.vector_add_hip]
language = "hip"
sources = ["vector_add.cu"]
targets = ["gfx90a:xnack-", "gfx1100", "gfx11-generic"]
toolchain = ["clang"]
"#;

const SOURCE: &str = "extern \"C\" __global__ void vector_add(float *o, const float *a, const float *b, int n) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) o[i] = a[i] + b[i];\n}\n";

fn have_clang() -> bool {
    let found = ["clang-19", "clang-20", "clang-18", "clang"]
        .iter()
        .any(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|output| output.status.success())
        });
    if !found {
        headroom_testkit::skip("clang", "no clang on PATH (install clang-19)");
    }
    found
}

struct Project {
    dir: tempfile::TempDir,
    /// `cache` in the project's directory, unless projects share one.
    cache: PathBuf,
}

impl Project {
    fn new(manifest: &str) -> Self {
        Project::with_source(manifest, SOURCE)
    }

    /// A project whose `vector_add.cu` is `source`.
    fn with_source(manifest: &str, source: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kernels.toml"), manifest).unwrap();
        std::fs::write(dir.path().join("vector_add.cu"), source).unwrap();
        let cache = dir.path().join("cache");
        Project { dir, cache }
    }

    fn cache_dir(&self) -> PathBuf {
        self.cache.clone()
    }

    /// Where the cache keeps `file` of `kernel` as the manifest builds it now:
    /// `<cache>/<backend>/<kernel>/<origin>/<file>`.
    fn layout(&self, kernel: &str, file: &str) -> PathBuf {
        let manifest = Manifest::load(&self.dir.path().join("kernels.toml")).unwrap();
        let kernel = manifest
            .kernels
            .iter()
            .find(|each| each.name == kernel)
            .unwrap();
        let origin = headroom_kernels::build::origin(kernel, &manifest.path).unwrap();
        self.cache
            .join(kernel.language.backend().as_str())
            .join(&kernel.name)
            .join(origin)
            .join(file)
    }

    fn command(&self, args: &[&str]) -> Command {
        self.command_with_manifest(&self.dir.path().join("kernels.toml"), args)
    }

    /// `headroom kernels` with this manifest, this project's cache and state, and no nvcc
    /// from the environment's CUDA_HOME or CUDA_PATH.
    fn command_with_manifest(&self, manifest: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(HEADROOM);
        command
            .arg("kernels")
            .arg("--manifest")
            .arg(manifest)
            .arg("--cache")
            .arg(self.cache_dir())
            .args(args);
        command
            .env_remove("HEADROOM_KERNEL_CACHE")
            .env_remove("HEADROOM_KERNEL_CACHE_MAX")
            .env_remove("CUDA_HOME")
            .env_remove("CUDA_PATH")
            .env("HEADROOM_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"));
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Writes `script` as the project's `bin/nvcc` and returns a PATH that finds it first,
    /// then the system's tools.
    fn scripted_nvcc(&self, script: &str) -> std::ffi::OsString {
        use std::os::unix::fs::PermissionsExt;
        let bin = self.dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nvcc"), script).unwrap();
        std::fs::set_permissions(bin.join("nvcc"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::env::join_paths([bin, PathBuf::from("/usr/bin"), PathBuf::from("/bin")]).unwrap()
    }
}

/// `("kernel target", status, reason)` for each pair of a `build --json` report.
fn pair_statuses(output: &Output) -> Vec<(String, String, Option<String>)> {
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}{}", stdout(output), stderr(output)));
    report["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                format!(
                    "{} {}",
                    pair["kernel"].as_str().unwrap(),
                    pair["target"].as_str().unwrap()
                ),
                pair["status"].as_str().unwrap().to_string(),
                pair["reason"].as_str().map(String::from),
            )
        })
        .collect()
}

fn statuses(output: &Output) -> Vec<String> {
    pair_statuses(output)
        .into_iter()
        .map(|(_, status, _)| status)
        .collect()
}

/// Every entry's blob verifies, every layout link resolves into the blobs, no temp files.
fn assert_consistent(cache_dir: &Path, expected_entries: usize) {
    let cache = Cache::open(cache_dir).unwrap();
    let entries = cache.entries().unwrap();
    assert_eq!(entries.len(), expected_entries);
    let blobs = std::fs::canonicalize(cache_dir.join("blobs")).unwrap();
    for entry in &entries {
        let bytes = cache
            .read_blob(&entry.record.blob)
            .unwrap()
            .unwrap_or_else(|| {
                panic!("{} {}: blob missing or corrupt", entry.kernel, entry.target)
            });
        assert_eq!(bytes.len() as u64, entry.record.size);
        let link = cache_dir.join(entry.artifact_path());
        assert!(
            std::fs::canonicalize(&link).unwrap().starts_with(&blobs),
            "{}",
            link.display()
        );
        assert_eq!(std::fs::read(&link).unwrap(), bytes);
    }
    let mut pending = vec![cache_dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for item in std::fs::read_dir(dir).unwrap() {
            let item = item.unwrap();
            assert!(
                !item.file_name().to_string_lossy().starts_with(".tmp"),
                "left-over temp file {}",
                item.path().display()
            );
            if item.file_type().unwrap().is_dir() {
                pending.push(item.path());
            }
        }
    }
}

#[test]
fn many_processes_build_one_cache_and_it_stays_consistent() {
    if !have_clang() {
        return;
    }
    let project = Project::new(MANIFEST);
    let children: Vec<_> = (0..8)
        .map(|_| {
            project
                .command(&["build", "--json", "--jobs", "2"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(statuses(&output)
            .iter()
            .all(|status| ["built", "reused", "up_to_date"].contains(&status.as_str())));
    }
    assert_consistent(&project.cache_dir(), 8);
    let again = project.run(&["build", "--json"]);
    assert!(
        statuses(&again).iter().all(|status| status == "up_to_date"),
        "{}",
        stdout(&again)
    );
}

#[test]
fn a_corrupted_blob_is_rebuilt_through_the_cli() {
    if !have_clang() {
        return;
    }
    let project = Project::new(MANIFEST);
    assert_eq!(project.run(&["build"]).status.code(), Some(0));
    let blob = std::fs::canonicalize(project.layout("vector_add_hip", "gfx1100.hsaco")).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();

    let output = project.run(&["build", "--json"]);
    assert_eq!(
        statuses(&output)
            .iter()
            .filter(|status| *status == "built")
            .count(),
        1
    );
    assert_consistent(&project.cache_dir(), 8);
}

#[test]
fn resolve_prints_the_artifact_or_exits_1_with_advice() {
    if !have_clang() {
        return;
    }
    let project = Project::new(MANIFEST);
    project.run(&["build"]);
    let hopper = project.run(&["resolve", "vector_add", "--device", "sm_90"]);
    assert_eq!(hopper.status.code(), Some(0));
    assert_eq!(
        stdout(&hopper).trim(),
        project
            .layout("vector_add", "sm_90a.ptx")
            .display()
            .to_string()
    );

    let rdna3 = project.run(&["resolve", "vector_add_hip", "--device", "gfx1101", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&rdna3.stdout).unwrap();
    assert_eq!(json["chosen"]["target"], "gfx11-generic");

    let old = project.run(&["resolve", "vector_add", "--device", "sm_70", "--explain"]);
    assert_eq!(old.status.code(), Some(1));
    assert_said(&old, "cannot be JIT-compiled for the older device 7.0");
    assert_said(
        &old,
        "none of the 5 artifacts of kernel `vector_add` runs on sm_70",
    );

    let bad = project.run(&["resolve", "vector_add", "--device", "nv100"]);
    assert_eq!(bad.status.code(), Some(2));
    assert_said(&bad, "--device");
}

#[test]
fn export_import_between_caches_through_the_cli() {
    if !have_clang() {
        return;
    }
    let project = Project::new(MANIFEST);
    project.run(&["build"]);
    let bundle = project.dir.path().join("kernels.tar.zst");
    assert_eq!(
        project
            .run(&["export", bundle.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );
    let user = Project::new(MANIFEST);
    let imported = user.run(&["import", bundle.to_str().unwrap()]);
    assert_eq!(imported.status.code(), Some(0), "{}", stderr(&imported));
    assert_consistent(&user.cache_dir(), 8);
    // The user's clang is the same, so the imported artifacts are already up to date.
    assert!(statuses(&user.run(&["build", "--json"]))
        .iter()
        .all(|status| status == "up_to_date"));
}

#[test]
fn manifest_errors_name_the_line_and_exit_2() {
    let project = Project::new(
        "[kernel.k]\nlanguage = \"cuda\"\nsources = [\"k.cu\"]\ntargets = [\"sm_80\", \"sm_9x\"]\n",
    );
    let output = project.run(&["build"]);
    assert_eq!(output.status.code(), Some(2));
    assert_said(&output, "kernels.toml:4:21: unknown target `sm_9x`");

    let missing = Project::new("");
    std::fs::remove_file(missing.dir.path().join("kernels.toml")).unwrap();
    let output = missing.run(&["build"]);
    assert_eq!(output.status.code(), Some(2));
    assert_said(&output, "pass its location with --manifest");
}

#[test]
fn an_export_to_a_missing_directory_says_which() {
    let project = Project::new("");
    let output = project.run(&["export", "no-such-dir/kernels.tar.zst"]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stderr(&output).trim_end(),
        "headroom: error: export to no-such-dir/kernels.tar.zst: there is no directory \
         no-such-dir; create it, or write the file elsewhere"
    );
}

#[test]
fn a_failed_compile_exits_1_and_shows_the_compiler_error() {
    if !have_clang() {
        return;
    }
    let project = Project::new(MANIFEST);
    std::fs::write(
        project.dir.path().join("vector_add.cu"),
        "this is not C++\n",
    )
    .unwrap();
    let output = project.run(&["build", "--keep-going"]);
    assert_eq!(output.status.code(), Some(1));
    assert_printed(&output, "error: vector_add sm_75: `");
    assert_printed(&output, "error: expected unqualified-id");
}

/// A scripted nvcc that is slow for sm_90 only, to interrupt a build half-way.
const SLOW_NVCC: &str = r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 12.4, V12.4.131"; exit 0; fi
out=; arch=
while [ $# -gt 0 ]; do case "$1" in -o) shift; out=$1 ;; -arch=*) arch=${1#-arch=} ;; esac; shift; done
[ "$arch" = sm_90 ] && sleep 5
echo "FAKE cubin $arch" > "$out"
"#;

#[test]
fn kernel_compiles_run_under_the_memory_governor() {
    let project = Project::new("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"vector_add.cu\"]\ntargets = [\"sm_80\", \"sm_90\"]\ntoolchain = [\"nvcc\"]\n");
    let path = project.scripted_nvcc(&SLOW_NVCC.replace("sleep 5", "true"));
    let output = project
        .command(&["build"])
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The governor recorded both compiles, with their peaks, in its history.
    let history =
        headroom_store::History::open(&project.dir.path().join("state/history.sqlite")).unwrap();
    let report = history
        .load_build(history.last_build_id().unwrap())
        .unwrap();
    assert!(
        report.build.command.starts_with("headroom kernels build"),
        "{}",
        report.build.command
    );
    let mut labels: Vec<&str> = report
        .jobs
        .iter()
        .map(|job| job.compiler.rsplit('/').next().unwrap())
        .collect();
    labels.sort();
    assert_eq!(labels, ["nvcc", "nvcc"], "{:?}", report.jobs);
    assert!(report.jobs.iter().all(|job| job.exit_code == Some(0)));
}

/// A toolchain that leaves a process holding its output does not hold the build up for as
/// long as that process lives: it waited 20 s for each call, version probe included.
#[test]
fn a_toolchain_that_leaves_a_process_holding_its_output_does_not_hold_the_build() {
    let project = Project::new("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"vector_add.cu\"]\ntargets = [\"sm_80\"]\ntoolchain = [\"nvcc\"]\n");
    // The wrapper leaves a process behind as a wrapper that starts a compile server does.
    let leaving_a_server = SLOW_NVCC.replacen("#!/bin/sh\n", "#!/bin/sh\nsleep 20 &\n", 1);
    let path = project.scripted_nvcc(&leaving_a_server);
    let start = std::time::Instant::now();
    let output = project
        .command(&["build"])
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(project.layout("k", "sm_80.cubin")).unwrap(),
        "FAKE cubin sm_80\n"
    );
}

#[test]
fn an_interrupted_build_keeps_the_artifacts_it_finished() {
    let project = Project::new("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"vector_add.cu\"]\ntargets = [\"sm_80\", \"sm_90\"]\ntoolchain = [\"nvcc\"]\n");
    let path = project.scripted_nvcc(SLOW_NVCC);
    let mut child = project
        .command(&["build", "-j1"])
        .env("PATH", path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();

    let finished_entry = project.layout("k", "sm_80.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !finished_entry.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        finished_entry.exists(),
        "sm_80 was not published before the build was interrupted"
    );
    assert_eq!(
        std::fs::read_to_string(project.layout("k", "sm_80.cubin")).unwrap(),
        "FAKE cubin sm_80\n"
    );
    assert!(!project.layout("k", "sm_90.json").exists());
}

#[test]
fn a_missing_source_names_the_kernel_the_full_path_and_the_manifest() {
    let project = Project::new("");
    let proj = project.dir.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    std::fs::write(
        proj.join("kernels.toml"),
        "[kernel.k]\nlanguage = \"cuda\"\nsources = [\"nope.cu\"]\ntargets = [\"sm_80\"]\n",
    )
    .unwrap();
    // A relative --manifest: the source is resolved against its directory, not the cwd.
    let output = project
        .command_with_manifest(Path::new("proj/kernels.toml"), &["build"])
        .current_dir(project.dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let dir = std::fs::canonicalize(&proj).unwrap();
    assert_eq!(
        stderr(&output).trim_end(),
        format!(
            "headroom: error: kernel `k`: cannot read its source {}: No such file or directory \
             (os error 2); fix its `sources` entry in {}",
            dir.join("nope.cu").display(),
            dir.join("kernels.toml").display()
        )
    );
}

#[test]
fn an_unknown_kernel_is_named_with_the_kernels_that_exist() {
    let project = Project::new(MANIFEST);
    let output = project.run(&["resolve", "vector_ad", "--device", "sm_89"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(
        message.contains("no kernel named `vector_ad` in the cache")
            && message
                .contains("the kernels there are `vector_add`, `vector_add_hip`; check the name"),
        "{message}"
    );
    assert!(!message.contains("kernels build"), "{message}");

    // A kernel of the manifest that is not built yet still says to build it.
    let unbuilt = project.run(&["resolve", "vector_add", "--device", "sm_89"]);
    assert_eq!(unbuilt.status.code(), Some(1));
    assert_said(&unbuilt, "run `headroom kernels build`");

    std::fs::remove_file(project.dir.path().join("kernels.toml")).unwrap();
    let nothing = project.run(&["resolve", "vector_add", "--device", "sm_89"]);
    assert_eq!(nothing.status.code(), Some(2));
    assert!(
        stderr(&nothing).contains(
            "there are none; run `headroom kernels build` or `headroom kernels import` first"
        ),
        "{}",
        stderr(&nothing)
    );

    let build = Project::new(MANIFEST).run(&["build", "--kernel", "vector_ad"]);
    assert_eq!(build.status.code(), Some(2));
    assert!(
        stderr(&build).contains("no kernel named `vector_ad` in the manifest ")
            && stderr(&build)
                .contains("the kernels there are `vector_add`, `vector_add_hip`; check --kernel"),
        "{}",
        stderr(&build)
    );
}

#[test]
fn a_metal_kernel_off_macos_is_skipped_and_a_missing_nvcc_still_fails() {
    if cfg!(target_os = "macos") {
        headroom_testkit::skip("linux", "Metal can be built on macOS");
        return;
    }
    let project = Project::new(
        "[kernel.scale]\nlanguage = \"metal\"\nsources = [\"vector_add.cu\"]\ntargets = [\"apple7\", \"metal3.1\"]\n\n\
         [kernel.k]\nlanguage = \"cuda\"\nsources = [\"vector_add.cu\"]\ntargets = [\"sm_80\"]\ntoolchain = [\"nvcc\"]\n",
    );
    // A PATH with no toolchain at all.
    let empty = project.dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let run = |args: &[&str]| project.command(args).env("PATH", &empty).output().unwrap();

    let metal = run(&["build", "--kernel", "scale", "--json"]);
    assert_eq!(metal.status.code(), Some(0), "{}", stderr(&metal));
    let skipped = Some("Metal needs macOS".to_string());
    assert_eq!(
        pair_statuses(&metal),
        [
            (
                "scale apple7".to_string(),
                "skipped".to_string(),
                skipped.clone()
            ),
            (
                "scale metal3.1".to_string(),
                "skipped".to_string(),
                skipped.clone()
            ),
        ]
    );
    let table = run(&["build", "--kernel", "scale"]);
    assert_eq!(table.status.code(), Some(0));
    assert_printed(&table, "scale   apple7    skipped (Metal needs macOS)");
    assert_printed(&table, "0 failed, 2 skipped");

    // nvcc could be installed, so its absence is an error (exit 2), or with --keep-going an
    // incomplete build (exit 1), as before.
    let missing = run(&["build"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_said(&missing, "no toolchain for kernel `k`: nvcc");
    assert_not_said(&missing, "scale");
    let keep_going = run(&["build", "--keep-going", "--json"]);
    assert_eq!(keep_going.status.code(), Some(1));
    assert!(pair_statuses(&keep_going).contains(&(
        "k sm_80".to_string(),
        "skipped".to_string(),
        None
    )));
}

/// The README's CI recipe on the bundled example exits 0 on Linux: Metal is skipped, clang
/// builds the rest.
#[test]
fn the_bundled_example_builds_with_keep_going_on_linux() {
    if cfg!(target_os = "macos") || !have_clang() {
        return;
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
    let project = Project::new("");
    let output = project
        .command_with_manifest(
            &example.join("kernels.toml"),
            &["build", "--keep-going", "--json"],
        )
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    for (pair, status, reason) in pair_statuses(&output) {
        if pair.starts_with("scale_metal ") {
            assert_eq!(
                (status.as_str(), reason.as_deref()),
                ("skipped", Some("Metal needs macOS")),
                "{pair}"
            );
        } else {
            assert_eq!(status, "built", "{pair}");
        }
    }
}

/// A scripted nvcc that says which one it is.
fn fake_nvcc(dir: &Path, release: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let nvcc = dir.join("nvcc");
    std::fs::write(
        &nvcc,
        format!("#!/bin/sh\necho 'Cuda compilation tools, release {release}'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn nvcc_is_found_through_cuda_home_then_cuda_path_then_path() {
    let project = Project::new("");
    let root = project.dir.path();
    fake_nvcc(&root.join("home/bin"), "1.0");
    fake_nvcc(&root.join("cuda-path/bin"), "2.0");
    fake_nvcc(&root.join("bin"), "3.0");
    let nvcc = |vars: &[(&str, &Path)]| {
        let mut command = project.command(&["toolchains", "--json"]);
        command.env("PATH", root.join("bin"));
        for (name, value) in vars {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        let found: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|err| panic!("{err}: {}", stderr(&output)));
        found[0]["toolchain"]["program"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let program = |dir: &str| root.join(dir).join("nvcc").display().to_string();
    let (home, cuda_path) = (root.join("home"), root.join("cuda-path"));
    assert_eq!(
        nvcc(&[("CUDA_HOME", &home), ("CUDA_PATH", &cuda_path)]),
        program("home/bin")
    );
    assert_eq!(nvcc(&[("CUDA_PATH", &cuda_path)]), program("cuda-path/bin"));
    // A CUDA_HOME without nvcc is passed over.
    assert_eq!(nvcc(&[("CUDA_HOME", &root.join("empty"))]), program("bin"));
    assert_eq!(nvcc(&[]), program("bin"));

    let help = project.run(&["build", "--help"]);
    assert_printed(
        &help,
        "$CUDA_HOME/bin/nvcc, else $CUDA_PATH/bin/nvcc, else nvcc on",
    );
}

/// The CUDA_HOME `.ci/cuda.sh` leaves in `$HEADROOM_CUDA_ENV` (by default
/// `~/.cache/headroom-ci`), or why there is none.
fn real_cuda_home() -> Result<PathBuf, String> {
    let dir = std::env::var_os("HEADROOM_CUDA_ENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/headroom-ci"))
        })
        .ok_or("neither HEADROOM_CUDA_ENV nor HOME is set")?;
    let home = dir.join("cuda-home");
    if home.join("bin/nvcc").exists() {
        Ok(home)
    } else {
        Err(format!("no nvcc in {}", home.join("bin").display()))
    }
}

#[test]
fn the_real_nvcc_builds_through_cuda_home() {
    let home = match real_cuda_home() {
        Ok(home) => home,
        Err(why) => {
            headroom_testkit::skip(
                "nvcc",
                format!("{why} (run `bash .ci/cuda.sh`, or set HEADROOM_CUDA_ENV)"),
            );
            return;
        }
    };
    let project = Project::new("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"vector_add.cu\"]\ntargets = [\"sm_80\"]\ntoolchain = [\"nvcc\"]\n");
    // nvcc needs the host compiler from PATH, but nvcc itself comes from CUDA_HOME.
    let run = |args: &[&str]| {
        project
            .command(args)
            .env("PATH", "/usr/bin:/bin")
            .env("CUDA_HOME", &home)
            .output()
            .unwrap()
    };
    let toolchains = run(&["toolchains", "--json"]);
    let found: serde_json::Value = serde_json::from_slice(&toolchains.stdout).unwrap();
    assert_eq!(
        found[0]["toolchain"]["program"].as_str(),
        Some(home.join("bin/nvcc").to_str().unwrap())
    );
    let output = run(&["build", "--json"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    let cubin = std::fs::read(project.layout("k", "sm_80.cubin")).unwrap();
    assert!(cubin.starts_with(b"\x7fELF"));
}

/// `vector_add` of another project: other sources (its entry point has another name, so each
/// project's PTX can be told apart) and other targets.
const OTHER_MANIFEST: &str = r#"
[kernel.vector_add]
language = "cuda"
sources = ["vector_add.cu"]
targets = ["sm_80", "sm_90"]
toolchain = ["clang"]
"#;

const OTHER_SOURCE: &str = "extern \"C\" __global__ void vector_add_other(float *o, const float *a, const float *b, int n) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) o[i] = a[i] * b[i];\n}\n";

/// `resolve --json`'s pick: its target and the PTX entry point in its artifact.
fn resolved(output: &Output) -> (String, String) {
    assert_eq!(output.status.code(), Some(0), "{}", stderr(output));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let chosen = &json["chosen"];
    let ptx = std::fs::read_to_string(chosen["artifact"].as_str().unwrap()).unwrap();
    let entry = ["vector_add_other", "vector_add"]
        .into_iter()
        .find(|name| ptx.contains(&format!(".entry {name}(")))
        .unwrap_or("none");
    (
        chosen["target"].as_str().unwrap().to_string(),
        entry.to_string(),
    )
}

/// Issue 36, item 15: two projects that both define `vector_add`, from different sources,
/// build into one cache. Each resolves only its own artifacts: before, the second's resolve
/// for sm_90 returned the first's sm_90a, and their sm_80 entries overwrote each other. From
/// elsewhere (no manifest) a resolve takes the newest build whole, never a target of another.
#[test]
fn projects_sharing_a_kernel_name_resolve_only_their_own_artifacts() {
    if !have_clang() {
        return;
    }
    let first = Project::new(MANIFEST);
    let mut second = Project::with_source(OTHER_MANIFEST, OTHER_SOURCE);
    second.cache = first.cache_dir();
    for project in [&first, &second] {
        let build = project.run(&["build", "--kernel", "vector_add"]);
        assert_eq!(build.status.code(), Some(0), "{}", stderr(&build));
    }
    let resolve = |project: &Project, device: &str| {
        resolved(&project.run(&["resolve", "vector_add", "--device", device, "--json"]))
    };
    let own = |target: &str, entry: &str| (target.to_string(), entry.to_string());
    assert_eq!(resolve(&second, "sm_90"), own("sm_90", "vector_add_other"));
    assert_eq!(resolve(&second, "sm_89"), own("sm_80", "vector_add_other"));
    assert_eq!(resolve(&first, "sm_90"), own("sm_90a", "vector_add"));
    assert_eq!(resolve(&first, "sm_80"), own("sm_80", "vector_add"));

    // A rebuild of the first finds its artifacts up to date: nothing of it was overwritten.
    let again = first.run(&["build", "--kernel", "vector_add", "--json"]);
    assert!(
        statuses(&again).iter().all(|status| status == "up_to_date"),
        "{}",
        stdout(&again)
    );

    // Without a manifest: the newest build (the second's), all of it, and nothing else.
    let elsewhere = first
        .command_with_manifest(&first.dir.path().join("none.toml"), &[])
        .args(["resolve", "vector_add", "--device", "sm_90", "--json"])
        .output()
        .unwrap();
    assert_eq!(resolved(&elsewhere), own("sm_90", "vector_add_other"));
}

/// After an edit, the project's resolve takes only artifacts of its current sources: until it
/// is rebuilt there are none, and the message says so and what to run.
#[test]
fn an_edited_kernel_resolves_nothing_until_it_is_rebuilt() {
    if !have_clang() {
        return;
    }
    let project = Project::with_source(OTHER_MANIFEST, OTHER_SOURCE);
    assert_eq!(project.run(&["build"]).status.code(), Some(0));
    std::fs::write(project.dir.path().join("vector_add.cu"), SOURCE).unwrap();
    let stale = project.run(&["resolve", "vector_add", "--device", "sm_90"]);
    assert_eq!(stale.status.code(), Some(1), "{}", stdout(&stale));
    assert!(
        stderr(&stale)
            .contains("no artifacts of kernel `vector_add` built from its sources and flags in ")
            && stderr(&stale).contains(
                "run `headroom kernels build` (the cache holds 1 other build of `vector_add`"
            ),
        "{}",
        stderr(&stale)
    );
    assert_eq!(project.run(&["build"]).status.code(), Some(0));
    let fresh = project.run(&["resolve", "vector_add", "--device", "sm_90", "--json"]);
    assert_eq!(resolved(&fresh), ("sm_90".into(), "vector_add".into()));
}

/// A bundle holds one build of each kernel, the project's current one, though the cache keeps
/// the build from before an edit: whoever imports it resolves to that build.
#[test]
fn export_ships_the_current_build_only() {
    if !have_clang() {
        return;
    }
    let project = Project::with_source(OTHER_MANIFEST, OTHER_SOURCE);
    assert_eq!(project.run(&["build"]).status.code(), Some(0));
    std::fs::write(project.dir.path().join("vector_add.cu"), SOURCE).unwrap();
    assert_eq!(project.run(&["build"]).status.code(), Some(0));
    assert_eq!(
        Cache::open(&project.cache_dir())
            .unwrap()
            .entries()
            .unwrap()
            .len(),
        4
    );

    let bundle = project.dir.path().join("kernels.tar.zst");
    let exported = project.run(&["export", bundle.to_str().unwrap(), "--json"]);
    assert_eq!(exported.status.code(), Some(0), "{}", stderr(&exported));
    let summary: serde_json::Value = serde_json::from_slice(&exported.stdout).unwrap();
    assert_eq!(summary["artifacts"], 2);

    let user = Project::new(OTHER_MANIFEST);
    std::fs::remove_file(user.dir.path().join("kernels.toml")).unwrap();
    let imported = user.run(&["import", bundle.to_str().unwrap()]);
    assert_eq!(imported.status.code(), Some(0), "{}", stderr(&imported));
    let resolve = user.run(&["resolve", "vector_add", "--device", "sm_90", "--json"]);
    assert_eq!(resolved(&resolve), ("sm_90".into(), "vector_add".into()));
}

/// Entries an older headroom wrote (`<backend>/<kernel>/<target>.json`, no origin) are not
/// resolved, since nothing says which project built them; the message says so, and `gc`
/// removes them.
#[test]
fn entries_of_an_older_headroom_are_named_and_not_used() {
    let project = Project::new(MANIFEST);
    let cache = Cache::open(&project.cache_dir()).unwrap();
    let blob = cache.store_blob(b"old ptx").unwrap();
    let kernel_dir = project.cache_dir().join("cuda/vector_add");
    std::fs::create_dir_all(&kernel_dir).unwrap();
    let old_entry = serde_json::json!({
        "kernel": "vector_add", "backend": "cuda", "target": "sm_80", "key": blob,
        "blob": blob, "size": 7, "format": "ptx", "ptx_isa": null, "toolchain": "clang",
    });
    std::fs::write(kernel_dir.join("sm_80.json"), old_entry.to_string()).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{}/{blob}", &blob[..2]),
        kernel_dir.join("sm_80.ptx"),
    )
    .unwrap();

    let output = project
        .command_with_manifest(&project.dir.path().join("none.toml"), &[])
        .args(["resolve", "vector_add", "--device", "sm_80"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    assert!(
        stderr(&output).contains("the cache holds 1 artifact of `vector_add` from an older headroom, which did not record which project built it, so it is not used; `headroom kernels gc` removes them"),
        "{}",
        stderr(&output)
    );
    let gc = project.run(&["gc", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(report["entries_removed"], 1, "{}", stdout(&gc));
    assert_eq!(std::fs::read_dir(&kernel_dir).unwrap().count(), 0);
}

/// A stand-in for the CUDA driver (`libcuda.so.1`): device 0 has the compute capability in
/// `FAKE_CUDA_CC` (e.g. `90`), or there is no device when it is unset.
const FAKE_CUDA: &str = r#"
#include <stdlib.h>
static int cc(void) { const char *v = getenv("FAKE_CUDA_CC"); return v ? atoi(v) : -1; }
int cuInit(unsigned int flags) { (void)flags; return cc() < 0 ? 100 : 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return ordinal == 0 ? 0 : 101; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
    (void)device;
    if (attribute == 75) { *value = cc() / 10; return 0; }
    if (attribute == 76) { *value = cc() % 10; return 0; }
    return 1;
}
"#;

/// A directory holding the stand-in driver, or `None` (with why) where no C compiler builds it.
fn fake_cuda_dir(dir: &Path) -> Option<PathBuf> {
    let lib = dir.join("fake-cuda");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("fake_cuda.c"), FAKE_CUDA).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(lib.join("libcuda.so.1"))
        .arg(lib.join("fake_cuda.c"))
        .status()
        .is_ok_and(|status| status.success());
    if !built {
        headroom_testkit::skip(
            "cc",
            "no C compiler (`cc`) to build the stand-in CUDA driver",
        );
    }
    built.then_some(lib)
}

/// Issue 36, item 20: `--device` defaults to `local`, the GPU the CUDA driver reports.
#[test]
fn resolve_picks_the_local_gpu_through_the_driver() {
    if !have_clang() {
        return;
    }
    let project = Project::new(MANIFEST);
    assert_eq!(
        project
            .run(&["build", "--kernel", "vector_add"])
            .status
            .code(),
        Some(0)
    );
    let Some(lib) = fake_cuda_dir(project.dir.path()) else {
        return;
    };
    let resolve = |cc: Option<&str>, args: &[&str]| {
        let mut command = project.command(&["resolve", "vector_add", "--json"]);
        command.args(args).env("LD_LIBRARY_PATH", &lib);
        match cc {
            Some(cc) => command.env("FAKE_CUDA_CC", cc),
            None => command.env_remove("FAKE_CUDA_CC"),
        };
        command.output().unwrap()
    };
    for (cc, device, target) in [("90", "sm_90", "sm_90a"), ("89", "sm_89", "sm_89")] {
        for args in [&[][..], &["--device", "local"][..]] {
            let output = resolve(Some(cc), args);
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(json["device"], device);
            assert_eq!(json["chosen"]["target"], target);
        }
    }
    let none = resolve(None, &[]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        stderr(&none).contains("--device local found no GPU here: the CUDA driver sees no device (check CUDA_VISIBLE_DEVICES); name the device instead, e.g. --device sm_90"),
        "{}",
        stderr(&none)
    );
}

/// Whether the loader would find a CUDA driver: in its cache or on `LD_LIBRARY_PATH`.
fn have_cuda_driver() -> bool {
    let in_cache = ["ldconfig", "/sbin/ldconfig"].iter().any(|ldconfig| {
        Command::new(ldconfig)
            .arg("-p")
            .output()
            .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).contains("libcuda.so.1"))
    });
    let on_path = std::env::var_os("LD_LIBRARY_PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("libcuda.so.1").exists())
    });
    in_cache || on_path
}

/// Issue 36, item 20: where no CUDA driver loads, `--device local` (the default) fails with an
/// error that names the flag and how to name the device instead.
#[test]
fn without_a_gpu_local_says_to_name_the_device() {
    if have_cuda_driver() {
        headroom_testkit::skip("no-gpu", "this machine has a CUDA driver");
        return;
    }
    let project = Project::new(MANIFEST);
    let output = project.run(&["resolve", "vector_add"]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert_said(
        &output,
        "--device local found no GPU here: the NVIDIA driver's libcuda.so.1 does not load",
    );
    assert_said(&output, "name the device instead, e.g. --device sm_90");
}

/// A manifest that exists but cannot be read is an error for `resolve`, not a reason to take
/// whichever build the cache has: it names the place and the flag.
#[test]
fn resolve_with_a_broken_manifest_names_it_and_the_flag() {
    let project = Project::new("[kernel.vector_add]\nlanguage = \"cuda\"\n");
    let output = project.run(&["resolve", "vector_add", "--device", "sm_90"]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert_said(&output, "kernels.toml:1:1: missing field `sources`");
    assert_said(&output, "pass the project's manifest with --manifest");
}
