//! The one driver of headroom's policy, shared by the live governor and the simulator. It
//! owns the scheduler, the predictor, each job's attempts and memory profile, OOM retries, the
//! burst hold and CPU priorities, and takes one call per event (a job offered, an attempt
//! begun, memory sampled, a decision asked for, an attempt ended, a job gone) with the time
//! and the readings passed in. The governor adds only I/O: sockets, `/proc`, signals, SQLite.
//! The simulator feeds it simulated events. Both therefore decide alike from alike events,
//! which `tests/one_driver.rs` in `headroom-sim` checks on a recorded build.

use std::collections::{HashMap, HashSet};

use headroom_size::format_size;

use crate::bursts::Bursts;
use crate::farm::{Farm, NodeId};
use crate::policy::{self, Action, Estimate, Limits, OutsideAction, Scheduler};
use crate::predict::{PastRun, PredictionSource, Predictor};
use crate::profile::{Profile, ProfileRecorder, Ran};
use crate::warm::WarmStart;
use crate::{JobId, SessionId};

/// What a job sent to a farm node is taken to need on this machine (the engine's client and
/// the preprocessor) before a farmed run of it, or of any job of the build, has shown it: about
/// what preprocessing a unit that includes the PyTorch C++ API takes.
pub const DEFAULT_LOCAL_SHARE: u64 = 256 << 20;

/// A job the build system has just started, as the caller identified it.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// The session (a `headroom build`, a `headroom run`) whose build system started it:
    /// sessions that share a governor share its slots fairly.
    pub session: SessionId,
    /// Stable across builds: what the history and the bursts know the job by.
    pub key: String,
    /// For people: the output file, or the source.
    pub label: String,
    /// Jobs of one group (same compiler and flags) predict each other.
    pub group: u64,
    /// The job's own last run, when the history has one.
    pub past: Option<PastRun>,
    /// Seconds of work that waited on the job in the last build that ran it.
    pub waiting_seconds: f64,
    /// Lower-memory rungs the job may step down to after running out of memory alone (0 when
    /// the user did not opt in, or its compiler does not take the flags).
    pub lower_rungs: usize,
    /// The farm's engine can compile it remotely (a single compile to an object file).
    pub farmable: bool,
    /// What it used on this machine the last time a farm node compiled it, when known.
    pub local_share: Option<u64>,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// In the scheduler's queue.
    Queued,
    /// The scheduler started it; the caller has not begun the attempt yet. It may be told to
    /// stop before it has begun: it then begins stopped.
    Admitted { suspended: bool },
    /// An attempt runs.
    Running { suspended: bool },
    /// The scheduler killed the attempt and requeued the job; the attempt has yet to end, and
    /// the scheduler has not started the job again.
    Killed,
}

/// One job, from its offer to its end.
#[derive(Debug, Clone)]
pub struct Job {
    pub session: SessionId,
    pub key: String,
    pub label: String,
    pub group: u64,
    pub state: JobState,
    pub estimate: Estimate,
    pub source: PredictionSource,
    /// It runs with no other job beside it (a retry after running out of memory).
    pub alone: bool,
    /// 0 at the user's flags; `n` at the n-th lower-memory rung.
    pub rung: usize,
    lower_rungs: usize,
    /// The CPU niceness of the current attempt.
    pub nice: u8,
    /// The farm node the current (or last) attempt was sent to; `None` when it ran here.
    pub node: Option<NodeId>,
    /// The predicted peak planned on `node` for that attempt.
    pub planned_on_node: u64,
    /// The same, while the attempt holds it on the node.
    placed: Option<u64>,
    farmable: bool,
    local_share: Option<u64>,
    pub attempts: u32,
    pub suspends: u32,
    pub requeues: u32,
    pub oom_retries: u32,
    /// The scheduler killed the current attempt, which has yet to end. It outlives
    /// [`JobState::Killed`]: the scheduler may start the job again before the killed attempt
    /// has reported its end, and that end is still a requeue, never an out-of-memory failure.
    pub attempt_killed: bool,
    /// The most bytes any attempt was seen to use.
    pub peak: u64,
    /// CPU seconds of the attempts that ended.
    pub cpu_seconds: f64,
    /// Seconds from the build's start to the first attempt's start.
    pub first_start: Option<f64>,
    /// Seconds the current attempt has run, stopped time excluded.
    pub active_seconds: f64,
    /// When the current attempt started, in seconds from the build's start.
    attempt_started: f64,
    /// The memory profile of the current attempt, for the next build.
    profile: ProfileRecorder,
}

impl Job {
    /// The scheduler started an attempt, here (`node` none) or on a farm node, at `nice`.
    fn begin(&mut self, node: Option<NodeId>, nice: u8, now: f64) {
        self.state = JobState::Admitted { suspended: false };
        self.node = node;
        self.nice = nice;
        self.attempts += 1;
        self.profile = ProfileRecorder::default();
        self.active_seconds = 0.0;
        self.attempt_started = now;
        self.first_start.get_or_insert(now);
    }

    /// Seconds from the build's start to the start of its current (or last) attempt.
    pub fn attempt_started(&self) -> f64 {
        self.attempt_started
    }

    /// Takes the job off the farm node its attempt holds, if any: returns the node and the
    /// room the job had there ([`Farm::release`]).
    fn leave_node(&mut self, farm: Option<&mut Farm>) -> Option<(NodeId, u64)> {
        let (farm, node, need) = (farm?, self.node?, self.placed.take()?);
        Some((node, farm.release(node, need)))
    }

    pub fn suspended(&self) -> bool {
        matches!(
            self.state,
            JobState::Admitted { suspended: true } | JobState::Running { suspended: true }
        )
    }
}

/// What one running job's processes use now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub id: JobId,
    pub bytes: u64,
    /// CPU seconds the current attempt has used.
    pub cpu_seconds: f64,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Ended {
    pub succeeded: bool,
    /// It ran out of memory (the kernel killed it, or it said so).
    pub out_of_memory: bool,
    pub cpu_seconds: f64,
    /// The most bytes the attempt used, as the kernel counted (0 when unknown).
    pub max_rss: u64,
    /// The engine could not reach the farm node it was sent to (nothing ran there).
    pub node_unreachable: bool,
}

