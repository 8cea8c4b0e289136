//! Crash consistency, end to end: `headroom build` and `headroom kernels build` are SIGKILLed
//! at random points (the CLI, the governor, a shim or a compiler), a share of them right inside
//! a write, and afterwards every invariant is checked: each cache entry verifies and points at
//! an intact blob, the history opens and the next run succeeds and records, no process is left
//! stopped or running, and the next run leaves no temporary file behind.
//!
//! `HEADROOM_CRASH_POINTS` (default 20, half of them each command) and `HEADROOM_CRASH_SEED`
//! choose the points; `bench/reliability/crash.sh` runs 200 and prints the summary.

use crate::support::{self, reliability};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom_kernels::cache::Cache;
use reliability::{descendants, reap_and_wait, Leftovers};
use support::HEADROOM;

/// Jobs of a `headroom build` point: short compiles that overlap.
const BUILD_JOBS: usize = 40;
/// Jobs of a build point aimed at the history's writes: so short that the governor spends much
/// of its time recording them.
const RECORD_JOBS: usize = 300;

/// What a point runs, and how its kill is aimed.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Mode {
    /// `headroom build` of overlapping fake compiles; a random process killed at a random time.
    Build,
    /// `headroom build` of many tiny jobs; the governor killed while it records them.
    BuildRecording,
    /// `headroom kernels build`; a random process killed at a random time.
    Kernels,
    /// `headroom kernels build`; the CLI killed the moment a cache write's temp file exists.
    KernelsPublishing,
}

const MODES: [Mode; 4] = [
    Mode::Build,
    Mode::BuildRecording,
    Mode::Kernels,
    Mode::KernelsPublishing,
];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Target {
    Cli,
    Governor,
    Shim,
    Compiler,
}

/// One point's scratch project: its own cache, state, runtime and temporary directories.
struct Point {
    dir: tempfile::TempDir,
    mode: Mode,
}

