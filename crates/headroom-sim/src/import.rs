//! Turns one `headroom build` run (its `--report` JSON, or `headroom report BUILD --json`)
//! into a trace, so the simulator replays builds that really happened.
//!
//! A report does not say which job waited for which, but its commands name files. The trace
//! makes each job depend on every job that had ended when the build system offered it, except
//! those whose output other jobs are seen to read and it does not name: a compile offered
//! after another ended (because `-j` had no free slot, not because it read its object) does
//! not wait for it when the trace is replayed with more cores, and a link still waits for the
//! objects it names. An output no governed job names may be read by something headroom does
//! not see (`ar` packing objects into the archive a link reads, a build script), so jobs
//! offered after it ended keep waiting for it. Replayed on the machine and `-j` it was
//! recorded with, the trace runs as the build did. Stretches when no governed job ran (build
//! scripts, code generators, `ar`) become `(ungoverned work)` jobs of the same length, which
//! wait for everything that ended before them and hold up everything offered after them.

use headroom_report::BuildReport;

use crate::machine::Machine;
use crate::trace::{JobKind, Recording, Trace, TraceJob, SCHEMA};

/// Profile points kept per job: enough for the shape, few enough to keep traces small.
const PROFILE_POINTS: usize = 12;
/// Idle stretches shorter than this are scheduling noise, not work.
const MIN_GAP_MS: u64 = 300;
const UNGOVERNED_BYTES: u64 = 16 << 20;

/// What the report itself does not know about the recording.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub name: String,
    /// The machine the build ran on.
    pub machine: Machine,
    /// The `-j` the build system ran with.
    pub jobs_flag: usize,
    /// For each of the report's jobs, one entry each, the jobs (by index in the report) whose
    /// output files its command names (`headroom_govern::last_build::named_inputs`).
    pub named_inputs: Vec<Vec<usize>>,
}

/// One span of the build: a governed job or an ungoverned stretch between jobs.
struct Span {
    /// The job's index in the report; `None` for an ungoverned stretch.
    report_index: Option<usize>,
    offered_ms: u64,
    start_ms: u64,
    end_ms: u64,
    job: TraceJob,
}

/// Builds the trace of `report`.
pub fn trace_from_report(report: &BuildReport, options: &ImportOptions) -> Trace {
    let mut spans: Vec<Span> = report
        .jobs
        .iter()
        .enumerate()
        .map(|(report_index, job)| {
            let duration_ms = job.end_ms.saturating_sub(job.start_ms).max(1);
            let mut profile: Vec<(f64, u64)> = report
                .samples
                .iter()
                .filter(|sample| {
                    sample.job_id == job.job_id
                        && (job.start_ms..=job.end_ms).contains(&sample.t_ms)
                })
                .map(|sample| ((sample.t_ms - job.start_ms) as f64 / 1000.0, sample.bytes))
                .collect();
            thin(&mut profile);
            Span {
                report_index: Some(report_index),
                offered_ms: job.offered_ms,
                start_ms: job.start_ms,
                end_ms: job.end_ms,
                job: TraceJob {
                    label: file_name(&job.label),
                    group: job.group.clone(),
                    kind: kind_of(&job.command),
                    deps: Vec::new(),
                    peak: job.peak.max(1),
                    duration: duration_ms as f64 / 1000.0,
                    cpu: job.cpu_ms as f64 / 1000.0,
                    profile,
                    input_bytes: None,
                },
            }
        })
        .collect();
    spans.extend(ungoverned_stretches(&spans));
    spans.sort_by_key(|span| (span.offered_ms, span.start_ms));
    assert_eq!(
        options.named_inputs.len(),
        report.jobs.len(),
        "named inputs for each job of the report"
    );
    let reads = Reads::new(&options.named_inputs);
    let mut jobs = Vec::with_capacity(spans.len());
    for (index, span) in spans.iter().enumerate() {
        let mut job = span.job.clone();
        job.deps = spans[..index]
            .iter()
            .enumerate()
            .filter(|(_, earlier)| {
                earlier.end_ms <= span.offered_ms
                    && reads.waited(span.report_index, earlier.report_index)
            })
            .map(|(dep, _)| dep)
            .collect();
        jobs.push(job);
    }
    Trace {
        schema: SCHEMA,
        name: options.name.clone(),
        source: Some(format!("headroom build, build {}", report.build.id)),
        recorded: report.build.duration_ms.map(|wall_ms| Recording {
            cores: options.machine.cores,
            memory: options.machine.memory,
            jobs_flag: options.jobs_flag,
            wall_seconds: wall_ms as f64 / 1000.0,
            command: report.build.command.clone(),
        }),
        jobs,
    }
}

