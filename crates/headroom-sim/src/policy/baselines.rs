//! What people use today, modelled in the same simulator so the comparison is fair: static
//! `-jN`, ninja pools, GNU parallel's `--memfree` and `--memsuspend`, a Buck2-style pressure
//! policy and Bazel-style fixed memory estimates.
//!
//! None of them knows about OOM retries, so all share one build-system model for a job the
//! kernel killed: the build fails, the user reruns it and the job is retried first; a job that
//! was killed twice is rerun on its own (the user's `-j1` for that target), which also
//! guarantees every run ends.

use std::collections::{HashMap, VecDeque};

use headroom_sched::{Action, JobId};

use crate::engine::{Policy, RunningJob, View};
use crate::machine::Machine;
use crate::trace::JobKind;
use crate::workload::SimJob;

const MB: u64 = 1_000_000;

/// A queued job and what the policy estimated for it when it was offered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    pub(super) id: JobId,
    pub(super) kind: JobKind,
    /// Cores it keeps busy.
    pub(super) threads: f64,
    estimate: u64,
    alone: bool,
}

/// Whether a job that cannot start yet holds back the jobs behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// Jobs start strictly in offer order (make, GNU parallel, Buck2, Bazel).
    Strict,
    /// Later jobs may pass one that waits for its pool (ninja).
    SkipBlocked,
}

/// The build system's queue, shared by every baseline.
#[derive(Debug, Default)]
pub(super) struct BuildQueue {
    waiting: VecDeque<Waiting>,
    /// Everything known about offered jobs, by id, for requeues.
    offered: HashMap<JobId, Waiting>,
    oom_kills: HashMap<JobId, u32>,
    alone_running: Option<JobId>,
}

impl BuildQueue {
    pub(super) fn offer(&mut self, job: &SimJob, estimate: u64) {
        let waiting = Waiting {
            id: job.id,
            kind: job.kind,
            threads: job.threads,
            estimate,
            alone: false,
        };
        self.offered.insert(job.id, waiting);
        self.waiting.push_back(waiting);
    }

    pub(super) fn requeue(&mut self, id: JobId, alone: bool) {
        if let Some(&waiting) = self.offered.get(&id) {
            self.waiting.push_front(Waiting { alone, ..waiting });
        }
        if self.alone_running == Some(id) {
            self.alone_running = None;
        }
    }

    pub(super) fn oom_killed(&mut self, id: JobId) {
        let kills = self.oom_kills.entry(id).or_insert(0);
        *kills += 1;
        let alone = *kills >= 2;
        self.requeue(id, alone);
    }

    /// Puts a job whose attempt failed for a reason of its own first in line again, alone if
    /// it ran alone: the build goes on, nothing is rerun.
    pub(super) fn retry(&mut self, id: JobId) {
        let alone = self.alone_running == Some(id);
        self.requeue(id, alone);
    }

    pub(super) fn finished(&mut self, id: JobId) {
        if self.alone_running == Some(id) {
            self.alone_running = None;
        }
    }

    fn estimate(&self, id: JobId) -> u64 {
        self.offered.get(&id).map_or(0, |waiting| waiting.estimate)
    }

    fn kind(&self, id: JobId) -> JobKind {
        self.offered
            .get(&id)
            .map_or(JobKind::Other, |waiting| waiting.kind)
    }

    /// Starts queued jobs while `admit` accepts them. `admit` is told about each start, so it
    /// can count what the started jobs take.
    pub(super) fn start_while(
        &mut self,
        running: &[RunningJob],
        order: Order,
        mut admit: impl FnMut(&Waiting) -> bool,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.alone_running.is_some() {
            return actions;
        }
        let mut index = 0;
        while index < self.waiting.len() {
            let candidate = self.waiting[index];
            if candidate.alone {
                if running.is_empty() && actions.is_empty() {
                    self.waiting.remove(index);
                    self.alone_running = Some(candidate.id);
                    actions.push(Action::Start {
                        id: candidate.id,
                        nice: 0,
                    });
                }
                return actions;
            }
            if admit(&candidate) {
                self.waiting.remove(index);
                actions.push(Action::Start {
                    id: candidate.id,
                    nice: 0,
                });
            } else if order == Order::Strict {
                return actions;
            } else {
                index += 1;
            }
        }
        actions
    }

    /// Starts queued jobs in order until `jobs` run, whatever they use (make's `-jN`).
    fn start_up_to(&mut self, running: &[RunningJob], jobs: usize) -> Vec<Action> {
        let mut count = running.len();
        self.start_while(running, Order::Strict, |_| {
            count += 1;
            count <= jobs
        })
    }

    /// Starts the next queued job when `room` says there is room: at most one per check,
    /// as GNU parallel does.
    fn start_one_if(&mut self, running: &[RunningJob], room: bool) -> Vec<Action> {
        let mut started = false;
        self.start_while(running, Order::Strict, |_| {
            let start = room && !started;
            started = true;
            start
        })
    }
}

