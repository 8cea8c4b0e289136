//! A real `torch.compile` on the CPU under `headroom run`: Inductor's C++ backend compiles the
//! generated kernels with the system g++, each compile a governed job; its compile-worker pool
//! is sized from the budget; and the pages its forked compile workers share with their parent
//! count once. torch 2.15 comes from the venv `.ci/cuda.sh` makes (as `build_cuda.rs` finds
//! it); where it is missing the test skips and says so.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::HEADROOM;

/// Starts Inductor's compile-worker pool (as torch does by itself where Triton is installed,
/// and waits for it: the workers are forked from one sidecar process), then compiles a small
/// model cold. Prints the pool size torch was given.
const PROGRAM: &str = r###"
import os, torch
from torch._inductor.async_compile import AsyncCompile
print("threads=" + os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "unset"), flush=True)
print("##headroom stage pool", flush=True)
AsyncCompile.wait_pool_ready()
print("##headroom stage compile", flush=True)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(),
    torch.nn.Linear(128, 128), torch.nn.ReLU(),
    torch.nn.Linear(128, 10),
)
compiled = torch.compile(model, backend="inductor")
print("shape", tuple(compiled(torch.randn(8, 64)).shape), flush=True)
"###;

/// The venv's python, where torch is installed in it.
fn torch_python() -> Option<PathBuf> {
    let dir = std::env::var_os("HEADROOM_CUDA_ENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/headroom-ci"))
        })?;
    let python = dir.join("venv/bin/python");
    let has_torch = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|output| output.status.success());
    if has_torch {
        Some(python)
    } else {
        headroom_testkit::skip(
            "torch",
            format!(
                "no torch in {} (run `bash .ci/cuda.sh`, or set HEADROOM_CUDA_ENV)",
                dir.join("venv").display()
            ),
        );
        None
    }
}

#[test]
fn a_cold_torch_compile_is_governed_its_pool_sized_and_its_shared_pages_counted_once() {
    let Some(python) = torch_python() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("prog.py"), PROGRAM).unwrap();
    let output = Command::new(HEADROOM)
        .current_dir(dir)
        // A cold compile: Inductor's caches and precompiled headers go under the test's dir.
        .env("TORCHINDUCTOR_CACHE_DIR", dir.join("inductor"))
        .env("TMPDIR", dir)
        .env("XDG_STATE_HOME", dir.join("state"))
        .env_remove("TORCHINDUCTOR_COMPILE_THREADS")
        .env_remove("TILELANG_AUTO_TUNING_CPU_COUNTS")
        .env_remove("HEADROOM_BUDGET")
        .args(["run", "--budget", "2G", "--json", "run.json", "--"])
        .arg(&python)
        .arg("prog.py")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("shape (8, 10)"), "{stdout}");

    // 2 GiB holds five workers of 400 MiB; a machine with fewer cores gets one per core.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = 5.min(cores);
    assert!(
        stdout.contains(&format!("threads={workers}\n")),
        "TORCHINDUCTOR_COMPILE_THREADS is sized from the budget: {stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let rung = &report["rungs"][0];
    let set = rung["compile_pools"]["set"].as_array().unwrap();
    assert!(
        set.contains(&serde_json::json!([
            "TORCHINDUCTOR_COMPILE_THREADS",
            workers.to_string()
        ])),
        "{:#}",
        rung["compile_pools"]
    );

    let jobs = rung["jobs"].as_array().unwrap();
    let compiles: Vec<&serde_json::Value> = jobs
        .iter()
        .filter(|job| job["compiler"].as_str().unwrap_or("").ends_with("g++"))
        .collect();
    assert!(
        !compiles.is_empty(),
        "Inductor's g++ calls are jobs: {jobs:#?}"
    );
    assert!(
        compiles.iter().all(|job| job["stage"] == "compile"),
        "{compiles:#?}"
    );

    // The sidecar and the workers it forked share most of their pages: counted once, the tree
    // holds far less than its RSS summed.
    let (rss, counted) = (
        rung["peak"]["rss"].as_u64().unwrap(),
        rung["peak"]["counted"].as_u64().unwrap(),
    );
    assert!(
        counted * 4 < rss * 3,
        "counted {} MiB against RSS {} MiB",
        counted >> 20,
        rss >> 20
    );
    let named: Vec<&str> = rung["largest_processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|process| process["command"].as_str())
        .collect();
    assert!(
        named.contains(&"torch._inductor…compile_worker"),
        "the compile workers are named as such: {named:?}"
    );
}
