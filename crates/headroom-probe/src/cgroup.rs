//! Memory cgroups, v1 and v2: the limit a process really lives under, what the kernel charges
//! to it, how often its OOM killer fired, and private child cgroups with their own limit.
//!
//! Both versions expose the same facts under different file names; `Cgroup` hides that.

use std::ffi::CString;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::ProbeError;

/// Limits at or above this are the kernel's way of saying "no limit".
const UNLIMITED: u64 = 1 << 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A memory cgroup directory.
#[derive(Debug)]
pub struct Cgroup {
    version: Version,
    dir: PathBuf,
    /// The hierarchy's mount point: ancestors are walked up to here.
    mount: PathBuf,
    /// Created by us: removed on drop.
    owned: bool,
}

impl Cgroup {
    /// The memory cgroup this process belongs to, or `None` where no memory controller is
    /// mounted (some containers, non-Linux-like sandboxes).
    pub fn of_self() -> Result<Option<Cgroup>, ProbeError> {
        Self::of_pid_file("/proc/self/cgroup")
    }

    /// The memory cgroup of process `pid`.
    pub fn of_pid(pid: i32) -> Result<Option<Cgroup>, ProbeError> {
        Self::of_pid_file(&format!("/proc/{pid}/cgroup"))
    }

    fn of_pid_file(path: &str) -> Result<Option<Cgroup>, ProbeError> {
        let membership = read(Path::new(path))?;
        let mounts = read(Path::new("/proc/self/mountinfo"))?;
        Ok(
            locate(&membership, &mounts, "memory").map(|(version, mount, dir)| Cgroup {
                version,
                dir,
                mount,
                owned: false,
            }),
        )
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This cgroup's own memory limit; `None` when unlimited.
    pub fn limit(&self) -> Option<u64> {
        limit_in(&self.dir, self.version)
    }

    /// The tightest limit of this cgroup and its ancestors: what really bounds its processes.
    pub fn effective_limit(&self) -> Option<u64> {
        self.dir
            .ancestors()
            .take_while(|dir| dir.starts_with(&self.mount))
            .filter_map(|dir| limit_in(dir, self.version))
            .min()
    }

    /// Memory charged to this cgroup now, page cache included.
    pub fn usage(&self) -> Result<u64, ProbeError> {
        let file = match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        };
        read_number(&self.dir.join(file))
    }

    /// Usage minus inactive file cache: the part the kernel cannot simply drop under pressure.
    /// This is what container runtimes report as a cgroup's "working set".
    pub fn working_set(&self) -> Result<u64, ProbeError> {
        let stat = read(&self.dir.join("memory.stat"))?;
        let key = match self.version {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        };
        let inactive = keyed_value(&stat, key).unwrap_or(0);
        Ok(self.usage()?.saturating_sub(inactive))
    }

    /// The highest usage the kernel has recorded, where the kernel keeps one (v1 always,
    /// v2 from Linux 5.19).
    pub fn peak(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        read_number(&self.dir.join(file)).ok()
    }

