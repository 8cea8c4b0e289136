//! The page `headroom report --html` writes for one build: its facts, memory per job over time
//! against the budget, every job in a table people sort by clicking, and what ran outside
//! admission. It lives beside the terminal summary and prints the same fields through the same
//! `format_size`, so the page and the summary never disagree about a job's peak.

use headroom_size::format_size;

use crate::chart::{Limit, Series, Timeline};
use crate::html::{Cell, Table};
use crate::{BuildReport, JobRecord};

/// The page of `report`: one stacked series per job (a job too short to be sampled has none,
/// but keeps its place in the legend and the table), with the budget as the limit.
pub fn timeline(report: &BuildReport) -> Timeline {
    let build = &report.build;
    let series = report
        .jobs
        .iter()
        .map(|job| Series {
            name: job.label.clone(),
            points: report
                .samples
                .iter()
                .filter(|s| s.job_id == job.job_id)
                .map(|s| (s.t_ms as f64 / 1000.0, s.bytes))
                .collect(),
            peak: job.peak,
        })
        .collect();
    let mut sections = vec![
        "<h2>Jobs</h2>\n<p>A job's peak is its recorded peak, as the terminal summary prints it: \
         the higher of its sampled RSS and the kernel's max RSS of its processes, which counts \
         spikes between samples. Click a column to sort.</p>\n"
            .to_string(),
        jobs_table(report).render(),
    ];
    if !report.outside.is_empty() {
        sections.push(
            "<h2>Processes outside admission</h2>\n<p>Counted against the budget, not governed.</p>\n"
                .to_string(),
        );
        sections.push(outside_table(report).render());
    }
    Timeline {
        title: format!("headroom build {}: {}", build.id, build.command),
        facts: facts(report),
        series,
        limit: Some(Limit {
            label: "budget".into(),
            bytes: build.budget,
        }),
        end: build
            .duration_ms
            .into_iter()
            .chain(report.jobs.iter().map(|job| job.end_ms))
            .max()
            .unwrap_or(0) as f64
            / 1000.0,
        sections,
        ..Timeline::default()
    }
}

