//! Follows one command's whole process tree from sample to sample, cheaply enough to sample at
//! 100 Hz: the tree is walked through the kernel's children lists, so each sample reads a few
//! small files per member and never scans all of `/proc`.
//!
//! A process belongs when the kernel says so (it is in the command's own cgroup) or, without a
//! cgroup, when it descends from the tracking process (which should be a child subreaper, so
//! double-forked daemons are reparented to it instead of to init). On kernels without children
//! lists, `/proc` is scanned instead, a process is looked at once to decide whether it belongs,
//! and sharing the command's session also counts.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::procs::{children_of, ProcStat};

/// How membership is decided.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Exactly the processes listed in this cgroup's `cgroup.procs`.
    Cgroup(PathBuf),
    /// Descendants of `ancestor` (not `ancestor` itself), plus every process in `session`.
    Descendants { ancestor: i32, session: i32 },
}

/// Processes that have been looked at and do not belong are forgotten this often, so a reused
/// pid is looked at again.
const STRANGER_MEMORY: Duration = Duration::from_secs(1);

/// The tracked tree.
#[derive(Debug)]
pub struct TreeTracker {
    scope: Scope,
    members: HashSet<i32>,
    strangers: HashSet<i32>,
    excluded: HashSet<i32>,
    strangers_since: Instant,
    /// Every pid that was ever a member, for matching kernel OOM-kill records afterwards.
    ever: HashSet<i32>,
    /// The kernel keeps `/proc/PID/task/TID/children` (CONFIG_PROC_CHILDREN).
    children_lists: bool,
}

impl TreeTracker {
    pub fn new(scope: Scope) -> Self {
        TreeTracker {
            scope,
            members: HashSet::new(),
            strangers: HashSet::new(),
            excluded: HashSet::new(),
            strangers_since: Instant::now(),
            ever: HashSet::new(),
            children_lists: children_of(std::process::id() as i32).is_some(),
        }
    }

    /// Never count `pid` or its descendants (e.g. a helper the tracker's owner started).
    pub fn exclude(&mut self, pid: i32) {
        self.excluded.insert(pid);
        self.members.remove(&pid);
    }

    /// Every pid seen in the tree so far.
    pub fn ever_seen(&self) -> &HashSet<i32> {
        &self.ever
    }

    /// The tree's processes now. Processes that vanish between listing and reading are skipped.
    pub fn sample(&mut self) -> Vec<ProcStat> {
        let mut stats: HashMap<i32, ProcStat> = HashMap::new();
        match self.scope.clone() {
            Scope::Cgroup(dir) => {
                let listed = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in listed.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if let Some(stat) = self.read(pid) {
                        stats.insert(pid, stat);
                    }
                }
            }
            Scope::Descendants { ancestor, .. } if self.children_lists => {
                self.walk_children(ancestor, &mut stats);
            }
            Scope::Descendants { ancestor, session } => {
                self.scan(ancestor, session, &mut stats);
            }
        }
        self.members = stats.keys().copied().collect();
        self.ever.extend(self.members.iter().copied());
        let mut processes: Vec<ProcStat> = stats.into_values().collect();
        processes.sort_by_key(|p| p.pid);
        processes
    }

    fn walk_children(&self, ancestor: i32, stats: &mut HashMap<i32, ProcStat>) {
        let mut pending = children_of(ancestor).unwrap_or_default();
        while let Some(pid) = pending.pop() {
            if self.excluded.contains(&pid) || stats.contains_key(&pid) {
                continue;
            }
            if let Some(stat) = self.read(pid) {
                stats.insert(pid, stat);
                pending.extend(children_of(pid).unwrap_or_default());
            }
        }
    }

    fn scan(&mut self, ancestor: i32, session: i32, stats: &mut HashMap<i32, ProcStat>) {
        if self.strangers_since.elapsed() > STRANGER_MEMORY {
            self.strangers.clear();
            self.strangers_since = Instant::now();
        }
        let mut unknown: Vec<i32> = Vec::new();
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<i32>().ok())
                else {
                    continue;
                };
                if pid == ancestor || self.excluded.contains(&pid) || self.strangers.contains(&pid)
                {
                    continue;
                }
                if self.members.contains(&pid) {
                    if let Some(stat) = self.read(pid) {
                        stats.insert(pid, stat);
                    }
                } else {
                    unknown.push(pid);
                }
            }
        }
        // Parents usually have lower pids, but pids wrap: repeat until nothing new joins.
        unknown.sort_unstable();
        let mut candidates: Vec<ProcStat> = unknown
            .into_iter()
            .filter_map(|pid| self.read(pid))
            .collect();
        loop {
            let before = candidates.len();
            candidates.retain(|candidate| {
                let belongs = candidate.ppid == ancestor
                    || candidate.sid == session
                    || stats.contains_key(&candidate.ppid);
                if belongs && !self.excluded.contains(&candidate.ppid) {
                    stats.insert(candidate.pid, candidate.clone());
                    false
                } else {
                    true
                }
            });
            if candidates.len() == before {
                break;
            }
        }
        self.strangers.extend(candidates.iter().map(|c| c.pid));
    }

    fn read(&self, pid: i32) -> Option<ProcStat> {
        let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
        Some(ProcStat::from_stat(stat))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// Starts `sh` in its own session whose background child is orphaned at once (its parent
    /// subshell exits), and samples the tree while both sleep.
    fn sample_a_double_fork(children_lists: bool) -> (i32, Vec<ProcStat>) {
        // As `headroom run` does: orphans of our descendants are reparented to us.
        // SAFETY: prctl with an integer flag.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
        let mut command = Command::new("sh");
        command.args(["-c", "(sleep 3 &) ; sleep 3"]);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let pid = child.id() as i32;
        let mut tracker = TreeTracker::new(Scope::Descendants {
            ancestor: std::process::id() as i32,
            session: pid,
        });
        tracker.children_lists &= children_lists;
        let members = tracker.sample();
        let _ = Command::new("kill")
            .args(["--", &format!("-{pid}")])
            .status();
        child.kill().ok();
        child.wait().ok();
        (pid, members)
    }

    fn sleeps_in_session(pid: i32, members: &[ProcStat]) -> usize {
        // Other tests in this process start children too; count only this session's sleeps.
        members
            .iter()
            .filter(|p| p.comm == "sleep" && p.sid == pid)
            .count()
    }

    #[test]
    fn follows_a_double_forked_daemon_through_children_lists() {
        if children_of(std::process::id() as i32).is_none() {
            headroom_testkit::skip(
                "task-children",
                "this kernel has no /proc/PID/task/TID/children lists",
            );
            return;
        }
        let (pid, members) = sample_a_double_fork(true);
        assert_eq!(
            sleeps_in_session(pid, &members),
            2,
            "the orphan included: {members:?}"
        );
    }

    #[test]
    fn follows_a_double_forked_daemon_by_scanning_proc() {
        let (pid, members) = sample_a_double_fork(false);
        assert_eq!(
            sleeps_in_session(pid, &members),
            2,
            "the orphan included: {members:?}"
        );
    }

    #[test]
    fn excluded_helpers_are_not_counted() {
        let mut helper = Command::new("sleep").arg("2").spawn().unwrap();
        let mut tracker = TreeTracker::new(Scope::Descendants {
            ancestor: std::process::id() as i32,
            session: -1,
        });
        tracker.exclude(helper.id() as i32);
        let members = tracker.sample();
        helper.kill().ok();
        helper.wait().ok();
        assert!(members.iter().all(|p| p.pid != helper.id() as i32));
    }
}
