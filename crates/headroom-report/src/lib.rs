//! What a build leaves behind: the build, its jobs, its memory samples and the processes that ran
//! outside admission. These types are both the rows of the history and the `--report` JSON, so
//! the two can never disagree.
//!
//! Everything drawn from a report lives here too, so that reading a report needs no SQLite:
//! the terminal summary ([`summary`]), the page `headroom report --html` writes
//! ([`build_page`]) around the timeline chart `headroom run --html` shares ([`chart`], with its
//! tables and facts in [`html`]), and Chrome's trace format ([`chrome_trace`]).

use serde::{Deserialize, Serialize};

pub mod build_page;
pub mod chart;
pub mod chrome_trace;
pub mod html;
pub mod summary;

/// A Unix time in milliseconds as RFC 3339 in UTC, to the second (`2026-11-22T19:28:05Z`). A
/// time before 1970 or after 9999, which only a damaged or hand-edited report holds, is shown
/// as its number, not formatted (the formatter cannot, and must not take a page down).
pub fn utc_time(unix_ms: i64) -> String {
    /// 9999-12-31T23:59:59Z, the last second RFC 3339 writes.
    const LAST_MS: i64 = 253_402_300_799_000;
    if !(0..=LAST_MS).contains(&unix_ms) {
        return format!("{unix_ms} ms from 1970 (not a date)");
    }
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms.unsigned_abs());
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Version of the JSON report layout; bumped on incompatible changes.
pub const REPORT_SCHEMA: u32 = 1;

/// One `headroom build` run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRecord {
    pub id: i64,
    pub started_unix_ms: i64,
    /// Wall time; `None` while the build runs or when the governor died before the end.
    pub duration_ms: Option<u64>,
    pub command: String,
    pub cwd: String,
    pub budget: u64,
    /// How the budget was chosen, for example `--budget 6G` or `cgroup limit 1.50 GiB − reserve`.
    pub budget_source: String,
    pub slots: u32,
    pub exit_code: Option<i32>,
    /// Highest total memory of all jobs together, as sampled.
    pub peak_total: Option<u64>,
    /// The variables headroom set for the build command, as `NAME=value` (`MAX_JOBS=4`,
    /// `MAKEFLAGS=-j4`, `TORCH_NO_COMPILER_WRAPPER=1`); empty in reports from before headroom
    /// recorded them. The name is from when they were all parallelism variables.
    #[serde(default)]
    pub parallelism_set: Vec<String>,
}

/// One compiler or linker job, over all its attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Number of the job within its build, in the order the build system offered it.
    pub job_id: u64,
    /// Identity of the job across builds: compiler, output, normalised flags and directory.
    pub key: String,
    /// Jobs with the same compiler and flags, whose peaks predict each other's.
    pub group: String,
    /// What people call the job: its output file, else its source.
    pub label: String,
    pub compiler: String,
    pub command: String,
    pub cwd: String,
    /// Milliseconds from the build's start.
    pub offered_ms: u64,
    pub start_ms: u64,
    pub end_ms: u64,
    pub peak: u64,
    pub cpu_ms: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub predicted: u64,
    /// `history`, `shared` (history another machine measured), `group` or `default`.
    pub prediction_source: String,
    pub attempts: u32,
    pub suspends: u32,
    /// Attempts the governor killed and ran again.
    pub requeues: u32,
    /// Attempts that ran out of memory and were retried alone.
    pub oom_retries: u32,
    /// The lower-memory flags the final attempt ran with, if the flag ladder was used.
    pub lowered_flags: Option<String>,
    /// Predicted bigger than the whole budget, so it ran alone.
    pub over_budget: bool,
    /// The CPU niceness its last attempt ran at: above 0 when it was off the longest path.
    #[serde(default)]
    pub nice: u8,
    /// The build farm node (`host:port`) that compiled its last attempt; absent when this
    /// machine did. Then `peak` is what the job used here (the engine's client), and
    /// `predicted` what was planned on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When its attempt on `node` started, in milliseconds from the build's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_start_ms: Option<u64>,
}

impl JobRecord {
    /// Seconds from the job's first start to its end.
    pub fn wall_seconds(&self) -> f64 {
        self.end_ms.saturating_sub(self.start_ms) as f64 / 1000.0
    }
}

/// A process of the build that ran outside every admitted job, with what the governor saw of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideProcess {
    pub pid: i32,
    /// The kernel's command name (`cc1plus`, `cicc`, `make`).
    pub name: String,
    /// Whether it is a compiler, linker or one of their inner tools (cc1plus, cicc, ptxas, ld…).
    pub compiler_like: bool,
    pub peak: u64,
    /// Milliseconds since the build started when it was first and last seen.
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    /// Why it was not governed, in words, and how to fix that.
    pub reason: String,
}

impl OutsideProcess {
    /// Seconds from when it was first seen to when it was last seen.
    pub fn seen_seconds(&self) -> f64 {
        self.last_seen_ms.saturating_sub(self.first_seen_ms) as f64 / 1000.0
    }
}

