//! Processes of a build that run outside every admitted job: a build driver, or a compiler
//! started where the interceptor could not act (by a statically linked or setuid program, or
//! one that removed `LD_PRELOAD`). Their memory is real, so the scheduler counts it against
//! the budget; compilers among them are named in the report with why they were not governed.

use std::collections::HashMap;

use headroom_probe::procs::ProcStat;
use headroom_process::signal_process;
use headroom_report::OutsideProcess;

use crate::compiler::is_compiler_like;

/// Processes that are not compilers count against the budget, and are kept in the report,
/// only from this size up: the build system's own small processes (make, ninja, sh, the
/// shims) are what the budget's reserve is for, and counting them too would keep two jobs
/// predicted at half the budget each from ever running together.
const HEAVY: u64 = 64 << 20;
/// Compilers outside the jobs are kept in the report from this peak or this many
/// milliseconds up: a probe (`nvcc --version`, which the shim lets through) is neither.
const NOTABLE_COMPILER: u64 = 16 << 20;
const NOTABLE_COMPILER_MS: u64 = 1000;

/// Whether `process` is a shim (`headroom-shim`, or `headroom` itself where the small shim
/// binary is missing): the process groups it starts are job attempts.
pub fn is_shim(process: &ProcStat) -> bool {
    process.comm == "headroom-shim" || process.comm == "headroom"
}

/// What the governor has seen outside the jobs during one build.
#[derive(Default)]
pub struct OutsideTracker {
    seen: HashMap<i32, OutsideProcess>,
    stopped: Vec<i32>,
}

impl OutsideTracker {
    /// Notes the processes outside every job at `t_ms`; returns the memory of those that
    /// count against the budget: compilers, and other processes from `HEAVY` up.
    pub fn observe(&mut self, processes: &[ProcStat], t_ms: u64) -> u64 {
        let mut counted = 0;
        for process in processes {
            if is_compiler_like(&process.comm) || process.counted_bytes >= HEAVY {
                counted += process.counted_bytes;
            }
            let entry = self
                .seen
                .entry(process.pid)
                .or_insert_with(|| described(process, processes, t_ms));
            // A process that has run another program since it was seen (a build driver's
            // fork that became the compiler) is what it runs now.
            if entry.name != process.comm {
                *entry = OutsideProcess {
                    peak: entry.peak,
                    first_seen_ms: entry.first_seen_ms,
                    ..described(process, processes, t_ms)
                };
            }
            entry.peak = entry.peak.max(process.counted_bytes);
            entry.last_seen_ms = t_ms;
        }
        counted
    }

    /// Whether any process outside the jobs is stopped now.
    pub fn any_stopped(&self) -> bool {
        !self.stopped.is_empty()
    }

    /// Stops the largest of `processes` (a compiler if there is one) that is not stopped yet.
    pub fn stop_largest(&mut self, processes: &[ProcStat]) {
        let candidates = processes.iter().filter(|p| !self.stopped.contains(&p.pid));
        let largest = candidates
            .max_by_key(|p| (is_compiler_like(&p.comm), p.rss_bytes))
            .map(|p| p.pid);
        if let Some(pid) = largest {
            tracing::warn!("memory is about to run out: stopping process {pid}, outside every job");
            signal_process(pid, libc::SIGSTOP);
            self.stopped.push(pid);
        }
    }

    /// Lets every process it stopped go on.
    pub fn resume_all(&mut self) {
        for pid in self.stopped.drain(..) {
            signal_process(pid, libc::SIGCONT);
        }
    }

    /// What the report keeps: compilers that were big or long enough to matter, and other
    /// processes that were heavy. A compiler never seen holding memory ran nothing: it was the
    /// rest of an attempt headroom killed, orphaned to the subreaper while its memory was
    /// freed (seen for up to 2.3 s after a requeue of a 4 GiB nvcc job).
    pub fn finish(mut self) -> Vec<OutsideProcess> {
        self.resume_all();
        let mut kept: Vec<OutsideProcess> = self
            .seen
            .into_values()
            .filter(|p| {
                let notable = p.peak >= NOTABLE_COMPILER
                    || (p.peak > 0 && p.last_seen_ms - p.first_seen_ms >= NOTABLE_COMPILER_MS);
                (p.compiler_like && notable) || p.peak >= HEAVY
            })
            .collect();
        kept.sort_by_key(|p| std::cmp::Reverse(p.peak));
        kept
    }
}

