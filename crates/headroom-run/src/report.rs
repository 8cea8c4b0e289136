//! What `headroom run` tells: the end-of-run table, `--json`, the HTML timeline (through the
//! shared chart) and an mprof-compatible `.dat` file so `mprof plot` keeps working.

use std::fmt::Write as _;

use headroom_diagnose::Diagnosis;
use headroom_report::chart::{Band, Event, Level, Limit, Series, Timeline};
use headroom_report::html::{self, escape, Cell, Table};
use headroom_report::BuildReport;
use headroom_size::format_size;
use serde::Serialize;

use super::pools::PoolSizes;
use super::stages::StageSummary;
use super::supervise::{KernelPeaks, ProcessPeak, Sample};

/// The whole run: every rung of the fallback ladder that ran.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    pub interval_s: f64,
    pub rungs: Vec<RungReport>,
    /// The rung that succeeded, if one did.
    pub succeeded_rung: Option<usize>,
    /// The user interrupted the run (Ctrl-C); the report covers what ran until then.
    pub interrupted: bool,
    /// CPU time headroom itself used (sampling, output pass-through), for judging its overhead.
    pub headroom_cpu_s: f64,
}

/// One rung: a command and how it went.
#[derive(Debug, Clone, Serialize)]
pub struct RungReport {
    pub rung: usize,
    pub command: Vec<String>,
    /// Environment overrides this rung applied.
    pub env: Vec<(String, String)>,
    pub started_unix: f64,
    pub duration_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub succeeded: bool,
    pub peak: Peaks,
    pub stages: Vec<StageSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<StagedDiagnosis>,
    /// How the process tree was followed.
    pub tracking: String,
    /// The processes with the largest sampled RSS, largest first.
    pub largest_processes: Vec<ProcessPeak>,
    /// The compilers the command started, each run as a job of the rung's governor.
    pub jobs: Vec<GovernedJob>,
    /// How the compile-worker pools of JIT compilers were sized from the budget; absent where
    /// no governor ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_pools: Option<PoolSizes>,
    pub notes: Vec<String>,
    pub samples: Vec<Sample>,
}

/// A compiler the command started, which ran as a governed job: admitted when the budget had
/// room for its predicted peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GovernedJob {
    /// Its output file, else its source.
    pub label: String,
    pub compiler: String,
    /// The most memory it was seen to use.
    pub peak: u64,
    pub predicted: u64,
    /// `history`, `shared`, `group` or `default`.
    pub prediction_source: String,
    /// Seconds since the rung started, from its admission to its end.
    pub start_s: f64,
    pub end_s: f64,
    /// The stage it started in (empty before the first stage).
    pub stage: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub attempts: u32,
}

impl GovernedJob {
    /// How the job ended, and after how many attempts where it took more than one.
    pub fn state(&self) -> String {
        let ended = match (self.exit_code, self.signal) {
            (_, Some(signal)) => format!("killed by signal {signal}"),
            (Some(0), None) => "succeeded".to_string(),
            (Some(code), None) => format!("failed (exit {code})"),
            (None, None) => "did not finish".to_string(),
        };
        if self.attempts > 1 {
            format!("{ended} after {} attempts", self.attempts)
        } else {
            ended
        }
    }
}

/// The jobs of the governor's report `build`, with times from the rung's start
/// (`rung_started_unix`) and each in the stage of `stages` it started in.
pub fn governed_jobs(
    build: &BuildReport,
    rung_started_unix: f64,
    stages: &[StageSummary],
) -> Vec<GovernedJob> {
    // The governor counts from its own start, a little before the rung's.
    let offset_s = build.build.started_unix_ms as f64 / 1000.0 - rung_started_unix;
    build
        .jobs
        .iter()
        .map(|job| {
            let start_s = offset_s + job.start_ms as f64 / 1000.0;
            GovernedJob {
                label: job.label.clone(),
                compiler: job.compiler.clone(),
                peak: job.peak,
                predicted: job.predicted,
                prediction_source: job.prediction_source.clone(),
                start_s,
                end_s: offset_s + job.end_ms as f64 / 1000.0,
                stage: stages
                    .iter()
                    .rev()
                    .find(|stage| stage.start_s <= start_s)
                    .map_or_else(String::new, |stage| stage.name.clone()),
                exit_code: job.exit_code,
                signal: job.signal,
                attempts: job.attempts,
            }
        })
        .collect()
}

