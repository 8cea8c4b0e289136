//! The end-of-build summary people read in their terminal.

use std::fmt::Write;

use headroom_probe::size::Size;

use crate::model::BuildReport;

/// How many of the largest jobs the summary lists.
const TOP_JOBS: usize = 10;

/// Renders the summary: totals, peak against the budget, the largest jobs and every job that
/// was built with lower-memory flags.
pub fn render(report: &BuildReport) -> String {
    let build = &report.build;
    let mut out = String::new();
    let wall = build
        .duration_ms
        .map_or("?".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
    let peak = build
        .peak_total
        .map_or("?".to_string(), |bytes| Size(bytes).to_string());
    let _ = writeln!(
        out,
        "headroom: {} jobs in {wall}; peak {peak} of a {} budget ({}); {} slots",
        report.jobs.len(),
        Size(build.budget),
        build.budget_source,
        build.slots
    );
    let _ = writeln!(
        out,
        "  suspends {} · requeues {} · OOM retries {} · lower flags {}",
        report.suspends(),
        report.requeues(),
        report.oom_retries(),
        report.lowered().count()
    );
    let nicer: Vec<u8> = report
        .jobs
        .iter()
        .map(|job| job.nice)
        .filter(|&n| n > 0)
        .collect();
    if let Some(most) = nicer.iter().max() {
        let _ = writeln!(
            out,
            "  CPU priority: {} of {} jobs ran nicer (up to niceness {most}), off the build's longest path",
            nicer.len(),
            report.jobs.len()
        );
    }
    for job in report.jobs.iter().filter(|job| job.over_budget) {
        let _ = writeln!(
            out,
            "  {} is predicted at {}, more than the budget: it ran alone",
            job.label,
            Size(job.predicted)
        );
    }
    if !report.jobs.is_empty() {
        let _ = writeln!(
            out,
            "  {:>10}  {:>8}  {:>8}  job",
            "peak", "time", "predicted"
        );
        for job in report.by_peak().into_iter().take(TOP_JOBS) {
            let seconds = job.wall_seconds();
            let _ = writeln!(
                out,
                "  {:>10}  {:>6.1} s  {:>8}  {}",
                Size(job.peak).to_string(),
                seconds,
                job.prediction_source,
                job.label
            );
        }
    }
    let lowered: Vec<_> = report.lowered().collect();
    if !lowered.is_empty() {
        let _ = writeln!(
            out,
            "  WARNING: {} jobs were built with lower-memory flags:",
            lowered.len()
        );
        for job in lowered {
            let flags = job.lowered_flags.as_deref().unwrap_or_default();
            let _ = writeln!(out, "    {}  ({flags})", job.label);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BuildRecord, JobRecord, REPORT_SCHEMA};

    fn report() -> BuildReport {
        let job = |job_id: u64, label: &str, peak: u64| JobRecord {
            job_id,
            key: format!("k{job_id}"),
            group: "g".into(),
            label: label.into(),
            compiler: "/usr/bin/g++".into(),
            command: format!("g++ -c -o {label}"),
            cwd: "/src".into(),
            offered_ms: 0,
            start_ms: 100 * job_id,
            end_ms: 100 * job_id + 2500,
            peak,
            cpu_ms: 2400,
            exit_code: Some(0),
            signal: None,
            predicted: peak,
            prediction_source: "history".into(),
            attempts: 1,
            suspends: 0,
            requeues: 0,
            oom_retries: 0,
            lowered_flags: None,
            over_budget: false,
            nice: 0,
        };
        let mut jobs = vec![
            job(0, "light.o", 150 << 20),
            job(1, "heavy.o", 1100 << 20),
            job(2, "huge.o", 3 << 30),
        ];
        jobs[1].suspends = 2;
        jobs[2].oom_retries = 1;
        jobs[2].over_budget = true;
        jobs[2].lowered_flags = Some("-g0 -O1".into());
        jobs[0].nice = 12;
        BuildReport {
            schema: REPORT_SCHEMA,
            build: BuildRecord {
                id: 7,
                started_unix_ms: 0,
                duration_ms: Some(42_300),
                command: "make".into(),
                cwd: "/src".into(),
                budget: 3 << 29,
                budget_source: "cgroup limit 1.75 GiB − reserve 256.0 MiB".into(),
                slots: 2,
                exit_code: Some(0),
                peak_total: Some(1400 << 20),
            },
            jobs,
            samples: Vec::new(),
        }
    }

    #[test]
    fn summary_snapshot() {
        insta::assert_snapshot!(render(&report()));
    }
}
