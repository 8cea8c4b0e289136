//! Load: several `headroom build` runs at once sharing one history. Every job of every build
//! must have its row, no build may fail or warn (a locked database among others), and each
//! governor's memory stays bounded.
//!
//! `HEADROOM_LOAD_BUILDS` (default 4) builds of `HEADROOM_LOAD_JOBS` (default 200) trivial
//! fake compiles each; `bench/reliability/load.sh` runs 8 × 2,500 and prints the figures.

use crate::support::{self, reliability};

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headroom_store::BuildReport;
use support::HEADROOM;

/// The most a governor may hold in memory, whatever the build's size.
const GOVERNOR_RSS_BOUND: u64 = 50 << 20;

fn number(variable: &str, default: usize) -> usize {
    std::env::var(variable)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Peak resident memory (VmHWM) of `pid`, in bytes.
fn peak_rss(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

#[test]
fn concurrent_builds_sharing_a_history_lose_no_rows() {
    let _alone = support::WHOLE_MACHINE.hold();
    if !support::have(&["make"]) {
        return;
    }
    let builds = number("HEADROOM_LOAD_BUILDS", 4);
    let jobs = number("HEADROOM_LOAD_JOBS", 200);
    let shared = tempfile::tempdir().unwrap();
    let projects: Vec<tempfile::TempDir> = (0..builds)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            reliability::project(dir.path(), jobs, "--mem 1 --ms 1");
            dir
        })
        .collect();
    let start = Instant::now();
    let children: Vec<_> = projects
        .iter()
        .map(|dir| {
            let mut command = Command::new(HEADROOM);
            command.args([
                "build",
                "--report",
                "report.json",
                "--",
                "make",
                "-s",
                "-j2",
            ]);
            reliability::isolate(&mut command, dir.path());
            command
                .env("HEADROOM_STATE_DIR", shared.path().join("state"))
                .env("XDG_RUNTIME_DIR", shared.path().join("run"))
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();

    // Each governor's peak memory, sampled while it runs.
    let peaks = Arc::new(Mutex::new(vec![0u64; builds]));
    let done = Arc::new(AtomicBool::new(false));
    let clis: Vec<i32> = children.iter().map(|child| child.id() as i32).collect();
    let sampler = {
        let (peaks, done) = (Arc::clone(&peaks), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for (index, &cli) in clis.iter().enumerate() {
                    let governor = reliability::descendants(cli)
                        .into_iter()
                        .find(|p| p.ppid == cli && p.comm == "headroom");
                    if let Some(peak) = governor.and_then(|g| peak_rss(g.pid)) {
                        let mut peaks = peaks.lock().unwrap();
                        peaks[index] = peaks[index].max(peak);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let outputs: Vec<_> = children
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect();
    let wall = start.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();

    let mut problems = Vec::new();
    let mut rows = 0;
    for (index, (output, dir)) in outputs.iter().zip(&projects).enumerate() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() || stderr.contains("warning") {
            problems.push(format!("build {index}: {}\n{stderr}", output.status));
        }
        let report: Option<BuildReport> = std::fs::read(dir.path().join("report.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        let recorded = report.map_or(0, |report| report.jobs.len());
        rows += recorded;
        if recorded != jobs {
            problems.push(format!("build {index}: {recorded} job rows, not {jobs}"));
        }
    }
    let peaks = peaks.lock().unwrap().clone();
    let peak_mib: Vec<String> = peaks
        .iter()
        .map(|&bytes| format!("{:.1}", bytes as f64 / f64::from(1 << 20)))
        .collect();
    eprintln!(
        "{builds} builds × {jobs} jobs at once, one history: {rows} of {} rows recorded in {:.1} s; governor peak RSS (MiB): {}",
        builds * jobs,
        wall.as_secs_f64(),
        peak_mib.join(", ")
    );
    for (index, &peak) in peaks.iter().enumerate() {
        if peak > GOVERNOR_RSS_BOUND {
            problems.push(format!("governor {index} peaked at {peak} bytes"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
