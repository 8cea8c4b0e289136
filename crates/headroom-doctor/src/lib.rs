//! `headroom doctor`: what this machine can take before a big build. It replaces the ritual of
//! `free -h`, checking swap, and `dmesg | grep -i "killed process"` with one report that also
//! says plainly what it could not read.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use headroom_config::{BuildOverrides, BuildSettings};
use headroom_diagnose::LoggedKill;
use headroom_probe::cgroup::{Cgroup, Version};
use headroom_probe::kernel_log;
use headroom_probe::meminfo::{read_meminfo, MemInfo};
use headroom_probe::psi::{self, Pressure};
use headroom_probe::room::MemoryFacts;
use headroom_sched::budget::{resolve, Budget, BudgetSpec};
use headroom_size::{format_size, parse_size};
use headroom_store::projects::{project_peaks, ProjectPeak};
use headroom_store::History;
use serde::Serialize;

/// How many OOM kills from the kernel log the report lists.
const RECENT_KILLS: usize = 5;
/// PSI `some avg10` above this (percent) means the machine is already short of memory.
const PRESSURE_WARNING: f64 = 10.0;

/// Arguments of `headroom doctor`.
#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON on stdout instead of the human report.
    #[arg(long)]
    json: bool,
    /// Memory one build job needs, for the recommended `-j` (a PyTorch C++ extension unit takes
    /// 1.4–1.9 GiB, an nvcc flash-attention job about 4.5 GB).
    #[arg(long, default_value = "1.5G", value_name = "SIZE", value_parser = parse_job_memory)]
    job_memory: u64,
    /// The build history to check projects against [default: the one `headroom build`
    /// writes, `history.sqlite` in HEADROOM_STATE_DIR].
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

fn parse_job_memory(text: &str) -> Result<u64, String> {
    match parse_size(text) {
        Ok(0) => Err("--job-memory must be above zero".into()),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(e.to_string()),
    }
}