    /// How many processes the kernel's OOM killer has killed in this cgroup.
    /// Old v1 kernels (before 4.13) do not count kills; they report `under_oom` only, and this is 0.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        read(&self.dir.join(file))
            .ok()
            .and_then(|text| keyed_value(&text, "oom_kill"))
            .unwrap_or(0)
    }

    /// The processes in this cgroup.
    pub fn pids(&self) -> Result<Vec<i32>, ProbeError> {
        let text = read(&self.dir.join("cgroup.procs"))?;
        Ok(text
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect())
    }

    /// Creates a child cgroup `name` under this process's own memory cgroup, with `limit` bytes
    /// of memory and no swap, so its processes meet the kernel's real OOM behaviour at `limit`.
    /// The child is removed (its processes killed first) when the returned value is dropped.
    pub fn create_under_self(name: &str, limit: Option<u64>) -> Result<Cgroup, ProbeError> {
        let parent = Self::of_self()?.ok_or_else(|| {
            ProbeError::Cgroup(
                "no memory cgroup controller is mounted (neither cgroup v1 `memory` nor cgroup v2 with `memory` enabled); a memory limit cannot be enforced on this machine".into(),
            )
        })?;
        parent.create_child(name, limit)
    }

    /// Creates a child cgroup `name` of this one with `limit` bytes of memory and no swap.
    pub fn create_child(&self, name: &str, limit: Option<u64>) -> Result<Cgroup, ProbeError> {
        if self.version == Version::V2 {
            self.enable_memory_controller_for_children()?;
        }
        let dir = self.dir.join(name);
        fs::create_dir(&dir).map_err(|source| {
            ProbeError::Cgroup(format!(
                "cannot create the cgroup {}: {source}; run as root, or inside a cgroup delegated to you (for example `systemd-run --user --scope -p Delegate=yes …`)",
                dir.display()
            ))
        })?;
        let child = Cgroup {
            version: self.version,
            dir,
            mount: self.mount.clone(),
            owned: true,
        };
        if let Some(limit) = limit {
            child.set_limit(limit)?;
        }
        Ok(child)
    }

    fn enable_memory_controller_for_children(&self) -> Result<(), ProbeError> {
        let control = self.dir.join("cgroup.subtree_control");
        if read(&control)?.split_whitespace().any(|c| c == "memory") {
            return Ok(());
        }
        fs::write(&control, "+memory").map_err(|source| {
            ProbeError::Cgroup(format!(
                "cannot enable the memory controller for children of {} ({source}); cgroup v2 forbids it in a cgroup that has processes of its own. Run headroom inside a delegated scope, for example `systemd-run --user --scope -p Delegate=yes headroom …`",
                self.dir.display()
            ))
        })
    }

    fn set_limit(&self, limit: u64) -> Result<(), ProbeError> {
        let value = limit.to_string();
        let (memory, swap) = match self.version {
            // v1 counts memory+swap together: setting it equal to the memory limit means no swap.
            Version::V1 => (
                "memory.limit_in_bytes",
                ("memory.memsw.limit_in_bytes", value.as_str()),
            ),
            Version::V2 => ("memory.max", ("memory.swap.max", "0")),
        };
        write(&self.dir.join(memory), &value)?;
        let swap_file = self.dir.join(swap.0);
        if swap_file.exists() {
            write(&swap_file, swap.1)?;
        }
        Ok(())
    }

    /// Makes `command`'s child join this cgroup before it execs, so not one allocation of the
    /// child escapes the limit: a child that cannot join does not start.
    pub fn attach(&self, command: &mut Command) {
        join_before_exec(&self.dir, command, Joining::Required);
    }

    /// Moves process `pid` into this cgroup.
    pub fn add_pid(&self, pid: i32) -> Result<(), ProbeError> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Kills every process in this cgroup and removes it.
    pub fn remove(mut self) -> Result<(), ProbeError> {
        self.owned = false;
        self.kill_and_rmdir()
    }

    fn kill_and_rmdir(&self) -> Result<(), ProbeError> {
        for _attempt in 0..100 {
            for pid in self.pids().unwrap_or_default() {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                // Busy while killed processes are still being reaped.
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        fs::remove_dir(&self.dir).map_err(|source| ProbeError::io(&self.dir, source))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.kill_and_rmdir();
        }
    }
}

/// Whether a child that cannot join its cgroup starts anyway ([`join_before_exec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joining {
    /// It does not start: its spawn fails with the error.
    Required,
    /// It starts where it is.
    BestEffort,
}