/// What becomes of a job whose attempt ended.
#[derive(Debug)]
pub enum AfterAttempt {
    /// It is queued again; its caller waits for the next start.
    Retry,
    /// It is over.
    Done(Box<Finished>),
}

/// A job that is over, with what the history keeps of it.
#[derive(Debug)]
pub struct Finished {
    pub job: Job,
    pub succeeded: bool,
    /// Its last attempt: CPU seconds, and wall seconds while not stopped.
    pub ran: Ran,
    /// How its memory moved over that attempt.
    pub profile: Option<Profile>,
}

/// The driver: see the module's header.
#[derive(Debug)]
pub struct Driver {
    scheduler: Scheduler,
    predictor: Predictor,
    jobs: HashMap<JobId, Job>,
    next_id: JobId,
    /// Which jobs the newest build offered together, and the keys this build has offered.
    bursts: Bursts,
    arrived: HashSet<String>,
    /// Whether jobs start at the niceness the scheduler chose; otherwise all at 0.
    priorities: bool,
    /// Seconds from the build's start to the last sample.
    last_sample: f64,
    /// The build farm's nodes, when the build has one.
    farm: Option<Farm>,
    /// The largest local share known in this build, from the history of the jobs offered and
    /// from farmed attempts that ended: what a farmed job nothing is known of reserves here.
    /// Preprocessing costs about alike across a build's units, and far less than compiling.
    largest_local_share: Option<u64>,
}

impl Driver {
    /// A driver for `limits`, with `priorities` on or off, that knows nothing of earlier
    /// builds yet.
    pub fn new(limits: Limits, priorities: bool) -> Driver {
        Driver {
            scheduler: Scheduler::new(limits),
            predictor: Predictor::new(crate::budget::default_job_peak(limits.budget, limits.slots)),
            jobs: HashMap::new(),
            next_id: 0,
            bursts: Bursts::default(),
            arrived: HashSet::new(),
            priorities,
            last_sample: 0.0,
            farm: None,
            largest_local_share: None,
        }
    }

    /// Takes new limits while jobs run: the governor's budget or slots changed because a
    /// session joined or left. The safety net's thresholds and the prediction of jobs nothing
    /// is known of follow them as [`Driver::new`] sets them; queued and running jobs stay.
    pub fn set_limits(&mut self, limits: Limits) {
        self.scheduler.set_limits(limits);
        self.size_unknown_jobs();
    }

    /// Predicts the jobs nothing is known of, from now on, at a slot's share of what the
    /// budget leaves to jobs now: less what the build's processes outside every job (pip's
    /// own Python, a build driver) and other users' governors hold. A share of the whole
    /// budget would not fit twice beside them, and a first build would run such jobs one at a
    /// time.
    fn size_unknown_jobs(&mut self) {
        let slots = self.scheduler.limits().slots;
        self.predictor
            .set_default_peak(crate::budget::default_job_peak(
                self.scheduler.jobs_budget(),
                slots,
            ));
    }

    /// The limits jobs are admitted within.
    pub fn limits(&self) -> Limits {
        self.scheduler.limits()
    }

    /// Leaves `bytes` of the budget to other users' governors in the same memory domain:
    /// what they hold now beyond what the budget already left out. Admission only: nothing
    /// of this governor's is stopped for them.
    pub fn set_held_elsewhere(&mut self, bytes: u64) {
        self.scheduler.observe_held_elsewhere(bytes);
        self.size_unknown_jobs();
    }

    /// Sends jobs that the engine can compile remotely to `farm`'s nodes when they fit there.
    pub fn set_farm(&mut self, farm: Farm) {
        self.farm = Some(farm);
    }

    pub fn farm(&self) -> Option<&Farm> {
        self.farm.as_ref()
    }

    /// Takes what earlier builds showed: the timing slack and the margin on peaks start from
    /// how far jobs strayed between two runs on this machine, and bursts from the newest.
    pub fn warm_start(&mut self, warm: WarmStart) {
        self.scheduler.note_reruns(warm.time_reruns);
        self.predictor.note_peak_reruns(warm.peak_reruns);
        self.bursts = warm.bursts;
    }

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// Registers and queues a job the build system just started. Returns its id, and whether
    /// to decide now: a job that came first in its burst waits, at most until the next tick,
    /// for the longer jobs its burst brought last time, so that the queue's order and not the
    /// race to connect decides which starts first.
    pub fn offer(&mut self, offer: Offer) -> (JobId, bool) {
        let id = self.next_id;
        self.next_id += 1;
        self.arrived.insert(offer.key.clone());
        let wait_for_burst = self.bursts.longer_one_coming(&offer.key, &self.arrived);
        let mut prediction = self.predictor.predict(id, offer.past.as_ref(), offer.group);
        prediction.estimate.waiting_seconds = offer.waiting_seconds;
        tracing::debug!(
            "job {id} offered: {}, predicted {} from {}{}",
            offer.label,
            format_size(prediction.estimate.peak),
            prediction.source.name(),
            if wait_for_burst {
                "; waits for the longer jobs its burst brought last time"
            } else {
                ""
            }
        );
        self.scheduler
            .submit(id, offer.session, prediction.estimate.clone(), false);
        self.largest_local_share = self.largest_local_share.max(offer.local_share);
        self.jobs.insert(
            id,
            Job {
                session: offer.session,
                key: offer.key,
                label: offer.label,
                group: offer.group,
                state: JobState::Queued,
                estimate: prediction.estimate,
                source: prediction.source,
                alone: false,
                rung: 0,
                lower_rungs: offer.lower_rungs,
                nice: 0,
                node: None,
                planned_on_node: 0,
                placed: None,
                farmable: offer.farmable,
                local_share: offer.local_share,
                attempts: 0,
                suspends: 0,
                requeues: 0,
                oom_retries: 0,
                attempt_killed: false,
                peak: 0,
                cpu_seconds: 0.0,
                first_start: None,
                active_seconds: 0.0,
                attempt_started: 0.0,
                profile: ProfileRecorder::default(),
            },
        );
        (id, !wait_for_burst)
    }

    /// The caller begins the attempt the scheduler started (hands it to the job's shim).
    /// Returns the job as it begins, or `None` when it has not been started.
    pub fn begin_attempt(&mut self, id: JobId) -> Option<&Job> {
        let job = self.jobs.get_mut(&id)?;
        let JobState::Admitted { suspended } = job.state else {
            return None;
        };
        job.state = JobState::Running { suspended };
        Some(job)
    }

