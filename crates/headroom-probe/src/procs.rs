//! A snapshot of every process's identity, resident memory and CPU time, read from `/proc`, so
//! callers can sum what one job's process tree, process group or session uses.
//!
//! Memory is counted as the kernel counts it. A forked worker shares its parent's pages until
//! either writes them, and RSS counts every shared page once per process: 17 processes of a
//! torch.compile pool read 6.6 GiB of RSS against 1.3 GiB of PSS. So where processes of one
//! tree share pages ([`count_shared_pages`]) each counts for its PSS; elsewhere RSS, which is
//! a hundred times cheaper to read, is what the process holds.

use std::collections::HashMap;

use crate::procmem;
use crate::ProbeError;

/// Processes below this RSS are counted at their RSS even in a family that shares pages:
/// reading their PSS costs more than the little they could over-count.
const SHARED_PAGES_FLOOR: u64 = 32 << 20;

/// One process at the moment of the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcStat {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub rss_bytes: u64,
    /// The memory the process counts for: its RSS, or its PSS where [`count_shared_pages`]
    /// found it shares pages with processes of its tree.
    pub counted_bytes: u64,
    /// CPU seconds of the process and of its children that it has waited for.
    pub cpu_seconds: f64,
    /// The kernel's short command name (`cc1plus`, `ld`), at most 15 bytes.
    pub comm: String,
    /// When the process started, in clock ticks after boot: with the pid, it names one process
    /// even after its pid is reused.
    pub start_ticks: u64,
}

/// What a process tree uses at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// The sum of the processes' RSS: pages shared between them are counted once per process.
    pub rss_bytes: u64,
    /// The sum of what each process counts for ([`ProcStat::counted_bytes`]): pages shared
    /// between forked processes of the tree are split between them, as the kernel splits them.
    pub counted_bytes: u64,
    /// CPU seconds used so far by the tree's processes and by the children they waited for:
    /// it only grows while the job runs, so it tells how far along the job is.
    pub cpu_seconds: f64,
}

/// Reads every process in `/proc`. Processes that exit while being read are skipped.
pub fn snapshot() -> Result<Vec<ProcStat>, ProbeError> {
    let processes = procfs::process::all_processes()?
        .filter_map(Result::ok)
        .filter_map(|process| process.stat().ok())
        .map(ProcStat::from_stat)
        .collect();
    Ok(processes)
}

impl ProcStat {
    pub(crate) fn from_stat(stat: procfs::process::Stat) -> ProcStat {
        let ticks = stat.utime + stat.stime + (stat.cutime + stat.cstime).max(0) as u64;
        let rss_bytes = stat.rss * procfs::page_size();
        ProcStat {
            pid: stat.pid,
            ppid: stat.ppid,
            pgid: stat.pgrp,
            sid: stat.session,
            rss_bytes,
            counted_bytes: rss_bytes,
            cpu_seconds: ticks as f64 / procfs::ticks_per_second() as f64,
            comm: stat.comm,
            start_ticks: stat.starttime,
        }
    }
}

/// Counts each process of `processes` (one tree, or the part of one outside its jobs) that
/// shares pages with another as the kernel does, by its PSS ([`ProcStat::counted_bytes`]).
/// Sharing is looked for where it is large: a process of at least [`SHARED_PAGES_FLOOR`] whose
/// parent or child in `processes` has the same command name, as the workers a Python pool
/// forks (or a Python sidecar starts) have. A compiler, which its driver starts with `exec`,
/// shares little but its libraries and is not read: that keeps PSS reads to the few processes
/// where RSS over-counts, at the cost [`procmem::counted_with_shared_pages`] bounds.
pub fn count_shared_pages(processes: &mut [ProcStat]) {
    let comm_of: HashMap<i32, &str> = processes.iter().map(|p| (p.pid, p.comm.as_str())).collect();
    let forked: Vec<bool> = processes
        .iter()
        .map(|p| {
            p.rss_bytes >= SHARED_PAGES_FLOOR
                && (comm_of.get(&p.ppid) == Some(&p.comm.as_str())
                    || processes
                        .iter()
                        .any(|child| child.ppid == p.pid && child.comm == p.comm))
        })
        .collect();
    for (process, shares) in processes.iter_mut().zip(forked) {
        if shares {
            process.counted_bytes = procmem::counted_with_shared_pages(
                process.pid,
                process.start_ticks,
                process.rss_bytes,
            );
        }
    }
}

