//! What CMD's end shows, gathered once it has exited: the kernel's own peaks, an OOM kill in
//! its cgroup or in the kernel log, a SIGKILL that was headroom's own, and processes of the
//! tree that outlived it.

use std::collections::HashSet;

use headroom_diagnose::ExitInfo;
use headroom_probe::cgroup::Cgroup;
use headroom_probe::rusage;
use headroom_size::format_size;
use serde::Serialize;

use super::spawn::{Forwarded, Started};
use super::watch::Watch;

/// The kernel's own account, to cross-check sampled peaks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KernelPeaks {
    /// Largest peak RSS of any single finished descendant (`getrusage(RUSAGE_CHILDREN)`); over
    /// every rung so far.
    pub largest_process: u64,
    /// The command's own cgroup's peak usage (page cache included), with `--memory-limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<u64>,
}

/// What CMD's end shows.
pub(super) struct Evidence {
    /// How it ended, with the kernel's OOM evidence where there is some.
    pub exit: ExitInfo,
    pub kernel: KernelPeaks,
    /// headroom sent SIGKILL itself, at the user's second Ctrl-C: a SIGKILL exit is then
    /// headroom's doing, not the OOM killer's.
    pub killed_by_headroom: bool,
    pub notes: Vec<String>,
}

/// Gathers what `cmd`'s end (`exit`) shows, from the kernel, its cgroup (under
/// `memory_limit`) and the tree `watch` followed.
pub(super) fn gather(
    mut exit: ExitInfo,
    cmd: &Started,
    forwarded: &Forwarded,
    memory_limit: Option<u64>,
    watch: &mut Watch,
) -> Evidence {
    let mut notes = Vec::new();
    let killed_by_headroom = forwarded.sent_kill && exit.signal == Some(libc::SIGKILL);
    if killed_by_headroom {
        notes.push(
            "headroom killed CMD with SIGKILL at the second Ctrl-C: that kill is headroom's, not the OOM killer's"
                .to_string(),
        );
    }
    let kernel = KernelPeaks {
        largest_process: rusage::children_max_rss(),
        cgroup: cmd.cgroup.as_ref().and_then(Cgroup::peak),
    };
    if let Some(cgroup) = &cmd.cgroup {
        let (before, oom_kills) = (cmd.oom_kills_before, cgroup.oom_kills());
        if oom_kills > before {
            exit.kernel_oom_evidence = Some(format!(
                "the kernel OOM killer killed {} process(es) in the run's cgroup ({} oom_kill {before} -> {oom_kills}) at the {} limit",
                oom_kills - before,
                cgroup.dir().display(),
                format_size(memory_limit.unwrap_or(0)),
            ));
        }
    }
    if exit.kernel_oom_evidence.is_none() && !exit.success() {
        match kernel_log_kill(watch.tracker.ever_seen(), cmd.started_unix) {
            Ok(Some(line)) => exit.kernel_oom_evidence = Some(format!("kernel log: {line}")),
            Ok(None) => {}
            Err(reason) => notes.push(reason),
        }
    }
    let survivors = watch.tracker.sample();
    if !survivors.is_empty() && cmd.cgroup.is_none() {
        notes.push(format!(
            "{} process(es) of the tree still run after CMD exited (pids {}); they were sampled while CMD ran",
            survivors.len(),
            survivors.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    Evidence {
        exit,
        kernel,
        killed_by_headroom,
        notes,
    }
}

/// A kernel-log OOM kill of one of the tree's processes since the run started.
fn kernel_log_kill(pids: &HashSet<i32>, started_unix: f64) -> Result<Option<String>, String> {
    let log = headroom_probe::kernel_log::read().map_err(|e| {
        format!("no cgroup watched this run and {e}, so an OOM kill cannot be confirmed")
    })?;
    Ok(headroom_diagnose::kills_in_log(&log)
        .into_iter()
        .filter(|logged| {
            let pid = logged.kill.victim.as_ref().and_then(|victim| victim.pid);
            pid.is_some_and(|pid| pids.contains(&(pid as i32)))
        })
        // Keep kills from after the run started, with a second of slack for clock granularity.
        .filter(|logged| {
            logged
                .unix_s
                .is_none_or(|unix_s| unix_s >= started_unix - 1.0)
        })
        .map(|logged| logged.kill.evidence)
        .next_back())
}
