//! `headroom run` on real processes that allocate known amounts in named stages: stage
//! attribution, peak accuracy against the kernel's own count, whole-tree tracking.

use crate::support::{self, run};

use run::*;
use support::stderr;

#[test]
fn stages_get_their_own_entry_peak_and_exit() {
    let Some(scratch) = Scratch::with_python() else {
        return;
    };
    let alloc = scratch.alloc_py();
    let (output, report) = scratch.run_ok(&[
        "--interval",
        "20ms",
        "--",
        "python3",
        &alloc,
        "small:32:0.4",
        "big:160:0.4",
        "free:0:0.4",
    ]);
    let (small, big, free) = (
        stage(&report, 0, "small"),
        stage(&report, 0, "big"),
        stage(&report, 0, "free"),
    );
    let base = bytes(&small["entry_bytes"]);
    // Each stage's peak is what it allocated on top of what it inherited (within 8 MiB of
    // interpreter noise).
    let near = |got: u64, want: u64| got.abs_diff(want) < 8 * MIB;
    assert!(
        near(bytes(&small["peak_bytes"]), base + 32 * MIB),
        "small: {small}"
    );
    assert!(
        near(bytes(&big["peak_bytes"]), base + 192 * MIB),
        "big: {big}"
    );
    assert!(near(bytes(&free["exit_bytes"]), base), "free: {free}");
    assert!(bytes(&big["entry_bytes"]) < bytes(&big["peak_bytes"]));
    assert!(big["duration_s"].as_f64().unwrap() >= 0.35);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("##headroom stage big"),
        "markers pass through"
    );
    assert!(
        stderr(&output).contains("big"),
        "the table names the stages"
    );
}

#[test]
fn sampled_peak_matches_the_kernels_for_one_process() {
    let Some(scratch) = Scratch::with_python() else {
        return;
    };
    let alloc = scratch.alloc_py();
    let (_, report) = scratch.run_ok(&["--", "python3", &alloc, "hold:256:0.5"]);
    let sampled = bytes(&report["rungs"][0]["peak"]["rss"]);
    let kernel = bytes(&report["rungs"][0]["peak"]["kernel"]["largest_process"]);
    let error = sampled.abs_diff(kernel) as f64 / kernel as f64;
    assert!(
        // The benchmark (bench/run/peak.sh) holds the 2% target; a test on a loaded CI machine
        // allows 5% so it fails only when sampling is really off.
        error < 0.05,
        "sampled {sampled} vs kernel {kernel}: {:.1}% apart",
        error * 100.0
    );
}

#[test]
fn a_tree_with_a_double_forked_daemon_is_summed() {
    let Some(scratch) = Scratch::with_python() else {
        return;
    };
    let alloc = scratch.alloc_py();
    // The daemon's parent subshell exits at once, orphaning it; it still counts.
    let script =
        format!("(python3 {alloc} daemon:96:1.2 >/dev/null &) ; python3 {alloc} main:64:1.2");
    let (_, report) = scratch.run_ok(&["--", "sh", "-c", &script]);
    let peak = bytes(&report["rungs"][0]["peak"]["rss"]);
    assert!(peak >= 160 * MIB, "both pythons counted: peak {peak}");
    // Both pythons are listed by their own peak: 96 MiB (the daemon) and 64 MiB.
    let largest = report["rungs"][0]["largest_processes"].as_array().unwrap();
    let python_peaks: Vec<u64> = largest
        .iter()
        .filter(|p| p["command"] == "python3")
        .map(|p| bytes(&p["peak_rss"]))
        .collect();
    assert_eq!(python_peaks.len(), 2, "{largest:?}");
    assert!(
        python_peaks[0] >= 96 * MIB && python_peaks[1] >= 64 * MIB,
        "{largest:?}"
    );
}

#[test]
fn stage_regex_starts_stages_from_existing_log_lines() {
    let scratch = Scratch::new();
    let (_, report) = scratch.run_ok(&[
        "--stage-regex", r"Memory at (\w+):", "--", "sh", "-c",
        "echo 'Memory at model_loaded_cpu: 1 GB'; sleep 0.2; echo 'Memory at compiled: 2 GB'; sleep 0.2",
    ]);
    let names: Vec<&str> = report["rungs"][0]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.ends_with(&["model_loaded_cpu", "compiled"]),
        "{names:?}"
    );
}

#[test]
fn html_and_mprof_reports_are_written() {
    let scratch = Scratch::new();
    let output = scratch.headroom(&[
        "run",
        "--html",
        "r.html",
        "--mprof",
        "r.dat",
        "--",
        "sh",
        "-c",
        "echo '##headroom stage one'; sleep 0.2; echo '##headroom stage two two'; sleep 0.2",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let html = std::fs::read_to_string(scratch.path("r.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("two two"));
    let dat = std::fs::read_to_string(scratch.path("r.dat")).unwrap();
    assert!(dat.starts_with("CMDLINE sh -c"));
    assert!(dat.lines().any(|l| l.starts_with("MEM ")));
    assert!(dat.lines().any(|l| l.starts_with("FUNC two_two ")), "{dat}");
}