/// What `processes` use together.
fn usage_of(processes: &[ProcStat]) -> Usage {
    Usage {
        rss_bytes: processes.iter().map(|p| p.rss_bytes).sum(),
        counted_bytes: processes.iter().map(|p| p.counted_bytes).sum(),
        cpu_seconds: processes.iter().map(|p| p.cpu_seconds).sum(),
    }
}

/// Memory and CPU time of process `root` and all its descendants (one read of
/// `/proc/PID/stat` each, and PSS where they share pages: [`count_shared_pages`]), found
/// through the kernel's `/proc/PID/task/TID/children` lists: a few small reads per job instead
/// of a scan of every process, which is what a governor sampling many jobs ten times a second
/// needs. Falls back to a full scan on kernels without those lists. `None` when `root` is gone.
pub fn tree_usage(root: i32) -> Option<Usage> {
    let mut pending = vec![root];
    let mut members = Vec::new();
    while let Some(pid) = pending.pop() {
        let Some(stat) = procfs::process::Process::new(pid)
            .and_then(|process| process.stat())
            .ok()
        else {
            continue;
        };
        members.push(ProcStat::from_stat(stat));
        match children_of(pid) {
            Some(children) => pending.extend(children),
            None => {
                let all = snapshot().ok()?;
                members = tree(&all, root).into_iter().cloned().collect();
                break;
            }
        }
    }
    if !members.iter().any(|p| p.pid == root) {
        return None;
    }
    count_shared_pages(&mut members);
    Some(usage_of(&members))
}

/// What one walk of a build's process tree found: the usage of each job (by the pid its
/// attempt started as), every process outside all jobs, and what is left of ended attempts.
#[derive(Debug, Default)]
pub struct BuildTree {
    pub jobs: Vec<(i32, Usage)>,
    pub outside: Vec<ProcStat>,
    /// Memory of processes an attempt started that outlived its leader and wait below the shim
    /// that started it, their subreaper, to be killed and reaped (a `cc1plus` still dying after
    /// its driver): it is memory in use until they are gone, but they belong to no job and are
    /// no compiler that ran outside admission.
    pub remains_bytes: u64,
}

/// Where the walk is: below what.
#[derive(Clone, Copy)]
enum Below {
    /// The build's own processes.
    Build,
    /// A process that starts jobs, in process group `group`: each of its children in a group
    /// of its own is an attempt.
    JobStarter { group: i32 },
    /// What is left of an attempt.
    Remains,
}

/// Walks the processes below `root` (not `root` itself, nor `skip` and what is below it):
/// the subtree of each pid in `job_roots` is summed as that job, as [`tree_usage`] sums it;
/// every other process is listed as outside, with [`count_shared_pages`] applied to them.
/// Used by the governor to see memory that no job accounts for. Below a process that
/// `starts_jobs` (a shim), a process-group leader is an attempt whose pid the governor does
/// not know yet, neither a job nor outside, and a process in another group than the shim's is
/// what is left of an attempt ([`BuildTree::remains_bytes`]). Job roots not met below `root`
/// are summed on their own.
pub fn walk_build(
    root: i32,
    skip: i32,
    job_roots: &[i32],
    starts_jobs: impl Fn(&ProcStat) -> bool,
) -> BuildTree {
    let mut found = BuildTree::default();
    let mut pending: Vec<(i32, Below)> = children_of(root)
        .unwrap_or_default()
        .into_iter()
        .map(|pid| (pid, Below::Build))
        .collect();
    while let Some((pid, below)) = pending.pop() {
        if pid == skip {
            continue;
        }
        if job_roots.contains(&pid) {
            found.jobs.extend(tree_usage(pid).map(|usage| (pid, usage)));
            continue;
        }
        let Ok(stat) = procfs::process::Process::new(pid).and_then(|process| process.stat()) else {
            continue;
        };
        let below_this = match below {
            Below::JobStarter { .. } if stat.pgrp == pid => continue,
            Below::JobStarter { group } if stat.pgrp != group => Below::Remains,
            Below::Remains => Below::Remains,
            _ => Below::Build,
        };
        // A zombie runs nothing and holds no memory: a compiler killed with its job, whose
        // parent died first, waits as one until the subreaper above the build reaps it.
        if stat.state == 'Z' {
            continue;
        }
        let process = ProcStat::from_stat(stat);
        let below_children = match below_this {
            Below::Build if starts_jobs(&process) => Below::JobStarter {
                group: process.pgid,
            },
            other => other,
        };
        pending.extend(
            children_of(pid)
                .unwrap_or_default()
                .into_iter()
                .map(|child| (child, below_children)),
        );
        match below_this {
            Below::Remains => found.remains_bytes += process.counted_bytes,
            _ => found.outside.push(process),
        }
    }
    for &pid in job_roots {
        if !found.jobs.iter().any(|&(seen, _)| seen == pid) {
            found.jobs.extend(tree_usage(pid).map(|usage| (pid, usage)));
        }
    }
    count_shared_pages(&mut found.outside);
    found
}

