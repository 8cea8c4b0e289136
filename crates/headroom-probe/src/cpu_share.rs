//! The build's share of the CPU: a `cpu` cgroup of the governor's own that the build runs in.
//!
//! headroom runs the jobs the build waits on first and lets the others yield. Niceness yields
//! to every process it competes with: on a machine kept busy by unrelated work, a niced job
//! loses the CPU to that work, and the build gets slower than plain `make -j`. A cgroup fixes
//! the scope: the build's cgroup weighs what its jobs weighed without it, so unrelated
//! processes see the build as before: `slots` processes at the user's niceness (what
//! `make -j slots` weighs), or, where the kernel groups the processes of the root cgroup by
//! session (autogroup), the user's session, whose share the jobs took before. Inside it,
//! niceness competes with the build's own processes only, so the jobs take their priority as
//! niceness there. v1 calls the weight `cpu.shares` (1024 for niceness 0), v2 `cpu.weight`
//! (100).
//!
//! The build command starts inside the cgroup, so every process of the build is born there.
//! Moving a process between cgroups is slow (the kernel waits for every CPU to pass a
//! quiescent point, milliseconds on a busy host, and holds back every fork and exit of the
//! machine meanwhile), so a compiler is moved only when it starts outside, as under a build
//! server that was running before the build ([`CpuShare::holds_this_process`]).
//!
//! The cgroup's name carries the governor's process id (`headroom-cpu-<pid>-build<n>`), so the
//! next governor removes what a killed one left behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cgroup::{own_dir, read, write, Version};
use crate::ProbeError;

/// The kind of temporary name ([`headroom_paths::temp`]) of a build's CPU cgroup.
const KIND: &str = "headroom-cpu-";

/// How many build cgroups this process has made: the next one's number, so that each has a
/// name of its own.
static MADE: AtomicU64 = AtomicU64::new(0);

/// The kernel's weight of a thread at each niceness from -20 to 19 (`sched_prio_to_weight`);
/// niceness 0 weighs 1024, and each step is about 1.25 times the next.
const WEIGHT_OF_NICENESS: [u64; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87,
    70, 56, 45, 36, 29, 23, 18, 15,
];

/// The weight, in `version`'s unit, of `count` threads at niceness `nice`, within what the
/// controller accepts.
pub fn weight(version: Version, nice: i32, count: u64) -> u64 {
    let kernel = WEIGHT_OF_NICENESS[(nice.clamp(-20, 19) + 20) as usize] * count;
    match version {
        Version::V1 => kernel.clamp(2, 262_144),
        Version::V2 => (kernel * 100 / 1024).clamp(1, 10_000),
    }
}

/// A build's CPU cgroup; [`CpuShare::remove`] takes it down.
#[derive(Debug)]
pub struct CpuShare {
    version: Version,
    /// The cgroup this process was in, where processes still inside go back at removal.
    home: PathBuf,
    dir: PathBuf,
}

impl CpuShare {
    /// Makes the cgroup under this process's own `cpu` cgroup, weighing what `slots` jobs
    /// started by this process weighed without it; first removes those of governors that
    /// ended.
    pub fn create(slots: usize) -> Result<CpuShare, ProbeError> {
        let (version, home, in_root) = own_dir("cpu")?.ok_or_else(|| {
            ProbeError::Cgroup(
                "no cpu cgroup controller is mounted (neither cgroup v1 `cpu` nor cgroup v2 with `cpu` available)".into(),
            )
        })?;
        remove_orphans(&home);
        let share = CpuShare {
            version,
            dir: home.join(format!(
                "{}build{}",
                headroom_paths::temp::prefix(KIND),
                MADE.fetch_add(1, Ordering::Relaxed)
            )),
            home,
        };
        let made = share.make(build_weight(version, slots, in_root));
        if made.is_err() {
            share.remove();
        }
        made.map(|()| share)
    }

    fn make(&self, build_weight: u64) -> Result<(), ProbeError> {
        if self.version == Version::V2 {
            enable_cpu_for_children(&self.home)?;
        }
        std::fs::create_dir(&self.dir).map_err(|source| {
            ProbeError::Cgroup(format!(
                "cannot create the cgroup {}: {source}; run as root, or inside a cgroup delegated to you (for example `systemd-run --user --scope -p Delegate=yes …`)",
                self.dir.display()
            ))
        })?;
        write(
            &self.dir.join(self.weight_file()),
            &build_weight.to_string(),
        )
    }

