//! A snapshot of every process's identity and resident memory, read from `/proc`, so callers can
//! sum the memory of one job's process tree, process group or session.

use crate::ProbeError;

/// One process at the moment of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub rss_bytes: u64,
    /// The kernel's short command name (`cc1plus`, `ld`), at most 15 bytes.
    pub comm: String,
}

/// Reads every process in `/proc`. Processes that exit while being read are skipped.
pub fn snapshot() -> Result<Vec<ProcStat>, ProbeError> {
    let page_size = procfs::page_size();
    let processes = procfs::process::all_processes()?
        .filter_map(Result::ok)
        .filter_map(|process| process.stat().ok())
        .map(|stat| ProcStat {
            pid: stat.pid,
            ppid: stat.ppid,
            pgid: stat.pgrp,
            sid: stat.session,
            rss_bytes: stat.rss * page_size,
            comm: stat.comm,
        })
        .collect();
    Ok(processes)
}

/// Resident memory of process `root` and all its descendants, found through the kernel's
/// `/proc/PID/task/TID/children` lists: a few small reads per job instead of a scan of every
/// process, which is what a governor sampling many jobs ten times a second needs.
/// Falls back to a full scan on kernels without those lists. `None` when `root` is gone.
pub fn tree_rss(root: i32) -> Option<u64> {
    let page_size = procfs::page_size();
    let mut pending = vec![root];
    let mut total = 0;
    let mut found_root = false;
    while let Some(pid) = pending.pop() {
        let Some(pages) = resident_pages(pid) else {
            continue;
        };
        found_root |= pid == root;
        total += pages * page_size;
        match children_of(pid) {
            Some(children) => pending.extend(children),
            None => {
                let all = snapshot().ok()?;
                return Some(tree(&all, root).iter().map(|p| p.rss_bytes).sum());
            }
        }
    }
    found_root.then_some(total)
}

/// The second field of `/proc/PID/statm`: resident pages.
fn resident_pages(pid: i32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    statm.split_whitespace().nth(1)?.parse().ok()
}

/// Children of every thread of `pid`; `None` when the kernel has no children lists.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut children = Vec::new();
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => children.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && task.path().exists() => {
                return None
            }
            Err(_) => {}
        }
    }
    Some(children)
}

/// `root` and all its descendants in `snapshot`.
pub fn tree(snapshot: &[ProcStat], root: i32) -> Vec<&ProcStat> {
    let mut members: Vec<&ProcStat> = snapshot.iter().filter(|p| p.pid == root).collect();
    let mut next = 0;
    while next < members.len() {
        let parent = members[next].pid;
        members.extend(
            snapshot
                .iter()
                .filter(|p| p.ppid == parent && p.pid != root),
        );
        next += 1;
    }
    members
}

/// Total resident memory of the processes in `snapshot` that `belongs` selects.
pub fn rss_where(snapshot: &[ProcStat], belongs: impl Fn(&ProcStat) -> bool) -> u64 {
    snapshot
        .iter()
        .filter(|p| belongs(p))
        .map(|p| p.rss_bytes)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn finds_a_child_tree_and_its_memory() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5; wait"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let all = snapshot().unwrap();
        let members = tree(&all, child.id() as i32);
        let by_children_lists = tree_rss(child.id() as i32).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(members.len(), 3, "sh and two sleeps: {members:?}");
        let by_scan: u64 = members.iter().map(|p| p.rss_bytes).sum();
        assert!(
            by_children_lists.abs_diff(by_scan) < by_scan / 5,
            "{by_children_lists} vs {by_scan}"
        );
        assert_eq!(
            tree_rss(child.id() as i32),
            None,
            "a reaped process has no tree"
        );
        let pid = child.id() as i32;
        assert!(rss_where(&all, |p| p.pid == pid) > 0);
    }

    #[test]
    fn sees_this_process_with_its_group() {
        let all = snapshot().unwrap();
        let me = all
            .iter()
            .find(|p| p.pid == std::process::id() as i32)
            .unwrap();
        assert_eq!(me.pgid, rustix::process::getpgrp().as_raw_nonzero().get());
        assert!(me.rss_bytes > 0);
    }
}
