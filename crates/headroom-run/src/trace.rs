//! `headroom run --trace`: the run as Chrome trace event JSON (written by headroom-report's
//! `chrome_trace`, as `headroom build --trace` is), so a script's stages and memory can be read
//! in ui.perfetto.dev beside a profiler's trace of the same run. One track holds each rung of
//! the fallback ladder as a slice with its stages inside it; counters carry the tree's RSS,
//! its GPU memory, MemAvailable and `--memory-limit`; a rung that failed for lack of memory
//! ends in an instant event. The compilers the command started, each a governed job, lie on
//! tracks of their own below ("jobs 1", "jobs 2", …: jobs that overlap go to different tracks).
//! Times are microseconds from the first rung's start.

use headroom_report::chrome_trace::{lanes, Trace};
use serde_json::{json, Value};

use super::report::{GovernedJob, Report, RungReport};

/// The one track of the rungs and their stages.
const RUNGS: u32 = 1;
/// The first track of the governed jobs; the jobs' lanes follow it.
const FIRST_JOBS: u32 = 2;

pub fn render(report: &Report) -> Value {
    let mut trace = Trace::new(&format!("headroom run: {}", report.command.join(" ")));
    trace.track(RUNGS, "rungs");
    let origin = report.rungs.first().map_or(0.0, |rung| rung.started_unix);
    // Microseconds from the first rung's start to `seconds` into `rung`.
    let at = |rung: &RungReport, seconds: f64| {
        ((rung.started_unix - origin + seconds) * 1e6)
            .round()
            .max(0.0) as u64
    };
    let (mut rss, mut gpu, mut available) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = 0;
    for rung in &report.rungs {
        let (start, end) = (at(rung, 0.0), at(rung, rung.duration_s));
        let env: String = rung.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        trace.slice(
            RUNGS,
            "rung",
            &format!("rung {}: {env}{}", rung.rung, rung.command.join(" ")),
            start,
            end,
            json!({
                "command": rung.command,
                "env": rung.env,
                "exit_code": rung.exit_code,
                "signal": rung.signal,
                "succeeded": rung.succeeded,
                "peak": rung.peak,
                "tracking": rung.tracking,
            }),
        );
        for stage in &rung.stages {
            trace.slice(
                RUNGS,
                "stage",
                &stage.name,
                at(rung, stage.start_s).clamp(start, end),
                at(rung, stage.end_s).clamp(start, end),
                json!({
                    "entry": stage.entry_bytes,
                    "peak": stage.peak_bytes,
                    "exit": stage.exit_bytes,
                    "gpu_peak": stage.gpu_peak_bytes,
                }),
            );
        }
        if let Some(staged) = rung.diagnosis.as_ref().filter(|staged| staged.is_memory) {
            trace.instant(
                RUNGS,
                "out of memory",
                end,
                json!({
                    "kind": staged.diagnosis.kind.label(),
                    "stage": staged.stage,
                    "evidence": staged.diagnosis.evidence,
                }),
            );
        }
        for sample in &rung.samples {
            let t = at(rung, sample.t);
            rss.push((t, sample.rss));
            gpu.extend(sample.gpu.map(|bytes| (t, bytes)));
            available.extend(sample.mem_available.map(|bytes| (t, bytes)));
        }
        // The tree is gone once the rung has ended.
        rss.push((end, 0));
        if rung.samples.iter().any(|sample| sample.gpu.is_some()) {
            gpu.push((end, 0));
        }
        last = end;
    }
    let jobs: Vec<(&RungReport, &GovernedJob)> = report
        .rungs
        .iter()
        .flat_map(|rung| rung.jobs.iter().map(move |job| (rung, job)))
        .collect();
    let spans: Vec<(u64, u64)> = jobs
        .iter()
        .map(|&(rung, job)| (at(rung, job.start_s), at(rung, job.end_s)))
        .collect();
    let job_lanes = lanes(&spans);
    for lane in 1..=job_lanes.iter().copied().max().unwrap_or(0) {
        trace.track(FIRST_JOBS + lane - 1, &format!("jobs {lane}"));
    }
    for ((&(rung, job), &(start, end)), lane) in jobs.iter().zip(&spans).zip(job_lanes) {
        trace.slice(
            FIRST_JOBS + lane - 1,
            "job",
            &job.label,
            start,
            end,
            json!({
                "rung": rung.rung,
                "compiler": job.compiler,
                "stage": job.stage,
                "peak": job.peak,
                "predicted": job.predicted,
                "prediction_source": job.prediction_source,
                "state": job.state(),
                "attempts": job.attempts,
            }),
        );
    }
    trace.counter("RSS", rss);
    trace.counter("GPU memory", gpu);
    trace.counter("MemAvailable", available);
    if let Some(limit) = report.memory_limit {
        trace.counter("memory limit", [(0, limit), (last, limit)]);
    }
    trace.finish(json!({
        "headroom": "run",
        "command": report.command,
        "memory_limit": report.memory_limit,
        "interval_s": report.interval_s,
        "succeeded_rung": report.succeeded_rung,
        "interrupted": report.interrupted,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_snapshot() {
        let trace = render(&crate::report::tests::ladder());
        insta::assert_snapshot!(serde_json::to_string_pretty(&trace).unwrap());
    }

    #[test]
    fn overlapping_jobs_lie_on_tracks_of_their_own() {
        let trace = render(&crate::report::tests::ladder());
        let events = trace["traceEvents"].as_array().unwrap();
        let track_of = |label: &str| {
            events
                .iter()
                .find(|event| event["cat"] == "job" && event["name"] == label)
                .map(|event| event["tid"].as_u64().unwrap())
        };
        assert_eq!(track_of("kernels/attention.o"), Some(2));
        assert_eq!(track_of("kernels/gemm.o"), Some(3));
        let named: Vec<&str> = events
            .iter()
            .filter(|event| event["name"] == "thread_name")
            .filter_map(|event| event["args"]["name"].as_str())
            .collect();
        assert_eq!(named, ["rungs", "jobs 1", "jobs 2"]);
    }
}