/// Memory of one job at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub t_ms: u64,
    pub job_id: u64,
    pub bytes: u64,
}

/// What the governor did to a job at one moment, or what happened to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    pub t_ms: u64,
    pub job_id: u64,
    pub kind: JobEventKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobEventKind {
    /// Stopped (SIGSTOP) near the budget.
    Suspend,
    Resume,
    /// Killed past the budget and queued again.
    Kill,
    /// Ran out of memory on its own (the kernel's OOM killer, or an OOM message).
    OutOfMemory,
}

impl JobEventKind {
    pub const ALL: [JobEventKind; 4] = [
        JobEventKind::Suspend,
        JobEventKind::Resume,
        JobEventKind::Kill,
        JobEventKind::OutOfMemory,
    ];

    /// As the history stores it and traces name it.
    pub fn name(self) -> &'static str {
        match self {
            JobEventKind::Suspend => "suspend",
            JobEventKind::Resume => "resume",
            JobEventKind::Kill => "kill",
            JobEventKind::OutOfMemory => "out of memory",
        }
    }
}

/// What the machine, or the cgroup the build runs in, could still hand out at one moment
/// (MemAvailable, or the cgroup's room, whichever is less).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Room {
    pub t_ms: u64,
    pub bytes: u64,
}

/// Everything known about one build: what `--report` writes and `headroom report` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildReport {
    pub schema: u32,
    pub build: BuildRecord,
    pub jobs: Vec<JobRecord>,
    pub samples: Vec<Sample>,
    /// Processes of the build that ran outside every admitted job; empty in reports from before
    /// headroom followed them.
    #[serde(default)]
    pub outside: Vec<OutsideProcess>,
    /// Suspensions, resumptions, kills and OOMs, in time order; empty in older reports.
    #[serde(default)]
    pub events: Vec<JobEvent>,
    /// What the machine could still hand out, at each sampling tick; empty in older reports.
    #[serde(default)]
    pub room: Vec<Room>,
}

/// Seconds during which jobs of a build waited to start, by what they waited for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Waiting {
    /// All slots were busy: the CPUs limited the build.
    pub for_slots: f64,
    /// A slot was free, but not the memory: the budget limited the build.
    pub for_memory: f64,
}

/// What one build farm node did for a build.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeUse {
    /// `host:port`.
    pub node: String,
    pub jobs: usize,
    /// The most predicted memory planned on it at once: what headroom kept under its memory.
    pub planned_peak: u64,
    /// Seconds during which at least one job ran there.
    pub busy_seconds: f64,
}

