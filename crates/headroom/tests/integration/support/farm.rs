//! What the farm tests share: a node (its daemons and its memory-limited cgroup), this
//! machine's cgroup, and `headroom build` run inside it. Each engine's test starts its own
//! daemons, on ports that `support::start_on_a_free_port` hands out.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headroom_probe::cgroup::Cgroup;
use headroom_store::BuildReport;

use super::{stderr, Listening};

pub const MIB: u64 = 1 << 20;

/// One farm node on loopback: its daemons (the first listens on `port`, where `--farm` points),
/// the memory-limited cgroup its compiles run in, and the directory of its logs and files.
/// Dropping it kills every process of it and removes its cgroup.
pub struct Node {
    pub daemons: Vec<Listening>,
    pub cgroup: Cgroup,
    pub port: u16,
    pub _dir: tempfile::TempDir,
}

impl Node {
    /// The node as `--farm` takes it, declaring `memory` and `slots`.
    pub fn farm_flag(&self, memory: &str, slots: usize) -> String {
        format!("--farm={}={memory}/{slots}", self.address())
    }

    /// Where the node listens, as a build report names it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the node (as [`Node::kill`]) once a compile on it has taken `bytes`, or after a
    /// minute if none does: a node that dies mid-compile. Returns when, in milliseconds since
    /// the Unix epoch.
    pub fn kill_while_compiling(&mut self, bytes: u64) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.cgroup.peak().unwrap_or(0) < bytes && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64)
    }

    /// Asserts that every job of `report` succeeded, and that none ran on this node after it
    /// was killed at `killed_unix_ms`: those went elsewhere. A job that ended on it before
    /// (a light one, while the heavy one the kill waited for ran) did run there.
    pub fn assert_nothing_ran_after_it_was_killed(
        &self,
        report: &BuildReport,
        killed_unix_ms: i64,
        log: &str,
    ) {
        for job in &report.jobs {
            assert_eq!(job.exit_code, Some(0), "{job:?}");
            if job.node.as_deref() == Some(self.address().as_str()) {
                let ended = report.build.started_unix_ms + job.end_ms as i64;
                assert!(ended <= killed_unix_ms, "{job:?} ended at {ended}: {log}");
            }
        }
    }

    /// Stops the node as a crash would: every process of it killed at once, those in its
    /// cgroup and its daemons that run outside it.
    pub fn kill(&mut self) {
        kill_all(&self.cgroup);
        for daemon in &mut self.daemons {
            let _ = daemon.child.kill();
            let _ = daemon.child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        remove(&self.cgroup);
    }
}

/// Kills every process in `cgroup` at once, as a crash would.
fn kill_all(cgroup: &Cgroup) {
    for pid in cgroup.pids().unwrap_or_default() {
        // SAFETY: kill(2) on the processes of this test's own daemons.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Kills what is left in `cgroup` and removes it.
fn remove(cgroup: &Cgroup) {
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
