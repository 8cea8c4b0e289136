//! Watching CMD's tree while it runs: a sample of every process's memory (and the machine's,
//! and the devices') at each interval and at each stage start, the peak of every process, and
//! the live status line.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use headroom_probe::cgroup::Cgroup;
use headroom_probe::procs::count_shared_pages;
use headroom_probe::tracker::{Scope, TreeTracker};
use headroom_probe::{meminfo, psi};
use headroom_size::format_size;
use serde::Serialize;

use super::pump::Terminal;
use super::spawn::Started;
use super::Launch;
use crate::devices::Devices;
use crate::stages::StageStart;

/// MemAvailable and PSI describe the whole machine and move slowly (PSI's shortest average is
/// 10 s): read them at most this often, whatever the interval.
const MACHINE_EVERY: Duration = Duration::from_millis(200);
/// The least time between two samples taken for stage starts (a regular sample just before a
/// stage start does not count: the stage's entry memory is measured at its start).
const STAGE_SAMPLE_GAP: Duration = Duration::from_millis(5);
/// How many processes the report lists by their peak.
const LARGEST_PROCESSES: usize = 10;

/// One reading of the tree and the machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the command started.
    pub t: f64,
    /// Resident memory of the whole tree.
    pub rss: u64,
    /// Memory of the whole tree as the kernel counts it: RSS, with the pages that forked
    /// processes share split between them (their PSS), as `headroom_probe::procs` counts it.
    pub counted: u64,
    pub processes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_usage: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_available: Option<u64>,
    /// System memory PSI `some avg10`, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi_some_avg10: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u64>,
    /// Seconds since the command started when `gpu` was read: NVML is read at most every
    /// 200 ms, so several samples share one reading, and it counts toward the stage it was
    /// taken in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_read_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron: Option<u64>,
    /// Resident memory by process name (`python3`, `cc1plus`, see [`process_name`]).
    pub by_command: Vec<(String, u64)>,
}

/// One process of the tree and the largest RSS it was sampled at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessPeak {
    pub pid: i32,
    pub command: String,
    pub peak_rss: u64,
}

/// The sampling state of one run.
pub(super) struct Watch<'a> {
    started: Instant,
    pub tracker: TreeTracker,
    /// How the tree is followed, for the report.
    pub tracking: &'static str,
    cgroup: Option<&'a Cgroup>,
    pub samples: Vec<Sample>,
    /// The name of each process seen, by pid and command name (see [`process_name`]).
    names: HashMap<(i32, String), String>,
    /// The last machine-wide reading: when, MemAvailable, PSI `some avg10`.
    machine: Option<(Instant, Option<u64>, Option<f64>)>,
    peak: u64,
    stage: Option<String>,
    /// When the last sample taken for a stage start was.
    last_stage_sample: Option<Instant>,
    /// Peak sampled RSS of every process seen, by pid.
    process_peaks: HashMap<i32, ProcessPeak>,
}

impl<'a> Watch<'a> {
    /// Watches the tree of `cmd`: its cgroup's processes where it has one, else every
    /// descendant of headroom and every process of CMD's session; never headroom's own helpers
    /// (the devices' readers, the governor).
    pub fn new(cmd: &'a Started, launch: &Launch, devices: &Devices) -> Watch<'a> {
        let (scope, tracking) = match &cmd.cgroup {
            Some(cgroup) => (Scope::Cgroup(cgroup.dir().to_path_buf()), "cgroup"),
            None => (
                Scope::Descendants {
                    ancestor: std::process::id() as i32,
                    session: cmd.pid,
                },
                "descendants (subreaper) and session",
            ),
        };
        let mut tracker = TreeTracker::new(scope);
        for helper in devices.helper_pids() {
            tracker.exclude(helper);
        }
        // The governor is headroom's, not the command's.
        if let Some(session) = launch.governor {
            tracker.exclude(session.governor_pid() as i32);
        }
        Watch {
            started: cmd.started,
            tracker,
            tracking,
            cgroup: cmd.cgroup.as_ref(),
            samples: Vec::new(),
            names: HashMap::new(),
            machine: None,
            peak: 0,
            stage: None,
            last_stage_sample: None,
            process_peaks: HashMap::new(),
        }
    }

    /// A stage has started: its entry memory is measured now rather than up to one interval
    /// late; a regex that matches every line of a chatty log must not turn that into thousands
    /// of samples a second.
    pub fn stage_started(&mut self, start: &StageStart, devices: &mut Devices) {
        devices.stage_started();
        self.stage = Some(start.name.clone());
        if self
            .last_stage_sample
            .is_none_or(|at: Instant| at.elapsed() >= STAGE_SAMPLE_GAP)
        {
            self.sample(devices);
            self.last_stage_sample = Some(Instant::now());
        }
    }

    /// Drops the samples taken after the tree was gone (between its exit and our reaping it):
    /// they say nothing about its memory, and the last memory of the last stage is the last
    /// sample of a live tree.
    pub fn forget_samples_after_exit(&mut self) {
        while self.samples.len() > 1 && self.samples.last().is_some_and(|s| s.rss == 0) {
            self.samples.pop();
        }
    }
}

impl Watch<'_> {
    pub fn sample(&mut self, devices: &mut Devices) {
        let t = self.started.elapsed().as_secs_f64();
        let mut processes = self.tracker.sample();
        count_shared_pages(&mut processes);
        let rss: u64 = processes.iter().map(|p| p.rss_bytes).sum();
        let counted: u64 = processes.iter().map(|p| p.counted_bytes).sum();
        let mut by_command: Vec<(String, u64)> = Vec::new();
        for process in &processes {
            let key = (process.pid, process.comm.clone());
            if !self.names.contains_key(&key) {
                if let Some(name) = process_name(process.pid, &process.comm) {
                    self.names.insert(key.clone(), name);
                }
            }
            // One caught mid-exec is named by its command for this sample only.
            let name = self.names.get(&key).unwrap_or(&process.comm);
            let entry = self
                .process_peaks
                .entry(process.pid)
                .or_insert_with(|| ProcessPeak {
                    pid: process.pid,
                    command: name.clone(),
                    peak_rss: 0,
                });
            if process.rss_bytes > entry.peak_rss {
                entry.peak_rss = process.rss_bytes;
                // The name at the peak: a process that execs changes its name.
                entry.command.clone_from(name);
            }
            match by_command.iter_mut().find(|(known, _)| known == name) {
                Some(entry) => entry.1 += process.rss_bytes,
                None => by_command.push((name.clone(), process.rss_bytes)),
            }
        }
        by_command.retain(|(_, bytes)| *bytes > 0);
        let pids: HashSet<i32> = processes.iter().map(|p| p.pid).collect();
        let device = devices.read(&pids);
        let (mem_available, psi_some_avg10) = self.machine_reading();
        self.peak = self.peak.max(rss);
        self.samples.push(Sample {
            t,
            rss,
            counted,
            processes: processes.len(),
            cgroup_usage: self.cgroup.and_then(|c| c.usage().ok()),
            mem_available,
            psi_some_avg10,
            gpu: device.gpu,
            gpu_read_s: device
                .gpu_read_at
                .map(|at| at.saturating_duration_since(self.started).as_secs_f64()),
            neuron: device.neuron,
            by_command,
        });
    }

