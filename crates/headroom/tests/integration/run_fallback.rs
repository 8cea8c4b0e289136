//! Fallback ladders: a memory failure moves on to the next rung, any other failure stops.

use crate::support::{self, run};

use run::*;
use support::assert_said;

#[test]
fn a_memory_failure_moves_to_the_next_rung_which_succeeds() {
    let Some(scratch) = Scratch::with_python() else {
        return;
    };
    // The first rung asks for 32 TiB and gets a real MemoryError; the override shrinks it.
    let program = "import os; n = int(os.environ.get('ALLOC_MB', 1 << 25)); print('##headroom stage allocate', flush=True); b = bytearray(n << 20)";
    let (output, report) =
        scratch.run_ok(&["--fallback", "ALLOC_MB=16", "--", "python3", "-c", program]);
    assert_eq!(report["succeeded_rung"], 1);
    let first = &report["rungs"][0];
    assert_eq!(first["diagnosis"]["kind"], "python_memory_error");
    assert_eq!(first["diagnosis"]["stage"], "allocate");
    assert_eq!(report["rungs"][1]["env"][0][0], "ALLOC_MB");
    assert_said(&output, "rung 1 succeeded");
}

#[test]
fn a_non_memory_failure_stops_the_ladder() {
    let scratch = Scratch::new();
    let output = scratch.run(&[
        "--fallback",
        "true",
        "--",
        "sh",
        "-c",
        "echo 'error: expected ;' >&2; exit 3",
    ]);
    assert_eq!(output.status.code(), Some(3));
    let report = scratch.json("r.json");
    assert_eq!(report["rungs"].as_array().unwrap().len(), 1);
    assert_eq!(report["succeeded_rung"], serde_json::Value::Null);
}

#[test]
fn an_oom_killed_first_rung_falls_back_inside_a_memory_limit() {
    if !have_python() || !can_make_cgroups() {
        return;
    }
    let scratch = Scratch::new();
    let alloc = scratch.alloc_py();
    let (_, report) = scratch.run_ok(&[
        "--memory-limit",
        "96M",
        "--fallback",
        &format!("python3 {alloc} load:8:0.1 compute:16:0.1"),
        "--",
        "python3",
        &alloc,
        "load:8:0.1",
        "compute:256:0.1",
    ]);
    assert_eq!(report["rungs"][0]["diagnosis"]["kind"], "kernel_oom_kill");
    assert_eq!(report["succeeded_rung"], 1);
}