    /// Records what the running jobs (`readings`) and the build's processes outside every job
    /// (`outside` bytes) use at `now`.
    pub fn sample(&mut self, readings: &[Reading], outside: u64, now: f64) {
        self.scheduler.observe_outside(outside);
        self.size_unknown_jobs();
        for reading in readings {
            let Some(job) = self.jobs.get_mut(&reading.id) else {
                continue;
            };
            job.peak = job.peak.max(reading.bytes);
            if !job.suspended() {
                job.active_seconds += now - self.last_sample.max(job.attempt_started);
            }
            job.profile.record(reading.cpu_seconds, reading.bytes);
            self.scheduler
                .observe(reading.id, reading.bytes, reading.cpu_seconds);
        }
        self.last_sample = now;
    }

    /// Decides what to do now, and returns what the caller must do to processes: `Start` (the
    /// caller then begins the attempt), `Suspend`, `Resume` and `Kill` of a running attempt.
    /// A job killed before its attempt began is only requeued, and not returned.
    /// `machine_left` is what the machine or cgroup can still hand out, when known.
    pub fn decide(&mut self, machine_left: Option<u64>, now: f64) -> Vec<Action> {
        let used = self.scheduler.used();
        let protecting = self.scheduler.protect(machine_left);
        let mut to_do = self.carry_out(protecting, used, machine_left, now);
        if !policy::stops(&to_do) {
            // The farm's nodes first: that is where the memory is; this machine takes what
            // is left, beside the farmed jobs' local shares.
            self.start_on_farm(now, &mut to_do);
            let admitted = self.scheduler.admit_queued();
            to_do.extend(self.carry_out(admitted, used, machine_left, now));
        }
        to_do
    }

    /// Updates the jobs the scheduler's `actions` act on, and returns those the caller must
    /// carry out. `used` is what the jobs used when the scheduler decided, for the log.
    fn carry_out(
        &mut self,
        actions: Vec<Action>,
        used: u64,
        machine_left: Option<u64>,
        now: f64,
    ) -> Vec<Action> {
        let budget = self.scheduler.limits().budget;
        let mut to_do = Vec::new();
        for action in actions {
            let (Action::Start { id, .. }
            | Action::Suspend(id)
            | Action::Resume(id)
            | Action::Kill(id)) = action;
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            log_decision(&action, id, job, budget, used, machine_left);
            let action = match action {
                Action::Start { id, nice } => {
                    let nice = if self.priorities { nice } else { 0 };
                    job.begin(None, nice, now);
                    Action::Start { id, nice }
                }
                Action::Suspend(_) | Action::Resume(_) => {
                    let suspended = matches!(action, Action::Suspend(_));
                    job.state = match job.state {
                        JobState::Admitted { .. } => JobState::Admitted { suspended },
                        JobState::Running { .. } => JobState::Running { suspended },
                        other => other,
                    };
                    job.suspends += u32::from(suspended);
                    action
                }
                Action::Kill(_) => {
                    job.requeues += 1;
                    job.attempt_killed = true;
                    job.leave_node(self.farm.as_mut());
                    let began = matches!(job.state, JobState::Running { .. });
                    job.state = if began {
                        JobState::Killed
                    } else {
                        JobState::Queued
                    };
                    if !began {
                        continue;
                    }
                    action
                }
            };
            to_do.push(action);
        }
        to_do
    }

    /// Starts queued jobs on the farm's nodes, in the queue's order, while a node has room
    /// for a job's predicted peak and this machine for its local share. Jobs waiting to run
    /// alone (after running out of memory where nothing else could take them) stay here.
    fn start_on_farm(&mut self, now: f64, to_do: &mut Vec<Action>) {
        let Some(farm) = self.farm.as_mut() else {
            return;
        };
        let candidates: Vec<(JobId, Estimate)> = self
            .scheduler
            .queued()
            .filter(|&(id, _, alone)| !alone && self.jobs.get(&id).is_some_and(|j| j.farmable))
            .map(|(id, estimate, _)| (id, estimate.clone()))
            .collect();
        for (id, estimate) in candidates {
            let job = self.jobs.get_mut(&id).expect("a queued job is known");
            let need = estimate.peak;
            let Some(node) = farm.place(need) else {
                continue;
            };
            let share = job
                .local_share
                .or(self.largest_local_share)
                .unwrap_or(DEFAULT_LOCAL_SHARE)
                .min(need);
            if !self.scheduler.start_elsewhere(id, Estimate::flat(share)) {
                // This machine has no room for even the client now: try again later.
                farm.release(node, need);
                return;
            }
            tracing::debug!(
                "job {id} {} goes to farm node {} (predicted {}, {} here)",
                job.label,
                farm.spec(node).name,
                format_size(need),
                format_size(share)
            );
            job.begin(Some(node), 0, now);
            job.placed = Some(need);
            job.planned_on_node = need;
            to_do.push(Action::Start { id, nice: 0 });
        }
    }

    /// What to do to the build's processes outside every job.
    pub fn outside_action(&self, machine_left: Option<u64>, any_stopped: bool) -> OutsideAction {
        self.scheduler.outside_action(machine_left, any_stopped)
    }

