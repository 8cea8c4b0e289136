//! A trace turned into what one simulation run needs: each job's memory curve over its own
//! progress, its CPU demand, its dependents, and the run-to-run variation drawn from the seed
//! (the same translation unit never peaks at exactly the same bytes twice).

use std::collections::HashMap;

use headroom_sched::budget::BudgetSpec;
use headroom_sched::chain::{self, Finished};
use headroom_sched::{JobId, Profile, ProfileRecorder, Ran, SessionId};

use crate::machine::FarmSpec;
use crate::trace::{JobKind, Trace, TraceJob};

/// How a run is set up: how it departs from the recorded trace, how often policies sample,
/// the budget headroom is given, and the farm beside the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Seconds between the policy's sampling ticks (the live governor samples every 100 ms).
    pub tick: f64,
    /// Seeds the run-to-run variation.
    pub seed: u64,
    /// Largest relative change of each job's peak and duration against the trace (0.03 = ±3%).
    pub variation: f64,
    /// Change of every job's peak against the trace, on top of the variation (0.1 = all 10%
    /// larger): what moves all jobs together, such as an edited header every unit includes
    /// or a newer compiler, and what no history knows of yet.
    pub growth: f64,
    /// headroom's `--budget` (and the clairvoyant reference's), out of the machine's memory:
    /// by default the governor's, the memory less its reserve.
    pub budget: BudgetSpec,
    /// The build farm beside the machine, when the build has one: policies that know of
    /// farms send compiles to its nodes.
    pub farm: Option<FarmSpec>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            tick: 0.1,
            seed: 1,
            variation: 0.03,
            growth: 0.0,
            budget: BudgetSpec::Auto,
            farm: None,
        }
    }
}

/// One job as this run sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimJob {
    pub id: JobId,
    /// The session (one `headroom build` of several at once) whose build offers it; 0 when
    /// one build runs alone.
    pub session: SessionId,
    pub label: String,
    /// The job's group key, numbered in order of first appearance in the trace.
    pub group: u64,
    pub kind: JobKind,
    pub deps: Vec<usize>,
    /// Seconds of work at full speed.
    pub duration: f64,
    /// Cores the job keeps busy while it runs (at least one).
    pub threads: f64,
    /// The peak this run reaches.
    pub peak: u64,
    /// The peak recorded in the trace: what a warm history knows about the job.
    pub history_peak: u64,
    /// The profile the governor would have recorded on the trace's run, sampling every tick.
    pub history_profile: Option<Profile>,
    /// Seconds of work the job took, and its peak, in the build before the trace's run (the
    /// trace's figures with a variation of their own): with the trace's run, what a warm
    /// governor reads from its last two builds about how far jobs stray between runs.
    pub earlier_duration: f64,
    pub earlier_peak: u64,
    pub input_bytes: Option<u64>,
    /// (seconds of progress, bytes) points, first at 0 and last at `duration`.
    curve: Vec<(f64, f64)>,
}

/// Progress within this much of a breakpoint or of the end counts as reaching it, so that
/// rounding never leaves a sliver of work that takes an event of its own.
pub(crate) const PROGRESS_EPSILON: f64 = 1e-9;

impl SimJob {
    /// Index of the curve segment that `progress` lies in, searching forward from `from`.
    pub(crate) fn segment_at(&self, progress: f64, from: usize) -> usize {
        segment_of(&self.curve, progress, from)
    }

    /// Bytes in use after `progress` seconds of work, within `segment`.
    pub(crate) fn memory_at(&self, progress: f64, segment: usize) -> f64 {
        curve_at(&self.curve, progress, segment)
    }

    /// Bytes gained per second of progress within `segment`.
    pub(crate) fn slope(&self, segment: usize) -> f64 {
        let (start, low) = self.curve[segment];
        let (end, high) = self.curve[segment + 1];
        if end <= start {
            0.0
        } else {
            (high - low) / (end - start)
        }
    }

    /// Progress at which `segment` ends.
    pub(crate) fn segment_end(&self, segment: usize) -> f64 {
        self.curve[segment + 1].0
    }

    /// The most bytes in use between `from` and `to` seconds of progress (0 past the end).
    pub(crate) fn highest_between(&self, from: f64, to: f64) -> f64 {
        if from >= self.duration {
            return 0.0;
        }
        let to = to.min(self.duration);
        let first = self.segment_at(from, 0);
        let last = self.segment_at(to, first);
        let corners = self.curve[first + 1..=last].iter().map(|&(_, bytes)| bytes);
        corners
            .chain([self.memory_at(from, first), self.memory_at(to, last)])
            .fold(0.0, f64::max)
    }

