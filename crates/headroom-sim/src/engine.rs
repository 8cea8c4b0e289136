//! The discrete-event simulator. It moves time from event to event (a job finishes, a job's
//! memory curve turns, the machine runs out of memory, the policy's sampling tick) and between
//! events every job's memory changes linearly, so the machine's total is exact at every
//! instant: when the jobs would take more than the machine has, the kernel's OOM killer acts
//! at that very moment and the event is counted.
//!
//! With a farm ([`SimConfig::farm`]) each node is such a machine of its own: a job the policy
//! sends to a node takes that node's memory and shares its cores, its node's kernel kills the
//! largest job there when the node runs out, and this machine holds only the engine's client
//! for it ([`CLIENT_BYTES`]) until it ends.

use headroom_sched::driver::DEFAULT_LOCAL_SHARE;
use headroom_sched::{chain, Action, JobId, NodeId, Profile, ProfileRecorder, Ran};
use serde::Serialize;

use crate::machine::{FarmSpec, Machine};
use crate::workload::{SimConfig, SimJob, Workload, PROGRESS_EPSILON};
use crate::SimError;

/// A running job as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunningJob {
    pub id: JobId,
    /// Bytes the job's processes use on this machine now: for a job compiled on a farm node,
    /// its engine client's.
    pub bytes: u64,
    /// The farm node it compiles on; `None` when it compiles here.
    pub node: Option<NodeId>,
    /// CPU seconds this attempt has used.
    pub cpu_seconds: f64,
    /// Simulated second at which this attempt started.
    pub started: f64,
    pub suspended: bool,
}

/// What a policy may look at when it decides.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub now: f64,
    /// True on a sampling tick, false right after another event.
    pub tick: bool,
    pub machine: Machine,
    /// Running jobs, oldest attempt first.
    pub running: &'a [RunningJob],
    /// The farm's nodes in order, as their engine's scheduler sees them (empty without one).
    pub nodes: &'a [NodeLoad],
}

/// What one farm node runs now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeLoad {
    /// Its cores and memory.
    pub spec: Machine,
    /// Jobs compiling on it.
    pub jobs: usize,
    /// Cores those jobs want.
    pub threads: f64,
    /// Bytes those jobs use.
    pub used: u64,
}

/// What a job compiled on a farm node holds on this machine while it runs: the engine's
/// client and its preprocessing, the figure headroom's driver assumes too.
pub const CLIENT_BYTES: u64 = DEFAULT_LOCAL_SHARE;

impl View<'_> {
    /// Bytes all running jobs use, suspended ones included.
    pub fn used(&self) -> u64 {
        self.running.iter().map(|job| job.bytes).sum()
    }

    /// Bytes the machine can still hand out.
    pub fn free(&self) -> u64 {
        self.machine.memory.saturating_sub(self.used())
    }
}

/// A scheduling policy under test. The simulator offers jobs as their dependencies finish,
/// asks for decisions after every event and on every tick, and carries out the actions.
/// `Action::Kill` means the policy has already requeued the job.
pub trait Policy {
    fn name(&self) -> String;
    /// The family the policy belongs to (`static` for every `-jN`), for reports.
    fn family(&self) -> &'static str;
    /// Whether the policy samples memory on ticks; policies that act only on events skip them.
    fn needs_ticks(&self) -> bool {
        true
    }
    fn offer(&mut self, job: &SimJob);
    fn decide(&mut self, view: &View<'_>) -> Vec<Action>;
    /// The farm node the policy sends job `id` to as it starts it; `None` (the default, and
    /// for every policy without a farm) runs it here.
    fn node_of(&self, _id: JobId) -> Option<NodeId> {
        None
    }
    /// The job ended at `now`, having used at most `peak` bytes on this machine (its engine
    /// client's, when a farm node compiled it), as the governor measures it.
    fn finished(&mut self, job: &SimJob, peak: u64, now: f64);
    /// The kernel killed the job for want of memory, here or on its farm node, when it had
    /// used at most `peak` bytes on this machine; the policy decides how it is retried.
    fn oom_killed(&mut self, job: &SimJob, peak: u64);
}

/// What one policy achieved on one trace and machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub policy: String,
    pub family: String,
    /// Seconds from the first offer to the last job's end.
    pub makespan: f64,
    /// Highest total memory of the running jobs on this machine (not on the farm's nodes).
    pub peak_memory: u64,
    /// Jobs the kernel's OOM killer killed, here and on the farm's nodes.
    pub oom_events: u32,
    /// Of those, the ones killed on a farm node.
    pub node_oom_events: u32,
    /// Jobs the policy itself killed and requeued.
    pub policy_kills: u32,
    pub suspensions: u32,
    /// Seconds of progress thrown away by kills of either kind.
    pub wasted_seconds: f64,
    /// Why the run stopped before every job finished (a deadlock or livelock of the policy).
    pub stalled: Option<String>,
    /// The jobs' total memory over the run: the highest use in each of 64 equal slices of the
    /// makespan, as fractions of `peak_memory` (for the charts; not in JSON).
    #[serde(skip)]
    pub memory_over_time: Option<Profile>,
}