impl BuildReport {
    /// The report as the JSON file `headroom build --report` and `headroom report --json`
    /// write: pretty, with a final new line.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let mut json = serde_json::to_vec_pretty(self)?;
        json.push(b'\n');
        Ok(json)
    }

    /// The report of a build that has just begun: nothing has happened in it yet.
    pub fn begun(build: BuildRecord) -> BuildReport {
        BuildReport {
            schema: REPORT_SCHEMA,
            build,
            jobs: Vec::new(),
            samples: Vec::new(),
            outside: Vec::new(),
            events: Vec::new(),
            room: Vec::new(),
        }
    }

    /// What each farm node did, by name; empty for a build without a farm.
    pub fn nodes(&self) -> Vec<NodeUse> {
        let mut names: Vec<&str> = self.jobs.iter().filter_map(|j| j.node.as_deref()).collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .map(|name| {
                let jobs: Vec<&JobRecord> = self
                    .jobs
                    .iter()
                    .filter(|job| job.node.as_deref() == Some(name))
                    .collect();
                // Each job's interval as +predicted at its start and -predicted at its end.
                let mut changes: Vec<(u64, i128)> = jobs
                    .iter()
                    .flat_map(|job| {
                        let bytes = i128::from(job.predicted);
                        let start = job.node_start_ms.unwrap_or(job.start_ms);
                        [(start, bytes), (job.end_ms, -bytes)]
                    })
                    .collect();
                changes.sort_by_key(|&(t, delta)| (t, delta));
                let (mut planned, mut planned_peak) = (0i128, 0i128);
                let (mut busy_ms, mut running, mut busy_since) = (0, 0i32, 0);
                for (t, delta) in changes {
                    planned += delta;
                    planned_peak = planned_peak.max(planned);
                    if delta > 0 {
                        if running == 0 {
                            busy_since = t;
                        }
                        running += 1;
                    } else {
                        running -= 1;
                        if running == 0 {
                            busy_ms += t.saturating_sub(busy_since);
                        }
                    }
                }
                NodeUse {
                    node: name.to_string(),
                    jobs: jobs.len(),
                    planned_peak: planned_peak as u64,
                    busy_seconds: busy_ms as f64 / 1000.0,
                }
            })
            .collect()
    }

    pub fn suspends(&self) -> u32 {
        self.jobs.iter().map(|job| job.suspends).sum()
    }

    pub fn requeues(&self) -> u32 {
        self.jobs.iter().map(|job| job.requeues).sum()
    }

    pub fn oom_retries(&self) -> u32 {
        self.jobs.iter().map(|job| job.oom_retries).sum()
    }

    /// Jobs that were built with lower-memory flags: people must be told.
    pub fn lowered(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.iter().filter(|job| job.lowered_flags.is_some())
    }

    /// No job went through admission: headroom watched the build but governed none of it.
    pub fn governed_nothing(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Compilers, linkers and their inner tools that ran outside admission: memory headroom
    /// neither predicted nor could hold back.
    pub fn ungoverned_compilers(&self) -> impl Iterator<Item = &OutsideProcess> {
        self.outside.iter().filter(|process| process.compiler_like)
    }

    /// Seconds during which jobs waited to start, split by what they waited for: a slot (all
    /// of the build's slots were busy: the CPUs limited it) or memory (a slot was free, but
    /// the budget had no room for the job). Jobs on farm nodes take no slot here.
    pub fn waiting(&self) -> Waiting {
        let local = |job: &&JobRecord| job.node.is_none();
        // At each moment: jobs waiting (+1 when offered, -1 when started), jobs running here.
        let mut changes: Vec<(u64, i64, i64)> = Vec::new();
        for job in &self.jobs {
            let start = job.start_ms.max(job.offered_ms);
            changes.push((job.offered_ms, 1, 0));
            changes.push((start, -1, i64::from(local(&job))));
            changes.push((job.end_ms.max(start), 0, -i64::from(local(&job))));
        }
        changes.sort_unstable();
        let (mut waiting, mut running) = (0i64, 0i64);
        let mut waited = Waiting::default();
        let mut last = changes.first().map_or(0, |change| change.0);
        for (t, waiting_change, running_change) in changes {
            let seconds = t.saturating_sub(last) as f64 / 1000.0;
            if waiting > 0 && running >= i64::from(self.build.slots) {
                waited.for_slots += seconds;
            } else if waiting > 0 {
                waited.for_memory += seconds;
            }
            waiting += waiting_change;
            running += running_change;
            last = t;
        }
        waited
    }

    /// Jobs by peak memory, largest first.
    pub fn by_peak(&self) -> Vec<&JobRecord> {
        let mut jobs: Vec<&JobRecord> = self.jobs.iter().collect();
        jobs.sort_by(|a, b| b.peak.cmp(&a.peak).then(a.job_id.cmp(&b.job_id)));
        jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_dates_when_they_can_be_and_numbers_otherwise() {
        assert_eq!(utc_time(1_764_000_000_000), "2025-11-24T16:00:00Z");
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        // The fuzzer's report: a start in the year 1,079,934.
        assert_eq!(
            utc_time(34_017_000_000_000_000),
            "34017000000000000 ms from 1970 (not a date)"
        );
        assert_eq!(utc_time(-1), "-1 ms from 1970 (not a date)");
        assert_eq!(
            utc_time(i64::MAX),
            format!("{} ms from 1970 (not a date)", i64::MAX)
        );
    }

    #[test]
    fn a_report_from_before_outside_processes_still_loads() {
        let old = r#"{
            "schema": 1,
            "build": {
                "id": 3, "started_unix_ms": 0, "duration_ms": 9000, "command": "make -j2",
                "cwd": "/src", "budget": 1073741824, "budget_source": "test", "slots": 2,
                "exit_code": 0, "peak_total": null
            },
            "jobs": [],
            "samples": []
        }"#;
        let report: BuildReport = serde_json::from_str(old).unwrap();
        assert!(report.build.parallelism_set.is_empty());
        assert!(report.outside.is_empty());
        assert!(report.governed_nothing());
    }

    fn job(job_id: u64, offered_ms: u64, start_ms: u64, end_ms: u64) -> JobRecord {
        JobRecord {
            job_id,
            offered_ms,
            start_ms,
            end_ms,
            ..JobRecord::default()
        }
    }

    #[test]
    fn waiting_is_split_between_slots_and_memory() {
        let mut report: BuildReport = serde_json::from_str(
            r#"{"schema": 1, "build": {"id": 1, "started_unix_ms": 0, "duration_ms": 9000,
                "command": "make", "cwd": "/src", "budget": 100, "budget_source": "test",
                "slots": 2, "exit_code": 0, "peak_total": null}, "jobs": [], "samples": []}"#,
        )
        .unwrap();
        assert_eq!(report.waiting(), Waiting::default());
        // 0–4 s: two jobs fill both slots while a third waits (4 s for a slot); 4–5 s: one
        // job runs and the third still waits with a slot free (1 s for memory).
        report.jobs = vec![
            job(0, 0, 0, 4000),
            job(1, 0, 0, 6000),
            job(2, 0, 5000, 7000),
        ];
        let waited = report.waiting();
        assert_eq!((waited.for_slots, waited.for_memory), (4.0, 1.0));
    }
}