/// Peaks, sampled and as the kernel counted them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Peaks {
    /// Largest sampled RSS of the whole tree.
    pub rss: u64,
    pub rss_at_s: f64,
    /// Largest sampled memory of the whole tree as the kernel counts it, with pages that
    /// forked processes share split between them (see [`Sample::counted`]).
    pub counted: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron: Option<u64>,
    /// Lowest MemAvailable seen during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_mem_available: Option<u64>,
    pub kernel: KernelPeaks,
}

impl Peaks {
    pub fn from_samples(samples: &[Sample], kernel: KernelPeaks) -> Peaks {
        let top = samples.iter().max_by_key(|s| s.rss);
        Peaks {
            rss: top.map_or(0, |s| s.rss),
            rss_at_s: top.map_or(0.0, |s| s.t),
            counted: samples.iter().map(|s| s.counted).max().unwrap_or(0),
            gpu: samples.iter().filter_map(|s| s.gpu).max(),
            neuron: samples.iter().filter_map(|s| s.neuron).max(),
            min_mem_available: samples.iter().filter_map(|s| s.mem_available).min(),
            kernel,
        }
    }
}

/// A diagnosis and the stage it happened in.
#[derive(Debug, Clone, Serialize)]
pub struct StagedDiagnosis {
    pub stage: String,
    pub is_memory: bool,
    #[serde(flatten)]
    pub diagnosis: Diagnosis,
}

impl RungReport {
    /// Each peak the rung has, named as the table and the page name it: sampled first, then the
    /// kernel's own counts, then devices and the machine.
    fn peak_facts(&self) -> Vec<(String, String)> {
        let peak = &self.peak;
        let named =
            |name: &str, bytes: Option<u64>| bytes.map(|b| (name.to_string(), format_size(b)));
        let mut facts = vec![(
            "tree RSS".to_string(),
            format!("{} at {:.2}s", format_size(peak.rss), peak.rss_at_s),
        )];
        // Shown only where it differs: where forked processes share pages.
        if peak.counted < peak.rss {
            facts.extend(named("tree, shared pages split (PSS)", Some(peak.counted)));
        }
        // getrusage(RUSAGE_CHILDREN) only ever grows: after the first rung it spans all rungs.
        let scope = if self.rung == 0 { "" } else { " so far" };
        facts.extend(named(
            &format!("largest process{scope} (kernel)"),
            Some(peak.kernel.largest_process),
        ));
        facts.extend(named("cgroup (kernel)", peak.kernel.cgroup));
        facts.extend(named("GPU", peak.gpu));
        facts.extend(named("Neuron", peak.neuron));
        facts.extend(named("lowest MemAvailable", peak.min_mem_available));
        facts
    }

    fn outcome(&self) -> String {
        match (self.succeeded, self.exit_code, self.signal) {
            (true, _, _) => "succeeded".to_string(),
            (false, _, Some(signal)) => format!("killed by signal {signal}"),
            (false, Some(code), None) => format!("failed (exit {code})"),
            (false, None, None) => "did not finish".to_string(),
        }
    }
}

/// How many stages the table shows from the start and from the end of a long list.
const TABLE_FIRST_STAGES: usize = 10;
const TABLE_LAST_STAGES: usize = 20;