impl Outcome {
    /// Whether every job finished.
    pub fn completed(&self) -> bool {
        self.stalled.is_none()
    }
}

/// Events allowed per job before a run counts as a livelock (far above any real schedule).
const EVENTS_PER_JOB_LIMIT: usize = 200_000;
/// Bytes below capacity at which the kernel already counts the machine as full.
const OOM_TOLERANCE: f64 = 1024.0;

#[derive(Debug, Clone)]
struct Run {
    job: usize,
    progress: f64,
    segment: usize,
    started: f64,
    suspended: bool,
    /// The CPU niceness it was started at.
    nice: u8,
    /// The fraction of full speed it runs at now ([`Simulation::share_cores`]).
    speed: f64,
    /// Where it compiles: `None` here, or on a farm node.
    node: Option<NodeId>,
    /// Bytes it uses where it compiles.
    bytes: f64,
    peak: f64,
}

/// This machine, as a place: farm node `n` is place `n + 1`.
const HERE: usize = 0;

impl Run {
    /// The place it compiles on.
    fn place(&self) -> usize {
        self.node.map_or(HERE, |node| node + 1)
    }

    /// Bytes it uses on `place`: where it compiles, its own; here, its engine client's when
    /// it compiles on a node.
    fn bytes_on(&self, place: usize) -> f64 {
        if self.place() == place {
            self.bytes
        } else if place == HERE {
            CLIENT_BYTES as f64
        } else {
            0.0
        }
    }

    /// The most bytes it used on this machine: its own, or its engine client's.
    fn peak_here(&self) -> u64 {
        if self.node.is_some() {
            CLIENT_BYTES
        } else {
            self.peak.round() as u64
        }
    }
}

/// The kernel's CPU weight of a thread at each niceness from 0 to 19 (`sched_prio_to_weight`
/// in the Linux scheduler): threads that want more cores than there are get them in
/// proportion to their weights.
const CPU_WEIGHTS: [f64; chain::LOWEST_PRIORITY as usize + 1] = [
    1024.0, 820.0, 655.0, 526.0, 423.0, 335.0, 272.0, 215.0, 172.0, 137.0, 110.0, 87.0, 70.0, 56.0,
    45.0, 36.0, 29.0, 23.0, 18.0, 15.0,
];

/// Runs `policy` over `workload` on `machine` until every job has finished, or until the
/// policy can make no more progress (then [`Outcome::stalled`] says why).
pub fn simulate(
    workload: &Workload,
    machine: Machine,
    policy: &mut dyn Policy,
    config: &SimConfig,
) -> Result<Outcome, SimError> {
    if let Some(job) = workload
        .jobs
        .iter()
        .find(|job| job.peak as f64 > machine.memory as f64 - OOM_TOLERANCE)
    {
        return Err(SimError::MachineTooSmall {
            trace: workload.name.clone(),
            machine: machine.to_string(),
            job: job.label.clone(),
            peak: job.peak,
        });
    }
    Simulation::new(workload, machine, config, policy).run()
}

struct Simulation<'a> {
    workload: &'a Workload,
    machine: Machine,
    farm: Option<FarmSpec>,
    tick: f64,
    policy: &'a mut dyn Policy,
    now: f64,
    next_tick: f64,
    runs: Vec<Run>,
    missing_deps: Vec<usize>,
    offered: Vec<bool>,
    done: Vec<bool>,
    finished: usize,
    outcome: Outcome,
    memory: ProfileRecorder,
}

