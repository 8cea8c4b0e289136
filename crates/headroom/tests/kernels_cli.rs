//! `headroom kernels` end to end through the real binary: many processes building into one
//! cache at once, corruption recovery, and the exit codes and messages users see.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use headroom_kernels::cache::Cache;

const HEADROOM: &str = env!("CARGO_BIN_EXE_headroom");

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
        eprintln!("skipping: no clang on PATH (install clang-19)");
    }
    found
}

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(manifest: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kernels.toml"), manifest).unwrap();
        std::fs::write(dir.path().join("vector_add.cu"), SOURCE).unwrap();
        Project { dir }
    }

    fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(HEADROOM);
        command
            .arg("kernels")
            .arg("--manifest")
            .arg(self.dir.path().join("kernels.toml"))
            .arg("--cache")
            .arg(self.cache_dir())
            .args(args);
        command
            .env_remove("HEADROOM_KERNEL_CACHE")
            .env_remove("HEADROOM_KERNEL_CACHE_MAX")
            .env("HEADROOM_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"));
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn statuses(output: &Output) -> Vec<String> {
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}{}", stdout(output), stderr(output)));
    report["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| pair["status"].as_str().unwrap().to_string())
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
    let blob = std::fs::canonicalize(project.cache_dir().join("hip/vector_add_hip/gfx1100.hsaco"))
        .unwrap();
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
            .cache_dir()
            .join("cuda/vector_add/sm_90a.ptx")
            .display()
            .to_string()
    );

    let rdna3 = project.run(&["resolve", "vector_add_hip", "--device", "gfx1101", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&rdna3.stdout).unwrap();
    assert_eq!(json["chosen"]["target"], "gfx11-generic");

    let old = project.run(&["resolve", "vector_add", "--device", "sm_70", "--explain"]);
    assert_eq!(old.status.code(), Some(1));
    assert!(
        stderr(&old).contains("cannot be JIT-compiled for the older device 7.0"),
        "{}",
        stderr(&old)
    );
    assert!(
        stderr(&old).contains("none of the 5 artifacts of kernel `vector_add` runs on sm_70"),
        "{}",
        stderr(&old)
    );

    let bad = project.run(&["resolve", "vector_add", "--device", "nv100"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--device"), "{}", stderr(&bad));
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
    assert!(
        stderr(&output).contains("kernels.toml:4:21: unknown target `sm_9x`"),
        "{}",
        stderr(&output)
    );

    let missing = Project::new("");
    std::fs::remove_file(missing.dir.path().join("kernels.toml")).unwrap();
    let output = missing.run(&["build"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("pass its location with --manifest"),
        "{}",
        stderr(&output)
    );
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
    assert!(
        stdout(&output).contains("error: vector_add sm_75: `"),
        "{}",
        stdout(&output)
    );
    assert!(
        stdout(&output).contains("error: expected unqualified-id"),
        "{}",
        stdout(&output)
    );
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
    let bin = project.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("nvcc"), SLOW_NVCC.replace("sleep 5", "true")).unwrap();
    std::fs::set_permissions(
        bin.join("nvcc"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path =
        std::env::join_paths([bin, PathBuf::from("/usr/bin"), PathBuf::from("/bin")]).unwrap();
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

#[test]
fn an_interrupted_build_keeps_the_artifacts_it_finished() {
    use std::os::unix::fs::PermissionsExt;
    let project = Project::new("[kernel.k]\nlanguage = \"cuda\"\nsources = [\"vector_add.cu\"]\ntargets = [\"sm_80\", \"sm_90\"]\ntoolchain = [\"nvcc\"]\n");
    let bin = project.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("nvcc"), SLOW_NVCC).unwrap();
    std::fs::set_permissions(bin.join("nvcc"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path =
        std::env::join_paths([bin, PathBuf::from("/usr/bin"), PathBuf::from("/bin")]).unwrap();
    let mut child = project
        .command(&["build", "-j1"])
        .env("PATH", path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();

    let finished_entry = project.cache_dir().join("cuda/k/sm_80.json");
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
        std::fs::read_to_string(project.cache_dir().join("cuda/k/sm_80.cubin")).unwrap(),
        "FAKE cubin sm_80\n"
    );
    assert!(!project.cache_dir().join("cuda/k/sm_90.json").exists());
}