/// The human table printed at the end of a run.
pub fn render_table(report: &Report) -> String {
    let mut out = String::new();
    // Notes every rung shares (NVML missing, say) are said once, at the end.
    let shared_notes: Vec<&String> = report.rungs.first().map_or(Vec::new(), |first| {
        first
            .notes
            .iter()
            .filter(|note| report.rungs.iter().all(|rung| rung.notes.contains(note)))
            .collect()
    });
    let ladder = report.rungs.len() > 1;
    for rung in &report.rungs {
        let env = rung
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v} "))
            .collect::<String>();
        // Without a fallback there is one run, not a ladder of rungs.
        let which = if ladder {
            format!(" · rung {}", rung.rung)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "headroom run{which} · `{env}{}` · {} after {:.2}s",
            rung.command.join(" "),
            rung.outcome(),
            rung.duration_s
        );
        // Device columns only where a device was read.
        let gpu = rung.stages.iter().any(|s| s.gpu_peak_bytes.is_some());
        let neuron = rung.stages.iter().any(|s| s.neuron_peak_bytes.is_some());
        let device_column = |shown: bool, value: Option<u64>| {
            if shown {
                format!(" {:>11}", value.map_or("-".to_string(), format_size))
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            out,
            "  {:<24} {:>9} {:>9} {:>9} {:>11} {:>11} {:>11}{}{}",
            "stage",
            "start",
            "end",
            "duration",
            "entry",
            "peak",
            "exit",
            if gpu {
                format!(" {:>11}", "GPU peak")
            } else {
                String::new()
            },
            if neuron {
                format!(" {:>11}", "Neuron peak")
            } else {
                String::new()
            },
        );
        for (index, stage) in rung.stages.iter().enumerate() {
            // A regex that matched thousands of lines makes thousands of stages: show the first
            // few and the last ones (where a failure is), all of them stay in --json.
            let hidden = rung
                .stages
                .len()
                .saturating_sub(TABLE_FIRST_STAGES + TABLE_LAST_STAGES);
            if hidden > 0 && index == TABLE_FIRST_STAGES {
                let _ = writeln!(out, "  … {hidden} more stages (all of them are in --json)");
            }
            if hidden > 0 && (TABLE_FIRST_STAGES..TABLE_FIRST_STAGES + hidden).contains(&index) {
                continue;
            }
            let _ = writeln!(
                out,
                "  {:<24} {:>8.2}s {:>8.2}s {:>8.2}s {:>11} {:>11} {:>11}{}{}",
                truncate(&stage.name, 24),
                stage.start_s,
                stage.end_s,
                stage.duration_s,
                format_size(stage.entry_bytes),
                format_size(stage.peak_bytes),
                format_size(stage.exit_bytes),
                device_column(gpu, stage.gpu_peak_bytes),
                device_column(neuron, stage.neuron_peak_bytes),
            );
        }
        let peaks: Vec<String> = rung
            .peak_facts()
            .into_iter()
            .map(|(name, value)| format!("{name} {value}"))
            .collect();
        let _ = writeln!(out, "  peak: {}", peaks.join(" · "));
        if !rung.largest_processes.is_empty() {
            let largest: Vec<String> = rung
                .largest_processes
                .iter()
                .take(3)
                .map(|p| format!("{} (pid {}) {}", p.command, p.pid, format_size(p.peak_rss)))
                .collect();
            let _ = writeln!(out, "  largest processes: {}", largest.join(" · "));
        }
        if let Some(peak) = rung.jobs.iter().map(|job| job.peak).max() {
            let _ = writeln!(
                out,
                "  {} compile{} governed, peak {}; see --json",
                rung.jobs.len(),
                if rung.jobs.len() == 1 { "" } else { "s" },
                format_size(peak)
            );
        }
        if let Some(pools) = &rung.compile_pools {
            let _ = writeln!(out, "  compile workers: {}", pools.describe());
        }
        if let Some(staged) = &rung.diagnosis {
            let _ = writeln!(
                out,
                "  diagnosis: {} in stage `{}` ({})",
                staged.diagnosis.kind.label(),
                staged.stage,
                if staged.is_memory {
                    "memory"
                } else {
                    "not memory"
                }
            );
            let _ = writeln!(
                out,
                "    evidence: {}",
                truncate(&staged.diagnosis.evidence, 200)
            );
            let _ = writeln!(out, "    advice: {}", staged.diagnosis.advice);
        }
        for note in rung
            .notes
            .iter()
            .filter(|note| !shared_notes.contains(note))
        {
            let _ = writeln!(out, "  note: {note}");
        }
    }
    for note in shared_notes {
        let _ = writeln!(out, "note: {note}");
    }
    if ladder || report.interrupted {
        let ladder: Vec<String> = report
            .rungs
            .iter()
            .map(|r| {
                format!(
                    "rung {} {} in {:.2}s, peak {}",
                    r.rung,
                    r.outcome(),
                    r.duration_s,
                    format_size(r.peak.rss)
                )
            })
            .collect();
        let _ = writeln!(out, "ladder: {}", ladder.join(" → "));
        match (report.succeeded_rung, report.interrupted) {
            (_, true) => {
                let _ = writeln!(out, "interrupted: the report covers what ran until Ctrl-C");
            }
            (Some(rung), false) => {
                let _ = writeln!(out, "rung {rung} succeeded");
            }
            (None, false) => {
                let _ = writeln!(out, "no rung succeeded");
            }
        }
    }
    out
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// At most this many commands get their own layer in the chart; the rest are summed.
const CHART_COMMANDS: usize = 7;

/// What the page says each peak measures, so a sampled peak that differs from the kernel's is
/// not read as a contradiction.
fn peaks_explained(report: &Report) -> String {
    let mut text = format!(
        "<p><strong>tree RSS</strong> is sampled every {} s: the resident memory of the \
         command's processes, summed, so it misses spikes shorter than that and counts memory \
         that processes share once per process; <strong>tree, shared pages split (PSS)</strong> \
         counts the pages that forked processes share once, split between them as the kernel \
         splits them. <strong>largest process (kernel)</strong> is \
         the largest max RSS the kernel recorded for one finished process.",
        report.interval_s
    );
    if report
        .rungs
        .iter()
        .any(|rung| rung.peak.kernel.cgroup.is_some())
    {
        text.push_str(
            " <strong>cgroup (kernel)</strong> is the kernel's high-water mark of the rung's own \
             cgroup, which <code>--memory-limit</code> holds and the OOM killer acts on: it counts \
             page cache, kernel memory and spikes between samples, and shared memory once, so it \
             can be above or below the sampled peak. The chart draws it as a dotted level.",
        );
    }
    text.push_str(" A memory failure is the vertical line where its rung ended.</p>\n");
    text
}

/// The HTML page: memory by command, rungs one after another on one time axis, stages as
/// bands, the `--memory-limit` line, the kernel's cgroup peak of each rung as a level and each
/// memory failure where it ended its rung; under the chart, each rung's command, outcome,
/// diagnosis and peaks, and its stages.
pub fn timeline(report: &Report) -> Timeline {
    let mut totals: Vec<(String, u64)> = Vec::new();
    for sample in report.rungs.iter().flat_map(|r| &r.samples) {
        for (name, bytes) in &sample.by_command {
            match totals.iter_mut().find(|(n, _)| n == name) {
                Some(entry) => entry.1 = entry.1.max(*bytes),
                None => totals.push((name.clone(), *bytes)),
            }
        }
    }
    totals.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let named: Vec<String> = totals
        .iter()
        .take(CHART_COMMANDS)
        .map(|(n, _)| n.clone())
        .collect();
    let mut layers: Vec<(String, Vec<(f64, u64)>)> =
        named.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut other = Vec::new();
    let mut bands = Vec::new();
    let mut events = Vec::new();
    let mut levels = Vec::new();
    let mut sections = vec![peaks_explained(report)];
    let ladder = report.rungs.len() > 1;
    let mut offset = 0.0;
    for rung in &report.rungs {
        for sample in &rung.samples {
            let t = offset + sample.t;
            for (name, points) in layers.iter_mut() {
                let bytes = sample
                    .by_command
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(0, |(_, b)| *b);
                points.push((t, bytes));
            }
            let rest: u64 = sample
                .by_command
                .iter()
                .filter(|(n, _)| !named.contains(n))
                .map(|(_, b)| b)
                .sum();
            other.push((t, rest));
        }
        let of_rung = |what: &str| {
            if ladder {
                format!("rung {} · {what}", rung.rung)
            } else {
                what.to_string()
            }
        };
        for stage in &rung.stages {
            bands.push(Band {
                label: of_rung(&stage.name),
                start: offset + stage.start_s,
                end: offset + stage.end_s,
            });
        }
        let end = offset + rung.duration_s;
        if let Some(bytes) = rung.peak.kernel.cgroup {
            levels.push(Level {
                label: of_rung("cgroup peak (kernel)"),
                bytes,
                start: offset,
                end,
            });
        }
        if let Some(staged) = rung.diagnosis.as_ref().filter(|staged| staged.is_memory) {
            events.push(Event {
                label: of_rung(staged.diagnosis.kind.label()),
                t: end,
            });
        }
        sections.push(rung_section(rung));
        offset = end;
    }
    let mut series: Vec<Series> = layers
        .into_iter()
        .map(|(name, points)| Series::sampled(name, points))
        .collect();
    if other.iter().any(|p| p.1 > 0) {
        series.push(Series::sampled("other processes".into(), other));
    }
    let result = match (report.succeeded_rung, report.interrupted) {
        (_, true) => "interrupted (Ctrl-C): the page covers what ran until then".to_string(),
        (Some(rung), false) => format!("rung {rung} succeeded"),
        (None, false) => "no rung succeeded".to_string(),
    };
    Timeline {
        title: format!("headroom run: {}", report.command.join(" ")),
        facts: vec![
            ("command".into(), report.command.join(" ")),
            ("result".into(), result),
            (
                "--memory-limit".into(),
                report.memory_limit.map_or("none".to_string(), format_size),
            ),
            ("sampled every".into(), format!("{} s", report.interval_s)),
            (
                "headroom's own CPU".into(),
                format!("{:.2} s", report.headroom_cpu_s),
            ),
        ],
        series,
        limit: report.memory_limit.map(|bytes| Limit {
            label: "--memory-limit".into(),
            bytes,
        }),
        bands,
        events,
        levels,
        end: offset,
        sections,
    }
}

/// One rung under the chart: its command, outcome, diagnosis and peaks, then its stages.
fn rung_section(rung: &RungReport) -> String {
    let env: String = rung.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    let mut facts = vec![
        (
            "command".to_string(),
            format!("{env}{}", rung.command.join(" ")),
        ),
        (
            "outcome".to_string(),
            format!("{} after {:.2}s", rung.outcome(), rung.duration_s),
        ),
    ];
    if let Some(staged) = &rung.diagnosis {
        let memory = if staged.is_memory {
            "memory"
        } else {
            "not memory"
        };
        facts.extend([
            (
                "diagnosis".to_string(),
                format!(
                    "{} in stage `{}` ({memory})",
                    staged.diagnosis.kind.label(),
                    staged.stage
                ),
            ),
            ("evidence".to_string(), staged.diagnosis.evidence.clone()),
            ("advice".to_string(), staged.diagnosis.advice.clone()),
        ]);
    }
    facts.extend(rung.peak_facts());
    if let Some(pools) = &rung.compile_pools {
        facts.push(("compile workers".to_string(), pools.describe()));
    }
    facts.push(("tracking".to_string(), rung.tracking.clone()));
    facts.extend(
        rung.notes
            .iter()
            .map(|note| ("note".to_string(), note.clone())),
    );
    let seconds = |s: f64| Cell::number(&format!("{s:.2}"), s);
    let bytes = |b: u64| Cell::number(&format_size(b), b as f64);
    let stages = Table {
        class: "stages",
        columns: vec![
            "stage",
            "start (s)",
            "end (s)",
            "duration (s)",
            "entry",
            "peak",
            "exit",
        ],
        rows: rung
            .stages
            .iter()
            .map(|stage| {
                vec![
                    Cell::text(&stage.name),
                    seconds(stage.start_s),
                    seconds(stage.end_s),
                    seconds(stage.duration_s),
                    bytes(stage.entry_bytes),
                    bytes(stage.peak_bytes),
                    bytes(stage.exit_bytes),
                ]
            })
            .collect(),
    };
    let jobs = Table {
        class: "jobs",
        columns: vec![
            "governed job",
            "stage",
            "peak",
            "start (s)",
            "time (s)",
            "state",
        ],
        rows: rung
            .jobs
            .iter()
            .map(|job| {
                vec![
                    Cell::text(&job.label),
                    Cell::text(&job.stage),
                    bytes(job.peak),
                    seconds(job.start_s),
                    seconds(job.end_s - job.start_s),
                    Cell::text(&job.state()),
                ]
            })
            .collect(),
    };
    format!(
        "<h2 class=\"rung\">Rung {}: {}</h2>\n{}{}{}",
        rung.rung,
        escape(&rung.outcome()),
        html::facts(&facts),
        stages.render(),
        if rung.jobs.is_empty() {
            String::new()
        } else {
            jobs.render()
        }
    )
}

/// The `.dat` format of memory_profiler's `mprof`: `CMDLINE`, one `MEM <MiB> <unix time>` per
/// sample, and one `FUNC` bracket per stage, so `mprof plot FILE` draws the stages.
pub fn render_mprof(report: &Report) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    let mut out = format!("CMDLINE {}\n", report.command.join(" "));
    for rung in &report.rungs {
        for sample in &rung.samples {
            let _ = writeln!(
                out,
                "MEM {:.6} {:.4}",
                sample.rss as f64 / MIB,
                rung.started_unix + sample.t
            );
        }
    }
    for rung in &report.rungs {
        for stage in &rung.stages {
            // mprof splits on spaces: stage names must be one word.
            let name: String = stage
                .name
                .chars()
                .map(|c| if c.is_whitespace() { '_' } else { c })
                .collect();
            let _ = writeln!(
                out,
                "FUNC {name} {:.4} {:.4} {:.4} {:.4}",
                stage.entry_bytes as f64 / MIB,
                rung.started_unix + stage.start_s,
                stage.exit_bytes as f64 / MIB,
                rung.started_unix + stage.end_s
            );
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use headroom_diagnose::{classify, ExitInfo};
    use headroom_report::{BuildRecord, JobRecord};

    const MIB: u64 = 1 << 20;

    fn sample(t: f64, python: u64, cc1plus: u64) -> Sample {
        let mut by_command = vec![("python3".to_string(), python * MIB)];
        if cc1plus > 0 {
            by_command.push(("cc1plus".to_string(), cc1plus * MIB));
        }
        Sample {
            t,
            rss: (python + cc1plus) * MIB,
            // The Python processes are forked workers that share half their pages.
            counted: (python / 2 + cc1plus) * MIB,
            processes: by_command.len(),
            cgroup_usage: None,
            mem_available: Some(8192 * MIB),
            psi_some_avg10: Some(0.0),
            gpu: None,
            gpu_read_s: None,
            neuron: None,
            by_command,
        }
    }

    fn stage(name: &str, start: f64, end: f64, entry: u64, peak: u64, exit: u64) -> StageSummary {
        StageSummary {
            name: name.into(),
            start_s: start,
            end_s: end,
            duration_s: end - start,
            entry_bytes: entry * MIB,
            exit_bytes: exit * MIB,
            peak_bytes: peak * MIB,
            peak_at_s: start,
            gpu_peak_bytes: None,
            neuron_peak_bytes: None,
        }
    }

    /// A run of two rungs: the first fails for lack of memory, the second succeeds with two
    /// governed jobs that overlap.
    pub(crate) fn ladder() -> Report {
        let failed_samples = vec![
            sample(0.0, 10, 0),
            sample(0.5, 200, 0),
            sample(1.0, 200, 700),
        ];
        let diagnosis = classify(
            b"g++: fatal error: Killed signal terminated program cc1plus\n",
            &ExitInfo::exited(1),
        )
        .unwrap();
        let ok_samples = vec![
            sample(0.0, 10, 0),
            sample(0.5, 200, 300),
            sample(1.5, 20, 0),
        ];
        Report {
            command: vec!["python3".into(), "build.py".into()],
            memory_limit: Some(1024 * MIB),
            interval_s: 0.05,
            rungs: vec![
                RungReport {
                    rung: 0,
                    command: vec!["python3".into(), "build.py".into()],
                    env: vec![],
                    started_unix: 1_700_000_000.0,
                    duration_s: 1.1,
                    exit_code: Some(1),
                    signal: None,
                    succeeded: false,
                    peak: Peaks::from_samples(
                        &failed_samples,
                        KernelPeaks {
                            largest_process: 700 * MIB,
                            cgroup: Some(930 * MIB),
                        },
                    ),
                    stages: vec![
                        stage("(start)", 0.0, 0.5, 10, 200, 200),
                        stage("compile kernels", 0.5, 1.1, 200, 900, 900),
                    ],
                    diagnosis: Some(StagedDiagnosis {
                        stage: "compile kernels".into(),
                        is_memory: true,
                        diagnosis,
                    }),
                    tracking: "cgroup".into(),
                    largest_processes: vec![
                        ProcessPeak {
                            pid: 41,
                            command: "cc1plus".into(),
                            peak_rss: 700 * MIB,
                        },
                        ProcessPeak {
                            pid: 40,
                            command: "python3".into(),
                            peak_rss: 200 * MIB,
                        },
                    ],
                    jobs: vec![],
                    compile_pools: None,
                    notes: vec!["NVML is not available (test); GPU memory is not recorded".into()],
                    samples: failed_samples,
                },
                RungReport {
                    rung: 1,
                    command: vec!["python3".into(), "build.py".into()],
                    env: vec![("MAX_JOBS".into(), "1".into())],
                    started_unix: 1_700_000_002.0,
                    duration_s: 1.6,
                    exit_code: Some(0),
                    signal: None,
                    succeeded: true,
                    peak: Peaks::from_samples(
                        &ok_samples,
                        KernelPeaks {
                            largest_process: 300 * MIB,
                            cgroup: Some(520 * MIB),
                        },
                    ),
                    stages: vec![
                        stage("(start)", 0.0, 0.5, 10, 500, 500),
                        stage("compile kernels", 0.5, 1.6, 500, 500, 20),
                    ],
                    diagnosis: None,
                    tracking: "cgroup".into(),
                    largest_processes: vec![],
                    jobs: vec![
                        GovernedJob {
                            label: "kernels/attention.o".into(),
                            compiler: "g++".into(),
                            peak: 300 * MIB,
                            predicted: 512 * MIB,
                            prediction_source: "default".into(),
                            start_s: 0.6,
                            end_s: 1.4,
                            stage: "compile kernels".into(),
                            exit_code: Some(0),
                            signal: None,
                            attempts: 1,
                        },
                        GovernedJob {
                            label: "kernels/gemm.o".into(),
                            compiler: "g++".into(),
                            peak: 450 * MIB,
                            predicted: 300 * MIB,
                            prediction_source: "history".into(),
                            start_s: 0.7,
                            end_s: 1.5,
                            stage: "compile kernels".into(),
                            exit_code: Some(0),
                            signal: None,
                            attempts: 2,
                        },
                    ],
                    compile_pools: Some(crate::pools::size_pools(
                        1 << 30,
                        crate::pools::DEFAULT_WORKER_COST,
                        2,
                        |name| (name == "TILELANG_AUTO_TUNING_CPU_COUNTS").then(|| "4".to_string()),
                    )),
                    notes: vec![],
                    samples: ok_samples,
                },
            ],
            succeeded_rung: Some(1),
            interrupted: false,
            headroom_cpu_s: 0.01,
        }
    }

    #[test]
    fn a_governed_job_is_timed_from_the_rung_and_placed_in_the_stage_it_started_in() {
        let job = |start_ms, end_ms| JobRecord {
            label: "u.o".into(),
            compiler: "g++".into(),
            start_ms,
            end_ms,
            peak: 300 * MIB,
            ..JobRecord::default()
        };
        // The governor started 0.2 s before the rung.
        let mut build = BuildReport::begun(BuildRecord {
            id: 1,
            started_unix_ms: 1_699_999_999_800,
            duration_ms: None,
            command: "python3 build.py".into(),
            cwd: "/src".into(),
            budget: 700 * MIB,
            budget_source: "set by --budget".into(),
            slots: 2,
            exit_code: None,
            peak_total: None,
            parallelism_set: vec![],
        });
        build.jobs = vec![job(300, 900), job(900, 1700)];
        let stages = ladder().rungs[1].stages.clone();
        let jobs = governed_jobs(&build, 1_700_000_000.0, &stages);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(near(jobs[0].start_s, 0.1) && near(jobs[0].end_s, 0.7));
        assert_eq!(jobs[0].stage, "(start)");
        assert!(near(jobs[1].start_s, 0.7) && near(jobs[1].end_s, 1.5));
        assert_eq!(jobs[1].stage, "compile kernels");
    }

    #[test]
    fn a_long_stage_list_is_cut_in_the_middle() {
        let mut report = ladder();
        report.rungs.truncate(1);
        report.rungs[0].stages = (0..100)
            .map(|i| stage(&format!("step{i}"), i as f64, i as f64 + 1.0, 1, 2, 1))
            .collect();
        let table = render_table(&report);
        assert!(
            table.contains("step9 ")
                && !table.contains("step10 ")
                && table.contains("step80 ")
                && table.contains("step99 ")
        );
        assert!(table.contains("… 70 more stages"), "{table}");
    }

    #[test]
    fn one_run_is_not_called_a_rung_and_a_note_every_rung_shares_is_said_once() {
        let mut report = ladder();
        let nvml = "NVML is not available (test); GPU memory is not recorded".to_string();
        for rung in &mut report.rungs {
            rung.notes = vec![nvml.clone()];
        }
        let table = render_table(&report);
        assert_eq!(table.matches("NVML is not available").count(), 1, "{table}");
        assert!(table.contains("headroom run · rung 1 · "), "{table}");
        report.rungs.truncate(1);
        let table = render_table(&report);
        assert!(!table.contains("rung 0"), "{table}");
        assert!(table.starts_with("headroom run · `"), "{table}");
    }

    #[test]
    fn table_snapshot() {
        insta::assert_snapshot!(render_table(&ladder()));
    }

    #[test]
    fn html_snapshot() {
        insta::assert_snapshot!(headroom_report::chart::render_html(&timeline(&ladder())));
    }

    #[test]
    fn timeline_puts_rungs_one_after_another() {
        let timeline = timeline(&ladder());
        let names: Vec<&str> = timeline.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["cc1plus", "python3"]);
        assert_eq!(timeline.bands[2].label, "rung 1 · (start)");
        assert!((timeline.bands[2].start - 1.1).abs() < 1e-9);
        assert_eq!(timeline.limit.as_ref().map(|l| l.bytes), Some(1024 * MIB));
    }

    #[test]
    fn the_page_marks_the_failure_and_names_both_peaks_of_each_rung() {
        let timeline = timeline(&ladder());
        assert_eq!(timeline.events.len(), 1, "only rung 0 ran out of memory");
        assert!(
            (timeline.events[0].t - 1.1).abs() < 1e-9,
            "where rung 0 ended"
        );
        let levels: Vec<u64> = timeline.levels.iter().map(|level| level.bytes).collect();
        assert_eq!(levels, [930 * MIB, 520 * MIB]);
        let html = headroom_report::chart::render_html(&timeline);
        for text in [
            "rung 0 · compiler process killed (out of memory)</text>",
            "rung 0 · cgroup peak (kernel) 930.0 MiB</text>",
            "<dt>command</dt><dd>MAX_JOBS=1 python3 build.py</dd>",
            "<dt>outcome</dt><dd>failed (exit 1) after 1.10s</dd>",
            "<dt>diagnosis</dt><dd>compiler process killed (out of memory) in stage `compile kernels` (memory)</dd>",
            "<dt>tree RSS</dt><dd>900.0 MiB at 1.00s</dd>",
            "<dt>cgroup (kernel)</dt><dd>930.0 MiB</dd>",
            "<dt>largest process so far (kernel)</dt><dd>300.0 MiB</dd>",
            "<h2 class=\"rung\">Rung 1: succeeded</h2>",
            "--memory-limit 1.00 GiB</text>",
        ] {
            assert!(html.contains(text), "{text} is not in {html}");
        }
    }

    #[test]
    fn mprof_file_has_mem_and_func_lines() {
        let dat = render_mprof(&ladder());
        let mut lines = dat.lines();
        assert_eq!(lines.next(), Some("CMDLINE python3 build.py"));
        assert_eq!(lines.next(), Some("MEM 10.000000 1700000000.0000"));
        assert!(
            dat.contains("FUNC compile_kernels 200.0000 1700000000.5000 900.0000 1700000001.1000")
        );
        assert_eq!(dat.lines().filter(|l| l.starts_with("MEM ")).count(), 6);
    }

    #[test]
    fn json_names_the_stage_and_the_numbers() {
        let json = serde_json::to_value(ladder()).unwrap();
        assert_eq!(json["succeeded_rung"], 1);
        assert_eq!(json["rungs"][0]["diagnosis"]["kind"], "compiler_killed");
        assert_eq!(json["rungs"][0]["diagnosis"]["stage"], "compile kernels");
        assert_eq!(json["rungs"][0]["peak"]["rss"], 900 * MIB);
    }
}
