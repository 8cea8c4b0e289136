//! An OOM kill inside a `--memory-limit` cgroup is classified as the kernel's OOM kill, in the
//! stage where it happened.

mod run_support;

use run_support::*;

#[test]
fn oom_kill_in_a_limited_cgroup_is_named_with_its_stage() {
    if !have_python() || !can_make_cgroups() {
        return;
    }
    let scratch = Scratch::new();
    let alloc = scratch.alloc_py();
    let output = scratch.headroom(&[
        "run",
        "--json",
        "r.json",
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
    assert!(
        stderr(&output).contains("killed by the kernel OOM killer in stage `compile`"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_memory_limit_that_cannot_be_made_is_a_clear_error() {
    if can_make_cgroups() {
        eprintln!("skipping: cgroups can be made here, so the failure path cannot be reached");
        return;
    }
    let scratch = Scratch::new();
    let output = scratch.headroom(&["run", "--memory-limit", "64M", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--memory-limit"),
        "{}",
        stderr(&output)
    );
}