    /// An attempt of job `id` ended at `now`. Returns what becomes of the job, and whether to
    /// decide now: a slot a finished job leaves waits, at most until the next tick, for a
    /// longer job that followed it last time and has not come yet.
    pub fn attempt_ended(&mut self, id: JobId, ended: Ended, now: f64) -> (AfterAttempt, bool) {
        let job = self
            .jobs
            .get_mut(&id)
            .expect("an attempt ends for a job the driver knows");
        job.cpu_seconds += ended.cpu_seconds;
        job.peak = job.peak.max(ended.max_rss);
        if std::mem::take(&mut job.attempt_killed) {
            // The scheduler requeued it when it chose the kill, and may have started it again
            // since: then the new attempt is the caller's next.
            if job.state == JobState::Killed {
                job.state = JobState::Queued;
            }
            return (AfterAttempt::Retry, true);
        }
        if !job.suspended() {
            job.active_seconds += (now - self.last_sample.max(job.attempt_started)).max(0.0);
        }
        job.state = JobState::Queued;
        if let Some((node, room_had)) = job.leave_node(self.farm.as_mut()) {
            let farm = self.farm.as_mut().expect("the job left a farm node");
            if ended.node_unreachable {
                farm.mark_down(node);
                tracing::info!(
                    "retry job {id} {}: farm node {} is unreachable",
                    job.label,
                    farm.spec(node).name
                );
                let estimate = job.estimate.clone();
                self.scheduler.remove(id);
                self.scheduler.submit(id, job.session, estimate, false);
                return (AfterAttempt::Retry, true);
            }
            if ended.out_of_memory {
                // It needed more than the node had left for it: a node with more room takes
                // it, or this machine does, alone.
                let estimate = job.estimate.clone().at_least(room_had.saturating_add(1));
                let alone = !farm.could_fit(estimate.peak);
                tracing::info!(
                    "retry job {id} {} {}: it ran out of memory on farm node {} with {} (predicted {})",
                    job.label,
                    if alone { "here, alone" } else { "on a node with more room" },
                    farm.spec(node).name,
                    format_size(room_had),
                    format_size(job.estimate.peak),
                );
                job.oom_retries += 1;
                job.alone = alone;
                job.estimate = estimate.clone();
                let (group, floor) = (job.group, estimate.peak);
                self.scheduler.remove(id);
                self.scheduler.submit(id, job.session, estimate, alone);
                self.raise_guessed_in_group(group, floor);
                return (AfterAttempt::Retry, true);
            }
        }
        let ran_here = job.node.is_none();
        if ended.succeeded && !ran_here {
            self.largest_local_share = self.largest_local_share.max(Some(job.peak));
        }
        let predicted = job.estimate.peak;
        if ended.out_of_memory && escalate(job) {
            let how = if job.rung > 0 {
                format!("alone at lower-memory rung {}", job.rung)
            } else if job.alone {
                "alone".to_string()
            } else {
                format!("planned at {}", format_size(job.estimate.peak))
            };
            tracing::info!(
                "retry job {id} {} {how}: it ran out of memory at {} (predicted {})",
                job.label,
                format_size(job.peak),
                format_size(predicted),
            );
            let estimate = job.estimate.clone().at_least(job.peak);
            self.scheduler.remove(id);
            self.scheduler.submit(id, job.session, estimate, job.alone);
            return (AfterAttempt::Retry, true);
        }
        let job = self.jobs.remove(&id).expect("checked above");
        let longest_queued = self
            .jobs
            .values()
            .filter(|job| job.state == JobState::Queued)
            .map(|job| self.bursts.path(&job.key))
            .fold(0.0, f64::max);
        let wait_for_followers =
            self.bursts
                .longer_one_follows(&job.key, longest_queued, &self.arrived);
        let ran = Ran {
            cpu_seconds: ended.cpu_seconds,
            wall_seconds: job.active_seconds,
        };
        let profile = job.profile.finish(ran);
        if ended.succeeded && ran_here {
            self.scheduler.finished(id, ran);
        } else {
            // A job that failed ended early for reasons of its own, and one a farm node
            // compiled ran at that node's pace: its timing says nothing of this machine.
            self.scheduler.remove(id);
        }
        if ended.succeeded && job.rung == 0 && ran_here {
            let run = PastRun {
                peak: job.peak,
                profile: profile.clone(),
                shared: false,
            };
            for (other, prediction) in self.predictor.learn(id, job.group, run) {
                if let Some(waiting) = self.jobs.get_mut(&other) {
                    waiting.estimate = Estimate {
                        waiting_seconds: waiting.estimate.waiting_seconds,
                        ..prediction.estimate.clone()
                    };
                    waiting.source = prediction.source;
                    self.scheduler.repredict(other, prediction.estimate);
                }
            }
        } else {
            self.predictor.forget(id);
        }
        let finished = Finished {
            job,
            succeeded: ended.succeeded,
            ran,
            profile,
        };
        (AfterAttempt::Done(Box::new(finished)), !wait_for_followers)
    }

    /// Raises to `floor` the jobs of `group` still waiting with the default prediction: one of
    /// them ran out of memory on a node with that much room, and nothing else is known of what
    /// they need (a farm node's run teaches no peak), so each would otherwise have to run out
    /// of memory once to learn it.
    fn raise_guessed_in_group(&mut self, group: u64, floor: u64) {
        for (&other, waiting) in &mut self.jobs {
            let guessed = waiting.source == PredictionSource::Default;
            if waiting.group == group && guessed && waiting.state == JobState::Queued {
                waiting.estimate = waiting.estimate.clone().at_least(floor);
                self.scheduler.repredict(other, waiting.estimate.clone());
            }
        }
    }

    /// Forgets a job whose caller went away (its shim was killed, the build interrupted).
    /// Returns it, so that the caller can resume its processes if they were stopped.
    pub fn forget(&mut self, id: JobId) -> Option<Job> {
        self.scheduler.remove(id);
        self.predictor.forget(id);
        let mut job = self.jobs.remove(&id)?;
        job.leave_node(self.farm.as_mut());
        Some(job)
    }
}

/// What to plan a job at that ran out of memory after using `seen` bytes: more than it was
/// seen to use, by a fifth or by 100 MiB, whichever is more (Kubernetes' Vertical Pod
/// Autoscaler raises a container's request so after an OOM kill). Running it alone at once
/// would leave the machine idle for a job that needed only a little more.
fn after_running_out(seen: u64) -> u64 {
    let fifth_more = (seen as f64 * 1.2).ceil() as u64;
    fifth_more.max(seen.saturating_add(100 << 20))
}

/// Moves a job that ran out of memory one step up: first beside the others with room for
/// more than it reached, then alone, then down the lower-memory rungs it has. Returns false
/// when nothing is left to try.
fn escalate(job: &mut Job) -> bool {
    if job.oom_retries == 0 && !job.alone {
        job.estimate = job.estimate.clone().at_least(after_running_out(job.peak));
    } else if !job.alone {
        job.alone = true;
    } else if job.rung < job.lower_rungs {
        job.rung += 1;
    } else {
        return false;
    }
    job.oom_retries += 1;
    true
}

