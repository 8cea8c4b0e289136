//! Compilers by every name a family answers to: a cross compiler with a target prefix and a
//! version (`x86_64-linux-gnu-g++-12`), a target-prefixed one (`aarch64-linux-gnu-gcc`) and a
//! versioned clang (`clang++-19`) are gcc-style compilers, so `--lower-flags` lowers their
//! flags as it lowers plain `g++`'s; nvcc climbs only its own rung, one target at a time. The
//! compiler is the stand-in (`headroom-fakecc`), linked under each name, which runs out of
//! memory unless it is given the flags a rung adds.

use crate::support::{self, fakecc};

use std::process::Output;

use headroom_store::BuildReport;
use support::HEADROOM;

/// Builds one object with the stand-in compiler linked as `name`, with `--lower-flags`, and
/// returns the build's output and report. The compiler runs out of memory unless it is given
/// `-O0`.
fn build_with_lower_flags(name: &str) -> (Output, BuildReport) {
    build_with_lower_flags_from(
        name,
        "-O2 -g --mem 20 --ms 50 --oom-unless=-O0 -c a.cpp -o a.o",
    )
}

/// As [`build_with_lower_flags`], with the compiler called with `args`.
fn build_with_lower_flags_from(name: &str, args: &str) -> (Output, BuildReport) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    std::os::unix::fs::symlink(fakecc::path(), dir.path().join("bin").join(name)).unwrap();
    std::fs::write(
        dir.path().join("Makefile"),
        format!("a.o:\n\t{name} {args}\n"),
    )
    .unwrap();
    let output = fakecc::command_in(dir.path(), HEADROOM)
        .args([
            "build",
            "--lower-flags",
            "--report",
            "report.json",
            "--",
            "make",
        ])
        .env("HOME", dir.path())
        .env("HEADROOM_SAMPLE_INTERVAL_MS", "20")
        .env_remove("HEADROOM_BUDGET")
        .env_remove("HEADROOM_JOBS")
        .env_remove("HEADROOM_LOG")
        .output()
        .unwrap();
    let report = std::fs::read(dir.path().join("report.json"))
        .map(|bytes| serde_json::from_slice(&bytes).expect("a valid report"))
        .unwrap_or_else(|err| {
            panic!(
                "{name}: no report ({err}); stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    (output, report)
}

#[test]
fn cross_and_versioned_gcc_and_clang_names_climb_the_flag_ladder() {
    for name in [
        "g++",
        "x86_64-linux-gnu-g++-12",
        "aarch64-linux-gnu-gcc",
        "clang++-19",
    ] {
        let (output, report) = build_with_lower_flags(name);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{name}: {stderr}");
        assert_eq!(report.jobs.len(), 1, "{name}: governed as one job");
        let job = &report.jobs[0];
        let flags = job.lowered_flags.as_deref().unwrap_or_default();
        assert!(flags.contains("-O*=-O0"), "{name}: lowered by `{flags}`");
        assert_eq!(
            job.oom_retries, 5,
            "{name}: with room for more, alone, then three rungs"
        );
    }
}

#[test]
fn nvcc_building_targets_at_once_climbs_to_one_at_a_time_and_nothing_else() {
    // Out of memory unless it builds one target at a time, as parallel ciccs would be.
    let oom_unless_one = "'--oom-unless=--threads 1'";
    let (output, report) = build_with_lower_flags_from(
        "nvcc",
        &format!("-O3 -g --threads 4 --mem 20 --ms 50 {oom_unless_one} -c a.cu -o a.o"),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let job = &report.jobs[0];
    assert_eq!(
        job.lowered_flags.as_deref(),
        Some("+--threads +1"),
        "{stderr}"
    );
    assert_eq!(
        job.oom_retries, 3,
        "with room for more, alone, then its one rung"
    );

    // gcc's rungs (-g0, -O1) are not nvcc's flags: one thread already, nothing to climb.
    let (output, report) = build_with_lower_flags_from(
        "nvcc",
        "-O3 -g --threads 1 --mem 20 --ms 50 --oom-unless=-O0 -c a.cu -o a.o",
    );
    assert!(!output.status.success());
    let job = &report.jobs[0];
    assert_eq!(job.lowered_flags, None);
    assert_eq!(job.oom_retries, 2, "with room for more, then alone");
}