    fn weight_file(&self) -> &'static str {
        match self.version {
            Version::V1 => "cpu.shares",
            Version::V2 => "cpu.weight",
        }
    }

    /// The build's cgroup: a process moves there by writing its id, or 0 for itself, to its
    /// `cgroup.procs`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves any process still inside back to the cgroup this process was in, and removes
    /// the build's cgroup. Errors are ignored: what stays is a leftover the next governor
    /// removes.
    pub fn remove(&self) {
        dismantle(&self.dir, &self.home);
    }

    /// Whether this process runs inside the build's cgroup `dir` already (it inherited it
    /// from the build command): it reads `/proc/self/cgroup` only, whose paths name the
    /// cgroup from the hierarchy's root, so the name of `dir` as a component of a line's
    /// path says so whatever the mount point.
    pub fn holds_this_process(dir: &Path) -> bool {
        std::fs::read_to_string("/proc/self/cgroup")
            .is_ok_and(|membership| names_cgroup(&membership, dir))
    }
}

/// Whether `membership` (a `/proc/PID/cgroup`) puts its process in `dir` or below it, by
/// `dir`'s name, which is the build's own.
fn names_cgroup(membership: &str, dir: &Path) -> bool {
    let Some(name) = dir.file_name().and_then(|name| name.to_str()) else {
        return false;
    };
    membership.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        path.split('/').any(|component| component == name)
    })
}

/// What `slots` jobs started by this process weigh together, in `version`'s unit, where the
/// process's cpu cgroup is the root one if `in_root`.
fn build_weight(version: Version, slots: usize, in_root: bool) -> u64 {
    match session_niceness().filter(|_| in_root) {
        Some(session) => weight(version, session, 1),
        None => weight(
            version,
            rustix::process::getpriority_process(None).unwrap_or(0),
            slots.max(1) as u64,
        ),
    }
}

/// The niceness of this process's session group, where the kernel schedules the processes of
/// the root cgroup by session (`kernel.sched_autogroup_enabled`): each session then weighs
/// one process at that niceness, whatever number of processes it runs.
fn session_niceness() -> Option<i32> {
    let enabled = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").ok()?;
    if enabled.trim() != "1" {
        return None;
    }
    // `/autogroup-398 nice 0`
    let group = std::fs::read_to_string("/proc/self/autogroup").ok()?;
    group.split_whitespace().nth(2)?.parse().ok()
}

fn enable_cpu_for_children(dir: &Path) -> Result<(), ProbeError> {
    let control = dir.join("cgroup.subtree_control");
    if read(&control)?.split_whitespace().any(|c| c == "cpu") {
        return Ok(());
    }
    std::fs::write(&control, "+cpu").map_err(|source| {
        ProbeError::Cgroup(format!(
            "cannot enable the cpu controller for children of {} ({source}); cgroup v2 forbids it in a cgroup that has processes of its own. Run headroom inside a delegated scope, for example `systemd-run --user --scope -p Delegate=yes headroom …`",
            dir.display()
        ))
    })
}

/// Removes the build cgroups under `home` whose governor has ended.
fn remove_orphans(home: &Path) {
    let Ok(entries) = std::fs::read_dir(home) else {
        return;
    };
    for entry in entries.flatten() {
        if headroom_paths::temp::is_orphaned(&entry.file_name().to_string_lossy(), KIND) {
            dismantle(&entry.path(), home);
        }
    }
}

