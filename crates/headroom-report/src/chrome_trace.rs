//! Chrome's trace event JSON, the format ui.perfetto.dev and chrome://tracing open, so that a
//! build (`headroom build --trace`, `headroom report --trace`) or a run (`headroom run
//! --trace`) can be read beside any other trace. [`Trace`] writes the events both commands
//! share; [`build_trace`] lays a build out with it.
//!
//! Times are microseconds from the start. Complete events on one track must nest, so jobs that
//! overlap go to different "slot" tracks: each job takes the lowest track free at its start.
//! A report counts each job's suspends, requeues and OOM retries but not when they happened,
//! so they are args of the job's slice, not instant events: no time is made up. The one
//! instant of a build is a job whose last attempt died of a signal, at its end. Reports hold
//! no MemAvailable readings and no description of the machine, so the trace has neither.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::{BuildReport, JobEvent, JobRecord};

/// The one process of a trace; its tracks are its threads.
const PID: u32 = 1;

/// Trace events being gathered: named tracks, their slices and instants, and counters.
pub struct Trace {
    events: Vec<Value>,
}

impl Trace {
    /// A trace whose process is called `process`.
    pub fn new(process: &str) -> Trace {
        Trace {
            events: vec![metadata("process_name", 0, process)],
        }
    }

    /// Names track `tid` (from 1).
    pub fn track(&mut self, tid: u32, name: &str) {
        self.events.push(metadata("thread_name", tid, name));
    }

    /// A slice on track `tid` from `start_us` to `end_us`.
    pub fn slice(
        &mut self,
        tid: u32,
        cat: &str,
        name: &str,
        start_us: u64,
        end_us: u64,
        args: Value,
    ) {
        self.events.push(json!({
            "ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid,
            "ts": start_us, "dur": end_us.saturating_sub(start_us), "args": args,
        }));
    }

    /// A moment on track `tid`. Its phase is `I`, as Chrome writes it and DevTools reads it;
    /// Perfetto and chrome://tracing read `I` and the `i` of the format's document alike.
    pub fn instant(&mut self, tid: u32, name: &str, at_us: u64, args: Value) {
        self.events.push(json!({
            "ph": "I", "s": "t", "cat": "event", "name": name, "pid": PID, "tid": tid,
            "ts": at_us, "args": args,
        }));
    }

    /// A counter track of bytes over time, from `(µs, bytes)` points; viewers call it
    /// `NAME bytes`.
    pub fn counter(&mut self, name: &str, points: impl IntoIterator<Item = (u64, u64)>) {
        for (at_us, bytes) in points {
            self.events.push(json!({
                "ph": "C", "cat": "memory", "name": name, "pid": PID, "tid": 0,
                "ts": at_us, "args": {"bytes": bytes},
            }));
        }
    }

    /// The whole trace, with `about` (what ran, with which limits) as its `otherData`.
    pub fn finish(self, about: Value) -> Value {
        json!({"traceEvents": self.events, "displayTimeUnit": "ms", "otherData": about})
    }
}

fn metadata(kind: &str, tid: u32, name: &str) -> Value {
    json!({
        "ph": "M", "cat": "__metadata", "name": kind, "pid": PID, "tid": tid,
        "args": {"name": name},
    })
}

/// The build as the Chrome trace file `--trace` writes: [`build_trace`] as JSON.
pub fn to_json(report: &BuildReport) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&build_trace(report))
}