/// The youngest running job that is not suspended, never the oldest one.
fn youngest_active(running: &[RunningJob]) -> Option<JobId> {
    running
        .iter()
        .skip(1)
        .rev()
        .find(|job| !job.suspended)
        .map(|job| job.id)
}

/// The oldest running job when it is suspended: it must run, or nothing ever frees memory.
fn oldest_if_suspended(running: &[RunningJob]) -> Option<Action> {
    running
        .first()
        .filter(|job| job.suspended)
        .map(|job| Action::Resume(job.id))
}

/// The oldest suspended job.
fn oldest_suspended(running: &[RunningJob]) -> Option<JobId> {
    running.iter().find(|job| job.suspended).map(|job| job.id)
}

/// Implements the parts of [`Policy`] that every baseline does the same way; `offer` adds
/// the offer of a baseline that estimates nothing.
macro_rules! build_queue_events {
    (offer) => {
        fn offer(&mut self, job: &SimJob) {
            self.queue.offer(job, 0);
        }
        build_queue_events!();
    };
    () => {
        fn finished(&mut self, job: &SimJob, _peak: u64, _now: f64) {
            self.queue.finished(job.id);
        }

        fn oom_killed(&mut self, job: &SimJob, _peak: u64) {
            self.queue.oom_killed(job.id);
        }
    };
}

/// `make -jN`: at most N jobs, in order, whatever they use.
pub struct StaticJobs {
    jobs: usize,
    queue: BuildQueue,
}

impl StaticJobs {
    pub fn new(jobs: usize) -> Self {
        StaticJobs {
            jobs: jobs.max(1),
            queue: BuildQueue::default(),
        }
    }
}

impl Policy for StaticJobs {
    fn name(&self) -> String {
        format!("static -j{}", self.jobs)
    }
    fn family(&self) -> &'static str {
        "static"
    }
    fn needs_ticks(&self) -> bool {
        false
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        self.queue.start_up_to(view.running, self.jobs)
    }
    build_queue_events!(offer);
}

/// ninja with a `link` pool of depth 1: up to `cores + 2` jobs (ninja's default `-j`), and
/// only one link at a time; compiles may pass a link that waits for the pool.
pub struct NinjaPools {
    jobs: usize,
    queue: BuildQueue,
}

impl NinjaPools {
    pub fn new(machine: Machine) -> Self {
        NinjaPools {
            jobs: machine.cores + 2,
            queue: BuildQueue::default(),
        }
    }
}

impl Policy for NinjaPools {
    fn name(&self) -> String {
        format!("ninja -j{} (link pool 1)", self.jobs)
    }
    fn family(&self) -> &'static str {
        "ninja"
    }
    fn needs_ticks(&self) -> bool {
        false
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        let mut count = view.running.len();
        let mut links = view
            .running
            .iter()
            .filter(|job| self.queue.kind(job.id) == JobKind::Link)
            .count();
        let jobs = self.jobs;
        self.queue
            .start_while(view.running, Order::SkipBlocked, |candidate| {
                let is_link = candidate.kind == JobKind::Link;
                if count >= jobs || (is_link && links >= 1) {
                    return false;
                }
                count += 1;
                links += usize::from(is_link);
                true
            })
    }
    build_queue_events!(offer);
}

/// GNU parallel `--memfree X`: start another job (one per check) only while more than X is
/// free; when less than X/2 is free, kill the youngest job and put it back in the queue.
pub struct ParallelMemfree {
    jobs: usize,
    memfree: u64,
    queue: BuildQueue,
}

impl ParallelMemfree {
    pub fn new(machine: Machine, memfree: u64) -> Self {
        ParallelMemfree {
            jobs: machine.cores,
            memfree,
            queue: BuildQueue::default(),
        }
    }
}

impl Policy for ParallelMemfree {
    fn name(&self) -> String {
        format!(
            "parallel --memfree {}",
            headroom_size::format_size(self.memfree)
        )
    }
    fn family(&self) -> &'static str {
        "parallel-memfree"
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        let free = view.free();
        if free < self.memfree / 2 && view.running.len() > 1 {
            if let Some(youngest) = view.running.last() {
                self.queue.requeue(youngest.id, false);
                return vec![Action::Kill(youngest.id)];
            }
        }
        let room = free > self.memfree && view.running.len() < self.jobs;
        self.queue.start_one_if(view.running, room)
    }
    build_queue_events!(offer);
}

/// GNU parallel `--memsuspend X`: start a job (one per check) while more than 2X is free or
/// nothing runs;
/// below 2X suspend the youngest job, below X all but the oldest; resume when 2X is free.
pub struct ParallelMemsuspend {
    jobs: usize,
    memsuspend: u64,
    queue: BuildQueue,
}

