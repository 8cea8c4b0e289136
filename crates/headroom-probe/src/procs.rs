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
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(members.len(), 3, "sh and two sleeps: {members:?}");
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