/// The build's metadata, in the summary's words where it has them.
fn facts(report: &BuildReport) -> Vec<(String, String)> {
    let build = &report.build;
    let or_unknown = |value: Option<String>| value.unwrap_or_else(|| "unknown".into());
    [
        ("command", build.command.clone()),
        ("directory", build.cwd.clone()),
        ("started", crate::utc_time(build.started_unix_ms)),
        (
            "duration",
            or_unknown(
                build
                    .duration_ms
                    .map(|ms| format!("{:.1} s", ms as f64 / 1000.0)),
            ),
        ),
        (
            "exit code",
            or_unknown(build.exit_code.map(|code| code.to_string())),
        ),
        (
            "budget",
            format!("{} ({})", format_size(build.budget), build.budget_source),
        ),
        ("slots", build.slots.to_string()),
        (
            "headroom set",
            if build.parallelism_set.is_empty() {
                "no variable".to_string()
            } else {
                build.parallelism_set.join(" ")
            },
        ),
        (
            "peak of all jobs",
            or_unknown(build.peak_total.map(format_size)),
        ),
        (
            "jobs",
            format!(
                "{} · suspends {} · requeues {} · OOM retries {} · lower flags {}",
                report.jobs.len(),
                report.suspends(),
                report.requeues(),
                report.oom_retries(),
                report.lowered().count()
            ),
        ),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect()
}

fn seconds(ms: u64) -> Cell {
    Cell::number(&format!("{:.1}", ms as f64 / 1000.0), ms as f64)
}

fn bytes(bytes: u64) -> Cell {
    Cell::number(&format_size(bytes), bytes as f64)
}

fn count(n: impl Into<f64> + ToString + Copy) -> Cell {
    Cell::number(&n.to_string(), n.into())
}

/// How a job ended: its exit code, else the signal that killed it (sorted as a shell's
/// `128 + signal`).
fn exit(job: &JobRecord) -> Cell {
    match (job.exit_code, job.signal) {
        (_, Some(signal)) => Cell::number(&format!("signal {signal}"), f64::from(128 + signal)),
        (Some(code), None) => count(code),
        (None, None) => Cell::number("?", -1.0),
    }
}

fn jobs_table(report: &BuildReport) -> Table {
    Table {
        class: "jobs",
        columns: vec![
            "label",
            "command",
            "start (s)",
            "duration (s)",
            "peak",
            "predicted",
            "prediction",
            "nice",
            "suspends",
            "requeues",
            "OOM retries",
            "lower flags",
            "exit",
        ],
        rows: report
            .jobs
            .iter()
            .map(|job| {
                vec![
                    Cell::text(&job.label),
                    Cell::html(format!(
                        "<code>{}</code>",
                        crate::html::escape(&job.command)
                    )),
                    seconds(job.start_ms),
                    Cell::number(&format!("{:.1}", job.wall_seconds()), job.wall_seconds()),
                    bytes(job.peak),
                    bytes(job.predicted),
                    Cell::text(&job.prediction_source),
                    count(job.nice),
                    count(job.suspends),
                    count(job.requeues),
                    count(job.oom_retries),
                    Cell::text(job.lowered_flags.as_deref().unwrap_or("")),
                    exit(job),
                ]
            })
            .collect(),
    }
}

fn outside_table(report: &BuildReport) -> Table {
    Table {
        class: "outside",
        columns: vec![
            "process",
            "pid",
            "compiler",
            "peak",
            "first seen (s)",
            "last seen (s)",
            "why not governed",
        ],
        rows: report
            .outside
            .iter()
            .map(|process| {
                vec![
                    Cell::text(&process.name),
                    count(process.pid),
                    Cell::text(if process.compiler_like { "yes" } else { "no" }),
                    bytes(process.peak),
                    seconds(process.first_seen_ms),
                    seconds(process.last_seen_ms),
                    Cell::text(&process.reason),
                ]
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::render_html;
    use crate::{BuildRecord, OutsideProcess, Sample, REPORT_SCHEMA};

    const MIB: u64 = 1 << 20;

    /// A small build under a large budget, as users reported it: a.o and b.o sampled (b.o's
    /// recorded peak above its highest sample), the link too short to be sampled.
    fn report() -> BuildReport {
        let job = |job_id: u64, label: &str, start_ms: u64, end_ms: u64, peak: u64| JobRecord {
            job_id,
            key: format!("k{job_id}"),
            group: "g++ -O2".into(),
            label: label.into(),
            compiler: "/usr/bin/g++".into(),
            command: format!("g++ -O2 -c -o {label} <src>"),
            cwd: "/src".into(),
            start_ms,
            end_ms,
            peak,
            exit_code: Some(0),
            predicted: 512 * MIB,
            prediction_source: "default".into(),
            attempts: 1,
            ..JobRecord::default()
        };
        let mut jobs = vec![
            job(0, "a.o", 10, 1900, 45 * MIB),
            job(1, "b.o", 20, 2400, 74 * MIB + 100 * 1024),
            job(2, "app", 2450, 2480, 12 * MIB),
        ];
        jobs[1].nice = 5;
        jobs[1].suspends = 1;
        jobs[2].signal = Some(9);
        jobs[2].exit_code = None;
        let samples = [(0, 500, 30), (0, 1500, 44), (1, 500, 40), (1, 1500, 67)]
            .map(|(job_id, t_ms, mib)| Sample {
                t_ms,
                job_id,
                bytes: mib * MIB,
            })
            .to_vec();
        BuildReport {
            schema: REPORT_SCHEMA,
            build: BuildRecord {
                id: 12,
                started_unix_ms: 1_732_000_000_000,
                duration_ms: Some(2600),
                command: "make -j2 app".into(),
                cwd: "/src".into(),
                budget: 21_440 * MIB,
                budget_source: "MemAvailable − reserve".into(),
                slots: 8,
                exit_code: Some(2),
                peak_total: Some(113 * MIB),
                parallelism_set: vec!["MAKEFLAGS=-j16".into()],
            },
            jobs,
            samples,
            outside: vec![OutsideProcess {
                pid: 77,
                name: "cc1plus".into(),
                compiler_like: true,
                peak: 300 * MIB,
                first_seen_ms: 100,
                last_seen_ms: 900,
                reason: "ran before the governor was listening".into(),
            }],
            events: Vec::new(),
            room: Vec::new(),
        }
    }

    #[test]
    fn every_job_is_listed_with_the_summarys_peak() {
        let html = render_html(&timeline(&report()));
        let summary = crate::summary::render(&report());
        // b.o's recorded peak, which the summary prints, not its highest sample (67 MiB).
        assert!(summary.contains("74.1 MiB") && html.contains("b.o — peak 74.1 MiB</li>"));
        assert!(html.contains("app — peak 12.0 MiB (no samples to draw)</li>"));
        assert_eq!(html.matches("<tr>").count(), 1 + 3 + 1 + 1, "{html}");
        assert!(html.contains(r#"<td data-sort="137">signal 9</td>"#));
        assert!(html.contains("budget 20.9 GiB, above the chart"), "{html}");
        assert!(html.contains("<dd>2024-11-19T07:06:40Z</dd>"));
    }

    #[test]
    fn page_snapshot() {
        insta::assert_snapshot!(render_html(&timeline(&report())));
    }
}
