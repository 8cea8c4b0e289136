//! Faults of the history during and after a build: a history another process holds locked
//! must cost the build no time and the summary no job, and a build whose governor was killed
//! must be reported as incomplete, never as a build that had nothing to do.

use crate::support::{self, reliability};

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use headroom_store::{BuildReport, History};
use support::stderr;

/// How long any state this test waits for may take to appear on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// Waits until `ready` holds, at most [`PATIENCE`].
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ready() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the history in `project` has begun a build: the governor has opened it.
fn build_begun(project: &Path) -> bool {
    let path = project.join("state/history.sqlite");
    path.exists()
        && History::open(&path)
            .and_then(|history| history.last_build_id())
            .is_ok()
}

/// A python3 process that holds the write lock of `history` (`BEGIN IMMEDIATE`) until killed;
/// returned once it holds it.
fn hold_lock(history: &Path) -> Child {
    let mut holder = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('BEGIN IMMEDIATE')\n\
             print('locked', flush=True)\n\
             time.sleep(600)\n",
        ])
        .arg(history)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    holder
}

#[test]
fn a_locked_history_stalls_no_compiler_and_the_summary_comes_from_memory() {
    if !support::have(&["make", "python3"]) {
        return;
    }
    const JOBS: usize = 40;
    let project = tempfile::tempdir().unwrap();
    let project = project.path();
    reliability::project(project, JOBS, "--mem 4 --ms 100");
    let mut build = reliability::headroom(
        project,
        &["build", "--report", "report.json", "--", "make", "-s"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for("the build to begin in the history", || build_begun(project));
    let mut holder = hold_lock(&project.join("state/history.sqlite"));
    let locked_at = Instant::now();
    let output = wait_with_output_and_release(&mut build, &mut holder);
    let took = locked_at.elapsed();
    let told = stderr(&output);
    eprintln!("{told}");
    eprintln!("the build ended {took:?} after the lock was taken");
    assert!(output.status.success(), "{told}");
    // The lock is held for 600 s; before, every job waited 5 s for it under the governor's
    // lock. Now only the shutdown's grace (3 s) waits on the history.
    assert!(took < Duration::from_secs(45), "{took:?}");
    assert!(
        told.contains(&format!("headroom: {JOBS} jobs in")),
        "{told}"
    );
    let report: BuildReport =
        serde_json::from_slice(&std::fs::read(project.join("report.json")).unwrap()).unwrap();
    assert_eq!(report.jobs.len(), JOBS, "every job is in --report");
    assert!(report.build.duration_ms.is_some() && report.build.peak_total.is_some());
    assert_eq!(
        told.matches("did not take all of this build").count(),
        1,
        "said once: {told}"
    );
    assert_eq!(told.matches("warning").count(), 1, "{told}");
}

/// Waits for `build`, then ends the lock's holder; returns the build's output.
fn wait_with_output_and_release(build: &mut Child, holder: &mut Child) -> Output {
    let mut err = String::new();
    std::io::Read::read_to_string(build.stderr.as_mut().unwrap(), &mut err).unwrap();
    let status = build.wait().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    Output {
        status,
        stdout: Vec::new(),
        stderr: err.into_bytes(),
    }
}

/// The `__governor` process below the CLI `cli`.
fn governor_of(cli: u32) -> Option<i32> {
    reliability::descendants(cli as i32)
        .into_iter()
        .map(|process| process.pid)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.split(|&b| b == 0).any(|arg| arg == b"__governor"))
        })
}

#[test]
fn a_build_whose_governor_was_killed_is_reported_incomplete() {
    if !support::have(&["make"]) {
        return;
    }
    const JOBS: usize = 8;
    let project = tempfile::tempdir().unwrap();
    let project = project.path();
    reliability::project(project, JOBS, "--mem 4 --ms 300");
    let build = reliability::headroom(project, &["build", "--", "make", "-s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the build to begin in the history", || build_begun(project));
    let governor = governor_of(build.id()).expect("the build has a governor");
    // SAFETY: kill(2) on this test's own descendant.
    unsafe { libc::kill(governor, libc::SIGKILL) };
    let output = build.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    for object in (0..JOBS).map(|i| format!("o{i}.o")) {
        assert!(project.join(&object).exists(), "{object} was built");
    }

    let report = reliability::headroom(project, &["report"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&report.stdout);
    eprintln!("{shown}{}", stderr(&report));
    assert!(report.status.success(), "{}", stderr(&report));
    assert!(shown.starts_with("build 1 · "), "which build: {shown}");
    assert!(shown.contains("make -s"), "{shown}");
    assert!(shown.contains("governor died"), "{shown}");
    assert!(shown.contains("INCOMPLETE record"), "{shown}");
    assert!(!shown.contains("nothing to rebuild"), "{shown}");

    // A build after it: `--list` shows both, the first as died.
    let again = reliability::headroom(project, &["build", "--", "make", "-s"])
        .output()
        .unwrap();
    assert!(again.status.success(), "{}", stderr(&again));
    let listed = reliability::headroom(project, &["report", "--list"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&listed.stdout);
    eprintln!("{table}");
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].trim_start().starts_with("2 ") && rows[0].contains(" 0 "),
        "{table}"
    );
    assert!(
        rows[1].trim_start().starts_with("1 ") && rows[1].contains("died"),
        "{table}"
    );
    assert!(rows[1].contains(&project.display().to_string()), "{table}");
    let json = reliability::headroom(project, &["report", "--list", "--json", "list.json"])
        .output()
        .unwrap();
    assert!(json.status.success(), "{}", stderr(&json));
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(project.join("list.json")).unwrap()).unwrap();
    assert_eq!(list[0]["state"], "ended");
    assert_eq!(list[1]["state"], "governor_died");
    assert_eq!(list[1]["command"], "make -s");
}