/// Moves every process of `dir` and its children (the cgroups of earlier versions of headroom
/// had one per priority level) to `home`, and removes them all. A process
/// that is exiting stays listed until it is reaped: a few tries, with a bound.
fn dismantle(dir: &Path, home: &Path) {
    let levels: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .map(|entry| entry.path())
                .collect()
        })
        .unwrap_or_default();
    for cgroup in levels.iter().map(PathBuf::as_path).chain([dir]) {
        for _try in 0..50 {
            for pid in read(&cgroup.join("cgroup.procs"))
                .unwrap_or_default()
                .split_whitespace()
            {
                let _ = write(&home.join("cgroup.procs"), pid);
            }
            match std::fs::remove_dir(cgroup) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_what_the_kernel_gives_niceness() {
        assert_eq!(weight(Version::V1, 0, 1), 1024);
        assert_eq!(weight(Version::V2, 0, 1), 100);
        assert_eq!(weight(Version::V1, 19, 1), 15);
        assert_eq!(weight(Version::V2, 19, 1), 1);
        for nice in 1..20 {
            assert!(weight(Version::V1, nice, 1) < weight(Version::V1, nice - 1, 1));
            assert!(weight(Version::V2, nice, 1) <= weight(Version::V2, nice - 1, 1));
        }
        // The build weighs what its slots would at the user's niceness, within the
        // controller's range.
        assert_eq!(weight(Version::V1, 0, 4), 4096);
        assert_eq!(weight(Version::V2, 0, 4), 400);
        assert_eq!(weight(Version::V1, 15, 2), 72);
        assert_eq!(weight(Version::V1, -20, 1000), 262_144);
        assert_eq!(weight(Version::V2, -20, 1000), 10_000);
        assert_eq!(weight(Version::V1, 40, 1), 15, "beyond 19 is 19");
    }

    #[test]
    fn a_process_is_in_the_build_cgroup_when_a_path_of_its_membership_names_it() {
        let dir = Path::new("/sys/fs/cgroup/cpu/user.slice/headroom-cpu-42-build0");
        let v1 = "12:cpu,cpuacct:/user.slice/headroom-cpu-42-build0\n4:memory:/user.slice\n";
        let v2 = "0::/user.slice/headroom-cpu-42-build0\n";
        let below = "0::/user.slice/headroom-cpu-42-build0/inner\n";
        assert!(names_cgroup(v1, dir) && names_cgroup(v2, dir) && names_cgroup(below, dir));
        let other = "0::/user.slice/headroom-cpu-42-build01\n12:cpu:/headroom-cpu-7-build0\n";
        assert!(!names_cgroup(other, dir));
        assert!(!names_cgroup("", dir));
    }

    /// Makes the cgroup where this machine lets us, or says why the test skips.
    fn created(slots: usize) -> Option<CpuShare> {
        match CpuShare::create(slots) {
            Ok(share) => Some(share),
            Err(err) => {
                headroom_testkit::skip(
                    "cgroup-cpu",
                    format!("no cpu cgroup can be made here: {err}"),
                );
                None
            }
        }
    }

    #[test]
    fn the_build_weighs_its_slots_and_what_runs_inside_goes_home_at_its_end() {
        let Some(share) = created(3) else { return };
        let read_weight = read(&share.dir().join(share.weight_file())).unwrap();
        let in_root = own_dir("cpu").unwrap().unwrap().2;
        assert_eq!(
            read_weight.trim().parse::<u64>().unwrap(),
            build_weight(share.version, 3, in_root)
        );
        assert!(!CpuShare::holds_this_process(share.dir()));
        // A process inside goes back home when the cgroup is removed.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        write(&share.dir().join("cgroup.procs"), &pid).unwrap();
        let membership = read(Path::new(&format!("/proc/{pid}/cgroup"))).unwrap();
        assert!(names_cgroup(&membership, share.dir()), "{membership}");
        share.remove();
        assert!(!share.dir().exists());
        let home = read(&share.home.join("cgroup.procs")).unwrap();
        assert!(home.split_whitespace().any(|p| p == pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_cgroups_of_ended_governors_are_removed() {
        let Some(share) = created(1) else { return };
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        let dead = ended.id();
        ended.wait().unwrap();
        let leftover = share.home.join(format!("{KIND}{dead}-build"));
        std::fs::create_dir(&leftover).unwrap();
        std::fs::create_dir(leftover.join("nice-3")).unwrap();
        let again = created(1).unwrap();
        assert!(!leftover.exists(), "{} is left", leftover.display());
        assert!(share.dir().exists(), "a live governor's cgroup stays");
        again.remove();
        share.remove();
    }
}