impl<'a> Simulation<'a> {
    fn new(
        workload: &'a Workload,
        machine: Machine,
        config: &SimConfig,
        policy: &'a mut dyn Policy,
    ) -> Self {
        let outcome = Outcome {
            policy: policy.name(),
            family: policy.family().to_string(),
            makespan: 0.0,
            peak_memory: 0,
            oom_events: 0,
            node_oom_events: 0,
            policy_kills: 0,
            suspensions: 0,
            wasted_seconds: 0.0,
            stalled: None,
            memory_over_time: None,
        };
        Simulation {
            workload,
            machine,
            farm: config.farm,
            tick: config.tick,
            policy,
            now: 0.0,
            next_tick: config.tick,
            runs: Vec::new(),
            missing_deps: workload.jobs.iter().map(|job| job.deps.len()).collect(),
            offered: vec![false; workload.jobs.len()],
            done: vec![false; workload.jobs.len()],
            finished: 0,
            outcome,
            memory: ProfileRecorder::default(),
        }
    }

    fn run(mut self) -> Result<Outcome, SimError> {
        let ready: Vec<usize> = (0..self.workload.jobs.len())
            .filter(|&job| self.missing_deps[job] == 0)
            .collect();
        self.offer(&ready);
        let mut tick_due = false;
        let event_limit = EVENTS_PER_JOB_LIMIT.saturating_mul(self.workload.jobs.len().max(1));
        for _ in 0..event_limit {
            self.kernel_oom_kills();
            let view_jobs = self.running_view();
            let nodes = self.node_loads();
            let view = View {
                now: self.now,
                tick: tick_due,
                machine: self.machine,
                running: &view_jobs,
                nodes: &nodes,
            };
            let actions = self.policy.decide(&view);
            let sampled = tick_due || !self.policy.needs_ticks();
            tick_due = false;
            self.apply(&actions)?;
            if self.overfull_place().is_some() {
                continue;
            }
            if self.finished == self.workload.jobs.len() {
                return Ok(self.into_outcome());
            }
            if self.runs.is_empty() {
                return Ok(self.stalled("nothing runs and the policy starts nothing"));
            }
            if sampled && actions.is_empty() && self.runs.iter().all(|run| run.suspended) {
                return Ok(self.stalled("every running job is suspended and none is resumed"));
            }
            let Some(tick) = self.advance() else {
                return Ok(self.stalled("every running job is suspended and nothing wakes one"));
            };
            tick_due = tick;
            self.complete_finished_jobs();
        }
        Ok(self.stalled("the run did not end within its event limit (a livelock)"))
    }

    /// Ends a run that can make no more progress: the outcome says so, and its makespan is
    /// the moment it stopped.
    fn stalled(mut self, reason: &str) -> Outcome {
        self.outcome.makespan = self.now;
        self.outcome.stalled = Some(format!(
            "stalled after {} of {} jobs: {reason}",
            self.finished,
            self.workload.jobs.len()
        ));
        self.into_outcome()
    }

    fn into_outcome(mut self) -> Outcome {
        let whole_run = Ran {
            cpu_seconds: self.outcome.makespan,
            wall_seconds: self.outcome.makespan,
        };
        self.outcome.memory_over_time = self.memory.finish(whole_run);
        self.outcome
    }

    /// This machine, then each farm node.
    fn places(&self) -> usize {
        1 + self.farm.map_or(0, |farm| farm.nodes)
    }

    fn machine_of(&self, place: usize) -> Machine {
        match self.farm {
            Some(farm) if place != HERE => farm.node,
            _ => self.machine,
        }
    }

    /// Bytes in use on `place`.
    fn used_on(&self, place: usize) -> f64 {
        self.runs.iter().map(|run| run.bytes_on(place)).sum()
    }

    /// Bytes in use on this machine.
    fn used(&self) -> f64 {
        self.used_on(HERE)
    }

    /// The first place whose jobs take all its memory, when one does.
    fn overfull_place(&self) -> Option<usize> {
        (0..self.places()).find(|&place| {
            !self.runs.is_empty()
                && self.used_on(place) >= self.machine_of(place).memory as f64 - OOM_TOLERANCE
        })
    }

    fn node_loads(&self) -> Vec<NodeLoad> {
        let Some(farm) = self.farm else {
            return Vec::new();
        };
        let mut nodes = vec![
            NodeLoad {
                spec: farm.node,
                jobs: 0,
                threads: 0.0,
                used: 0,
            };
            farm.nodes
        ];
        for run in &self.runs {
            if let Some(node) = run.node {
                let load = &mut nodes[node];
                load.jobs += 1;
                load.threads += self.workload.jobs[run.job].threads;
                load.used += run.bytes.round() as u64;
            }
        }
        nodes
    }

