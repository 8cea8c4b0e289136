//! What the farm tests share: memory-limited cgroups for this machine and for each node,
//! loopback ports, and `headroom build` run inside this machine's cgroup.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use headroom_probe::cgroup::Cgroup;
use headroom_store::BuildReport;

pub const MIB: u64 = 1 << 20;

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

/// A cgroup of this test's whose processes may use `limit` bytes; `None` (the test skips,
/// saying why) where memory cgroups cannot be made.
pub fn limited_cgroup(name: &str, limit: u64) -> Option<Cgroup> {
    let name = format!("headroom-farm-{name}-{}", std::process::id());
    match Cgroup::create_under_self(&name, Some(limit)) {
        Ok(cgroup) => Some(cgroup),
        Err(err) => {
            headroom_testkit::skip(
                "cgroup",
                format!("cannot make a memory-limited cgroup here: {err}"),
            );
            None
        }
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
/// `dir`) inside `cgroup`, this machine's cap. Returns how it ended, how long it took and
/// its report.
pub fn headroom_build(
    mut command: Command,
    dir: &Path,
    cgroup: &Cgroup,
    args: &[String],
    build: &[&str],
) -> (Output, f64, BuildReport) {
    command
        .env_remove("HEADROOM_FARM")
        .env_remove("HEADROOM_FARM_ENGINE")
        .env_remove("HEADROOM_FARM_TOKEN")
        .args(["build", "--report", "report.json"])
        .args(args)
        .arg("--")
        .args(build);
    cgroup.attach(&mut command);
    let start = Instant::now();
    let output = command.output().unwrap();
    let seconds = start.elapsed().as_secs_f64();
    let report = serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap())
        .expect("the build wrote its report");
    (output, seconds, report)
}

/// What a farm must show against this machine alone: the build succeeded in under 0.8 of the
/// time, with no OOM kill here (`here`) or on either node, and both nodes compiled. Returns
/// the build's log.
pub fn assert_faster_with_no_oom_kill(
    farmed: &Output,
    farm_seconds: f64,
    alone_seconds: f64,
    here: &Cgroup,
    nodes: [&Cgroup; 2],
    report: &BuildReport,
) -> String {
    let log = stderr(farmed);
    assert!(farmed.status.success(), "{log}");
    assert!(
        farm_seconds < 0.8 * alone_seconds,
        "with the farm {farm_seconds:.1} s, alone {alone_seconds:.1} s: {log}"
    );
    assert_eq!(here.oom_kills(), 0, "{log}");
    assert_eq!(nodes.map(Cgroup::oom_kills), [0, 0], "{log}");
    assert_eq!(report.nodes().len(), 2, "both nodes compiled: {log}");
    log
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