/// A build as a trace: each job a slice on a slot track with its suspensions, resumptions,
/// kills and OOMs as instants, the jobs' total memory, the budget and what the machine could
/// still hand out as counters, and the build record (command, budget and its source, slots)
/// as `otherData`.
pub fn build_trace(report: &BuildReport) -> Value {
    let build = &report.build;
    let mut trace = Trace::new(&format!("headroom build {}: {}", build.id, build.command));
    let tracks = slot_tracks(&report.jobs);
    for track in 1..=tracks.iter().copied().max().unwrap_or(0) {
        trace.track(track, &format!("slot {track}"));
    }
    // Each job's events, in time order, found once rather than by scanning all events per job.
    let mut events_of: BTreeMap<u64, Vec<&JobEvent>> = BTreeMap::new();
    for event in &report.events {
        events_of.entry(event.job_id).or_default().push(event);
    }
    for (job, &track) in report.jobs.iter().zip(&tracks) {
        let (start, end) = (micros(job.start_ms), micros(job.end_ms));
        trace.slice(track, "job", &job.label, start, end, job_args(job));
        for event in events_of.remove(&job.job_id).unwrap_or_default() {
            trace.instant(
                track,
                event.kind.name(),
                micros(event.t_ms),
                json!({"job": job.job_id, "label": job.label}),
            );
        }
        if let Some(signal) = job.signal {
            trace.instant(
                track,
                &format!("killed by signal {signal}"),
                end,
                json!({"job": job.job_id, "label": job.label}),
            );
        }
    }
    trace.counter(
        "memory of jobs",
        jobs_memory(report)
            .into_iter()
            .map(|(t_ms, bytes)| (micros(t_ms), bytes)),
    );
    let last_ms = report
        .jobs
        .iter()
        .map(|job| job.end_ms)
        .chain(report.samples.iter().map(|sample| sample.t_ms))
        .chain(build.duration_ms)
        .max()
        .unwrap_or(0);
    trace.counter(
        "budget",
        [(0, build.budget), (micros(last_ms), build.budget)],
    );
    if !report.room.is_empty() {
        trace.counter(
            "MemAvailable",
            report
                .room
                .iter()
                .map(|room| (micros(room.t_ms), room.bytes)),
        );
    }
    trace.finish(json!({"headroom": "build", "build": build}))
}

fn micros(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

fn job_args(job: &JobRecord) -> Value {
    json!({
        "job": job.job_id,
        "command": job.command,
        "label": job.label,
        "peak": job.peak,
        "predicted": job.predicted,
        "prediction_source": job.prediction_source,
        "nice": job.nice,
        "attempts": job.attempts,
        "suspends": job.suspends,
        "requeues": job.requeues,
        "oom_retries": job.oom_retries,
        "exit_code": job.exit_code,
        "signal": job.signal,
        "lowered_flags": job.lowered_flags,
        "over_budget": job.over_budget,
    })
}

/// The track of each job, in the order of `jobs`, from 1: the lowest whose last job had ended
/// by the job's start (see [`lanes`]).
fn slot_tracks(jobs: &[JobRecord]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (jobs[i].start_ms, jobs[i].job_id));
    let spans: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| (jobs[i].start_ms, jobs[i].end_ms))
        .collect();
    let mut tracks = vec![0; jobs.len()];
    for (&i, lane) in order.iter().zip(lanes(&spans)) {
        tracks[i] = lane;
    }
    tracks
}

/// The lane of each `(start, end)` span, in their order, from 1: taken by start (the earlier
/// span first where two start together), each span goes to the lowest lane whose last span
/// had ended by its start. Spans on one lane never overlap, as slices on one track must not.
pub fn lanes(spans: &[(u64, u64)]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].0, i));
    let mut free_from: Vec<u64> = Vec::new();
    let mut lanes = vec![0; spans.len()];
    for i in order {
        let (start, end) = spans[i];
        let lane = match free_from.iter().position(|&free| free <= start) {
            Some(lane) => lane,
            None => {
                free_from.push(0);
                free_from.len() - 1
            }
        };
        free_from[lane] = end.max(start);
        lanes[i] = lane as u32 + 1;
    }
    lanes
}