/// One line per decision, with the figures it rests on (`-v`, `HEADROOM_LOG=info`): what a
/// user needs to answer "why did it wait?" or "why was it stopped?". `used` is what the
/// running jobs and the processes outside them used when the scheduler decided.
fn log_decision(
    action: &Action,
    id: JobId,
    job: &Job,
    budget: u64,
    used: u64,
    machine_left: Option<u64>,
) {
    // Called for every action, on the governor's path: nothing is formatted unless logged.
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let label = &job.label;
    let predicted = format_size(job.estimate.peak);
    let seen = format_size(job.peak);
    let budget = format_size(budget);
    let using = format!(
        "the build used {} of the {budget} budget",
        format_size(used)
    );
    let left = machine_left.map_or(String::new(), |left| {
        format!(", {} left on the machine", format_size(left))
    });
    match action {
        Action::Start { nice, .. } => {
            let before = if job.peak > 0 {
                format!(", seen at {seen} before it was stopped")
            } else {
                String::new()
            };
            tracing::info!(
                "start job {id} {label}: predicted {predicted} (from {}){before}; it fits \
beside the running jobs ({using}{left}); attempt {}, nice {nice}",
                job.source.name(),
                job.attempts + 1
            )
        }
        Action::Suspend(_) => tracing::info!(
            "suspend job {id} {label}: seen at {seen} against {predicted} predicted, and \
{using}{left}; it keeps its memory and resumes when there is room"
        ),
        Action::Resume(_) => {
            tracing::info!("resume job {id} {label}: there is room again ({using}{left})")
        }
        Action::Kill(_) => tracing::info!(
            "kill and requeue job {id} {label}: seen at {seen} against {predicted} predicted, \
and {using}{left}; stopping it would not free enough, so it runs again later"
        ),
    }
}

