//! An OOM kill inside a `--memory-limit` cgroup is classified as the kernel's OOM kill, in the
//! stage where it happened; a `--memory-limit` whose cgroup cannot be made is a clear error,
//! reached as `nobody` where root may make cgroups.

use crate::support::{self, run};

use run::*;
use support::{assert_said, stderr, HEADROOM};

#[test]
fn oom_kill_in_a_limited_cgroup_is_named_with_its_stage() {
    if !have_python() || !can_make_cgroups() {
        return;
    }
    let scratch = Scratch::new();
    let alloc = scratch.alloc_py();
    let output = scratch.run(&[
        "--memory-limit",
        "80M",
        "--",
        "python3",
        &alloc,
        "load:16:0.3",
        "compile:512:0.3",
        "never:0:0.1",
    ]);
    assert_eq!(
        output.status.code(),
        Some(137),
        "SIGKILL passes through: {}",
        stderr(&output)
    );
    let report = scratch.json("r.json");
    let rung = &report["rungs"][0];
    assert_eq!(
        rung["diagnosis"]["kind"], "kernel_oom_kill",
        "{}",
        rung["diagnosis"]
    );
    assert_eq!(rung["diagnosis"]["stage"], "compile");
    assert!(rung["diagnosis"]["evidence"]
        .as_str()
        .unwrap()
        .contains("oom_kill"));
    assert_eq!(rung["tracking"], "cgroup");
    let limit = 80 * MIB;
    assert!(bytes(&rung["peak"]["kernel"]["cgroup"]) <= limit + MIB);
    assert_said(
        &output,
        "killed by the kernel OOM killer in stage `compile`",
    );
}

/// The user `nobody` (uid and gid 65534), who may not make cgroups where root made them.
const NOBODY: u32 = 65534;

/// `headroom ARGS…` as `nobody`, from a copy of the binary in a scratch directory `nobody`
/// owns: the failure path where this machine lets root make cgroups.
fn headroom_as_nobody(scratch: &Scratch, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    // The build's own binary may sit where `nobody` cannot reach it (under /root, say).
    let binary = scratch.path("headroom");
    if std::fs::hard_link(HEADROOM, &binary).is_err() {
        std::fs::copy(HEADROOM, &binary).expect("copy the binary");
    }
    std::os::unix::fs::chown(scratch.dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown");
    scratch
        .command_of(&binary, args)
        .env("HOME", scratch.dir.path())
        .env_remove("XDG_CONFIG_HOME")
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run headroom as nobody")
}

#[test]
fn a_memory_limit_that_cannot_be_made_is_a_clear_error() {
    let scratch = Scratch::new();
    let args = ["run", "--memory-limit", "64M", "--", "true"];
    let output = if !can_make_cgroups() {
        scratch.headroom(&args)
    } else if unsafe { libc::geteuid() } == 0 {
        headroom_as_nobody(&scratch, &args)
    } else {
        headroom_testkit::skip(
            "root",
            "this user may make cgroups and cannot become one who may not, so the failure \
             path cannot be reached",
        );
        return;
    };
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_said(&output, "--memory-limit");
}
