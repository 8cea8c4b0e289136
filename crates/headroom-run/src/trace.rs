//! `headroom run --trace`: the run as Chrome trace event JSON (written by headroom-report's
//! `chrome_trace`, as `headroom build --trace` is), so a script's stages and memory can be read
//! in ui.perfetto.dev beside a profiler's trace of the same run. One track holds each rung of
//! the fallback ladder as a slice with its stages inside it; counters carry the tree's RSS,
//! its GPU memory, MemAvailable and `--memory-limit`; a rung that failed for lack of memory
//! ends in an instant event. Times are microseconds from the first rung's start.

use headroom_store::model::chrome_trace::Trace;
use serde_json::{json, Value};

use super::report::{Report, RungReport};

/// The one track of the rungs and their stages.
const RUNGS: u32 = 1;

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