/// Everything doctor found.
#[derive(Debug, Clone, Serialize)]
pub struct Findings {
    pub memory: Memory,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
    pub cpus: usize,
    pub environment: Environment,
    pub oom_kills: OomKills,
    pub settings: SettingsCheck,
    pub budget: Recommendation,
    pub history: HistoryCheck,
    /// Things to fix or know, most important first.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub total: u64,
    pub available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

impl From<MemInfo> for Memory {
    fn from(info: MemInfo) -> Self {
        Memory {
            total: info.total,
            available: info.available,
            swap_total: info.swap_total,
            swap_free: info.swap_free,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CgroupFacts {
    pub version: &'static str,
    pub dir: String,
    /// The tightest limit over this process (its cgroup and ancestors); none when unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Environment {
    /// `WSL1` or `WSL2` when running under Windows Subsystem for Linux.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wsl: Option<String>,
    /// The container runtime, when inside one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OomKills {
    pub readable: bool,
    /// Why the kernel log could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub total: usize,
    /// The most recent kills, newest last.
    pub recent: Vec<LoggedKill>,
    /// Seconds since boot now, to tell how long ago each kill was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uptime_s: Option<f64>,
}

/// The settings `headroom build` would read here (`headroom.toml`, the user's file,
/// `HEADROOM_BUDGET`), read the same way.
#[derive(Debug, Clone, Serialize)]
pub struct SettingsCheck {
    /// The settings files found, the project's first.
    pub files: Vec<String>,
    /// Why `headroom build` would refuse them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// The budget `headroom build` would use here.
    pub bytes: u64,
    /// How it was chosen, and where it was set.
    pub source: String,
    pub job_memory: u64,
    pub jobs: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct HistoryCheck {
    pub path: String,
    /// Why no project could be checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub projects: Vec<ProjectFit>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProjectFit {
    #[serde(flatten)]
    pub project: ProjectPeak,
    /// Its largest job fits in the budget: it builds here, if slowly. `None` (JSON `null`) when
    /// its latest build governed nothing and no job was too large: its peaks prove nothing.
    pub fits_one_job_at_a_time: Option<bool>,
    /// Its recorded total peak fits: it builds here as parallel as it did before. `None` as
    /// above.
    pub fits_as_recorded: Option<bool>,
}

impl ProjectFit {
    /// Judges `project` against `budget`. A peak above the budget proves a project does not fit
    /// whatever headroom saw, but a peak within it proves it fits only if headroom governed the
    /// compilers of its latest build.
    fn judge(project: ProjectPeak, budget: u64) -> ProjectFit {
        let within = |peak: u64| {
            if peak > budget {
                Some(false)
            } else if project.governed_nothing() {
                None
            } else {
                Some(true)
            }
        };
        ProjectFit {
            fits_one_job_at_a_time: within(project.largest_job),
            fits_as_recorded: within(project.peak_total),
            project,
        }
    }
}

pub fn main(args: DoctorArgs) -> anyhow::Result<u8> {
    let findings = examine(&args)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&findings)
                .context("cannot encode the findings as JSON")?
        );
    } else {
        print!("{}", render(&findings));
    }
    Ok(0)
}

fn examine(args: &DoctorArgs) -> anyhow::Result<Findings> {
    let memory: Memory = read_meminfo()
        .context("cannot read /proc/meminfo; headroom doctor needs Linux's /proc")?
        .into();
    let cgroup = Cgroup::of_self().ok().flatten().map(|cgroup| CgroupFacts {
        version: match cgroup.version() {
            Version::V1 => "v1",
            Version::V2 => "v2",
        },
        dir: cgroup.dir().display().to_string(),
        limit: cgroup.effective_limit(),
        usage: cgroup.usage().ok(),
    });
    let pressure = psi::system_memory_pressure();
    let environment = Environment {
        wsl: read("/proc/sys/kernel/osrelease").and_then(|release| wsl_from_release(&release)),
        container: container_from(
            std::env::var("container").ok().as_deref(),
            Path::new("/.dockerenv").exists(),
            Path::new("/run/.containerenv").exists(),
            read("/proc/1/cgroup").as_deref().unwrap_or(""),
        ),
    };
    let oom_kills = match kernel_log::read().map(|log| headroom_diagnose::kills_in_log(&log)) {
        Ok(kills) => OomKills {
            readable: true,
            error: None,
            total: kills.len(),
            recent: kills[kills.len().saturating_sub(RECENT_KILLS)..].to_vec(),
            uptime_s: read("/proc/uptime")
                .and_then(|text| text.split_whitespace().next()?.parse().ok()),
        },
        Err(e) => OomKills {
            readable: false,
            error: Some(e.to_string()),
            total: 0,
            recent: Vec::new(),
            uptime_s: None,
        },
    };
    let facts = MemoryFacts::read().context("cannot work out a build budget")?;
    // What `headroom build` would run with here; what stops it is a finding, not a failure.
    let loaded = std::env::current_dir()
        .context("cannot read the current directory")
        .and_then(|cwd| BuildSettings::load(&BuildOverrides::default(), &cwd));
    let (budget, settings) = match loaded {
        Ok(settings) => (
            settings.resolve_budget(&facts),
            SettingsCheck {
                files: settings
                    .files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect(),
                error: None,
            },
        ),
        Err(err) => {
            let (room, room_source) = facts.room();
            let auto = resolve(BudgetSpec::Auto, room, &room_source);
            let budget = Budget {
                source: format!("{}; auto, as the settings are unusable", auto.source),
                ..auto
            };
            let error = SettingsCheck {
                files: Vec::new(),
                error: Some(format!("{err:#}")),
            };
            (budget, error)
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let recommendation = Recommendation {
        jobs: recommended_jobs(budget.bytes, args.job_memory, cpus),
        bytes: budget.bytes,
        source: budget.source,
        job_memory: args.job_memory,
    };
    let history = check_history(
        args.history.clone().unwrap_or_else(History::default_path),
        recommendation.bytes,
    );
    let mut findings = Findings {
        memory,
        cgroup,
        pressure: pressure.as_ref().ok().copied(),
        cpus,
        environment,
        oom_kills,
        settings,
        budget: recommendation,
        history,
        warnings: Vec::new(),
    };
    findings.warnings = warnings(&findings, pressure.err().map(|e| e.to_string()));
    Ok(findings)
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `-j` for jobs of `job_memory` each within `budget`: at least 1, at most the CPU count.
fn recommended_jobs(budget: u64, job_memory: u64, cpus: usize) -> usize {
    ((budget / job_memory.max(1)) as usize).clamp(1, cpus.max(1))
}

/// WSL kernels say so in their release string: `5.15.90.1-microsoft-standard-WSL2` (WSL2) or
/// `4.4.0-19041-Microsoft` (WSL1).
fn wsl_from_release(release: &str) -> Option<String> {
    let lower = release.to_ascii_lowercase();
    if !lower.contains("microsoft") {
        return None;
    }
    Some(
        if lower.contains("wsl2") || lower.contains("microsoft-standard") {
            "WSL2"
        } else {
            "WSL1"
        }
        .to_string(),
    )
}

/// Container runtimes leave marks: systemd-nspawn and podman set `container=`, Docker creates
/// `/.dockerenv`, podman `/run/.containerenv`, and PID 1's cgroup names the runtime.
fn container_from(
    env: Option<&str>,
    dockerenv: bool,
    containerenv: bool,
    init_cgroup: &str,
) -> Option<String> {
    if let Some(name) = env.filter(|n| !n.is_empty()) {
        return Some(name.to_string());
    }
    if dockerenv {
        return Some("docker".into());
    }
    if containerenv {
        return Some("podman".into());
    }
    ["kubepods", "docker", "containerd", "lxc", "libpod"]
        .into_iter()
        .find(|runtime| init_cgroup.contains(runtime))
        .map(str::to_string)
}

fn check_history(path: PathBuf, budget: u64) -> HistoryCheck {
    let display = path.display().to_string();
    if !path.exists() {
        return HistoryCheck {
            path: display,
            note: Some("no build history yet: `headroom build -- …` records one (set HEADROOM_STATE_DIR, or pass --history, to use another one)".into()),
            projects: Vec::new(),
        };
    }
    match History::open(&path).and_then(|history| project_peaks(&history)) {
        Ok(projects) => HistoryCheck {
            path: display,
            note: None,
            projects: projects
                .into_iter()
                .map(|project| ProjectFit::judge(project, budget))
                .collect(),
        },
        Err(e) => HistoryCheck {
            path: display,
            note: Some(format!("cannot read the build history: {e}")),
            projects: Vec::new(),
        },
    }
}

fn warnings(findings: &Findings, psi_error: Option<String>) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(error) = &findings.settings.error {
        warnings.push(format!(
            "`headroom build` here stops before building: {error}"
        ));
    }
    for fit in &findings.history.projects {
        if fit.fits_one_job_at_a_time == Some(false) {
            warnings.push(format!(
                "{} will not build here: one of its jobs peaked at {}, above the {} budget; build it on a larger machine or add swap",
                fit.project.cwd,
                format_size(fit.project.largest_job),
                format_size(findings.budget.bytes)
            ));
        }
    }
    for fit in &findings.history.projects {
        let outside = fit.project.latest_ungoverned_compilers;
        if outside > 0 {
            warnings.push(format!(
                "{}: {outside} compilers of its latest build ran outside admission, so headroom neither predicted nor held back their memory; `headroom report {}` says why",
                fit.project.cwd, fit.project.latest_build_id
            ));
        }
    }
    if findings.memory.swap_total == 0 {
        warnings.push("no swap: a build that overshoots is OOM-killed instead of slowing down; add a swap file (e.g. `fallocate -l 8G /swapfile && mkswap /swapfile && swapon /swapfile`)".into());
    }
    if let Some(CgroupFacts {
        limit: Some(limit), ..
    }) = &findings.cgroup
    {
        if *limit < findings.memory.total {
            warnings.push(format!(
                "this shell lives under a {} cgroup limit, below the machine's {}: builds get that, not the machine",
                format_size(*limit),
                format_size(findings.memory.total)
            ));
        }
    }
    if findings.environment.wsl.as_deref() == Some("WSL2") {
        warnings.push("WSL2 gives its VM half the host's RAM by default: raise `memory=` under [wsl2] in %UserProfile%\\.wslconfig, then `wsl --shutdown`".into());
    }
    match (&findings.pressure, psi_error) {
        (Some(pressure), _) if pressure.some.avg10 > PRESSURE_WARNING => warnings.push(format!(
            "memory pressure is high right now (tasks stalled {:.1}% of the last 10 s): something else is using the memory",
            pressure.some.avg10
        )),
        (None, Some(error)) => warnings.push(format!("memory pressure (PSI) is unavailable: {error}")),
        _ => {}
    }
    if !findings.oom_kills.readable {
        warnings.push("OOM kills cannot be checked: the kernel log is not readable here".into());
    }
    warnings
}

/// The human report.
pub fn render(findings: &Findings) -> String {
    let mut out = String::from("headroom doctor\n");
    let memory = &findings.memory;
    let swap = if memory.swap_total == 0 {
        "no swap".to_string()
    } else {
        format!(
            "swap {} ({} free)",
            format_size(memory.swap_total),
            format_size(memory.swap_free)
        )
    };
    let _ = writeln!(
        out,
        "  memory     {} total · {} available · {swap}",
        format_size(memory.total),
        format_size(memory.available)
    );
    match &findings.cgroup {
        Some(cgroup) => {
            let limit = cgroup.limit.map_or("no limit".to_string(), |l| {
                format!("limit {}", format_size(l))
            });
            let usage = cgroup
                .usage
                .map_or(String::new(), |u| format!(", {} charged", format_size(u)));
            let _ = writeln!(
                out,
                "  cgroup     {} {} · {limit}{usage}",
                cgroup.version, cgroup.dir
            );
        }
        None => {
            let _ = writeln!(out, "  cgroup     no memory cgroup controller");
        }
    }
    match &findings.pressure {
        Some(p) => {
            let _ = writeln!(
                out,
                "  pressure   some {:.2}% / full {:.2}% of the last 10 s (60 s: {:.2}% / {:.2}%)",
                p.some.avg10, p.full.avg10, p.some.avg60, p.full.avg60
            );
        }
        None => {
            let _ = writeln!(out, "  pressure   unavailable");
        }
    }
    let environment = match (&findings.environment.wsl, &findings.environment.container) {
        (Some(wsl), Some(container)) => format!("{wsl}, in a {container} container"),
        (Some(wsl), None) => wsl.clone(),
        (None, Some(container)) => format!("{container} container"),
        (None, None) => "bare metal or VM (not WSL, no container seen)".into(),
    };
    let _ = writeln!(out, "  system     {} CPUs · {environment}", findings.cpus);
    let kills = &findings.oom_kills;
    if kills.readable {
        let _ = writeln!(out, "  OOM kills  {} in the kernel log", kills.total);
        for logged in &kills.recent {
            let when = match (kills.uptime_s, logged.uptime_s) {
                (Some(now), Some(then)) => ago(now - then),
                (None, Some(then)) => format!("at {then:.0}s after boot"),
                (_, None) => "at a time the log does not say".to_string(),
            };
            let (name, pid) = logged
                .kill
                .victim
                .as_ref()
                .map_or(("?", None), |victim| (victim.name.as_str(), victim.pid));
            let pid = pid.map_or_else(|| "pid unknown".to_string(), |pid| format!("pid {pid}"));
            let _ = writeln!(out, "             {when}: {name} ({pid})");
        }
    } else {
        let _ = writeln!(
            out,
            "  OOM kills  unknown: {}",
            kills.error.as_deref().unwrap_or("kernel log unreadable")
        );
    }
    let settings = match (&findings.settings.error, findings.settings.files.as_slice()) {
        (Some(_), _) => "unusable: `headroom build` here stops on them (see warnings)".to_string(),
        (None, []) => "none: no headroom.toml here or above, no user settings file".to_string(),
        (None, files) => files.join(", "),
    };
    let _ = writeln!(out, "  settings   {settings}");
    let budget = &findings.budget;
    let _ = writeln!(
        out,
        "  budget     {} ({}) → -j{} at {} per job",
        format_size(budget.bytes),
        budget.source,
        budget.jobs,
        format_size(budget.job_memory)
    );
    let history = &findings.history;
    match &history.note {
        Some(note) => {
            let _ = writeln!(out, "  history    {note}");
        }
        None => {
            let _ = writeln!(
                out,
                "  history    {} project(s) in {}",
                history.projects.len(),
                history.path
            );
            for fit in &history.projects {
                let project = &fit.project;
                let largest = match project.largest_job {
                    0 => "unknown".to_string(),
                    bytes => format_size(bytes),
                };
                let verdict = match (fit.fits_one_job_at_a_time, fit.fits_as_recorded) {
                    (Some(false), _) => "does NOT fit".to_string(),
                    (None, _) | (_, None) => format!(
                        "governed nothing: no compiler went through admission in its latest build (see `headroom report {}`)",
                        project.latest_build_id
                    ),
                    (Some(true), Some(false)) => {
                        "fits, throttled below its recorded parallelism".to_string()
                    }
                    (Some(true), Some(true)) => "fits".to_string(),
                };
                let outside = match project.latest_ungoverned_compilers {
                    0 => String::new(),
                    count => {
                        format!(" — {count} compilers ran outside admission, peaks not counted")
                    }
                };
                let _ = writeln!(
                    out,
                    "             {}: largest job {largest}, total peak {} — {verdict}{outside}",
                    project.cwd,
                    format_size(project.peak_total)
                );
            }
        }
    }
    if !findings.warnings.is_empty() {
        let _ = writeln!(out, "warnings:");
        for warning in &findings.warnings {
            // A TOML error quotes the file over several lines: keep them under their bullet.
            let _ = writeln!(out, "  - {}", warning.trim_end().replace('\n', "\n    "));
        }
    }
    out
}

/// `42 s ago`, `17 min ago`, `5.2 h ago`, `3.0 days ago`.
pub fn ago(seconds: f64) -> String {
    let seconds = seconds.max(0.0);
    match seconds {
        s if s < 120.0 => format!("{s:.0} s ago"),
        s if s < 7200.0 => format!("{:.0} min ago", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h ago", s / 3600.0),
        s => format!("{:.1} days ago", s / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn ages_read_naturally() {
        assert_eq!(ago(42.0), "42 s ago");
        assert_eq!(ago(1500.0), "25 min ago");
        assert_eq!(ago(18_000.0), "5.0 h ago");
        assert_eq!(ago(3.0 * 86_400.0), "3.0 days ago");
    }

    #[test]
    fn jobs_are_bounded_by_memory_and_cpus() {
        assert_eq!(recommended_jobs(16 * GIB, 2 * GIB, 32), 8);
        assert_eq!(recommended_jobs(16 * GIB, 2 * GIB, 4), 4);
        assert_eq!(recommended_jobs(GIB, 2 * GIB, 4), 1, "never below one");
    }

    #[test]
    fn recognises_wsl_kernels() {
        assert_eq!(
            wsl_from_release("5.15.90.1-microsoft-standard-WSL2\n").as_deref(),
            Some("WSL2")
        );
        assert_eq!(
            wsl_from_release("4.4.0-19041-Microsoft").as_deref(),
            Some("WSL1")
        );
        assert_eq!(wsl_from_release("6.1.0-18-amd64"), None);
    }

    #[test]
    fn recognises_containers() {
        assert_eq!(
            container_from(Some("podman"), false, false, "").as_deref(),
            Some("podman")
        );
        assert_eq!(
            container_from(None, true, false, "").as_deref(),
            Some("docker")
        );
        assert_eq!(
            container_from(None, false, false, "0::/kubepods/besteffort/pod1").as_deref(),
            Some("kubepods")
        );
        assert_eq!(container_from(None, false, false, "0::/init.scope"), None);
    }

    fn project(cwd: &str, job: u64, total: u64) -> ProjectPeak {
        ProjectPeak {
            cwd: cwd.into(),
            last_command: "ninja".into(),
            builds: 3,
            last_started_unix_ms: 0,
            peak_total: total,
            largest_job: job,
            latest_build_id: 17,
            latest_jobs: 40,
            latest_ungoverned_compilers: 0,
        }
    }

    fn findings() -> Findings {
        let budget = 13 * GIB;
        let mut findings = Findings {
            memory: Memory {
                total: 24 * GIB,
                available: 20 * GIB,
                swap_total: 0,
                swap_free: 0,
            },
            cgroup: Some(CgroupFacts {
                version: "v1",
                dir: "/sys/fs/cgroup/memory/user".into(),
                limit: Some(16 * GIB),
                usage: Some(GIB),
            }),
            pressure: Some(Pressure::default()),
            cpus: 8,
            environment: Environment {
                wsl: Some("WSL2".into()),
                container: None,
            },
            oom_kills: OomKills {
                readable: true,
                error: None,
                total: 1,
                recent: vec![LoggedKill {
                    kill: headroom_diagnose::OomKill {
                        time: Some("[  758.200000]".into()),
                        invoked_by: None,
                        victim: Some(headroom_diagnose::Victim {
                            name: "cc1plus".into(),
                            pid: Some(4242),
                            rss_bytes: None,
                        }),
                        constraint: None,
                        evidence: "Out of memory: Killed process 4242 (cc1plus)".into(),
                        line: 1,
                        evidence_line: 1,
                    },
                    uptime_s: Some(758.2),
                    unix_s: None,
                }],
                uptime_s: Some(758.2 + 1500.0),
            },
            settings: SettingsCheck {
                files: vec!["/src/torch-ext/headroom.toml".into()],
                error: None,
            },
            budget: Recommendation {
                bytes: budget,
                source: "cgroup limit 16.0 GiB with 1.00 GiB in use, minus a reserve of 1.50 GiB"
                    .into(),
                job_memory: 3 * GIB / 2,
                jobs: 8,
            },
            history: HistoryCheck {
                path: "history.sqlite".into(),
                note: None,
                projects: [
                    project("/src/flash-attn", 30 * GIB, 60 * GIB),
                    project("/src/torch-ext", 2 * GIB, 20 * GIB),
                    ProjectPeak {
                        latest_ungoverned_compilers: 2,
                        ..project("/src/mixed", GIB, 3 * GIB)
                    },
                    project("/src/tiny", GIB / 4, GIB),
                    ProjectPeak {
                        latest_build_id: 21,
                        latest_jobs: 0,
                        latest_ungoverned_compilers: 6,
                        ..project("/src/bazel-app", 0, 5 * GIB)
                    },
                ]
                .into_iter()
                .map(|project| ProjectFit::judge(project, budget))
                .collect(),
            },
            warnings: Vec::new(),
        };
        findings.warnings = warnings(&findings, None);
        findings
    }

    #[test]
    fn warnings_lead_with_projects_that_cannot_build() {
        let findings = findings();
        assert!(
            findings.warnings[0].contains("/src/flash-attn will not build here"),
            "{:?}",
            findings.warnings
        );
        assert!(findings.warnings.iter().any(|w| w.starts_with("no swap")));
        assert!(findings.warnings.iter().any(|w| w.contains(".wslconfig")));
        assert!(findings.warnings.iter().any(|w| w.contains("cgroup limit")));
    }

    #[test]
    fn governed_nothing_never_fits_yet_a_peak_above_the_budget_still_does_not_fit() {
        let unseen = ProjectPeak {
            latest_jobs: 0,
            ..project("/src/bazel-app", GIB, 20 * GIB)
        };
        let fit = ProjectFit::judge(unseen.clone(), 13 * GIB);
        assert_eq!(
            (fit.fits_one_job_at_a_time, fit.fits_as_recorded),
            (None, Some(false))
        );
        let too_big = ProjectFit::judge(unseen, GIB / 2);
        assert_eq!(too_big.fits_one_job_at_a_time, Some(false));
        let governed = ProjectFit::judge(project("/src/tiny", GIB, 2 * GIB), 13 * GIB);
        assert_eq!(
            (governed.fits_one_job_at_a_time, governed.fits_as_recorded),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn projects_with_compilers_outside_admission_are_warned_about() {
        let findings = findings();
        assert!(
            findings.warnings.iter().any(|w| w
                .starts_with("/src/mixed: 2 compilers of its latest build ran outside admission")),
            "{:?}",
            findings.warnings
        );
    }

    #[test]
    fn report_snapshot() {
        insta::assert_snapshot!(render(&findings()));
    }

    #[test]
    fn unreadable_kernel_log_is_said_plainly() {
        let mut findings = findings();
        findings.oom_kills = OomKills {
            readable: false,
            error: Some("cannot read the kernel log (…)".into()),
            total: 0,
            recent: vec![],
            uptime_s: None,
        };
        findings.warnings = warnings(&findings, None);
        assert!(render(&findings).contains("OOM kills  unknown: cannot read the kernel log"));
        assert!(findings
            .warnings
            .iter()
            .any(|w| w.contains("cannot be checked")));
    }
}