    /// Byte-seconds the job occupies over its life when it runs undisturbed.
    pub fn memory_area(&self) -> f64 {
        self.curve
            .windows(2)
            .map(|pair| (pair[1].0 - pair[0].0) * (pair[0].1 + pair[1].1) / 2.0)
            .sum()
    }

    /// Core-seconds the job consumes.
    pub fn core_seconds(&self) -> f64 {
        self.duration * self.threads
    }
}

/// A trace prepared for simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub jobs: Vec<SimJob>,
    /// For each job, the jobs that list it as a dependency.
    pub dependents: Vec<Vec<usize>>,
}

impl Workload {
    /// Prepares `trace` (which must have passed [`Trace::validate`]) for a run.
    pub fn new(trace: &Trace, config: &SimConfig) -> Workload {
        let rng = |offset| fastrand::Rng::with_seed(config.seed.wrapping_add(offset));
        // This run, and the run before the trace's, each vary with seeds of their own.
        let mut this_run = rng(0);
        let (mut earlier_durations, mut earlier_peaks) = (rng(1), rng(2));
        let vary = |rng: &mut fastrand::Rng| 1.0 + config.variation * (2.0 * rng.f64() - 1.0);
        let mut groups: HashMap<&str, u64> = HashMap::new();
        let mut dependents = vec![Vec::new(); trace.jobs.len()];
        let mut jobs = Vec::with_capacity(trace.jobs.len());
        for (index, job) in trace.jobs.iter().enumerate() {
            let next_group = groups.len() as u64;
            let group = *groups.entry(job.group.as_str()).or_insert(next_group);
            for &dep in &job.deps {
                dependents[dep].push(index);
            }
            let peak_factor = (1.0 + config.growth) * vary(&mut this_run);
            let duration = job.duration * vary(&mut this_run);
            let peak = (job.peak as f64 * peak_factor).round().max(1.0);
            let recorded = curve(&job.profile, job.duration, job.duration, job.peak as f64);
            let threads = (job.cpu / job.duration).max(1.0);
            jobs.push(SimJob {
                id: index as JobId,
                session: 0,
                label: job.label.clone(),
                group,
                kind: job.kind,
                deps: job.deps.clone(),
                duration,
                threads,
                peak: peak as u64,
                history_peak: job.peak,
                history_profile: sampled_profile(&recorded, job.duration, threads, config.tick),
                earlier_duration: job.duration * vary(&mut earlier_durations),
                earlier_peak: (job.peak as f64 * vary(&mut earlier_peaks)).round() as u64,
                input_bytes: job.input_bytes,
                curve: curve(&job.profile, job.duration, duration, peak),
            });
        }
        Workload {
            name: trace.name.clone(),
            jobs,
            dependents,
        }
    }

    /// The builds of `traces` run at once on one machine, the i-th as session i: their jobs
    /// together, each build's with its own dependencies, labelled `i:LABEL` (two sessions may
    /// build the same trace) and named `A + B`. Jobs of the same compiler and flags form one
    /// group across sessions, as they do for one governor.
    pub fn sessions(traces: &[Trace], config: &SimConfig) -> Workload {
        let mut union = Trace {
            schema: crate::trace::SCHEMA,
            name: traces
                .iter()
                .map(|trace| trace.name.as_str())
                .collect::<Vec<_>>()
                .join(" + "),
            source: None,
            recorded: None,
            jobs: Vec::new(),
        };
        let mut sessions = Vec::new();
        for (session, trace) in traces.iter().enumerate() {
            let offset = union.jobs.len();
            union.jobs.extend(trace.jobs.iter().map(|job| TraceJob {
                label: format!("{session}:{}", job.label),
                deps: job.deps.iter().map(|dep| dep + offset).collect(),
                ..job.clone()
            }));
            sessions.resize(union.jobs.len(), session as SessionId);
        }
        let mut workload = Workload::new(&union, config);
        for (job, session) in workload.jobs.iter_mut().zip(sessions) {
            job.session = session;
        }
        workload
    }

    /// How many sessions offer its jobs.
    pub fn session_count(&self) -> usize {
        self.jobs
            .iter()
            .map(|job| job.session as usize + 1)
            .max()
            .unwrap_or(1)
    }

    /// The same jobs, all offered by one session: one build over the union of the sessions'.
    pub fn as_one_session(&self) -> Workload {
        let mut one = self.clone();
        for job in &mut one.jobs {
            job.session = 0;
        }
        one
    }

    /// The largest peak of any job in this run.
    pub fn largest_peak(&self) -> u64 {
        self.jobs.iter().map(|job| job.peak).max().unwrap_or(0)
    }

