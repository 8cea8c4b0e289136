//! CPU weights for the jobs of one build, inside a `cpu` cgroup of the governor's own.
//!
//! headroom runs the jobs the build waits on first and lets the others yield. Niceness yields
//! to every process on the machine: on a machine kept busy by unrelated work, a niced job
//! loses the CPU to that work, and the build gets slower than plain `make -j`. A cgroup fixes
//! the scope: the build's cgroup weighs what its jobs weighed without it, so unrelated
//! processes see the build as before: `slots` processes at the user's niceness (what
//! `make -j slots` weighs), or, where the kernel groups the processes of the root cgroup by
//! session (autogroup), the user's session, whose share the jobs took before; inside it,
//! one child per priority level (`nice-0` … `nice-19`) with the weight the kernel gives that
//! niceness, so jobs yield to the build's other jobs only. v1 calls the weight `cpu.shares`
//! (1024 for niceness 0), v2 `cpu.weight` (100).
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

/// How many priority levels there are: niceness 0 to 19.
pub const LEVELS: u8 = 20;

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

/// A build's CPU cgroup with its priority levels; [`CpuWeights::remove`] takes it down.
#[derive(Debug)]
pub struct CpuWeights {
    version: Version,
    /// The cgroup this process was in, where processes still inside go back at removal.
    home: PathBuf,
    dir: PathBuf,
}

impl CpuWeights {
    /// Makes the cgroup under this process's own `cpu` cgroup, weighing what `slots` jobs
    /// started by this process weighed without it, and its levels; first removes those of
    /// governors that ended.
    pub fn create(slots: usize) -> Result<CpuWeights, ProbeError> {
        let (version, home, in_root) = own_dir("cpu")?.ok_or_else(|| {
            ProbeError::Cgroup(
                "no cpu cgroup controller is mounted (neither cgroup v1 `cpu` nor cgroup v2 with `cpu` available)".into(),
            )
        })?;
        remove_orphans(&home);
        let weights = CpuWeights {
            version,
            dir: home.join(format!(
                "{}build{}",
                headroom_paths::temp::prefix(KIND),
                MADE.fetch_add(1, Ordering::Relaxed)
            )),
            home,
        };
        let made = weights.make(build_weight(version, slots, in_root));
        if made.is_err() {
            weights.remove();
        }
        made.map(|()| weights)
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
        )?;
        if self.version == Version::V2 {
            enable_cpu_for_children(&self.dir)?;
        }
        for level in 0..LEVELS {
            let dir = self.level(level);
            std::fs::create_dir(&dir).map_err(|source| ProbeError::io(&dir, source))?;
            let level_weight = weight(self.version, i32::from(level), 1);
            write(&dir.join(self.weight_file()), &level_weight.to_string())?;
        }
        Ok(())
    }

    fn weight_file(&self) -> &'static str {
        match self.version {
            Version::V1 => "cpu.shares",
            Version::V2 => "cpu.weight",
        }
    }

    /// The cgroup of priority level `nice` (0 the highest, 19 the lowest): a process moves
    /// there by writing its id, or 0 for itself, to its `cgroup.procs`.
    pub fn level(&self, nice: u8) -> PathBuf {
        self.dir.join(format!("nice-{}", nice.min(LEVELS - 1)))
    }

    /// The build's cgroup.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves any process still inside back to the cgroup this process was in, and removes
    /// the levels and the build's cgroup. Errors are ignored: what stays is a leftover the
    /// next governor removes.
    pub fn remove(&self) {
        dismantle(&self.dir, &self.home);
    }
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

/// Moves every process of `dir` and its children to `home`, and removes them all. A process
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
    fn levels_weigh_what_the_kernel_gives_their_niceness() {
        assert_eq!(weight(Version::V1, 0, 1), 1024);
        assert_eq!(weight(Version::V2, 0, 1), 100);
        assert_eq!(weight(Version::V1, 19, 1), 15);
        assert_eq!(weight(Version::V2, 19, 1), 1);
        for nice in 1..i32::from(LEVELS) {
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

    /// Makes the cgroup where this machine lets us, or says why the test skips.
    fn created(slots: usize) -> Option<CpuWeights> {
        match CpuWeights::create(slots) {
            Ok(weights) => Some(weights),
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
    fn the_build_weighs_its_slots_and_its_levels_their_niceness() {
        let Some(weights) = created(3) else { return };
        let file = weights.weight_file();
        let read_weight =
            |dir: &Path| -> u64 { read(&dir.join(file)).unwrap().trim().parse().unwrap() };
        let in_root = own_dir("cpu").unwrap().unwrap().2;
        assert_eq!(
            read_weight(weights.dir()),
            build_weight(weights.version, 3, in_root)
        );
        for level in 0..LEVELS {
            assert_eq!(
                read_weight(&weights.level(level)),
                weight(weights.version, i32::from(level), 1)
            );
        }
        // A process inside goes back home when the cgroup is removed.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        write(&weights.level(7).join("cgroup.procs"), &pid).unwrap();
        weights.remove();
        assert!(!weights.dir().exists());
        let home = read(&weights.home.join("cgroup.procs")).unwrap();
        assert!(home.split_whitespace().any(|p| p == pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_cgroups_of_ended_governors_are_removed() {
        let Some(weights) = created(1) else { return };
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        let dead = ended.id();
        ended.wait().unwrap();
        let leftover = weights.home.join(format!("{KIND}{dead}-build"));
        std::fs::create_dir(&leftover).unwrap();
        std::fs::create_dir(leftover.join("nice-3")).unwrap();
        let again = created(1).unwrap();
        assert!(!leftover.exists(), "{} is left", leftover.display());
        assert!(weights.dir().exists(), "a live governor's cgroup stays");
        again.remove();
        weights.remove();
    }
}