/// Which of the report's jobs read which one's output, as their commands name it.
struct Reads<'a> {
    named_inputs: &'a [Vec<usize>],
    /// Whether any job names the job's output.
    read_by_a_job: Vec<bool>,
}

impl<'a> Reads<'a> {
    fn new(named_inputs: &'a [Vec<usize>]) -> Self {
        let mut read_by_a_job = vec![false; named_inputs.len()];
        for &input in named_inputs.iter().flatten() {
            read_by_a_job[input] = true;
        }
        Reads {
            named_inputs,
            read_by_a_job,
        }
    }

    /// Whether the span `job` waited for the span `earlier`, which had ended when `job` was
    /// offered (spans by report index, `None` for ungoverned stretches): unless jobs are seen
    /// to read what `earlier` made and `job`, a governed job, does not name it.
    fn waited(&self, job: Option<usize>, earlier: Option<usize>) -> bool {
        let (Some(job), Some(earlier)) = (job, earlier) else {
            return true;
        };
        !self.read_by_a_job[earlier] || self.named_inputs[job].contains(&earlier)
    }
}

/// The last part of a path: labels are often absolute paths, which must not leak into a
/// committed trace and mean nothing on another machine.
fn file_name(label: &str) -> String {
    label
        .rsplit('/')
        .find(|part| !part.is_empty())
        .unwrap_or(label)
        .to_string()
}

/// Compiles have `-c` (or are rustc); anything else a compiler driver runs is a link.
fn kind_of(command: &str) -> JobKind {
    let words: Vec<&str> = command.split_whitespace().collect();
    let is_rustc = words
        .first()
        .is_some_and(|program| program.ends_with("rustc"));
    if is_rustc || words.contains(&"-c") {
        JobKind::Compile
    } else {
        JobKind::Link
    }
}

/// Keeps at most [`PROFILE_POINTS`] evenly spread samples, always including the highest.
fn thin(profile: &mut Vec<(f64, u64)>) {
    if profile.len() <= PROFILE_POINTS {
        return;
    }
    let highest = profile
        .iter()
        .enumerate()
        .max_by_key(|(_, point)| point.1)
        .map_or(0, |(index, _)| index);
    let step = profile.len() as f64 / (PROFILE_POINTS - 1) as f64;
    let mut keep: Vec<usize> = (0..PROFILE_POINTS - 1)
        .map(|slot| (slot as f64 * step) as usize)
        .chain([highest, profile.len() - 1])
        .collect();
    keep.sort_unstable();
    keep.dedup();
    *profile = keep.into_iter().map(|index| profile[index]).collect();
}