impl ParallelMemsuspend {
    pub fn new(machine: Machine, memsuspend: u64) -> Self {
        ParallelMemsuspend {
            jobs: machine.cores,
            memsuspend,
            queue: BuildQueue::default(),
        }
    }
}

impl Policy for ParallelMemsuspend {
    fn name(&self) -> String {
        format!(
            "parallel --memsuspend {}",
            headroom_size::format_size(self.memsuspend)
        )
    }
    fn family(&self) -> &'static str {
        "parallel-memsuspend"
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        if let Some(resume) = oldest_if_suspended(view.running) {
            return vec![resume];
        }
        let free = view.free();
        if !view.running.is_empty() && free < self.memsuspend {
            return view
                .running
                .iter()
                .skip(1)
                .filter(|job| !job.suspended)
                .map(|job| Action::Suspend(job.id))
                .collect();
        }
        if !view.running.is_empty() && free < 2 * self.memsuspend {
            return youngest_active(view.running)
                .map(Action::Suspend)
                .into_iter()
                .collect();
        }
        if let Some(id) = oldest_suspended(view.running) {
            return vec![Action::Resume(id)];
        }
        let room = view.running.len() < self.jobs;
        self.queue.start_one_if(view.running, room)
    }
    build_queue_events!(offer);
}

/// Buck2-style memory pressure: one job per core while there is no pressure; under pressure
/// (90% of memory in use) stop starting jobs and freeze the youngest, never the oldest; thaw
/// the oldest frozen job once use drops below 80%.
pub struct Buck2Pressure {
    jobs: usize,
    queue: BuildQueue,
}

/// Share of memory in use at which pressure is high.
const PRESSURE_HIGH: f64 = 0.90;
/// Share of memory in use below which a frozen job is thawed.
const PRESSURE_LOW: f64 = 0.80;

impl Buck2Pressure {
    pub fn new(machine: Machine) -> Self {
        Buck2Pressure {
            jobs: machine.cores,
            queue: BuildQueue::default(),
        }
    }
}

impl Policy for Buck2Pressure {
    fn name(&self) -> String {
        "buck2 pressure".to_string()
    }
    fn family(&self) -> &'static str {
        "buck2"
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        if let Some(resume) = oldest_if_suspended(view.running) {
            return vec![resume];
        }
        let share = view.used() as f64 / view.machine.memory as f64;
        if share >= PRESSURE_HIGH {
            return youngest_active(view.running)
                .map(Action::Suspend)
                .into_iter()
                .collect();
        }
        if let Some(id) = oldest_suspended(view.running) {
            return if share < PRESSURE_LOW {
                vec![Action::Resume(id)]
            } else {
                Vec::new()
            };
        }
        self.queue.start_up_to(view.running, self.jobs)
    }
    build_queue_events!(offer);
}

/// How Bazel estimates an action's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BazelEstimate {
    /// 250 MB for every action (Bazel's default).
    Fixed,
    /// 80 MB + 0.7 × input bytes for compiles, 250 MB for the rest.
    Inputs,
}

/// Bazel's local resource manager: one action per core, and the sum of the estimates of
/// running actions within `--local_ram_resources` (default 67% of the machine's memory).
pub struct BazelEstimates {
    jobs: usize,
    ram: u64,
    estimate: BazelEstimate,
    queue: BuildQueue,
}

impl BazelEstimates {
    pub fn new(machine: Machine, estimate: BazelEstimate) -> Self {
        BazelEstimates {
            jobs: machine.cores,
            ram: machine.memory / 100 * 67,
            estimate,
            queue: BuildQueue::default(),
        }
    }

    fn estimate_of(&self, job: &SimJob) -> u64 {
        match (self.estimate, job.kind, job.input_bytes) {
            (BazelEstimate::Inputs, JobKind::Compile, Some(inputs)) => 80 * MB + inputs / 10 * 7,
            _ => 250 * MB,
        }
    }
}

impl Policy for BazelEstimates {
    fn name(&self) -> String {
        match self.estimate {
            BazelEstimate::Fixed => "bazel 250MB/action",
            BazelEstimate::Inputs => "bazel 80MB+0.7×inputs",
        }
        .to_string()
    }
    fn family(&self) -> &'static str {
        "bazel"
    }
    fn needs_ticks(&self) -> bool {
        false
    }
    fn offer(&mut self, job: &SimJob) {
        let estimate = self.estimate_of(job);
        self.queue.offer(job, estimate);
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        let mut count = view.running.len();
        let mut reserved: u64 = view
            .running
            .iter()
            .map(|job| self.queue.estimate(job.id))
            .sum();
        let (jobs, ram) = (self.jobs, self.ram);
        self.queue
            .start_while(view.running, Order::Strict, |candidate| {
                let fits = count == 0 || reserved + candidate.estimate <= ram;
                if count >= jobs || !fits {
                    return false;
                }
                count += 1;
                reserved += candidate.estimate;
                true
            })
    }
    build_queue_events!();
}