    pub fn largest_processes(&self) -> Vec<ProcessPeak> {
        let mut peaks: Vec<ProcessPeak> = self.process_peaks.values().cloned().collect();
        peaks.sort_by(|a, b| b.peak_rss.cmp(&a.peak_rss).then(a.pid.cmp(&b.pid)));
        peaks.truncate(LARGEST_PROCESSES);
        peaks
    }

    fn machine_reading(&mut self) -> (Option<u64>, Option<f64>) {
        match self.machine {
            Some((at, available, pressure)) if at.elapsed() < MACHINE_EVERY => {
                (available, pressure)
            }
            _ => {
                let available = meminfo::read_meminfo().ok().map(|m| m.available);
                let pressure = psi::system_memory_pressure().ok().map(|p| p.some.avg10);
                self.machine = Some((Instant::now(), available, pressure));
                (available, pressure)
            }
        }
    }

    pub fn show_status(&self, terminal: &Terminal) {
        let Some(last) = self.samples.last() else {
            return;
        };
        terminal.show_status(&format!(
            "headroom: {} now, {} peak, {} process(es){}{} · {:.1}s",
            format_size(last.rss),
            format_size(self.peak),
            last.processes,
            self.stage
                .as_ref()
                .map_or(String::new(), |s| format!(" · stage {s}")),
            last.mem_available.map_or(String::new(), |a| format!(
                " · {} available",
                format_size(a)
            )),
            last.t
        ));
    }
}

/// What torch's Inductor names its compile workers' entry point: `python …/torch/_inductor/
/// compile_worker/__main__.py`, or `python -m torch._inductor.compile_worker`.
const INDUCTOR_COMPILE_WORKER: [&str; 2] = [
    "torch/_inductor/compile_worker",
    "torch._inductor.compile_worker",
];

/// The name a process is shown by: its command name (`cc1plus`), except for a Python process
/// that is a compile worker of torch's Inductor, named `torch._inductor…compile_worker`: the
/// sidecar and the workers it forks are what a torch.compile run holds most of its memory in,
/// and `python3` does not say so. Reads `/proc/PID/cmdline` of Python processes only.
///
/// `None` for a Python process whose command line is empty: one caught inside `execve`, whose
/// command name is already `python3` but whose arguments are not yet in place (or one that
/// has exited). Its name is not known yet, so it is not kept.
fn process_name(pid: i32, comm: &str) -> Option<String> {
    if !comm.starts_with("python") {
        return Some(comm.to_string());
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if cmdline.is_empty() {
        return None;
    }
    let cmdline = String::from_utf8_lossy(&cmdline);
    let is_compile_worker = INDUCTOR_COMPILE_WORKER
        .iter()
        .any(|entry| cmdline.contains(entry));
    Some(if is_compile_worker {
        "torch._inductor…compile_worker".to_string()
    } else {
        comm.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_process_without_its_arguments_is_not_named_for_good() {
        let Ok(mut python) = std::process::Command::new("python3")
            .args(["-c", "pass"])
            .spawn()
        else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        let pid = python.id() as i32;
        // Exited and not yet reaped, its command line reads empty, as inside `execve`.
        while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap()
            .contains(") Z ")
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(process_name(pid, "python3"), None);
        python.wait().unwrap();
        assert_eq!(
            process_name(std::process::id() as i32, "cc1plus").as_deref(),
            Some("cc1plus")
        );
    }
}