    /// For each job, its own seconds in this run plus the longest chain of work that waits
    /// on it: how long the build goes on from its start at best.
    pub fn chains(&self) -> Vec<f64> {
        let finished: Vec<Finished> = self
            .jobs
            .iter()
            .map(|job| Finished {
                seconds: job.duration,
                inputs: job.deps.clone(),
            })
            .collect();
        chain::waiting_seconds(&finished)
            .into_iter()
            .zip(&self.jobs)
            .map(|(waiting, job)| job.duration + waiting)
            .collect()
    }
}

/// Scales a recorded profile to a curve that starts at progress 0, ends at `duration` and
/// peaks at `peak`. A missing or empty profile becomes a straight ramp from 0 to the peak.
fn curve(profile: &[(f64, u64)], recorded: f64, duration: f64, peak: f64) -> Vec<(f64, f64)> {
    let highest = profile.iter().map(|&(_, bytes)| bytes).max().unwrap_or(0);
    if highest == 0 {
        return vec![(0.0, 0.0), (duration, peak)];
    }
    let time_scale = duration / recorded;
    let byte_scale = peak / highest as f64;
    let mut points = vec![(0.0, 0.0)];
    for &(seconds, bytes) in profile {
        let at = (seconds.min(recorded) * time_scale).max(points[points.len() - 1].0);
        points.push((at, bytes as f64 * byte_scale));
    }
    let last = points[points.len() - 1];
    if last.0 < duration {
        points.push((duration, last.1));
    }
    points
}

/// Index of the segment of `curve` that `progress` lies in, searching forward from `from`.
fn segment_of(curve: &[(f64, f64)], progress: f64, from: usize) -> usize {
    let mut segment = from;
    while segment + 2 < curve.len() && progress >= curve[segment + 1].0 - PROGRESS_EPSILON {
        segment += 1;
    }
    segment
}

/// Bytes in use on `curve` after `progress` seconds, within `segment`.
fn curve_at(curve: &[(f64, f64)], progress: f64, segment: usize) -> f64 {
    let (start, low) = curve[segment];
    let (end, high) = curve[segment + 1];
    if end <= start {
        return high;
    }
    let fraction = ((progress - start) / (end - start)).clamp(0.0, 1.0);
    low + (high - low) * fraction
}

/// The profile of a job that followed `curve` for `duration` seconds on `threads` cores,
/// recorded as the governor records one: a sample every `tick`.
fn sampled_profile(
    curve: &[(f64, f64)],
    duration: f64,
    threads: f64,
    tick: f64,
) -> Option<Profile> {
    let mut recorder = ProfileRecorder::default();
    let mut segment = 0;
    let mut seconds = tick;
    while seconds <= duration {
        segment = segment_of(curve, seconds, segment);
        let bytes = curve_at(curve, seconds, segment).round() as u64;
        recorder.record(seconds * threads, bytes);
        seconds += tick;
    }
    recorder.finish(Ran {
        cpu_seconds: duration * threads,
        wall_seconds: duration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(profile: Vec<(f64, u64)>) -> SimJob {
        let trace = Trace {
            schema: crate::trace::SCHEMA,
            name: "t".into(),
            source: None,
            recorded: None,
            jobs: vec![crate::trace::TraceJob {
                label: "a.o".into(),
                group: "cc".into(),
                kind: JobKind::Compile,
                deps: vec![],
                peak: 1000,
                duration: 10.0,
                cpu: 20.0,
                profile,
                input_bytes: None,
            }],
        };
        let config = SimConfig {
            variation: 0.0,
            ..SimConfig::default()
        };
        Workload::new(&trace, &config).jobs.remove(0)
    }

    #[test]
    fn a_profile_is_scaled_to_the_peak_and_interpolated() {
        let job = job(vec![(2.0, 50), (5.0, 100), (8.0, 60)]);
        assert_eq!(job.threads, 2.0);
        let at = |progress: f64| job.memory_at(progress, job.segment_at(progress, 0));
        assert_eq!(at(0.0), 0.0);
        assert_eq!(at(2.0), 500.0);
        assert_eq!(at(3.5), 750.0);
        assert_eq!(at(5.0), 1000.0);
        assert_eq!(at(9.0), 600.0);
        assert_eq!(at(10.0), 600.0);
    }

    #[test]
    fn highest_between_sees_a_peak_inside_the_span() {
        let job = job(vec![(2.0, 50), (5.0, 100), (8.0, 60)]);
        assert_eq!(job.highest_between(0.0, 2.0), 500.0);
        assert_eq!(job.highest_between(4.0, 9.0), 1000.0);
        assert_eq!(job.highest_between(8.5, 20.0), 600.0);
        assert_eq!(job.highest_between(10.0, 20.0), 0.0);
    }

    #[test]
    fn no_profile_is_a_ramp_to_the_peak() {
        let job = job(vec![]);
        assert_eq!(job.memory_at(5.0, job.segment_at(5.0, 0)), 500.0);
        assert_eq!(job.memory_area(), 5000.0);
    }
}