    fn running_view(&self) -> Vec<RunningJob> {
        self.runs
            .iter()
            .map(|run| RunningJob {
                id: run.job as JobId,
                bytes: run.bytes_on(HERE).round() as u64,
                node: run.node,
                cpu_seconds: run.progress * self.workload.jobs[run.job].threads,
                started: run.started,
                suspended: run.suspended,
            })
            .collect()
    }

    /// Notes the jobs' total memory now: between events it moves in straight lines, so its
    /// highest points are at events.
    fn record_memory(&mut self) {
        let used = self.used().round() as u64;
        self.outcome.peak_memory = self.outcome.peak_memory.max(used);
        self.memory.record(self.now, used);
    }

    fn offer(&mut self, jobs: &[usize]) {
        for &job in jobs {
            self.offered[job] = true;
            self.policy.offer(&self.workload.jobs[job]);
        }
    }

    fn position(&self, id: JobId) -> Option<usize> {
        self.runs.iter().position(|run| run.job as JobId == id)
    }

    fn apply(&mut self, actions: &[Action]) -> Result<(), SimError> {
        for &action in actions {
            let invalid = || SimError::InvalidAction {
                policy: self.outcome.policy.clone(),
                action: format!("{action:?}"),
            };
            match action {
                Action::Start { id, nice } => {
                    let job = usize::try_from(id).map_err(|_| invalid())?;
                    let startable = job < self.workload.jobs.len()
                        && self.offered[job]
                        && !self.done[job]
                        && self.position(id).is_none();
                    if !startable {
                        return Err(invalid());
                    }
                    let node = self.policy.node_of(id);
                    let nodes = self.farm.map_or(0, |farm| farm.nodes);
                    if node.is_some_and(|node| node >= nodes) {
                        return Err(invalid());
                    }
                    let sim_job = &self.workload.jobs[job];
                    let bytes = sim_job.memory_at(0.0, 0);
                    self.runs.push(Run {
                        job,
                        progress: 0.0,
                        segment: sim_job.segment_at(0.0, 0),
                        started: self.now,
                        suspended: false,
                        nice: nice.min(chain::LOWEST_PRIORITY),
                        speed: 1.0,
                        node,
                        bytes,
                        peak: bytes,
                    });
                }
                Action::Suspend(id) | Action::Resume(id) => {
                    let index = self.position(id).ok_or_else(invalid)?;
                    let suspend = matches!(action, Action::Suspend(_));
                    if suspend && !self.runs[index].suspended {
                        self.outcome.suspensions += 1;
                    }
                    self.runs[index].suspended = suspend;
                }
                Action::Kill(id) => {
                    let index = self.position(id).ok_or_else(invalid)?;
                    let run = self.runs.remove(index);
                    self.outcome.policy_kills += 1;
                    self.outcome.wasted_seconds += run.progress;
                }
            }
        }
        self.record_memory();
        Ok(())
    }

    /// Each kernel's OOM killer: while a machine (this one or a farm node) is full, kill the
    /// job using the most memory on it. Killing a job's engine client here ends its compile on
    /// the node too.
    fn kernel_oom_kills(&mut self) {
        while let Some(place) = self.overfull_place() {
            let largest = self
                .runs
                .iter()
                .enumerate()
                .max_by(|a, b| {
                    a.1.bytes_on(place)
                        .total_cmp(&b.1.bytes_on(place))
                        .then(a.0.cmp(&b.0))
                })
                .map(|(index, _)| index)
                .unwrap_or(0);
            let run = self.runs.remove(largest);
            self.outcome.oom_events += 1;
            if place != HERE {
                self.outcome.node_oom_events += 1;
            }
            self.outcome.wasted_seconds += run.progress;
            let job = &self.workload.jobs[run.job];
            self.policy.oom_killed(job, run.peak_here());
        }
    }

    /// Sets each run's speed, the fraction of full speed it gets (0 while suspended), on each
    /// machine apart ([`share_cores`]).
    fn share_cores(&mut self) {
        let jobs = &self.workload.jobs;
        for place in 0..self.places() {
            let cores = self.machine_of(place).cores;
            let mut runs: Vec<&mut Run> = self
                .runs
                .iter_mut()
                .filter(|run| run.place() == place)
                .collect();
            share_cores(&mut runs, jobs, cores);
        }
    }

