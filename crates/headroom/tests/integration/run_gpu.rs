//! GPU memory through NVML loaded at run time. No GPU here, so a stand-in
//! `libnvidia-ml.so.1` (compiled from `run_support/fake_nvml.c`) is put on the loader's path;
//! on a machine with the real driver the same code path reads real devices.

use crate::support::{self, run};

use std::process::Command;

use run::*;
use support::{assert_said, stderr, HEADROOM};

/// Builds the stand-in NVML into the scratch directory; prints why a test skips when it cannot.
fn build_fake_nvml(scratch: &Scratch) -> bool {
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/integration/support/fake_nvml.c"
    );
    let compiled = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(scratch.path("libnvidia-ml.so.1"))
        .arg(source)
        .status();
    let built = compiled.is_ok_and(|s| s.success());
    if !built {
        headroom_testkit::skip("cc", "no C compiler (`cc`) to build the stand-in NVML");
    }
    built
}

#[test]
fn gpu_memory_of_the_tree_is_recorded_per_sample_and_per_stage() {
    let scratch = Scratch::new();
    if !build_fake_nvml(&scratch) {
        return;
    }
    let output = Command::new(HEADROOM)
        .args([
            "run",
            "--json",
            "r.json",
            "--",
            "sh",
            "-c",
            "echo '##headroom stage on-gpu'; sleep 0.5",
        ])
        .current_dir(scratch.dir.path())
        .env("LD_LIBRARY_PATH", scratch.dir.path())
        .env("FAKE_NVML_BYTES", (3u64 << 30).to_string())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let report = scratch.json("r.json");
    let rung = &report["rungs"][0];
    assert_eq!(rung["peak"]["gpu"], 3u64 << 30, "{}", rung["peak"]);
    assert_eq!(stage(&report, 0, "on-gpu")["gpu_peak_bytes"], 3u64 << 30);
    assert!(
        rung["notes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| !n.as_str().unwrap().contains("NVML")),
        "no 'NVML missing' note when it loads: {}",
        rung["notes"]
    );
    assert_said(&output, "GPU 3.00 GiB");
}

#[test]
fn a_gpu_reading_counts_only_toward_the_stage_it_was_taken_in() {
    let scratch = Scratch::new();
    if !build_fake_nvml(&scratch) {
        return;
    }
    const TRAIN: u64 = 8 << 30;
    const EVAL: u64 = 1 << 30;
    std::fs::write(scratch.path("gpu-bytes"), "0").unwrap();
    // The command frees most of its GPU memory, then says the next stage starts: NVML's last
    // reading, taken before the marker, holds the first stage's memory.
    let script = format!(
        "echo '##headroom stage train'; echo {TRAIN} > next && mv next gpu-bytes; sleep 1; \
         echo {EVAL} > next && mv next gpu-bytes; echo '##headroom stage eval'; sleep 1"
    );
    let output = Command::new(HEADROOM)
        .args(["run", "--json", "r.json", "--", "sh", "-c", &script])
        .current_dir(scratch.dir.path())
        .env("LD_LIBRARY_PATH", scratch.dir.path())
        .env("FAKE_NVML_BYTES_FILE", scratch.path("gpu-bytes"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let report = scratch.json("r.json");
    assert_eq!(stage(&report, 0, "train")["gpu_peak_bytes"], TRAIN);
    assert_eq!(
        stage(&report, 0, "eval")["gpu_peak_bytes"],
        EVAL,
        "eval's peak comes from readings taken in eval: {}",
        report["rungs"][0]["stages"]
    );
    assert_eq!(report["rungs"][0]["peak"]["gpu"], TRAIN);
}

#[test]
fn without_nvml_a_note_says_gpu_memory_is_not_recorded() {
    let scratch = Scratch::new();
    let output = Command::new(HEADROOM)
        .args(["run", "--json", "r.json", "--", "true"])
        .current_dir(scratch.dir.path())
        .env("LD_LIBRARY_PATH", scratch.dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let report = scratch.json("r.json");
    if report["rungs"][0]["peak"]["gpu"].is_u64() {
        headroom_testkit::skip("no-gpu", "this machine has a real NVML");
        return;
    }
    let notes = report["rungs"][0]["notes"].to_string();
    assert!(
        notes.contains("libnvidia-ml.so.1") && notes.contains("not recorded"),
        "{notes}"
    );
}
