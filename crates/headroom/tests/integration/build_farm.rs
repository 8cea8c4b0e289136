//! `headroom build` with a build farm, against real `distccd` daemons on loopback, each node in
//! a memory-limited cgroup of its own and this machine in another: the farm runs more units
//! at once than this machine alone fits, with no OOM kill anywhere, a job that runs out of memory on a node is
//! retried on one where it fits and never here unadmitted, a node stopped mid-build loses no
//! job, and without a reachable farm the build runs as it does without one. Skips, saying
//! why, where distcc or memory cgroups are missing.

use crate::support::{self, fakecc, farm};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use farm::{Node, MIB};
use headroom_probe::cgroup::Cgroup;
use headroom_store::BuildReport;
use support::{limited_cgroup, stderr, ClosedPort, HEADROOM};

/// Starts a farm node: a `distccd` in a memory-limited cgroup of its own, whose compiles may
/// use `limit` bytes in all, running `slots` at once, its log in the node's directory.
fn start_node(name: &str, limit: u64, slots: usize) -> Option<Node> {
    let cgroup = limited_cgroup(name, limit)?;
    let dir = tempfile::tempdir().unwrap();
    // distccd refuses port 0, so it is offered free ports until one stays free.
    let daemon = support::start_on_a_free_port(
        "distccd",
        |port| {
            let mut daemon = Command::new("distccd");
            daemon
                .args([
                    "--no-detach",
                    "--daemon",
                    "--log-stderr",
                    "--enable-tcp-insecure",
                ])
                .args(["--allow", "127.0.0.1", "--listen", "127.0.0.1"])
                .args(["--port", &port.to_string(), "--jobs", &slots.to_string()]);
            cgroup.attach(&mut daemon);
            daemon
        },
        &dir.path().join("distccd.log"),
    );
    Some(Node {
        port: daemon.port,
        daemons: vec![daemon],
        cgroup,
        _dir: dir,
    })
}

/// This machine's cgroup, `(name, limit)`, and two nodes, each `(name, limit, slots)`; `None`
/// (the test skips, saying why) without distcc or memory cgroups.
fn here_and_two_nodes(
    here: (&str, u64),
    a: (&str, u64, usize),
    b: (&str, u64, usize),
) -> Option<(Cgroup, Node, Node)> {
    if !have_distcc() {
        return None;
    }
    let here = limited_cgroup(here.0, here.1)?;
    Some((here, start_node(a.0, a.1, a.2)?, start_node(b.0, b.1, b.2)?))
}

fn have_distcc() -> bool {
    let found = support::on_path("distcc") && support::on_path("distccd");
    if !found {
        headroom_testkit::skip("distcc", "distcc is not installed (apt-get install distcc)");
    }
    found
}

