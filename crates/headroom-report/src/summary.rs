//! The end-of-build summary people read in their terminal. It says what headroom governed and,
//! as plainly, what it did not: a build whose compilers ran where headroom could not admit
//! them must never read like a governed one.

use std::fmt::Write;

use headroom_size::Size;

use crate::{BuildReport, OutsideProcess};

/// How many of the largest jobs, or of the largest processes outside admission, the summary
/// lists.
const LISTED: usize = 10;
/// What each prediction source means, in the order the legend names them.
const SOURCES: [(&str, &str); 4] = [
    ("history", "its own last clean run here"),
    ("shared", "its last run on another machine"),
    (
        "group",
        "jobs with the same compiler and flags in this build",
    ),
    ("default", "nothing known yet: a cautious guess"),
];
/// A process outside admission that is not a compiler is worth naming from this peak on.
const HEAVY_OUTSIDE: u64 = 256 << 20;

/// Renders the summary: totals, peak against the budget, the parallelism headroom set, the
/// largest jobs, every job that was built with lower-memory flags, and the compilers and heavy
/// processes that ran outside admission.
pub fn render(report: &BuildReport) -> String {
    let build = &report.build;
    let mut out = String::new();
    let wall = build
        .duration_ms
        .map_or("?".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
    let peak = build
        .peak_total
        .map_or("?".to_string(), |bytes| Size(bytes).to_string());
    if build.duration_ms.is_none() {
        let _ = writeln!(
            out,
            "headroom: INCOMPLETE record: {} jobs recorded, and no end: the governor died before \
             the build ended (or the build is still running); jobs that ended after are missing",
            report.jobs.len(),
        );
    } else {
        let _ = writeln!(
            out,
            "headroom: {} jobs in {wall}; peak {peak} of a {} budget ({}); {} slots",
            report.jobs.len(),
            Size(build.budget),
            build.budget_source,
            build.slots
        );
    }
    let _ = writeln!(
        out,
        "  suspends {} · requeues {} · OOM retries {} · lower flags {}",
        report.suspends(),
        report.requeues(),
        report.oom_retries(),
        report.lowered().count()
    );
    let shared = report
        .jobs
        .iter()
        .filter(|job| job.prediction_source == "shared")
        .count();
    if shared > 0 {
        let _ = writeln!(
            out,
            "  {shared} of {} jobs were predicted from shared history (peaks other machines measured)",
            report.jobs.len()
        );
    }
    if !build.parallelism_set.is_empty() {
        let _ = writeln!(
            out,
            "  headroom set {} (it governs the jobs they start)",
            build.parallelism_set.join(" ")
        );
    }
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
    render_limits(&mut out, report);
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
        let listed: Vec<_> = report.by_peak().into_iter().take(LISTED).collect();
        for job in &listed {
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
        if report.jobs.len() > listed.len() {
            let _ = writeln!(
                out,
                "  showing the {} largest of {} jobs (the JSON report lists all: --report FILE, \
                 or `headroom report --json FILE`)",
                listed.len(),
                report.jobs.len()
            );
        }
        let legend: Vec<String> = SOURCES
            .iter()
            .filter(|(name, _)| listed.iter().any(|job| job.prediction_source == *name))
            .map(|(name, meaning)| format!("{name} = {meaning}"))
            .collect();
        let _ = writeln!(out, "  predicted from: {}", legend.join(" · "));
    }
    render_farm(&mut out, report);
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
    render_outside(&mut out, report);
    out
}

/// What held the build back: jobs waiting for a slot (the CPUs) or for memory (the budget).
fn render_limits(out: &mut String, report: &BuildReport) {
    if report.jobs.is_empty() {
        return;
    }
    let waited = report.waiting();
    let slots = format!("one of the {} slots", report.build.slots);
    let line = if waited.for_slots == 0.0 && waited.for_memory == 0.0 {
        "limited by neither CPUs nor memory: no job waited to start".to_string()
    } else if waited.for_slots >= waited.for_memory {
        format!(
            "limited by CPUs: jobs waited {:.1} s for {slots}, {:.1} s for memory",
            waited.for_slots, waited.for_memory
        )
    } else {
        format!(
            "limited by memory: jobs waited {:.1} s for memory, {:.1} s for {slots}",
            waited.for_memory, waited.for_slots
        )
    };
    let _ = writeln!(out, "  {line}");
}

/// What each build farm node did: its jobs, the most memory planned on it at once, and how
/// long it was busy.
fn render_farm(out: &mut String, report: &BuildReport) {
    let nodes = report.nodes();
    if nodes.is_empty() {
        return;
    }
    let farmed: usize = nodes.iter().map(|node| node.jobs).sum();
    let _ = writeln!(
        out,
        "  farm: {farmed} of {} jobs compiled on {} nodes (the peak column shows what they used here)",
        report.jobs.len(),
        nodes.len()
    );
    let _ = writeln!(
        out,
        "  {:>6}  {:>12}  {:>8}  node",
        "jobs", "planned peak", "busy"
    );
    for node in nodes {
        let _ = writeln!(
            out,
            "  {:>6}  {:>12}  {:>6.1} s  {}",
            node.jobs,
            Size(node.planned_peak).to_string(),
            node.busy_seconds,
            node.node
        );
    }
}

/// What ran outside admission: the compilers (loudly when nothing was admitted at all), then the
/// other processes heavy enough to matter.
fn render_outside(out: &mut String, report: &BuildReport) {
    let compilers: Vec<&OutsideProcess> = report.ungoverned_compilers().collect();
    let complete = report.build.duration_ms.is_some();
    if report.governed_nothing() && compilers.is_empty() && complete {
        let _ = writeln!(
            out,
            "  no compiler ran in this build (nothing to rebuild?), so headroom governed nothing"
        );
    } else if report.governed_nothing() && !compilers.is_empty() {
        let _ = writeln!(
            out,
            "  WARNING: headroom governed nothing in this build: no compiler went through admission, {} ran outside it:",
            compilers.len()
        );
    } else if !compilers.is_empty() {
        let _ = writeln!(
            out,
            "  WARNING: {} compilers ran outside admission (not governed):",
            compilers.len()
        );
    }
    list_outside(out, compilers);
    let heavy: Vec<&OutsideProcess> = report
        .outside
        .iter()
        .filter(|process| !process.compiler_like && process.peak >= HEAVY_OUTSIDE)
        .collect();
    if !heavy.is_empty() {
        let _ = writeln!(
            out,
            "  {} heavy processes ran outside admission (counted against the budget, not governed):",
            heavy.len()
        );
        list_outside(out, heavy);
    }
}

/// The largest of `processes` as a table, then each distinct reason those were not governed.
fn list_outside(out: &mut String, mut processes: Vec<&OutsideProcess>) {
    if processes.is_empty() {
        return;
    }
    processes.sort_by(|a, b| {
        b.peak
            .cmp(&a.peak)
            .then(a.first_seen_ms.cmp(&b.first_seen_ms))
            .then(a.pid.cmp(&b.pid))
    });
    let listed = &processes[..processes.len().min(LISTED)];
    let _ = writeln!(
        out,
        "  {:>10}  {:>8}  {:>8}  process",
        "peak", "time", "pid"
    );
    for process in listed {
        let _ = writeln!(
            out,
            "  {:>10}  {:>6.1} s  {:>8}  {}",
            Size(process.peak).to_string(),
            process.seen_seconds(),
            process.pid,
            process.name
        );
    }
    if processes.len() > LISTED {
        let _ = writeln!(out, "  … and {} more", processes.len() - LISTED);
    }
    let mut reasons: Vec<&str> = Vec::new();
    for process in listed {
        if !reasons.contains(&process.reason.as_str()) {
            reasons.push(&process.reason);
        }
    }
    for reason in reasons {
        let _ = writeln!(out, "    why: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BuildRecord, JobRecord, REPORT_SCHEMA};

    const MIB: u64 = 1 << 20;
    const STATIC_DRIVER: &str = "started by a statically linked build driver, which headroom's \
        LD_PRELOAD interceptor cannot see; run the compilers through headroom-launch";

    fn outside(pid: i32, name: &str, compiler_like: bool, peak: u64) -> OutsideProcess {
        OutsideProcess {
            pid,
            name: name.into(),
            compiler_like,
            peak,
            first_seen_ms: 1000,
            last_seen_ms: 1000 + 300 * u64::from(pid.unsigned_abs()),
            reason: STATIC_DRIVER.into(),
        }
    }

    fn report() -> BuildReport {
        let job = |job_id: u64, label: &str, peak: u64| JobRecord {
            job_id,
            key: format!("k{job_id}"),
            group: "g".into(),
            label: label.into(),
            compiler: "/usr/bin/g++".into(),
            command: format!("g++ -c -o {label}"),
            cwd: "/src".into(),
            start_ms: 100 * job_id,
            end_ms: 100 * job_id + 2500,
            peak,
            cpu_ms: 2400,
            exit_code: Some(0),
            predicted: peak,
            prediction_source: "history".into(),
            attempts: 1,
            ..JobRecord::default()
        };
        let mut jobs = vec![
            job(0, "light.o", 150 << 20),
            job(1, "heavy.o", 1100 << 20),
            job(2, "huge.o", 3 << 30),
        ];
        jobs[1].suspends = 2;
        jobs[1].prediction_source = "shared".into();
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
                parallelism_set: vec!["MAX_JOBS=4".into(), "MAKEFLAGS=-j4".into()],
            },
            jobs,
            samples: Vec::new(),
            outside: vec![
                outside(31, "make", false, 20 * MIB),
                OutsideProcess {
                    reason: "not a compiler or linker: headroom admits only those".into(),
                    ..outside(57, "python3", false, 400 * MIB)
                },
                OutsideProcess {
                    reason: "ran before the governor was listening".into(),
                    ..outside(88, "cicc", true, 900 * MIB)
                },
            ],
            events: Vec::new(),
            room: Vec::new(),
        }
    }

    #[test]
    fn summary_snapshot() {
        insta::assert_snapshot!(render(&report()));
    }

    #[test]
    fn a_farmed_build_shows_each_node() {
        let mut report = report();
        report.outside.clear();
        // Jobs 1 and 2 overlap on node a (3 GiB planned at once); job 3 runs later on node b.
        let farmed = [
            (1, "10.0.0.5:3632", 0, 4000),
            (2, "10.0.0.5:3632", 1000, 5000),
            (3, "10.0.0.6:3632", 6000, 8000),
        ];
        for (job_id, node, start_ms, end_ms) in farmed {
            let job = &mut report.jobs[job_id - 1];
            job.node = Some(node.into());
            job.start_ms = start_ms;
            job.end_ms = end_ms;
            job.predicted = 3 << 29;
        }
        let text = render(&report);
        assert!(text.contains("farm: 3 of"), "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn a_build_that_governed_nothing_says_so_and_names_its_compilers() {
        let mut report = report();
        report.jobs.clear();
        report.outside = (1..=12)
            .map(|pid| outside(pid, "cc1plus", true, (100 + 50 * pid as u64) * MIB))
            .collect();
        report.outside[0].reason = "an unlisted process's reason is left out".into();
        report.outside[11].reason = "ran before the governor was listening".into();
        insta::assert_snapshot!(render(&report));
    }

    #[test]
    fn a_build_that_governed_nothing_and_saw_no_compiler_still_says_so() {
        let mut report = report();
        report.jobs.clear();
        report.outside.clear();
        report.build.parallelism_set.clear();
        let summary = render(&report);
        assert!(
            summary.contains("no compiler ran in this build (nothing to rebuild?)")
                && !summary.contains("WARNING"),
            "{summary}"
        );
        assert!(!summary.contains("headroom set"), "{summary}");
    }

    /// A build whose governor died has no end: its summary must not read like a finished
    /// build that had nothing to do.
    #[test]
    fn a_build_without_an_end_says_its_record_is_incomplete() {
        let mut report = report();
        report.jobs.clear();
        report.outside.clear();
        report.build.duration_ms = None;
        report.build.exit_code = None;
        report.build.peak_total = None;
        let summary = render(&report);
        assert!(summary.contains("INCOMPLETE record"), "{summary}");
        assert!(!summary.contains("nothing to rebuild"), "{summary}");
        assert!(!summary.contains('?'), "{summary}");
    }

    #[test]
    fn a_long_table_says_how_many_it_shows() {
        let mut report = report();
        let template = report.jobs[0].clone();
        report.jobs = (0..20)
            .map(|job_id| JobRecord {
                job_id,
                label: format!("o{job_id}.o"),
                prediction_source: "default".into(),
                ..template.clone()
            })
            .collect();
        let summary = render(&report);
        assert!(
            summary.contains("showing the 10 largest of 20 jobs"),
            "{summary}"
        );
        assert!(
            summary.contains("predicted from: default = nothing known yet"),
            "{summary}"
        );
    }
}
