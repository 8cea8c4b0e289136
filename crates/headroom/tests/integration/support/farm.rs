//! What the farm tests share: memory-limited cgroups for this machine and for each node,
//! and `headroom build` run inside this machine's cgroup.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use headroom_probe::cgroup::Cgroup;
use headroom_store::BuildReport;

use super::stderr;

pub const MIB: u64 = 1 << 20;

/// A loopback port that was free a moment ago, for sccache-dist: it must be told its
/// address before it binds, and it daemonizes (the process started exits 0 at once), so
/// neither its process tree nor its exit says which port it got; [`wait_listening`] is the
/// only sign. distccd, moto, redis and wsgidav are started with `support::start_on_*`.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Waits until something listens on loopback `port`.
pub fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills every process in `cgroup` at once, as a crash would.
pub fn kill_all(cgroup: &Cgroup) {
    for pid in cgroup.pids().unwrap_or_default() {
        // SAFETY: kill(2) on the processes of this test's own daemons.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Kills what is left in `cgroup` and removes it.
pub fn remove(cgroup: &Cgroup) {
    kill_all(cgroup);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cgroup.pids().unwrap_or_default().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir(cgroup.dir());
}

/// Runs `headroom` (`command`, set up to run `build --report report.json ARGS -- BUILD` in
/// `dir`) inside `cgroup`, this machine's cap. Returns how it ended and its report.
pub fn headroom_build(
    mut command: Command,
    dir: &Path,
    cgroup: &Cgroup,
    args: &[String],
    build: &[&str],
) -> (Output, BuildReport) {
    command
        .env_remove("HEADROOM_FARM")
        .env_remove("HEADROOM_FARM_ENGINE")
        .env_remove("HEADROOM_FARM_TOKEN")
        .args(["build", "--report", "report.json"])
        .args(args)
        .arg("--")
        .args(build);
    cgroup.attach(&mut command);
    let output = command.output().unwrap();
    let report = serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap())
        .expect("the build wrote its report");
    (output, report)
}

/// What a farm must show: the build succeeded with no OOM kill here (`here`) or on either
/// node, both nodes compiled, and more units ran at once than this machine alone fits (one).
/// How much sooner that ends is a benchmark's question (bench/build/farm.sh), not this test's.
/// Returns the build's log.
pub fn assert_side_by_side_with_no_oom_kill(
    farmed: &Output,
    here: &Cgroup,
    nodes: [&Cgroup; 2],
    report: &BuildReport,
) -> String {
    let log = stderr(farmed);
    assert!(farmed.status.success(), "{log}");
    assert_eq!(here.oom_kills(), 0, "{log}");
    assert_eq!(nodes.map(Cgroup::oom_kills), [0, 0], "{log}");
    assert_eq!(report.nodes().len(), 2, "both nodes compiled: {log}");
    assert!(most_at_once(report) >= 2, "{:?}: {log}", report.jobs);
    log
}

/// The most jobs of `report` that ran at one instant.
fn most_at_once(report: &BuildReport) -> usize {
    report
        .jobs
        .iter()
        .map(|job| {
            report
                .jobs
                .iter()
                .filter(|other| other.start_ms <= job.start_ms && job.start_ms < other.end_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}