impl Point {
    fn new(mode: Mode) -> Point {
        let dir = tempfile::tempdir().unwrap();
        let recipe = match mode {
            Mode::BuildRecording => "--mem 1 --ms 1",
            _ => "--mem 4 --ms 40",
        };
        let point = Point { dir, mode };
        reliability::project(point.dir.path(), point.jobs(), recipe);
        point
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn jobs(&self) -> usize {
        match self.mode {
            Mode::BuildRecording => RECORD_JOBS,
            _ => BUILD_JOBS,
        }
    }

    fn is_kernels(&self) -> bool {
        matches!(self.mode, Mode::Kernels | Mode::KernelsPublishing)
    }

    /// The point's command; `again` rebuilds everything (`make -B`) and writes a report.
    fn command(&self, again: bool) -> Command {
        let mut command = Command::new(HEADROOM);
        if self.is_kernels() {
            command
                .args(["kernels", "--manifest", "kernels.toml", "--cache", "cache"])
                .arg("build");
        } else {
            command.arg("build");
            if again {
                command.args(["--report", "report.json", "--", "make", "-B"]);
            } else {
                command.arg("make");
            }
            command.args(["-s", "-j4"]);
        }
        reliability::isolate(&mut command, self.dir.path());
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        command
    }
}

/// What happened at one point.
#[derive(Default)]
struct Outcome {
    killed: Option<Target>,
    mid_write: bool,
    /// Entries or blobs found wrong, right after the kill or after the next run.
    cache: Vec<String>,
    /// Why the history did not open.
    history: Vec<String>,
    /// How the next run failed, or what it did not record.
    next_run: Vec<String>,
    leftovers: Leftovers,
}

/// The processes of a running command that a kill may aim at.
fn candidates(cli: i32, target: Target) -> Vec<i32> {
    let tree = descendants(cli);
    let comm_of = |pid: i32| {
        tree.iter()
            .find(|p| p.pid == pid)
            .map(|p| p.comm.as_str())
            .unwrap_or("")
    };
    tree.iter()
        .filter(|p| match target {
            Target::Cli => p.pid == cli,
            Target::Governor => p.ppid == cli && p.comm == "headroom",
            Target::Shim => p.comm == "headroom-shim",
            Target::Compiler => comm_of(p.ppid) == "headroom-shim",
        })
        .map(|p| p.pid)
        .collect()
}

/// Waits `delay`, then SIGKILLs one process of kind `target` as soon as one exists; `None`
/// when the command ended first.
fn kill_at(child: &mut Child, delay: Duration, target: Target) -> Option<i32> {
    let start = Instant::now();
    while start.elapsed() < delay {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    loop {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        let found = candidates(child.id() as i32, target);
        if !found.is_empty() {
            let pid = found[fastrand::usize(..found.len())];
            // SAFETY: kill(2) on a process of this test's own command.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Kills the CLI the moment a temp file exists in the cache: the kill lands between a write's
/// start and its rename. Returns whether it did before the command ended.
fn kill_while_publishing(child: &mut Child, cache: &Path) -> bool {
    loop {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if !reliability::temp_files(cache).is_empty() {
            // SAFETY: kill(2) on this test's own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            return true;
        }
        std::thread::yield_now();
    }
}

/// Whether the history's write-ahead log ends inside a transaction: after the 32-byte header,
/// frames of a 24-byte header and one page follow, a commit frame giving the database size;
/// frames of the current generation (matching salts) after the last commit, or a torn frame,
/// mean the writer died mid-write.
fn wal_ends_mid_transaction(wal: &Path) -> bool {
    let Ok(bytes) = std::fs::read(wal) else {
        return false;
    };
    if bytes.len() < 32 {
        return false;
    }
    let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let frame = 24 + word(8) as usize;
    let salts = &bytes[16..24];
    let (mut at, mut open) = (32, false);
    while at + frame <= bytes.len() && &bytes[at + 8..at + 16] == salts {
        open = word(at + 4) == 0;
        at += frame;
    }
    let torn = at < bytes.len() && at + frame > bytes.len() && bytes.len() > at + 16;
    open || (torn && &bytes[at + 8..at + 16] == salts)
}

/// How long the command runs undisturbed, for aiming kills within it.
fn usual_duration(mode: Mode) -> Duration {
    let point = Point::new(mode);
    let start = Instant::now();
    let output = point.command(false).output().unwrap();
    assert!(
        output.status.success(),
        "{mode:?} without a kill: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    start.elapsed()
}

fn run_point(mode: Mode, usual: Duration) -> Outcome {
    let point = Point::new(mode);
    let mut outcome = Outcome::default();
    let mut child = point.command(false).stderr(Stdio::null()).spawn().unwrap();
    let history = point.path("state/history.sqlite");
    match mode {
        Mode::KernelsPublishing => {
            if kill_while_publishing(&mut child, &point.path("cache")) {
                outcome.killed = Some(Target::Cli);
                outcome.mid_write = !reliability::temp_files(&point.path("cache")).is_empty();
            }
        }
        Mode::BuildRecording => {
            let delay = usual.mul_f64(fastrand::f64());
            if kill_at(&mut child, delay, Target::Governor).is_some() {
                outcome.killed = Some(Target::Governor);
                outcome.mid_write =
                    wal_ends_mid_transaction(&point.path("state/history.sqlite-wal"));
            }
        }
        Mode::Build | Mode::Kernels => {
            let targets = [
                Target::Cli,
                Target::Governor,
                Target::Shim,
                Target::Compiler,
            ];
            let target = targets[fastrand::usize(..targets.len())];
            let delay = usual.mul_f64(fastrand::f64());
            if kill_at(&mut child, delay, target).is_some() {
                outcome.killed = Some(target);
            }
        }
    }
    let _ = child.wait();
    outcome.leftovers = reap_and_wait(point.dir.path());
    if point.is_kernels() {
        outcome
            .cache
            .extend(reliability::check_cache(&point.path("cache")));
    }
    if history.exists() {
        if let Err(err) = headroom_store::History::open(&history) {
            outcome.history.push(err.to_string());
        }
    }
    // The next run: it must succeed, record, and clear what the killed one left.
    let next = point.command(true).output().unwrap();
    if !next.status.success() {
        outcome
            .next_run
            .push(format!("failed: {}", String::from_utf8_lossy(&next.stderr)));
    }
    if point.is_kernels() {
        outcome
            .cache
            .extend(reliability::check_cache(&point.path("cache")));
        let entries = Cache::open(&point.path("cache"))
            .and_then(|cache| cache.entries())
            .map_or(0, |entries| entries.len());
        if entries != reliability::KERNEL_PAIRS {
            outcome.next_run.push(format!(
                "{entries} cache entries, not {}",
                reliability::KERNEL_PAIRS
            ));
        }
    } else {
        let recorded = std::fs::read(point.path("report.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<headroom_store::BuildReport>(&bytes).ok())
            .map_or(0, |report| report.jobs.len());
        if recorded != point.jobs() {
            outcome
                .next_run
                .push(format!("recorded {recorded} jobs, not {}", point.jobs()));
        }
    }
    outcome.leftovers.add(&reap_and_wait(point.dir.path()));
    outcome.leftovers.temp_files = reliability::leftover_files(point.dir.path());
    outcome
}

#[test]
fn killed_builds_leave_consistent_caches_and_histories() {
    let _alone = support::WHOLE_MACHINE.hold();
    if !support::have(&["make", "clang-19"]) {
        return;
    }
    let points: usize = std::env::var("HEADROOM_CRASH_POINTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("HEADROOM_CRASH_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    fastrand::seed(seed);
    reliability::become_subreaper();
    let usual: BTreeMap<Mode, Duration> = MODES.iter().map(|&m| (m, usual_duration(m))).collect();

    let mut kills: BTreeMap<String, usize> = BTreeMap::new();
    let (mut mid_write, mut missed) = (BTreeMap::<Mode, usize>::new(), 0);
    let mut leftovers = Leftovers::default();
    let mut violations = Vec::new();
    let (mut corrupt_caches, mut corrupt_histories, mut failed_next) = (0, 0, 0);
    for index in 0..points {
        let mode = MODES[index % MODES.len()];
        let outcome = run_point(mode, usual[&mode]);
        match outcome.killed {
            Some(target) => *kills.entry(format!("{mode:?}, {target:?}")).or_default() += 1,
            None => missed += 1,
        }
        if outcome.mid_write {
            *mid_write.entry(mode).or_default() += 1;
        }
        corrupt_caches += usize::from(!outcome.cache.is_empty());
        corrupt_histories += usize::from(!outcome.history.is_empty());
        failed_next += usize::from(!outcome.next_run.is_empty());
        let found = [&outcome.cache, &outcome.history, &outcome.next_run];
        for violation in found.into_iter().flatten() {
            violations.push(format!(
                "point {index} ({mode:?}, killed {:?}): {violation}",
                outcome.killed
            ));
        }
        if !outcome.leftovers.is_empty() {
            violations.push(format!(
                "point {index} ({mode:?}, killed {:?}): left {:?}",
                outcome.killed, outcome.leftovers
            ));
        }
        leftovers.add(&outcome.leftovers);
    }
    eprintln!("crash points: {points} (HEADROOM_CRASH_SEED={seed})");
    eprintln!("usual durations: {usual:?}");
    for (what, count) in &kills {
        eprintln!("  kills, {what}: {count}");
    }
    eprintln!("  command ended before its kill: {missed}");
    eprintln!("  kills that landed mid-write: {mid_write:?}");
    eprintln!("corrupted caches: {corrupt_caches}");
    eprintln!("corrupted histories: {corrupt_histories}");
    eprintln!("next runs that failed or did not record: {failed_next}");
    eprintln!("leftover stopped processes: {}", leftovers.stopped.len());
    eprintln!("leftover running processes: {}", leftovers.running.len());
    eprintln!("leftover temp files: {}", leftovers.temp_files.len());
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
