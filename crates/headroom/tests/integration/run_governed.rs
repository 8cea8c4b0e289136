//! `headroom run` governs the compilers its program starts: a Python program that compiles
//! heavy units at once in a `multiprocessing` pool gets them admitted as the budget allows,
//! each a job in `--json`, while the program itself runs as it is.

use crate::support::{self, fakecc};

use std::path::Path;
use std::process::Command;
use support::HEADROOM;

/// Four compiles of 300 MiB for 1.5 s each, started at once by four pool workers, in the stage
/// `compile`.
const PROGRAM: &str = r###"
import multiprocessing, subprocess, sys

def compile_unit(i):
    return subprocess.run(
        ["g++", "--mem", "300", "--ms", "1500", "-c", f"u{i}.cpp", "-o", f"u{i}.o"]
    ).returncode

if __name__ == "__main__":
    print("##headroom stage compile", flush=True)
    with multiprocessing.Pool(4) as pool:
        codes = pool.map(compile_unit, range(4))
    sys.exit(max(codes))
"###;

fn python3_missing() -> bool {
    let missing = Command::new("python3").arg("--version").output().is_err();
    if missing {
        headroom_testkit::skip("python3", "python3 is not installed");
    }
    missing
}

/// The most jobs that ran at once, from their start and end times.
fn most_at_once(jobs: &[(f64, f64)]) -> usize {
    jobs.iter()
        .map(|&(start, _)| {
            jobs.iter()
                .filter(|&&(other_start, other_end)| other_start <= start && start < other_end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn project(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::os::unix::fs::symlink(fakecc::path(), dir.join("bin/g++")).unwrap();
    std::fs::write(dir.join("prog.py"), PROGRAM).unwrap();
}

#[test]
fn the_compiles_of_a_multiprocessing_pool_are_governed_jobs_within_the_budget() {
    if python3_missing() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    project(dir);
    let output = fakecc::command_in(dir, HEADROOM)
        .env("TMPDIR", dir)
        .env_remove("HEADROOM_BUDGET")
        .args(["run", "--budget", "700M", "--json", "run.json", "--"])
        .args(["python3", "prog.py"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let jobs = report["rungs"][0]["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no jobs in --json:\n{report:#}"));
    let mut labels: Vec<&str> = jobs
        .iter()
        .map(|job| job["label"].as_str().unwrap())
        .collect();
    labels.sort_unstable();
    assert_eq!(labels, ["u0.o", "u1.o", "u2.o", "u3.o"], "{jobs:#?}");
    for job in jobs {
        assert!(
            job["compiler"].as_str().unwrap().ends_with("g++"),
            "{job:#}"
        );
        assert_eq!(job["stage"], "compile", "{job:#}");
        assert_eq!(job["exit_code"], 0, "{job:#}");
        assert!(job["peak"].as_u64().unwrap() >= 200 << 20, "{job:#}");
        assert!(job["prediction_source"].is_string(), "{job:#}");
    }
    let spans: Vec<(f64, f64)> = jobs
        .iter()
        .map(|job| {
            (
                job["start_s"].as_f64().unwrap(),
                job["end_s"].as_f64().unwrap(),
            )
        })
        .collect();
    // 700 MiB holds two compiles of 300 MiB, never three.
    assert!(most_at_once(&spans) <= 2, "{spans:?}");
    let last = jobs
        .iter()
        .max_by(|a, b| {
            a["start_s"]
                .as_f64()
                .partial_cmp(&b["start_s"].as_f64())
                .unwrap()
        })
        .unwrap();
    assert_eq!(last["stage"], "compile", "{last:#}");
    assert!(stderr.contains("4 compiles governed, peak "), "{stderr}");
}

/// Stands for torch Inductor's compile worker (`python …/torch/_inductor/compile_worker/
/// __main__.py`): holds 64 MiB for a moment and prints the pool variables it was given.
const COMPILE_WORKER: &str = r###"
import os, time
print("threads=" + os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "unset"), flush=True)
print("tilelang=" + os.environ.get("TILELANG_AUTO_TUNING_CPU_COUNTS", "unset"), flush=True)
held = b"x" * (64 << 20)
time.sleep(0.5)
"###;

#[test]
fn a_compile_worker_is_named_as_such_and_a_users_pool_size_is_kept() {
    if python3_missing() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let worker = dir.join("torch/_inductor/compile_worker");
    std::fs::create_dir_all(&worker).unwrap();
    std::fs::write(worker.join("__main__.py"), COMPILE_WORKER).unwrap();
    let output = fakecc::command_in(dir, HEADROOM)
        .env("TMPDIR", dir)
        .env_remove("HEADROOM_BUDGET")
        .env_remove("TILELANG_AUTO_TUNING_CPU_COUNTS")
        .env("TORCHINDUCTOR_COMPILE_THREADS", "7")
        .args(["run", "--budget", "400M", "--json", "run.json", "--"])
        .args(["python3", "torch/_inductor/compile_worker/__main__.py"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // 400 MiB holds one worker of 400 MiB; the user's own TORCHINDUCTOR_COMPILE_THREADS stands.
    assert!(stdout.contains("threads=7\n"), "{stdout}");
    assert!(stdout.contains("tilelang=1\n"), "{stdout}");
    assert!(
        stderr.contains("compile workers: set TILELANG_AUTO_TUNING_CPU_COUNTS=1")
            && stderr.contains("kept yours: TORCHINDUCTOR_COMPILE_THREADS=7"),
        "{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let rung = &report["rungs"][0];
    assert_eq!(
        rung["compile_pools"]["kept"],
        serde_json::json!([["TORCHINDUCTOR_COMPILE_THREADS", "7"]]),
        "{rung:#}"
    );
    assert_eq!(
        rung["largest_processes"][0]["command"], "torch._inductor…compile_worker",
        "{:#}",
        rung["largest_processes"]
    );
    assert!(
        rung["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|sample| sample["by_command"][0][0] == "torch._inductor…compile_worker"),
        "the chart's layers name it too"
    );
}