/// A project of `units` compiles by the stand-in compiler named `g++`, each taking the memory
/// and time its `mem/UNIT` file says (`MIB MILLIS`). distccd runs as `nobody`: the project
/// must be readable by all.
fn project(units: &[&str], mib: u64, millis: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for sub in ["bin", "mem"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    std::os::unix::fs::symlink(fakecc::path(), dir.path().join("bin/g++")).unwrap();
    let objects: Vec<String> = units.iter().map(|unit| format!("{unit}.o")).collect();
    // The build's own record of whether its shims were told that a farm takes compiles.
    let mut makefile = format!(
        "all: {}\n\techo $$HEADROOM_SESSION_FARM > farm-session\n",
        objects.join(" ")
    );
    for unit in units {
        // A node compiles in a directory of its own: the file is named by its full path.
        makefile += &format!(
            "{unit}.o:\n\tg++ --mem-file $(CURDIR)/mem/{unit} -c {unit}.cpp -o {unit}.o\n"
        );
    }
    std::fs::write(dir.path().join("Makefile"), makefile).unwrap();
    set_memory(dir.path(), units, mib, millis);
    dir
}

fn set_memory(dir: &Path, units: &[&str], mib: u64, millis: u64) {
    for unit in units {
        std::fs::write(dir.join("mem").join(unit), format!("{mib} {millis}\n")).unwrap();
        let _ = std::fs::remove_file(dir.join(format!("{unit}.o")));
    }
}

/// Runs `headroom build ARGS -- make -j8` in `dir`, inside `cgroup` (this machine's cap).
/// Returns how it ended, how long it took and its report.
fn headroom_build(dir: &Path, cgroup: &Cgroup, args: &[String]) -> (Output, BuildReport) {
    let headroom = fakecc::command_in(dir, HEADROOM);
    farm::headroom_build(headroom, dir, cgroup, args, &["make", "-j8"])
}

#[test]
fn the_farm_runs_units_side_by_side_with_no_oom_kill_anywhere() {
    let _alone = support::WHOLE_MACHINE.hold();
    // This machine fits one 400 MiB job at a time; so does each node.
    let Some((here, a, b)) = here_and_two_nodes(
        ("here", 800 * MIB),
        ("a", 700 * MIB, 2),
        ("b", 700 * MIB, 2),
    ) else {
        return;
    };
    let units = ["u1", "u2", "u3", "u4", "u5", "u6"];
    let dir = project(&units, 400, 1500);
    let (alone, _) = headroom_build(dir.path(), &here, &["--budget".into(), "600M".into()]);
    assert!(alone.status.success(), "{}", stderr(&alone));
    let farm_session = || std::fs::read_to_string(dir.path().join("farm-session")).unwrap();
    assert_eq!(
        farm_session(),
        "0\n",
        "compilers start before the governor answers"
    );

    set_memory(dir.path(), &units, 400, 1500);
    let farm = [a.farm_flag("600M", 2), b.farm_flag("600M", 2)];
    let mut args = vec!["--budget".to_string(), "600M".to_string()];
    args.extend(farm);
    let (farmed, report) = headroom_build(dir.path(), &here, &args);
    let log =
        farm::assert_side_by_side_with_no_oom_kill(&farmed, &here, [&a.cgroup, &b.cgroup], &report);
    for node in &report.nodes() {
        assert!(node.planned_peak <= 600 * MIB, "{node:?}");
    }
    assert!(log.contains("farm (distcc): "), "{log}");
    assert_eq!(
        farm_session(),
        "1\n",
        "no compiler starts here before the answer"
    );
    for unit in units {
        assert!(dir.path().join(format!("{unit}.o")).exists());
    }
    let _ = std::fs::remove_dir(here.dir());
}

#[test]
fn a_job_out_of_memory_on_a_node_is_retried_where_it_fits_and_never_here() {
    let _alone = support::WHOLE_MACHINE.hold();
    // This machine cannot hold the 400 MiB job at all: run here, it would be OOM-killed.
    let Some((here, small, large)) = here_and_two_nodes(
        ("small-here", 250 * MIB),
        ("small", 300 * MIB, 1),
        ("large", 800 * MIB, 1),
    ) else {
        return;
    };
    let dir = project(&["grows"], 100, 300);
    let budget = ["--budget".to_string(), "200M".to_string()];
    let (first, _) = headroom_build(dir.path(), &here, &budget);
    assert!(first.status.success(), "{}", stderr(&first));

    // An edited header: the job now needs 400 MiB, and the history says about 100.
    set_memory(dir.path(), &["grows"], 400, 1000);
    let mut args = budget.to_vec();
    args.extend([small.farm_flag("280M", 1), large.farm_flag("700M", 1)]);
    let (farmed, report) = headroom_build(dir.path(), &here, &args);
    let log = stderr(&farmed);
    assert!(farmed.status.success(), "{log}");
    assert!(
        small.cgroup.oom_kills() >= 1,
        "it ran out on the small node: {log}"
    );
    let job = &report.jobs[0];
    assert_eq!(job.node.as_deref(), Some(large.address().as_str()), "{log}");
    assert_eq!(job.oom_retries, 1, "{log}");
    assert!(
        job.peak < 100 * MIB,
        "only distcc's client ran here: {job:?}"
    );
    assert_eq!(
        here.oom_kills(),
        0,
        "nothing fell back to this machine: {log}"
    );
    assert!(dir.path().join("grows.o").exists());
    let _ = std::fs::remove_dir(here.dir());
}

#[test]
fn a_node_stopped_mid_build_loses_no_job() {
    let _alone = support::WHOLE_MACHINE.hold();
    let Some((here, mut doomed, survivor)) = here_and_two_nodes(
        ("stop-here", 2048 * MIB),
        ("doomed", 1024 * MIB, 2),
        ("survivor", 1024 * MIB, 2),
    ) else {
        return;
    };
    let units = ["s1", "s2", "s3", "s4"];
    let dir = project(&units, 200, 3000);
    let args = [
        "--budget".to_string(),
        "1G".to_string(),
        doomed.farm_flag("1G", 2),
        survivor.farm_flag("1G", 2),
    ];
    let (output, report, killed) = std::thread::scope(|scope| {
        let build = scope.spawn(|| headroom_build(dir.path(), &here, &args));
        let killed = doomed.kill_while_compiling(100 * MIB);
        let (output, report) = build.join().unwrap();
        (output, report, killed)
    });
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("unreachable"), "{log}");
    assert_eq!(report.jobs.len(), units.len());
    doomed.assert_nothing_ran_after_it_was_killed(&report, killed, &log);
    for unit in units {
        assert!(dir.path().join(format!("{unit}.o")).exists());
    }
    let _ = std::fs::remove_dir(here.dir());
}

#[test]
fn without_a_reachable_farm_the_build_runs_here_as_always() {
    let _alone = support::WHOLE_MACHINE.hold();
    let Some(here) = limited_cgroup("unreachable", 2048 * MIB) else {
        return;
    };
    let units = ["l1", "l2"];
    let dir = project(&units, 50, 200);
    let nothing_listens = ClosedPort::new();
    let closed = nothing_listens.port;
    let args = [format!("--farm=127.0.0.1:{closed}=8G/4")];
    let (output, report) = headroom_build(dir.path(), &here, &args);
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    assert!(
        log.contains(&format!("farm node 127.0.0.1:{closed} is unreachable"))
            || log.contains("`distcc` is not on PATH"),
        "{log}"
    );
    assert!(report.jobs.iter().all(|job| job.node.is_none()), "{log}");
    assert!(report.nodes().is_empty());
    assert_eq!(report.jobs.len(), units.len());
    let _ = std::fs::remove_dir(here.dir());
}