    /// Moves time to the next event; returns whether that event is a sampling tick, or `None`
    /// when no event can ever come (every running job is suspended and nothing ticks).
    fn advance(&mut self) -> Option<bool> {
        self.share_cores();
        let mut step = f64::INFINITY;
        // Bytes gained per second on each place (an engine client's stay as they are).
        let mut slopes = vec![0.0; self.places()];
        for run in self.runs.iter().filter(|run| !run.suspended) {
            let (job, speed) = (&self.workload.jobs[run.job], run.speed);
            let to_end = (job.duration - run.progress).max(0.0) / speed;
            let to_turn = (job.segment_end(run.segment) - run.progress).max(0.0) / speed;
            step = step.min(to_end).min(to_turn);
            slopes[run.place()] += job.slope(run.segment) * speed;
        }
        for (place, &slope) in slopes.iter().enumerate() {
            if slope > 0.0 {
                let memory = self.machine_of(place).memory as f64;
                let room = (memory - self.used_on(place)).max(0.0);
                step = step.min(room / slope);
            }
        }
        let ticks = self.policy.needs_ticks();
        if ticks {
            step = step.min((self.next_tick - self.now).max(0.0));
        }
        if !step.is_finite() {
            return None;
        }
        self.now += step;
        for run in self.runs.iter_mut().filter(|run| !run.suspended) {
            let job = &self.workload.jobs[run.job];
            run.progress = (run.progress + step * run.speed).min(job.duration);
            run.segment = job.segment_at(run.progress, run.segment);
            run.bytes = job.memory_at(run.progress, run.segment);
            run.peak = run.peak.max(run.bytes);
        }
        self.record_memory();
        let mut tick_due = false;
        while ticks && self.next_tick <= self.now + PROGRESS_EPSILON {
            tick_due = true;
            self.next_tick += self.tick;
        }
        Some(tick_due)
    }

    fn complete_finished_jobs(&mut self) {
        let workload = self.workload;
        let (finished, running): (Vec<Run>, Vec<Run>) = std::mem::take(&mut self.runs)
            .into_iter()
            .partition(|run| run.progress >= workload.jobs[run.job].duration - PROGRESS_EPSILON);
        self.runs = running;
        let mut ready = Vec::new();
        for run in finished {
            self.done[run.job] = true;
            self.finished += 1;
            self.outcome.makespan = self.now;
            let job = &workload.jobs[run.job];
            self.policy.finished(job, run.peak_here(), self.now);
            for &dependent in &workload.dependents[run.job] {
                self.missing_deps[dependent] -= 1;
                if self.missing_deps[dependent] == 0 {
                    ready.push(dependent);
                }
            }
        }
        ready.sort_unstable();
        self.offer(&ready);
    }
}

/// Sets the speed of each of `runs`, the jobs on one machine with `cores` cores: full speed
/// unless they want more cores than there are. Then each job's threads get cores in proportion
/// to their weight, and a job that would get more than it can use (its threads) gets just
/// that, the rest going to the others.
fn share_cores(runs: &mut [&mut Run], jobs: &[SimJob], cores: usize) {
    let threads = |run: &Run| {
        if run.suspended {
            0.0
        } else {
            jobs[run.job].threads
        }
    };
    let weight = |run: &Run| CPU_WEIGHTS[usize::from(run.nice)];
    let mut cores_left = cores as f64;
    let demand: f64 = runs.iter().map(|run| threads(run)).sum();
    let first_nice = runs.first().map(|run| run.nice);
    if demand <= cores_left || runs.iter().all(|run| Some(run.nice) == first_nice) {
        let speed = (cores_left / demand).min(1.0);
        for run in runs.iter_mut() {
            run.speed = if run.suspended { 0.0 } else { speed };
        }
        return;
    }
    // The heaviest jobs are the ones that may get all they want; once one cannot, the cores
    // left per weight stay the same for every lighter job.
    let mut heaviest_first: Vec<usize> = (0..runs.len()).collect();
    heaviest_first.sort_by(|&a, &b| weight(runs[b]).total_cmp(&weight(runs[a])));
    let mut weight_left: f64 = runs.iter().map(|run| threads(run) * weight(run)).sum();
    for index in heaviest_first {
        let run = &mut *runs[index];
        let (threads, weight) = (threads(run), weight(run));
        run.speed = if threads > 0.0 {
            (weight * cores_left / weight_left).min(1.0)
        } else {
            0.0
        };
        cores_left -= run.speed * threads;
        weight_left -= threads * weight;
    }
}