/// Children of every thread of `pid`; `None` when the kernel has no children lists (or `pid`
/// is gone).
pub fn children_of(pid: i32) -> Option<Vec<i32>> {
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
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;

    /// A Python process that fills 200 MiB, then forks four children that sleep: five
    /// processes whose RSS each holds the same 200 MiB.
    const FORKED_POOL: &str = r#"
import os, sys, time
shared = b"x" * (200 << 20)
for _ in range(4):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print("forked", flush=True)
time.sleep(60)
"#;

    /// Starts `python3 -c script` (in a process group of its own where `own_group`) and
    /// returns it with the first line it prints; `None`, after saying the test is skipped,
    /// where python3 is not installed.
    fn python_once_it_prints(
        script: &str,
        own_group: bool,
    ) -> Option<(std::process::Child, String)> {
        let mut command = Command::new("python3");
        command
            .args(["-c", script])
            .stdout(std::process::Stdio::piped());
        if own_group {
            command.process_group(0);
        }
        let Ok(mut python) = command.spawn() else {
            headroom_testkit::skip("python3", "python3 is not installed");
            return None;
        };
        let mut line = String::new();
        std::io::BufReader::new(python.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Some((python, line))
    }

    #[test]
    fn forked_workers_count_their_shared_pages_once() {
        let Some((mut pool, line)) = python_once_it_prints(FORKED_POOL, true) else {
            return;
        };
        let pid = pool.id() as i32;
        let usage = tree_usage(pid).unwrap();
        let build = walk_build(std::process::id() as i32, 0, &[], |_| false);
        let outside: Vec<&ProcStat> = build
            .outside
            .iter()
            .filter(|p| p.pid == pid || p.ppid == pid)
            .collect();
        let _ = Command::new("kill")
            .args(["--", &format!("-{pid}")])
            .status();
        pool.kill().unwrap();
        pool.wait().unwrap();
        assert_eq!(line.trim(), "forked");
        let mib = |bytes: u64| bytes >> 20;
        assert!(mib(usage.rss_bytes) >= 5 * 200, "{usage:?}");
        assert!(
            (200..300).contains(&mib(usage.counted_bytes)),
            "the 200 MiB the five processes share count once: {usage:?}"
        );
        assert_eq!(outside.len(), 5, "{outside:?}");
        let counted: u64 = outside.iter().map(|p| p.counted_bytes).sum();
        assert!((200..300).contains(&mib(counted)), "{outside:?}");
    }

    #[test]
    fn a_zombie_is_not_a_process_outside_the_jobs() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let state = || {
            procfs::process::Process::new(pid)
                .and_then(|process| process.stat())
                .map(|stat| stat.state)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state().ok() != Some('Z') {
            assert!(std::time::Instant::now() < deadline, "`true` never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let tree = walk_build(std::process::id() as i32, 0, &[], |_| false);
        let listed = tree.outside.iter().any(|process| process.pid == pid);
        child.wait().unwrap();
        assert!(!listed, "the unreaped `true` is not outside the jobs");
    }

    /// Stands for a shim: a subreaper that starts an attempt in a process group of its own,
    /// whose leader ends once its child holds 64 MiB, and leaves that child behind; prints
    /// `left` then.
    const JOB_STARTER_WITH_REMAINS: &str = r#"
import ctypes, os, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
ready, told = os.pipe()
leader = os.fork()
if leader == 0:
    os.setpgid(0, 0)
    if os.fork() == 0:
        held = bytearray(64 << 20)
        for i in range(0, len(held), 4096):
            held[i] = 1
        os.write(told, b"x")
        time.sleep(30)
        os._exit(0)
    os.read(ready, 1)
    os._exit(0)
os.waitpid(leader, 0)
print("left", flush=True)
time.sleep(30)
"#;

    #[test]
    fn what_an_attempt_leaves_below_its_shim_is_counted_but_not_outside() {
        let Some((mut starter, line)) = python_once_it_prints(JOB_STARTER_WITH_REMAINS, false)
        else {
            return;
        };
        // The leader's child, now the starter's.
        let starter_pid = starter.id() as i32;
        let remains = children_of(starter_pid).unwrap_or_default();
        let walk = walk_build(std::process::id() as i32, 0, &[], |p| p.pid == starter_pid);
        for &pid in &remains {
            signal(pid);
        }
        starter.kill().unwrap();
        starter.wait().unwrap();
        assert_eq!(remains.len(), 1, "{line}: {remains:?}");
        assert!(
            !walk.outside.iter().any(|p| p.pid == remains[0]),
            "{:?}",
            walk.outside
        );
        assert!(walk.remains_bytes >= 64 << 20, "{walk:?}");
    }

    fn signal(pid: i32) {
        // SAFETY: kill(2) on a process this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    #[test]
    fn a_build_walk_tells_jobs_from_processes_outside_them() {
        let me = std::process::id() as i32;
        let mut job = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5; wait"])
            .spawn()
            .unwrap();
        let mut outside = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let walk = walk_build(me, 0, &[job.id() as i32], |_| false);
        assert_eq!(walk.jobs.len(), 1);
        assert!(walk.jobs[0].1.rss_bytes > 0);
        let outside_pids: Vec<i32> = walk.outside.iter().map(|p| p.pid).collect();
        assert!(
            outside_pids.contains(&(outside.id() as i32)),
            "{outside_pids:?}"
        );
        assert!(
            !walk.outside.iter().any(|p| p.ppid == job.id() as i32),
            "the job's own children are the job's"
        );
        let skipped = walk_build(me, outside.id() as i32, &[], |_| false);
        assert!(!skipped.outside.iter().any(|p| p.pid == outside.id() as i32));
        for child in [&mut job, &mut outside] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
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
        let by_children_lists = tree_usage(child.id() as i32).unwrap().rss_bytes;
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(members.len(), 3, "sh and two sleeps: {members:?}");
        let by_scan: u64 = members.iter().map(|p| p.rss_bytes).sum();
        assert!(
            by_children_lists.abs_diff(by_scan) < by_scan / 5,
            "{by_children_lists} vs {by_scan}"
        );
        assert_eq!(
            tree_usage(child.id() as i32),
            None,
            "a reaped process has no tree"
        );
        let pid = child.id() as i32;
        assert!(rss_where(&all, |p| p.pid == pid) > 0);
    }

    #[test]
    fn a_tree_keeps_the_cpu_time_of_children_that_have_exited() {
        // The busy inner shell exits; the outer one has waited for it, so it counts its time.
        let mut child = Command::new("sh")
            .args([
                "-c",
                "sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done'; sleep 5",
            ])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut after_exit = None;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let usage = tree_usage(pid).unwrap();
            let all = snapshot().unwrap();
            if all.iter().any(|p| p.ppid == pid && p.comm == "sleep") {
                after_exit = Some(usage.cpu_seconds);
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let busy = after_exit.expect("the inner shell finished within 10 s");
        assert!(busy > 0.1, "the loop used {busy} CPU seconds");
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