/// The governor's decisions without sockets, processes or sleeps: time is passed in.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::bursts::BurstOffer;

    const GIB: u64 = 1 << 30;

    fn driver(budget: u64, slots: usize) -> Driver {
        Driver::new(Limits { budget, slots }, true)
    }

    fn offer(key: &str, group: u64) -> Offer {
        Offer {
            session: 0,
            key: key.into(),
            label: key.into(),
            group,
            past: None,
            waiting_seconds: 0.0,
            lower_rungs: 0,
            farmable: false,
            local_share: None,
        }
    }

    fn with_history(key: &str, peak: u64) -> Offer {
        Offer {
            session: 0,
            past: Some(PastRun {
                peak,
                profile: None,
                shared: false,
            }),
            ..offer(key, 0)
        }
    }

    fn started(actions: &[Action]) -> Vec<JobId> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Start { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }

    fn succeeded(cpu_seconds: f64, max_rss: u64) -> Ended {
        Ended {
            succeeded: true,
            out_of_memory: false,
            cpu_seconds,
            max_rss,
            node_unreachable: false,
        }
    }

    fn out_of_memory(max_rss: u64) -> Ended {
        Ended {
            succeeded: false,
            out_of_memory: true,
            cpu_seconds: 1.0,
            max_rss,
            node_unreachable: false,
        }
    }

    /// A driver with a farm of `nodes` (memory, slots), offered `peaks` as farmable jobs whose
    /// history knows their peaks and a 100 MiB local share.
    fn farmed(budget: u64, nodes: &[(u64, usize)], peaks: &[u64]) -> (Driver, Vec<JobId>) {
        let mut driver = driver(budget, 1);
        driver.set_farm(Farm::new(
            nodes
                .iter()
                .enumerate()
                .map(|(i, &(memory, slots))| crate::NodeSpec {
                    name: format!("node{i}"),
                    memory,
                    slots,
                })
                .collect(),
        ));
        let ids = peaks
            .iter()
            .enumerate()
            .map(|(i, &peak)| {
                let offer = Offer {
                    session: 0,
                    farmable: true,
                    local_share: Some(100 << 20),
                    ..with_history(&format!("unit{i}.o"), peak)
                };
                driver.offer(offer).0
            })
            .collect();
        (driver, ids)
    }

    fn nodes_of(driver: &Driver, ids: &[JobId]) -> Vec<Option<NodeId>> {
        ids.iter().map(|&id| driver.job(id).unwrap().node).collect()
    }

    #[test]
    fn farm_nodes_take_what_fits_them_and_this_machine_takes_what_is_left() {
        // Two 3 GiB nodes with 2 slots each, 2 GiB jobs: one per node, one here.
        let (mut driver, ids) = farmed(3 * GIB, &[(3 * GIB, 2), (3 * GIB, 2)], &[2 * GIB; 4]);
        assert_eq!(started(&driver.decide(None, 0.0)), ids[..3].to_vec());
        assert_eq!(
            nodes_of(&driver, &ids),
            vec![Some(0), Some(1), None, None],
            "one per node, where it fits; then this machine; nothing fits beside them"
        );
        driver.begin_attempt(ids[0]);
        let (after, _) = driver.attempt_ended(ids[0], succeeded(1.0, 90 << 20), 1.0);
        let AfterAttempt::Done(finished) = after else {
            panic!("it compiled on node 0");
        };
        assert_eq!(finished.job.node, Some(0));
        assert_eq!(started(&driver.decide(None, 1.0)), vec![ids[3]]);
        assert_eq!(driver.job(ids[3]).unwrap().node, Some(0));
    }

    #[test]
    fn a_farmed_job_nothing_is_known_of_reserves_the_local_share_the_build_has_shown() {
        // Room here for a 100 MiB job and one default share (256 MiB) beside it, and three
        // 1 GiB units of which no farmed run is known.
        let mut driver = driver(400 << 20, 2);
        driver.set_farm(Farm::new(
            (0..3)
                .map(|i| crate::NodeSpec {
                    name: format!("node{i}"),
                    memory: 2 * GIB,
                    slots: 1,
                })
                .collect(),
        ));
        let here = driver.offer(with_history("link", 100 << 20)).0;
        let farmed: Vec<JobId> = (0..3)
            .map(|i| {
                let offer = Offer {
                    session: 0,
                    farmable: true,
                    ..with_history(&format!("unit{i}.o"), GIB)
                };
                driver.offer(offer).0
            })
            .collect();
        assert_eq!(started(&driver.decide(None, 0.0)), vec![farmed[0], here]);
        driver.begin_attempt(farmed[0]);
        driver.attempt_ended(farmed[0], succeeded(1.0, 20 << 20), 1.0);
        assert_eq!(
            started(&driver.decide(None, 1.0)),
            farmed[1..].to_vec(),
            "the first farmed run used 20 MiB here: the others reserve that, and both fit"
        );
    }

    #[test]
    fn a_job_out_of_memory_on_a_node_goes_to_a_larger_one_or_runs_here_alone() {
        let (mut driver, ids) = farmed(GIB, &[(2 * GIB, 1), (6 * GIB, 1)], &[GIB, 5 * GIB]);
        driver.decide(None, 0.0);
        assert_eq!(
            nodes_of(&driver, &ids),
            vec![Some(0), Some(1)],
            "tightest fit"
        );
        driver.begin_attempt(ids[0]);
        let (after, _) = driver.attempt_ended(ids[0], out_of_memory(90 << 20), 1.0);
        assert!(matches!(after, AfterAttempt::Retry));
        let job = driver.job(ids[0]).unwrap();
        assert!(
            job.estimate.peak > 2 * GIB,
            "it needs more than the node had"
        );
        assert_eq!(job.oom_retries, 1);
        assert!(!job.alone, "the 6 GiB node can take it once it has room");

        // Out of memory on the largest node: only this machine, alone, is left.
        let (mut driver, ids) = farmed(8 * GIB, &[(2 * GIB, 1)], &[GIB]);
        driver.decide(None, 0.0);
        assert_eq!(driver.job(ids[0]).unwrap().node, Some(0));
        driver.begin_attempt(ids[0]);
        driver.attempt_ended(ids[0], out_of_memory(90 << 20), 1.0);
        let job = driver.job(ids[0]).unwrap();
        assert!(job.alone && job.estimate.peak > 2 * GIB);
        assert_eq!(started(&driver.decide(None, 1.0)), vec![ids[0]]);
        assert_eq!(driver.job(ids[0]).unwrap().node, None, "it runs here");
    }

    #[test]
    fn a_group_nothing_is_known_of_learns_from_one_out_of_memory_on_a_node() {
        let mut driver = driver(GIB, 1);
        driver.set_farm(Farm::new(vec![crate::NodeSpec {
            name: "node".into(),
            memory: 8 * GIB,
            slots: 8,
        }]));
        let unknown = |key: &str| Offer {
            session: 0,
            farmable: true,
            ..offer(key, 7)
        };
        let first = driver.offer(unknown("a.o")).0;
        driver.decide(None, 0.0);
        let guessed = driver.job(first).unwrap().estimate.peak;
        driver.begin_attempt(first);
        let second = driver.offer(unknown("b.o")).0;
        let third = driver.offer(unknown("c.o")).0;
        // The node had room for 2 of them at the default; the first ran out all the same.
        for id in [second, third] {
            assert_eq!(driver.job(id).unwrap().node, None, "not started yet");
        }
        driver.attempt_ended(first, out_of_memory(50 << 20), 1.0);
        let floor = driver.job(first).unwrap().estimate.peak;
        assert!(floor > guessed);
        for id in [second, third] {
            assert!(
                driver.job(id).unwrap().estimate.peak >= floor,
                "raised with it"
            );
        }
    }

    #[test]
    fn a_node_the_engine_cannot_reach_takes_nothing_more() {
        let (mut driver, ids) = farmed(GIB, &[(5 * GIB, 2)], &[2 * GIB; 2]);
        assert_eq!(started(&driver.decide(None, 0.0)), ids.clone());
        assert_eq!(nodes_of(&driver, &ids), vec![Some(0), Some(0)]);
        for &id in &ids {
            driver.begin_attempt(id);
        }
        let unreachable = Ended {
            node_unreachable: true,
            ..Ended::default()
        };
        let (after, _) = driver.attempt_ended(ids[0], unreachable, 0.5);
        assert!(matches!(after, AfterAttempt::Retry));
        assert_eq!(driver.job(ids[0]).unwrap().oom_retries, 0);
        // The node takes nothing more. The retried job is bigger than this machine's budget,
        // so it runs here once the other job, on the node, has ended: started beside it, it
        // would only be suspended and killed.
        assert!(started(&driver.decide(None, 0.5)).is_empty());
        driver.attempt_ended(ids[1], succeeded(1.0, 50 << 20), 1.0);
        assert_eq!(started(&driver.decide(None, 1.0)), vec![ids[0]]);
        assert_eq!(driver.job(ids[0]).unwrap().node, None);
    }

    #[test]
    fn a_job_waits_here_for_room_beside_the_local_shares_of_farmed_jobs() {
        // The node takes one job; the second fits here alone, but not beside the first's
        // local share: it waits for that, as starting it would only get it killed.
        let (mut driver, ids) = farmed(GIB, &[(GIB, 1)], &[GIB - (64 << 20); 2]);
        assert_eq!(started(&driver.decide(None, 0.0)), vec![ids[0]]);
        assert_eq!(driver.job(ids[0]).unwrap().node, Some(0));
        driver.begin_attempt(ids[0]);
        assert!(started(&driver.decide(None, 0.1)).is_empty());
        driver.attempt_ended(ids[0], succeeded(1.0, 100 << 20), 1.0);
        assert_eq!(started(&driver.decide(None, 1.0)), vec![ids[1]]);
    }

    #[test]
    fn a_job_runs_from_offer_to_its_record_with_stopped_time_left_out() {
        let mut driver = driver(2 * GIB, 2);
        let (old, decide_now) = driver.offer(with_history("old.o", GIB));
        assert!(decide_now, "no earlier build: nothing to wait for");
        let (young, _) = driver.offer(with_history("young.o", GIB / 2));
        assert_eq!(started(&driver.decide(None, 0.05)), vec![old, young]);
        assert_eq!(
            driver.job(young).unwrap().state,
            JobState::Admitted { suspended: false }
        );
        assert!(driver.begin_attempt(old).is_some());
        assert!(driver.begin_attempt(young).is_some());
        assert!(driver.begin_attempt(young).is_none(), "begins once");
        let reading = |id, bytes| Reading {
            id,
            bytes,
            cpu_seconds: 0.1,
        };
        // Counted from its start (0.05), not from the build's start: 0.05 seconds active.
        driver.sample(&[reading(old, GIB), reading(young, GIB / 8)], 0, 0.1);
        assert!(driver.decide(None, 0.1).is_empty());
        // The old job grows past the budget's suspend line: the young one is stopped at 0.2.
        driver.sample(
            &[reading(old, 2 * GIB - GIB / 4), reading(young, GIB / 8)],
            0,
            0.2,
        );
        assert_eq!(driver.decide(None, 0.2), vec![Action::Suspend(young)]);
        let (other, _) = driver.offer(offer("c.o", 2));
        // Stopped from 0.2 until the old job shrinks back and it is resumed at 0.4.
        driver.sample(
            &[reading(old, 2 * GIB - GIB / 4), reading(young, GIB / 8)],
            0,
            0.3,
        );
        assert!(driver.decide(None, 0.3).is_empty());
        driver.sample(&[reading(old, GIB / 4), reading(young, GIB / 8)], 0, 0.4);
        assert_eq!(driver.decide(None, 0.4), vec![Action::Resume(young)]);
        driver.sample(&[reading(young, GIB / 2)], 0, 0.5);
        let (after, decide_now) = driver.attempt_ended(young, succeeded(0.3, GIB / 2), 0.55);
        assert!(decide_now);
        let AfterAttempt::Done(finished) = after else {
            panic!("a job that succeeded is done");
        };
        // Active 0.05..0.2 and 0.4..0.55: 0.3 of the 0.5 seconds since its start.
        assert!(
            (finished.ran.wall_seconds - 0.3).abs() < 1e-9,
            "{:?}",
            finished.ran
        );
        assert_eq!(finished.job.suspends, 1);
        assert_eq!(finished.job.peak, GIB / 2);
        assert_eq!(finished.job.first_start, Some(0.05));
        // The job offered while one was stopped starts once the old one, seen near the
        // budget, has ended too.
        driver.attempt_ended(old, succeeded(0.5, 2 * GIB - GIB / 4), 0.55);
        assert_eq!(started(&driver.decide(None, 0.55)), vec![other]);
    }

    #[test]
    fn a_finished_job_teaches_the_jobs_of_its_group_still_waiting() {
        let mut driver = driver(4 * GIB, 1);
        let (first, _) = driver.offer(offer("a.o", 7));
        let (second, _) = driver.offer(offer("b.o", 7));
        assert_eq!(
            driver.job(second).unwrap().source,
            PredictionSource::Default
        );
        driver.decide(None, 0.0);
        driver.begin_attempt(first);
        driver.attempt_ended(first, succeeded(1.0, GIB), 1.0);
        let waiting = driver.job(second).unwrap();
        assert_eq!(waiting.source, PredictionSource::Group);
        assert!(waiting.estimate.peak > GIB && waiting.estimate.peak < 2 * GIB);
    }

    #[test]
    fn a_job_stopped_or_killed_before_its_attempt_began_begins_so() {
        let mut driver = driver(2 * GIB, 2);
        let (old, _) = driver.offer(with_history("old.o", GIB));
        let (young, _) = driver.offer(with_history("young.o", GIB / 2));
        driver.decide(None, 0.0);
        driver.begin_attempt(old);
        // The old job grows to the budget before the young one's shim has taken its start.
        let reading = |id, bytes| Reading {
            id,
            bytes,
            cpu_seconds: 1.0,
        };
        driver.sample(&[reading(old, 2 * GIB - GIB / 8)], 0, 0.1);
        assert_eq!(driver.decide(None, 0.1), vec![Action::Suspend(young)]);
        let begun = driver.begin_attempt(young).expect("it was started");
        assert!(begun.suspended(), "it begins stopped");
        // Past the budget the young job is killed and requeued: its attempt must still end.
        driver.sample(&[reading(old, 2 * GIB + 1), reading(young, 1)], 0, 0.2);
        assert_eq!(driver.decide(None, 0.2), vec![Action::Kill(young)]);
        assert_eq!(driver.job(young).unwrap().state, JobState::Killed);
        let ended = Ended {
            succeeded: false,
            out_of_memory: false,
            cpu_seconds: 0.0,
            max_rss: 0,
            node_unreachable: false,
        };
        assert!(matches!(
            driver.attempt_ended(young, ended, 0.3),
            (AfterAttempt::Retry, true)
        ));
        assert_eq!(driver.job(young).unwrap().requeues, 1);
    }

    #[test]
    fn a_killed_attempt_that_ends_after_its_job_started_again_is_a_requeue_not_an_oom() {
        let mut driver = driver(2 * GIB, 2);
        let (old, _) = driver.offer(with_history("old.o", GIB));
        let (young, _) = driver.offer(with_history("young.o", GIB / 2));
        driver.decide(None, 0.0);
        driver.begin_attempt(old);
        driver.begin_attempt(young);
        let reading = |id, bytes| Reading {
            id,
            bytes,
            cpu_seconds: 1.0,
        };
        driver.sample(&[reading(old, 2 * GIB + 1), reading(young, 1)], 0, 0.1);
        assert_eq!(driver.decide(None, 0.1), vec![Action::Kill(young)]);
        // The old job shrinks back, and the scheduler starts the requeued job again before
        // its killed attempt has reported its end.
        driver.sample(&[reading(old, GIB)], 0, 0.2);
        assert!(started(&driver.decide(None, 0.2)).contains(&young));
        // The kill reaches the shim as a SIGKILL, which looks like the OOM killer's.
        let (after, _) = driver.attempt_ended(young, out_of_memory(1), 0.3);
        assert!(matches!(after, AfterAttempt::Retry));
        let job = driver.job(young).unwrap();
        assert_eq!((job.requeues, job.oom_retries), (1, 0));
        assert!(!job.alone, "a requeue does not make a job run alone");
        assert!(
            driver.begin_attempt(young).is_some(),
            "the start the scheduler chose is the shim's next attempt"
        );
    }

    #[test]
    fn a_job_killed_before_it_began_is_only_requeued() {
        let mut driver = driver(2 * GIB, 2);
        let (old, _) = driver.offer(with_history("old.o", GIB));
        let (young, _) = driver.offer(with_history("young.o", GIB / 2));
        driver.decide(None, 0.0);
        driver.begin_attempt(old);
        let over = Reading {
            id: old,
            bytes: 2 * GIB + 1,
            cpu_seconds: 1.0,
        };
        driver.sample(&[over], 0, 0.1);
        assert_eq!(driver.decide(None, 0.1), vec![], "nothing runs to kill");
        assert_eq!(driver.job(young).unwrap().state, JobState::Queued);
        assert!(driver.begin_attempt(young).is_none());
    }

    #[test]
    fn after_running_out_plans_a_fifth_or_100_mib_more() {
        assert_eq!(after_running_out(10 * GIB), 12 * GIB);
        assert_eq!(after_running_out(100 << 20), 200 << 20);
    }

    #[test]
    fn out_of_memory_retries_with_room_for_more_then_alone_then_down_the_rungs() {
        let mut driver = driver(8 * GIB, 4);
        let (id, _) = driver.offer(Offer {
            session: 0,
            lower_rungs: 1,
            ..offer("big.o", 1)
        });
        let (beside, _) = driver.offer(offer("small.o", 2));
        let attempt = |driver: &mut Driver, at: f64| {
            let actions = driver.decide(None, at);
            for started in started(&actions) {
                driver.begin_attempt(started);
            }
            actions
        };
        assert_eq!(started(&attempt(&mut driver, 0.0)), vec![id, beside]);
        // First beside the others, planned a fifth above what it reached.
        let (after, _) = driver.attempt_ended(id, out_of_memory(5 * GIB + GIB / 2), 1.0);
        assert!(matches!(after, AfterAttempt::Retry));
        let job = driver.job(id).unwrap();
        assert!(!job.alone && job.rung == 0 && job.oom_retries == 1);
        assert_eq!(job.estimate.peak, after_running_out(5 * GIB + GIB / 2));
        assert!(
            started(&attempt(&mut driver, 1.0)).is_empty(),
            "6.6 GiB does not fit beside small.o's 2 GiB default"
        );
        driver.attempt_ended(beside, succeeded(1.0, GIB), 2.0);
        assert_eq!(started(&attempt(&mut driver, 2.0)), vec![id]);
        // Then alone.
        driver.attempt_ended(id, out_of_memory(6 * GIB), 3.0);
        let job = driver.job(id).unwrap();
        assert!(job.alone && job.rung == 0 && job.oom_retries == 2);
        assert_eq!(started(&attempt(&mut driver, 3.0)), vec![id]);
        driver.attempt_ended(id, out_of_memory(6 * GIB), 4.0);
        assert_eq!(driver.job(id).unwrap().rung, 1, "the lower-memory rung");
        attempt(&mut driver, 4.0);
        let (after, _) = driver.attempt_ended(id, out_of_memory(6 * GIB), 5.0);
        let AfterAttempt::Done(finished) = after else {
            panic!("nothing left to try");
        };
        assert_eq!((finished.job.attempts, finished.job.oom_retries), (4, 3));
        assert!(!finished.succeeded);
    }

    #[test]
    fn new_limits_keep_the_running_jobs_and_size_the_next_unknown_ones() {
        let mut driver = driver(8 * GIB, 4);
        let first = driver.offer(offer("a.o", 1)).0;
        assert_eq!(started(&driver.decide(None, 0.0)), vec![first]);
        driver.begin_attempt(first);
        // A second session joins: the governor halves the budget.
        let halved = Limits {
            budget: 4 * GIB,
            slots: 4,
        };
        driver.set_limits(halved);
        let second = driver.offer(offer("b.o", 2)).0;
        let expected = crate::budget::default_job_peak(halved.budget, halved.slots);
        assert_eq!(driver.job(second).unwrap().estimate.peak, expected);
        assert_ne!(expected, crate::budget::default_job_peak(8 * GIB, 4));
        assert_eq!(
            driver.job(first).unwrap().state,
            JobState::Running { suspended: false }
        );
    }

    #[test]
    fn jobs_nothing_is_known_of_get_a_share_of_what_the_budget_leaves_to_jobs() {
        let mut driver = driver(6 * GIB, 2);
        // pip's own Python holds 1 GiB of the budget beside the jobs.
        driver.sample(&[], GIB, 0.0);
        let (first, _) = driver.offer(offer("flash_api.o", 1));
        let (second, _) = driver.offer(offer("kernel.o", 2));
        assert_eq!(
            driver.job(first).unwrap().estimate.peak,
            crate::budget::default_job_peak(5 * GIB, 2)
        );
        assert_eq!(
            started(&driver.decide(None, 0.0)),
            vec![first, second],
            "two shares fit beside what runs outside the jobs"
        );
    }

    #[test]
    fn without_priorities_every_job_starts_at_nice_0() {
        for priorities in [true, false] {
            let mut driver = Driver::new(
                Limits {
                    budget: 8 * GIB,
                    slots: 2,
                },
                priorities,
            );
            let profile = Profile::new(crate::profile::ran(10.0, 10.0), &[1, 4]);
            let long = Offer {
                session: 0,
                past: Some(PastRun {
                    peak: GIB,
                    profile,
                    shared: false,
                }),
                ..offer("long.o", 1)
            };
            driver.offer(long);
            let short = Offer {
                session: 0,
                waiting_seconds: 2.0,
                ..offer("short.o", 2)
            };
            let (short, _) = driver.offer(short);
            let nice = driver
                .decide(None, 0.0)
                .into_iter()
                .find_map(|action| match action {
                    Action::Start { id, nice } if id == short => Some(nice),
                    _ => None,
                });
            assert_eq!(nice.unwrap() > 0, priorities, "priorities {priorities}");
        }
    }

    #[test]
    fn a_job_first_in_its_burst_holds_the_decision_for_a_longer_one_coming() {
        let mut driver = driver(8 * GIB, 2);
        let burst = |key: &str, path: f64| BurstOffer {
            key: key.into(),
            offered_ms: 0,
            end_ms: 10_000,
            path,
        };
        driver.warm_start(WarmStart {
            bursts: Bursts::new([burst("short.o", 1.0), burst("long.o", 9.0)]),
            ..WarmStart::default()
        });
        assert!(
            !driver.offer(offer("short.o", 1)).1,
            "the long one is coming"
        );
        assert!(
            driver.offer(offer("long.o", 1)).1,
            "nothing longer is coming"
        );
    }
}