/// Makes `command`'s child join the cgroup `dir` before it execs, so that it and everything
/// it starts are born there.
pub fn join_before_exec(dir: &Path, command: &mut Command, joining: Joining) {
    let procs = CString::new(
        dir.join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .expect("cgroup paths come from the kernel and have no NUL bytes");
    // SAFETY: the closure only makes raw syscalls (open, write, close) on data prepared
    // before fork; it allocates nothing and takes no locks.
    unsafe {
        command.pre_exec(move || {
            let joined = rustix::fs::open(
                procs.as_c_str(),
                rustix::fs::OFlags::WRONLY,
                rustix::fs::Mode::empty(),
            )
            // Writing 0 moves the writing process itself.
            .and_then(|fd| rustix::io::write(&fd, b"0"));
            match (joined, joining) {
                (Err(err), Joining::Required) => Err(err.into()),
                _ => Ok(()),
            }
        });
    }
}

/// The directory of this process's cgroup for `controller` (`memory`, `cpu`), with the
/// version of its hierarchy and whether it is the hierarchy's root; `None` where that
/// controller is not mounted.
pub fn own_dir(controller: &str) -> Result<Option<(Version, PathBuf, bool)>, ProbeError> {
    let membership = read(Path::new("/proc/self/cgroup"))?;
    let mounts = read(Path::new("/proc/self/mountinfo"))?;
    Ok(locate(&membership, &mounts, controller)
        .map(|(version, mount, dir)| (version, dir.clone(), dir == mount)))
}

/// Finds the cgroup directory for `controller` from `/proc/PID/cgroup` and
/// `/proc/self/mountinfo`: its mount point, and the directory under it. Prefers a v1
/// hierarchy of that controller; otherwise the v2 hierarchy if it has the controller.
fn locate(
    membership: &str,
    mountinfo: &str,
    controller: &str,
) -> Option<(Version, PathBuf, PathBuf)> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    let v1 = membership.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then_some(path)
    });
    if let Some(path) = v1 {
        let mount = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == controller))?;
        return Some((Version::V1, mount.point.clone(), mount.dir_for(path)));
    }
    let path = membership
        .lines()
        .find_map(|line| line.strip_prefix("0::"))?;
    let mount = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    let controllers =
        fs::read_to_string(mount.point.join("cgroup.controllers")).unwrap_or_default();
    controllers
        .split_whitespace()
        .any(|c| c == controller)
        .then(|| (Version::V2, mount.point.clone(), mount.dir_for(path)))
}

/// One line of `/proc/self/mountinfo`, the fields we need.
struct Mount {
    /// The path inside the filesystem that is mounted (not `/` inside cgroup namespaces).
    root: String,
    point: PathBuf,
    fstype: String,
    options: String,
}

impl Mount {
    fn parse(line: &str) -> Option<Mount> {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        Some(Mount {
            root: left.get(3)?.to_string(),
            point: PathBuf::from(left.get(4)?),
            fstype: right.next()?.to_string(),
            options: right.nth(1)?.to_string(),
        })
    }

    fn dir_for(&self, cgroup_path: &str) -> PathBuf {
        let relative = cgroup_path
            .strip_prefix(self.root.as_str())
            .unwrap_or(cgroup_path);
        self.point.join(relative.trim_start_matches('/'))
    }
}

fn limit_in(dir: &Path, version: Version) -> Option<u64> {
    let file = match version {
        Version::V1 => "memory.limit_in_bytes",
        Version::V2 => "memory.max",
    };
    read_number(&dir.join(file))
        .ok()
        .filter(|&limit| limit < UNLIMITED)
}

pub(crate) fn read(path: &Path) -> Result<String, ProbeError> {
    fs::read_to_string(path).map_err(|source| ProbeError::io(path, source))
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), ProbeError> {
    fs::write(path, value).map_err(|source| ProbeError::io(path, source))
}

fn read_number(path: &Path) -> Result<u64, ProbeError> {
    let text = read(path)?;
    let value = text.trim();
    if value == "max" {
        return Ok(u64::MAX);
    }
    value.parse().map_err(|_| ProbeError::Malformed {
        path: path.to_path_buf(),
        value: value.to_string(),
    })
}

/// The value of `key` in a `key value` per line file such as `memory.stat` or `memory.events`.
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:35 /user.slice /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    #[test]
    fn locates_a_v1_memory_cgroup() {
        let membership = "4:memory:/build/job\n1:cpu:/\n0::/user.slice/x";
        let (version, mount, dir) = locate(membership, MOUNTINFO, "memory").unwrap();
        assert_eq!(version, Version::V1);
        assert_eq!(mount, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(dir, Path::new("/sys/fs/cgroup/memory/build/job"));
        let (_, mount, dir) = locate(membership, MOUNTINFO, "cpu").unwrap();
        assert_eq!(mount, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(dir, Path::new("/sys/fs/cgroup/cpu"));
    }

    #[test]
    fn strips_the_mount_root_inside_cgroup_namespaces() {
        let mount = Mount::parse(MOUNTINFO.lines().nth(3).unwrap()).unwrap();
        assert_eq!(mount.fstype, "cgroup2");
        assert_eq!(
            mount.dir_for("/user.slice/app.scope"),
            Path::new("/sys/fs/cgroup/unified/app.scope")
        );
    }

    #[test]
    fn reads_keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(2));
        assert_eq!(keyed_value(events, "oom"), Some(3));
        assert_eq!(keyed_value(events, "missing"), None);
    }
}