/// The stretches of the build when no governed job ran, each as one job.
fn ungoverned_stretches(spans: &[Span]) -> Vec<Span> {
    let mut by_start: Vec<(u64, u64)> = spans
        .iter()
        .map(|span| (span.start_ms, span.end_ms))
        .collect();
    by_start.sort_unstable();
    let mut stretches = Vec::new();
    let mut busy_until = 0;
    for (start, end) in by_start {
        if start >= busy_until + MIN_GAP_MS {
            let seconds = (start - busy_until) as f64 / 1000.0;
            stretches.push(Span {
                report_index: None,
                offered_ms: busy_until,
                start_ms: busy_until,
                end_ms: start,
                job: TraceJob {
                    label: "(ungoverned work)".into(),
                    group: "(ungoverned)".into(),
                    kind: JobKind::Other,
                    deps: Vec::new(),
                    peak: UNGOVERNED_BYTES,
                    duration: seconds,
                    cpu: seconds,
                    profile: Vec::new(),
                    input_bytes: None,
                },
            });
        }
        busy_until = busy_until.max(end);
    }
    stretches
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_report::{BuildRecord, JobRecord, Sample};

    fn job(job_id: u64, command: &str, offered_ms: u64, start_ms: u64, end_ms: u64) -> JobRecord {
        JobRecord {
            job_id,
            key: format!("key{job_id}"),
            group: "g++ -O2".into(),
            label: format!("out{job_id}"),
            compiler: "g++".into(),
            command: command.into(),
            cwd: ".".into(),
            offered_ms,
            start_ms,
            end_ms,
            peak: 100 << 20,
            cpu_ms: end_ms - start_ms,
            exit_code: Some(0),
            prediction_source: "default".into(),
            attempts: 1,
            ..JobRecord::default()
        }
    }

    /// A report of build 3, `make -j2`, that ran `jobs` in 9 s.
    fn report(jobs: Vec<JobRecord>) -> BuildReport {
        BuildReport {
            schema: headroom_report::REPORT_SCHEMA,
            build: BuildRecord {
                id: 3,
                started_unix_ms: 0,
                duration_ms: Some(9000),
                command: "make -j2".into(),
                cwd: ".".into(),
                budget: 1 << 30,
                budget_source: "test".into(),
                slots: 2,
                exit_code: Some(0),
                peak_total: None,
                parallelism_set: Vec::new(),
            },
            jobs,
            samples: Vec::new(),
            outside: Vec::new(),
            events: Vec::new(),
            room: Vec::new(),
        }
    }

    #[test]
    fn a_report_becomes_a_replayable_trace() {
        let report = BuildReport {
            jobs: vec![
                job(0, "g++ -c a.cc -o a.o", 0, 0, 2000),
                job(1, "g++ -c b.cc -o b.o", 0, 0, 3000),
                JobRecord {
                    label: "/home/someone/project/app".into(),
                    ..job(2, "g++ a.o b.o -o app", 5000, 5000, 9000)
                },
            ],
            samples: vec![
                Sample {
                    t_ms: 1000,
                    job_id: 0,
                    bytes: 50 << 20,
                },
                Sample {
                    t_ms: 1900,
                    job_id: 0,
                    bytes: 90 << 20,
                },
            ],
            ..report(Vec::new())
        };
        let options = ImportOptions {
            name: "tiny".into(),
            machine: "2c/24G".parse().expect("valid machine"),
            jobs_flag: 2,
            named_inputs: vec![vec![], vec![], vec![0, 1]],
        };
        let trace = trace_from_report(&report, &options);
        trace.validate().expect("valid trace");
        let labels: Vec<&str> = trace.jobs.iter().map(|job| job.label.as_str()).collect();
        assert_eq!(labels, ["out0", "out1", "(ungoverned work)", "app"]);
        assert_eq!(trace.jobs[2].duration, 2.0);
        assert_eq!(trace.jobs[2].deps, [0, 1]);
        assert_eq!(trace.jobs[3].deps, [0, 1, 2]);
        assert_eq!(trace.jobs[3].kind, JobKind::Link);
        assert_eq!(trace.jobs[0].profile, [(1.0, 50 << 20), (1.9, 90 << 20)]);
        assert_eq!(trace.recorded.expect("recorded").wall_seconds, 9.0);
    }

    #[test]
    fn a_job_waits_for_what_it_reads_and_what_nobody_is_seen_to_read() {
        // Recorded at -j1: each job was offered when the one before it ended.
        let jobs = vec![
            job(0, "g++ -c a.cc -o a.o", 0, 0, 2000),
            job(1, "g++ -c b.cc -o b.o", 2000, 2000, 4000),
            // Packed by `ar`, which headroom does not see, into an archive the link reads.
            job(2, "g++ -c c.cc -o c.o", 4000, 4000, 6000),
            job(3, "g++ a.o b.o libc.a -o app", 6000, 6000, 8000),
            job(4, "g++ -c d.cc -o d.o", 8000, 8000, 9000),
        ];
        let report = report(jobs);
        let options = ImportOptions {
            name: "sequential".into(),
            machine: "2c/24G".parse().expect("valid machine"),
            jobs_flag: 1,
            named_inputs: vec![vec![], vec![], vec![], vec![0, 1], vec![]],
        };
        let trace = trace_from_report(&report, &options);
        trace.validate().expect("valid trace");
        let deps: Vec<&[usize]> = trace.jobs.iter().map(|job| job.deps.as_slice()).collect();
        let none: &[usize] = &[];
        assert_eq!(deps, [none, none, none, &[0, 1, 2], &[2, 3]]);
    }
}