/// What the report says of `process`, one of the processes outside the jobs at `t_ms`.
fn described(process: &ProcStat, outside: &[ProcStat], t_ms: u64) -> OutsideProcess {
    let compiler_like = is_compiler_like(&process.comm);
    OutsideProcess {
        pid: process.pid,
        name: process.comm.clone(),
        compiler_like,
        peak: 0,
        first_seen_ms: t_ms,
        last_seen_ms: t_ms,
        reason: if compiler_like {
            why_not_governed(process, outside)
        } else {
            "not a compiler: counted against the budget".to_string()
        },
    }
}

/// Why a compiler-like `process` ran outside admission, and how to fix that.
fn why_not_governed(process: &ProcStat, outside: &[ProcStat]) -> String {
    if let Some(parent) = outside
        .iter()
        .find(|p| p.pid == process.ppid && is_compiler_like(&p.comm))
    {
        return format!(
            "part of `{}` (pid {}), which was not governed",
            parent.comm, parent.pid
        );
    }
    let parent_name = std::fs::read_to_string(format!("/proc/{}/comm", process.ppid))
        .map(|name| name.trim().to_string())
        .unwrap_or_else(|_| "?".to_string());
    let parent_intercepted = std::fs::read_to_string(format!("/proc/{}/maps", process.ppid))
        .is_ok_and(|maps| maps.contains("libheadroom-intercept"));
    if parent_intercepted {
        format!(
            "started by `{parent_name}` (pid {}) in a way the interceptor does not see (fexecve or \
             a raw system call); run it through `headroom-launch COMPILER ARGS…`",
            process.ppid
        )
    } else {
        format!(
            "started by `{parent_name}` (pid {}), which does not load headroom's interceptor \
             (statically linked, setuid, or its environment dropped LD_PRELOAD); run the compiler \
             through `headroom-launch COMPILER ARGS…` (e.g. CMAKE_CXX_COMPILER_LAUNCHER), or start \
             it from a dynamically linked tool",
            process.ppid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: i32, ppid: i32, comm: &str, mib: u64) -> ProcStat {
        ProcStat {
            pid,
            ppid,
            pgid: 1,
            sid: 1,
            rss_bytes: mib << 20,
            counted_bytes: mib << 20,
            cpu_seconds: 0.0,
            comm: comm.to_string(),
            start_ticks: 0,
        }
    }

    #[test]
    fn compilers_and_heavy_processes_count_and_the_build_systems_small_ones_do_not() {
        let mut tracker = OutsideTracker::default();
        let seen = [
            process(10, 1, "ninja", 8),
            process(11, 10, "sh", 2),
            process(12, 10, "python3", 400),
            process(13, 10, "g++", 20),
            process(14, 13, "cc1plus", 900),
        ];
        assert_eq!(tracker.observe(&seen, 0), (400 + 20 + 900) << 20);
        tracker.observe(&seen, 1500);
        let kept = tracker.finish();
        let names: Vec<&str> = kept.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["cc1plus", "python3", "g++"]);
        assert_eq!(
            kept[0].reason,
            "part of `g++` (pid 13), which was not governed"
        );
        assert!(
            kept[2]
                .reason
                .contains("does not load headroom's interceptor"),
            "{}",
            kept[2].reason
        );
    }

    #[test]
    fn a_fork_seen_before_it_became_the_compiler_is_named_as_the_compiler() {
        let mut tracker = OutsideTracker::default();
        tracker.observe(&[process(30, 1, "static-driver", 1)], 0);
        tracker.observe(&[process(30, 1, "g++", 300)], 500);
        let kept = tracker.finish();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(
            (
                kept[0].name.as_str(),
                kept[0].compiler_like,
                kept[0].first_seen_ms
            ),
            ("g++", true, 0)
        );
        assert!(
            kept[0]
                .reason
                .contains("does not load headroom's interceptor"),
            "{}",
            kept[0].reason
        );
    }

    #[test]
    fn a_compiler_that_never_held_memory_is_not_reported() {
        let mut tracker = OutsideTracker::default();
        let exiting = [process(20, 1, "cicc", 0), process(21, 1, "cc1plus", 1)];
        for t_ms in [0, 1000, 2300] {
            tracker.observe(&exiting, t_ms);
        }
        let kept = tracker.finish();
        let names: Vec<&str> = kept.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["cc1plus"],
            "a small compiler that ran long still is"
        );
    }
}
