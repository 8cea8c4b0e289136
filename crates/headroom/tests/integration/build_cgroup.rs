//! The promise of `headroom build`, inside a real memory-limited cgroup: the same build that
//! the kernel OOM-kills on its own completes under headroom with zero OOM kills, whether the
//! build names its compiler or calls it by the absolute path a CMake tree configured earlier
//! recorded. Uses cgroup v1 or v2, whichever this machine has; skips, saying why, where none
//! can be made.

use crate::support::{self, fakecc};

use fakecc::command_in;

use std::process::Command;

use headroom_store::BuildReport;
use support::{limited_cgroup, HEADROOM};

const LIMIT: u64 = 600 << 20;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    std::os::unix::fs::symlink(fakecc::path(), dir.path().join("bin/g++")).unwrap();
    let mut makefile = String::from("all: a.o b.o c.o d.o\n");
    for object in ["a.o", "b.o", "c.o", "d.o"] {
        makefile += &format!("{object}:\n\tg++ --mem 250 --ms 800 -c {object}.cpp -o {object}\n");
    }
    std::fs::write(dir.path().join("Makefile"), makefile).unwrap();
    dir
}

/// Runs the build `build` makes without headroom in a fresh cgroup capped at `limit`, and
/// checks that it fails because the kernel OOM-killed part of it (`why` says why it cannot
/// fit). False when no cgroup can be made here (the test then skips). The jobs' peaks must
/// meet for that, so the callers hold [`support::WHOLE_MACHINE`]; even so, on a loaded
/// machine one compile may be done before the other reaches its peak (seen twice in CI runs,
/// with real g++), so the build gets three tries, each from scratch (`build` cleans first).
fn oom_killed_alone(name: &str, limit: u64, build: impl Fn() -> Command, why: &str) -> bool {
    for _ in 0..3 {
        let Some(bare) = limited_cgroup(name, limit) else {
            return false;
        };
        let mut build = build();
        bare.attach(&mut build);
        let without = build.output().unwrap();
        let oom_kills = bare.oom_kills();
        bare.remove().unwrap();
        if oom_kills >= 1 {
            assert!(!without.status.success(), "{why}");
            return true;
        }
    }
    panic!("{why}, but the kernel OOM-killed no job in three tries");
}

#[test]
fn make_j4_is_oom_killed_alone_and_completes_under_headroom() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = project();
    let make = || {
        let mut make = command_in(dir.path(), "make");
        make.args(["-B", "-j4", "-k"]);
        make
    };
    if !oom_killed_alone("bare", LIMIT, make, "4 × 250 MiB cannot fit in 600 MiB") {
        return;
    }

    let Some(governed) = limited_cgroup("governed", LIMIT) else {
        return;
    };
    let dir = project();
    let mut headroom = command_in(dir.path(), HEADROOM);
    headroom.args(["build", "--", "make", "-j4"]);
    governed.attach(&mut headroom);
    let with = headroom.output().unwrap();
    let stderr = String::from_utf8_lossy(&with.stderr);
    assert!(with.status.success(), "{stderr}");
    assert_eq!(governed.oom_kills(), 0, "{stderr}");
    assert!(
        stderr.contains("cgroup limit 600.0 MiB"),
        "the budget came from the cgroup: {stderr}"
    );
    for object in ["a.o", "b.o", "c.o", "d.o"] {
        assert!(dir.path().join(object).exists());
    }
    governed.remove().unwrap();
}

/// The bundled template-heavy example with two 450 MiB units, one light unit and `main.cpp`:
/// two heavy units at once do not fit in `CAPPED`.
const CAPPED: u64 = 800 << 20;
const UNITS: [&str; 5] = [
    "-DHEAVY=2",
    "-DHEAVY_MIB=450",
    "-DLIGHT=1",
    "-DLIGHT_MIB=150",
    "-G",
];

/// A copy of `examples/template-heavy`, configured with CMake outside headroom.
fn configured_example() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/template-heavy");
    for file in [
        "CMakeLists.txt",
        "Makefile",
        "heavy.hpp",
        "main.cpp",
        "unit.cpp",
    ] {
        std::fs::copy(format!("{example}/{file}"), dir.path().join(file)).unwrap();
    }
    let configure = Command::new("cmake")
        .args(["-S", ".", "-B", "build"])
        .args(UNITS)
        .arg("Ninja")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(configure.status.success(), "{configure:?}");
    let cache = std::fs::read_to_string(dir.path().join("build/CMakeCache.txt")).unwrap();
    let compiler = cache
        .lines()
        .find_map(|line| line.strip_prefix("CMAKE_CXX_COMPILER:FILEPATH="))
        .unwrap();
    assert!(compiler.starts_with('/'), "CMake recorded {compiler}");
    dir
}

/// Runs `args` under `headroom build` in a fresh cgroup capped at `CAPPED`; returns the report.
fn governed_build(dir: &std::path::Path, name: &str, args: &[&str]) -> Option<BuildReport> {
    let cgroup = limited_cgroup(name, CAPPED)?;
    let mut headroom = command_in(dir, HEADROOM);
    headroom
        .args(["build", "--report", "report.json", "--"])
        .args(args);
    cgroup.attach(&mut headroom);
    let output = headroom.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    assert_eq!(cgroup.oom_kills(), 0, "{args:?}: {stderr}");
    cgroup.remove().unwrap();
    let report: BuildReport =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert!(report.outside.iter().all(|p| !p.compiler_like), "{stderr}");
    Some(report)
}

#[test]
fn a_tree_configured_before_headroom_is_governed_however_it_is_built() {
    let _alone = support::WHOLE_MACHINE.hold();
    if !support::have(&["cmake", "ninja"]) {
        return;
    }
    let dir = configured_example();
    let clean = |dir: &std::path::Path| {
        let cleaned = Command::new("ninja")
            .args(["-C", "build", "-t", "clean"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(cleaned.status.success());
    };
    let ninja = || {
        clean(dir.path());
        let mut ninja = command_in(dir.path(), "ninja");
        ninja.args(["-C", "build", "-j2"]);
        ninja
    };
    if !oom_killed_alone(
        "cmake-bare",
        CAPPED,
        ninja,
        "2 × 450 MiB cannot fit in 800 MiB",
    ) {
        return;
    }

    for (name, build) in [
        ("ninja", &["ninja", "-C", "build", "-j2"][..]),
        ("cmake-build", &["cmake", "--build", "build"][..]),
    ] {
        clean(dir.path());
        let Some(report) = governed_build(dir.path(), name, build) else {
            return;
        };
        // Two heavy units, one light, main.cpp and the link: every one a governed job,
        // each by the absolute path CMake recorded.
        assert_eq!(report.jobs.len(), 5, "{build:?}: {:?}", report.jobs);
        assert!(report.jobs.iter().all(|job| job.compiler.starts_with('/')));
        assert!(dir.path().join("build/template-heavy").exists());
    }

    let make = [
        "make",
        "CXX=/usr/bin/g++",
        "HEAVY=2",
        "HEAVY_MIB=450",
        "LIGHT=1",
        "LIGHT_MIB=150",
        "check",
    ];
    let Some(report) = governed_build(dir.path(), "make", &make) else {
        return;
    };
    assert_eq!(report.jobs.len(), 5, "{:?}", report.jobs);
    assert!(report.jobs.iter().all(|job| job.compiler == "/usr/bin/g++"));
}