/// `(ms, bytes)`: the memory of the jobs running at each sample and each job's end, every job
/// counted at its latest sample until it ends.
fn jobs_memory(report: &BuildReport) -> Vec<(u64, u64)> {
    // At one moment samples come before ends: `false` sorts first.
    let mut changes: Vec<(u64, bool, u64, u64)> = report
        .samples
        .iter()
        .map(|s| (s.t_ms, false, s.job_id, s.bytes))
        .chain(
            report
                .jobs
                .iter()
                .map(|job| (job.end_ms, true, job.job_id, 0)),
        )
        .collect();
    changes.sort_unstable();
    let mut running: BTreeMap<u64, u64> = BTreeMap::new();
    let mut points: Vec<(u64, u64)> = Vec::new();
    for (t_ms, ended, job_id, bytes) in changes {
        if ended {
            running.remove(&job_id);
        } else {
            running.insert(job_id, bytes);
        }
        let total = running.values().sum();
        match points.last_mut() {
            Some(last) if last.0 == t_ms => last.1 = total,
            _ => points.push((t_ms, total)),
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BuildRecord, Sample, REPORT_SCHEMA};

    fn job(job_id: u64, start_ms: u64, end_ms: u64) -> JobRecord {
        JobRecord {
            job_id,
            label: format!("{job_id}.o"),
            start_ms,
            end_ms,
            ..JobRecord::default()
        }
    }

    fn report(jobs: Vec<JobRecord>, samples: Vec<Sample>) -> BuildReport {
        BuildReport {
            schema: REPORT_SCHEMA,
            build: BuildRecord {
                id: 1,
                started_unix_ms: 0,
                duration_ms: Some(5000),
                command: "make -j2".into(),
                cwd: "/src".into(),
                budget: 1000,
                budget_source: "test".into(),
                slots: 2,
                exit_code: Some(0),
                peak_total: None,
                parallelism_set: Vec::new(),
            },
            jobs,
            samples,
            outside: Vec::new(),
            events: Vec::new(),
            room: Vec::new(),
        }
    }

    fn sample(t_ms: u64, job_id: u64, bytes: u64) -> Sample {
        Sample {
            t_ms,
            job_id,
            bytes,
        }
    }

    #[test]
    fn overlapping_jobs_take_the_lowest_free_slot() {
        let jobs = [
            job(0, 0, 100),
            job(1, 50, 300),
            job(2, 100, 200),
            job(3, 150, 250),
        ];
        assert_eq!(slot_tracks(&jobs), [1, 2, 1, 3]);
    }

    #[test]
    fn jobs_count_at_their_latest_sample_until_they_end() {
        let report = report(
            vec![job(0, 0, 100), job(1, 0, 300)],
            vec![sample(50, 0, 10), sample(50, 1, 20), sample(200, 1, 30)],
        );
        assert_eq!(
            jobs_memory(&report),
            [(50, 30), (100, 20), (200, 30), (300, 0)]
        );
    }

    #[test]
    fn a_build_has_slot_tracks_job_slices_counters_and_its_record() {
        let mut killed = job(1, 50, 300);
        killed.signal = Some(9);
        let trace = build_trace(&report(
            vec![job(0, 0, 100), killed],
            vec![sample(50, 0, 10)],
        ));
        let events = trace["traceEvents"].as_array().unwrap();
        let of = |ph: &'static str| events.iter().filter(move |e| e["ph"] == ph);
        let slices: Vec<(&Value, &Value, &Value)> = of("X")
            .map(|e| (&e["name"], &e["tid"], &e["dur"]))
            .collect();
        assert_eq!(
            slices,
            [
                (&json!("0.o"), &json!(1), &json!(100_000)),
                (&json!("1.o"), &json!(2), &json!(250_000))
            ]
        );
        let names: Vec<&Value> = of("M").map(|e| &e["args"]["name"]).collect();
        assert_eq!(
            names,
            [
                &json!("headroom build 1: make -j2"),
                &json!("slot 1"),
                &json!("slot 2")
            ]
        );
        let instants: Vec<&Value> = of("I").map(|e| &e["ts"]).collect();
        assert_eq!(instants, [&json!(300_000)]);
        let budget: Vec<&Value> = of("C")
            .filter(|e| e["name"] == "budget")
            .map(|e| &e["ts"])
            .collect();
        assert_eq!(budget, [&json!(0), &json!(5_000_000)]);
        assert_eq!(trace["otherData"]["build"]["budget_source"], "test");
    }
}
