//! Admission and the live safety net.
//!
//! Admission: a job starts when a CPU slot is free and its predicted peak fits in the budget
//! next to the reservations of the running jobs (a running job reserves the larger of its
//! prediction and what it uses now; the margins of predictions pool, see [`crate::plan`]).
//! Where that fails but profiles from earlier runs say how the jobs' memory moves over time,
//! the job still starts if it fits in every slice of the future (`plan`): its peak comes when
//! the others' have passed. Smaller jobs may overtake a queued job that does not fit, but only
//! a bounded number of times, so large jobs never starve behind a stream of small ones. A job
//! bigger than the whole budget has it to itself at its peak: without a profile it starts once
//! nothing runs (farmed jobs included), with one it may start where the others end before its
//! peak comes. A job that knows no profile of its own and fits no plan still starts once every
//! running job has passed its peak, unless one is beyond the whole budget: at worst it is
//! stopped before their needs meet. Jobs
//! whose length is known from their profile queue longest first, counting with each job the
//! work that waited on it in an earlier build (`chain`), and each job starts at a CPU niceness
//! that grows with how far its path is from the longest one, so that when jobs want more cores
//! than there are, the kernel gives them to the jobs the build waits on.
//!
//! Sessions: every job is of a session (a `headroom build`, a `headroom run`) of one governor.
//! While more than one session has jobs queued, admission first gives each its share of the
//! slots (the slots divided among them, at least one each), round by round: each session that
//! runs fewer than n jobs may start its n-th, in queue order within it, so that sessions that
//! run fewer jobs also have the first call on memory that frees. The slots left go to
//! whoever can use them. No job is ever stopped to admit another;
//! the safety net acts on memory alone, across sessions by the same rules. With one session
//! admission is as if sessions did not exist.
//!
//! Safety net: when what the jobs really use nears the budget, the youngest running job is
//! suspended (its growth stops) and resumed when there is room again; once stopped jobs hold a
//! quarter of the budget, the youngest of them is killed and requeued instead (unless it has
//! done much of the work, or the jobs beside it have all passed their peaks); past the budget,
//! or when the machine itself is nearly out, the youngest job is killed and requeued. The
//! oldest running job is never suspended or killed, so the build always makes progress.

use std::collections::VecDeque;

use crate::chain;
use crate::plan::{Need, Outlook, Plan, Total};
use crate::profile::{Profile, Ran};
use crate::slack::TimingSlack;
use crate::{JobId, SessionId};

/// What the budget and the machine allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes the jobs together may use.
    pub budget: u64,
    /// Jobs that may run at once (CPU slots).
    pub slots: usize,
}

/// When the safety net acts, as fractions of the budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Suspend the youngest job when real use reaches this fraction of the budget.
    pub suspend_at: f64,
    /// Resume a suspended job when real use plus its expected growth stays below this fraction.
    pub resume_below: f64,
    /// Kill the youngest job when the machine (or cgroup) has less than this many bytes left.
    pub machine_reserve: u64,
    /// How many later jobs may overtake a queued job that does not fit yet.
    pub max_overtakes: usize,
    /// How far a job may stray from its profile in CPU time and pace (0.2 = 20%): admission
    /// over time plans for each job's peak anywhere in that window. Once jobs of this build
    /// finish along their profiles, the slack follows how far they really strayed.
    pub timing_slack: f64,
}

impl Thresholds {
    pub fn for_limits(limits: Limits) -> Self {
        // Admission fills the budget by design (flat reservations, or plans over time, up to
        // the budget), so the net keeps out of the way of jobs that behave as predicted: it
        // acts in the last 8% of the budget, but never more than the last 512 MiB, which is
        // room for jobs to grow between two samples; the budget itself keeps a reserve below
        // the machine.
        let budget = limits.budget.max(1) as f64;
        let margin = (0.08 * budget).min(SUSPEND_MARGIN_MOST as f64) / budget;
        Thresholds {
            suspend_at: 1.0 - margin,
            resume_below: 1.0 - 2.0 * margin,
            machine_reserve: (limits.budget / 50).max(32 << 20),
            max_overtakes: 4 * limits.slots.max(1),
            timing_slack: 0.2,
        }
    }
}

/// The most bytes below the budget at which the safety net starts suspending jobs.
const SUSPEND_MARGIN_MOST: u64 = 512 << 20;

/// CPU seconds of work that a stopped job may lose to a kill and a fresh start, whatever
/// the others have done.
const LITTLE_WORK: f64 = 30.0;

/// A job using less than this fraction of its highest use so far has left its peak phase
/// (a compiler's memory falls to a fraction of its peak once its heaviest pass is done).
const PEAK_PASSED: f32 = 0.75;

/// Whether `bytes` is below the peak phase of a job whose highest use was `peak`.
fn below_peak_phase(bytes: u64, peak: u64) -> bool {
    (bytes as f64) < f64::from(PEAK_PASSED) * peak as f64
}

/// What the caller must do to the processes of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start the job at this CPU niceness (see [`chain::niceness`]).
    Start {
        id: JobId,
        nice: u8,
    },
    /// Stop the job (SIGSTOP): it keeps its memory but stops growing.
    Suspend(JobId),
    Resume(JobId),
    /// Kill the job; the scheduler has already put it back at the front of the queue.
    Kill(JobId),
}

/// What a job is expected to need.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// The most bytes it will use at once.
    pub peak: u64,
    /// Of `peak`, the bytes allowed for how far the job may stray from its last run. Jobs
    /// stray independently, so admission pools the margins of jobs running together instead
    /// of adding them up (see [`crate::plan`]).
    pub margin: u64,
    /// How its memory moves over its life, when an earlier run showed it.
    pub profile: Option<Profile>,
    /// Seconds of work that waited on this job in an earlier build
    /// ([`waiting_seconds`](crate::chain::waiting_seconds)), 0 when unknown.
    pub waiting_seconds: f64,
    /// The profile is another job's (the largest finished job of its group), not this job's
    /// own: how far the job strays from it is how the group's jobs differ in length, not how
    /// one job's runs differ, so it is planned with the configured timing slack and does not
    /// teach the learned one.
    pub borrowed_profile: bool,
    /// Predicted by the default because no job of this group (same compiler and flags) has
    /// finished in this build yet. While one such job of a group runs, the others start only
    /// in slots no other job can fill (see `Scheduler::waits_for_its_group`).
    pub learning_group: Option<u64>,
}

impl Estimate {
    /// An estimate with no profile: the job may need its peak at any moment.
    pub fn flat(peak: u64) -> Self {
        Estimate {
            peak,
            margin: 0,
            profile: None,
            waiting_seconds: 0.0,
            borrowed_profile: false,
            learning_group: None,
        }
    }

    /// The same estimate, with a peak of at least `bytes` (what an attempt was seen to use).
    pub fn at_least(self, bytes: u64) -> Self {
        let need = self.need().at_least(bytes);
        Estimate {
            peak: need.bytes,
            margin: need.margin,
            ..self
        }
    }

    fn need(&self) -> Need {
        Need {
            bytes: self.peak,
            margin: self.margin.min(self.peak),
        }
    }

    fn outlook(&self, slack: f64) -> Outlook<'_> {
        match &self.profile {
            None => Outlook::Flat(self.need()),
            Some(profile) => Outlook::Timed {
                profile,
                progress: 0.0,
                peak: self.need(),
                floor: 0,
                slack,
            },
        }
    }
}

#[derive(Debug, Clone)]
struct Queued {
    id: JobId,
    session: SessionId,
    estimate: Estimate,
    alone: bool,
    overtaken: usize,
}

#[derive(Debug, Clone)]
struct Running {
    id: JobId,
    session: SessionId,
    estimate: Estimate,
    alone: bool,
    /// What it needs on this machine while a farm node compiles it (the engine's client and
    /// the preprocessor); `None` when it compiles here.
    local_share: Option<Estimate>,
    /// Latest measured memory of the job's processes.
    current: u64,
    /// Highest measured memory during this attempt.
    peak: u64,
    /// CPU seconds this attempt has used: how far along its profile it is.
    cpu_seconds: f64,
    /// CPU seconds this attempt had used when it first fell below [`PEAK_PASSED`] of `peak`
    /// after reaching it; `None` while it has not, or has since risen above it.
    fell_at: Option<f64>,
    suspended: bool,
}

impl Running {
    /// What the job is expected to need here at most from now on.
    fn reservation(&self) -> Need {
        if self.suspended {
            Need {
                bytes: self.current,
                margin: 0,
            }
        } else {
            self.local_estimate().need().at_least(self.current)
        }
    }

    fn local_estimate(&self) -> &Estimate {
        self.local_share.as_ref().unwrap_or(&self.estimate)
    }

    fn compiles_here(&self) -> bool {
        self.local_share.is_none()
    }

    /// Whether the job was predicted, or seen, to need more than the whole `budget`: it has
    /// shown that it fits beside nothing, so no job starts in its falling tail either.
    fn beyond(&self, budget: u64) -> bool {
        self.local_estimate().peak.max(self.peak) > budget
    }

    /// Whether the job has fallen from its highest use to below its peak phase and stays
    /// there: a compiler's memory falls once its heaviest pass is done.
    fn past_its_peak(&self) -> bool {
        self.fell_at.is_some() && below_peak_phase(self.current, self.peak)
    }

    /// What the job is expected to need over the rest of its life. A job that has used more
    /// CPU time than its profile allows for is off the map: it reserves its peak to the end.
    /// Jobs of a group differ in length more than in shape, so a job that follows a profile
    /// borrowed from another job of its group, and has fallen from its own peak, is placed
    /// along that profile by lining up where the two left their peaks, and never back in the
    /// profile's peak phase. The rest of such a profile is planned as it is, without the
    /// configured slack, which guesses at how far the group's jobs differ: if the job runs
    /// longer, one started in its tail is stopped before their needs meet, and waits there
    /// with its work, since this one only gives memory back (`gives_back_for_something`).
    fn outlook(&self, slack: f64) -> Outlook<'_> {
        let estimate = self.local_estimate();
        let (progress, slack_ahead) = match (&estimate.profile, self.fell_at) {
            (Some(profile), Some(fell_at)) if estimate.borrowed_profile && self.past_its_peak() => {
                // Past the profile's peak phase even at the far end of the timing slack.
                let profile_fell = profile.fell_below_peak_at(PEAK_PASSED);
                let progress =
                    (self.cpu_seconds * profile_fell / fell_at).max(profile_fell * (1.0 + slack));
                // Once past the profile's end, what it holds is planned with the slack again.
                let ahead = if progress < profile.cpu_seconds() {
                    0.0
                } else {
                    slack
                };
                (progress, ahead)
            }
            _ => (self.cpu_seconds, slack),
        };
        match &estimate.profile {
            Some(profile)
                if !self.suspended && progress / (1.0 + slack) < profile.cpu_seconds() =>
            {
                Outlook::Timed {
                    profile,
                    progress,
                    peak: self.local_estimate().need().at_least(self.peak),
                    floor: self.current,
                    slack: slack_ahead,
                }
            }
            _ => Outlook::Flat(self.reservation()),
        }
    }
}

/// The policy's whole state: the queue in arrival order and the running jobs oldest first.
#[derive(Debug, Clone)]
pub struct Scheduler {
    limits: Limits,
    thresholds: Thresholds,
    queue: VecDeque<Queued>,
    running: Vec<Running>,
    slack: TimingSlack,
    /// What the build's processes outside every job use now (a build driver, a compiler no
    /// interceptor saw): real memory, so admission and the safety net count it.
    outside: u64,
    /// What other users' governors in the same memory domain hold now beyond what the budget
    /// already left out: admission leaves it to them; the safety net, which acts on real use,
    /// does not count it.
    held_elsewhere: u64,
}

/// What the caller must do to processes outside every job, which headroom cannot requeue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutsideAction {
    /// Stop the largest of them (SIGSTOP): memory is about to run out and stopping jobs
    /// did not help.
    StopLargest,
    /// Let every stopped one go on.
    ResumeAll,
    Nothing,
}

impl Scheduler {
    pub fn new(limits: Limits) -> Self {
        Self::with_thresholds(limits, Thresholds::for_limits(limits))
    }

    pub fn with_thresholds(limits: Limits, thresholds: Thresholds) -> Self {
        Scheduler {
            limits: with_a_slot(limits),
            thresholds,
            queue: VecDeque::new(),
            running: Vec::new(),
            slack: TimingSlack::new(thresholds.timing_slack),
            outside: 0,
            held_elsewhere: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes new limits (sessions joined or left the governor, and its budget or slots
    /// changed): the safety net's thresholds follow them as [`Scheduler::new`] sets them, and
    /// the queued and running jobs stay as they are. Running jobs beyond new, smaller limits
    /// are not stopped for it: admission waits until they fit again, and the safety net
    /// acts on what they really use, as ever.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = with_a_slot(limits);
        self.thresholds = Thresholds::for_limits(limits);
    }

    /// Queues a job of `session`. An `alone` job (an OOM retry) runs with no other job beside
    /// it.
    ///
    /// Jobs queue by the longest path they start: their own expected length plus the work
    /// that waited on them in an earlier build (the longest path ends the build if it starts last), but
    /// never ahead of a job that has already been overtaken or waits to run alone; jobs of
    /// unknown length and unknown followers queue in the order they come.
    pub fn submit(&mut self, id: JobId, session: SessionId, estimate: Estimate, alone: bool) {
        let seconds = expected_seconds(&estimate);
        let after_waiting = self
            .queue
            .iter()
            .rposition(|job| job.overtaken > 0 || job.alone)
            .map_or(0, |index| index + 1);
        let position = (after_waiting..self.queue.len())
            .find(|&index| expected_seconds(&self.queue[index].estimate) < seconds)
            .unwrap_or(self.queue.len());
        let job = Queued {
            id,
            session,
            estimate,
            alone,
            overtaken: 0,
        };
        self.queue.insert(position, job);
    }

    /// A running job ended having run so (CPU seconds, and wall seconds while not stopped):
    /// forgets it and notes how far it strayed from its own profile.
    pub fn finished(&mut self, id: JobId, ran: Ran) {
        let own_profile = self
            .running
            .iter()
            .find(|job| job.id == id)
            .filter(|job| !job.estimate.borrowed_profile)
            .and_then(|job| job.estimate.profile.as_ref());
        if let Some(profile) = own_profile {
            self.slack.note(profile, ran);
        }
        self.remove(id);
    }

    /// Notes how far jobs strayed between their runs in two earlier builds, each as
    /// `(earlier run, later run)`, oldest later run first: a build starts with the timing
    /// slack its machine showed, once enough jobs have, instead of the configured one.
    pub fn note_reruns(&mut self, reruns: impl IntoIterator<Item = (Ran, Ran)>) {
        for (earlier, later) in reruns {
            self.slack.note_rerun(earlier, later);
        }
    }

    /// Forgets a job, queued or running (its client went away, or it is to be retried).
    pub fn remove(&mut self, id: JobId) {
        self.queue.retain(|job| job.id != id);
        self.running.retain(|job| job.id != id);
    }

    /// Replaces the estimate of a queued or running job, for example when a finished job of
    /// its group has just shown what such jobs really need. What waited on the job stays.
    pub fn repredict(&mut self, id: JobId, estimate: Estimate) {
        let keeping_waiting = |old: &Estimate| Estimate {
            waiting_seconds: old.waiting_seconds,
            ..estimate.clone()
        };
        if let Some(job) = self.queue.iter_mut().find(|job| job.id == id) {
            job.estimate = keeping_waiting(&job.estimate);
        }
        if let Some(job) = self.running.iter_mut().find(|job| job.id == id) {
            job.estimate = keeping_waiting(&job.estimate);
        }
    }

    /// Records the memory a running job uses now, and the CPU seconds its current attempt has
    /// used so far.
    pub fn observe(&mut self, id: JobId, bytes: u64, cpu_seconds: f64) {
        if let Some(job) = self.running.iter_mut().find(|job| job.id == id) {
            job.current = bytes;
            if bytes > job.peak {
                job.peak = bytes;
                job.fell_at = None;
            } else if job.fell_at.is_none() && below_peak_phase(bytes, job.peak) {
                job.fell_at = Some(cpu_seconds);
            }
            job.cpu_seconds = cpu_seconds;
        }
    }

    pub fn is_queued(&self, id: JobId) -> bool {
        self.queue.iter().any(|job| job.id == id)
    }

    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    pub fn queued_count(&self) -> usize {
        self.queue.len()
    }

    /// Records what the build's processes outside every job use now.
    pub fn observe_outside(&mut self, bytes: u64) {
        self.outside = bytes;
    }

    /// Records what other users' governors hold now beyond what the budget left out.
    pub fn observe_held_elsewhere(&mut self, bytes: u64) {
        self.held_elsewhere = bytes;
    }

    /// What the running jobs really use now, suspended ones included, and what runs outside
    /// them.
    pub fn used(&self) -> u64 {
        self.outside + self.running.iter().map(|job| job.current).sum::<u64>()
    }

    /// What to do with processes outside every job, after [`Scheduler::decide`]: they are
    /// stopped only as a last resort, when use is past the budget (or the machine is short)
    /// with no job left to stop but the oldest, and only while a job runs that will free
    /// memory; they go on once use is back under the resume line, or when no job runs.
    pub fn outside_action(&self, machine_left: Option<u64>, any_stopped: bool) -> OutsideAction {
        let over = self.used() > self.limits.budget || self.machine_short(machine_left);
        let jobs_left_to_stop = self.running.iter().skip(1).any(|job| !job.suspended);
        let resume_line = self.thresholds.resume_below * self.limits.budget as f64;
        if self.running.is_empty() || (any_stopped && (self.used() as f64) < resume_line) {
            return if any_stopped {
                OutsideAction::ResumeAll
            } else {
                OutsideAction::Nothing
            };
        }
        if over && !jobs_left_to_stop && self.outside > 0 {
            OutsideAction::StopLargest
        } else {
            OutsideAction::Nothing
        }
    }

    /// What the running jobs have reserved: the admission side of the budget.
    pub fn reserved(&self) -> u64 {
        self.reservations().bytes()
    }

    fn reservations(&self) -> Total {
        self.running
            .iter()
            .fold(Total::default(), |total, job| total.with(job.reservation()))
    }

    /// Decides what to do now. `machine_left` is what the machine or cgroup can still hand
    /// out (for example MemAvailable), when known: it catches memory that other programs take.
    pub fn decide(&mut self, machine_left: Option<u64>) -> Vec<Action> {
        let mut actions = self.protect(machine_left);
        if !stops(&actions) {
            actions.extend(self.admit_queued());
        }
        actions
    }

    /// The first half of [`Scheduler::decide`]: stops, kills or resumes running jobs as the
    /// memory they use now requires. Admission must wait when this stops anything.
    pub fn protect(&mut self, machine_left: Option<u64>) -> Vec<Action> {
        let mut actions = Vec::new();
        self.safety_net(machine_left, &mut actions);
        actions
    }

    /// The second half of [`Scheduler::decide`]: starts the queued jobs that fit here.
    pub fn admit_queued(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        self.admit(&mut actions);
        actions
    }

    /// Whether the machine (or cgroup) has less left than the safety net keeps in reserve.
    fn machine_short(&self, machine_left: Option<u64>) -> bool {
        machine_left.is_some_and(|left| left < self.thresholds.machine_reserve)
    }

    fn safety_net(&mut self, machine_left: Option<u64>, actions: &mut Vec<Action>) {
        let budget = self.limits.budget as f64;
        if (self.used() > self.limits.budget || self.machine_short(machine_left))
            && self.running.len() > 1
        {
            self.kill_and_requeue(self.running.len() - 1, actions);
            return;
        }
        // When older jobs finish, the oldest remaining one may be a suspended one: it runs.
        if let Some(oldest) = self.running.first_mut().filter(|job| job.suspended) {
            oldest.suspended = false;
            actions.push(Action::Resume(oldest.id));
        }
        if self.used() as f64 >= self.thresholds.suspend_at * budget {
            // Stopped jobs keep their memory: past a quarter of the budget, stopping more
            // only trades progress for nothing, so the youngest stopped job gives its memory
            // back and starts again later with what it was seen to need; but not one whose
            // work is worth more than that (`gives_back_for_something`): it stays stopped
            // until the jobs ahead of it finish or fall.
            let held: u64 = self
                .running
                .iter()
                .filter(|job| job.suspended)
                .map(|job| job.current)
                .sum();
            let youngest_suspended = self
                .running
                .iter()
                .rposition(|job| job.suspended)
                .filter(|&i| i > 0 && self.gives_back_for_something(i));
            if let Some(index) = youngest_suspended.filter(|_| held > self.limits.budget / 4) {
                self.kill_and_requeue(index, actions);
                return;
            }
            let youngest_active = self
                .running
                .iter_mut()
                .skip(1)
                .rev()
                .find(|job| !job.suspended);
            if let Some(job) = youngest_active {
                job.suspended = true;
                actions.push(Action::Suspend(job.id));
            }
            return;
        }
        // The oldest job always runs; others resume oldest first while their growth fits.
        let mut used = self.used();
        for (position, job) in self.running.iter_mut().enumerate() {
            if !job.suspended {
                continue;
            }
            let growth = job.estimate.peak.saturating_sub(job.current);
            let fits = (used + growth) as f64 <= self.thresholds.resume_below * budget;
            if position == 0 || fits {
                job.suspended = false;
                used += growth;
                actions.push(Action::Resume(job.id));
            } else {
                break;
            }
        }
    }

    /// Kills the running job at `index` and puts it at the front of the queue, predicted at
    /// no less than it was seen to use.
    fn kill_and_requeue(&mut self, index: usize, actions: &mut Vec<Action>) {
        let victim = self.running.remove(index);
        self.queue.push_front(Queued {
            id: victim.id,
            session: victim.session,
            estimate: victim.estimate.at_least(victim.peak),
            alone: victim.alone,
            overtaken: 0,
        });
        actions.push(Action::Kill(victim.id));
    }

    /// The queued jobs in the order they would start, with their estimates and whether they
    /// wait to run alone.
    pub fn queued(&self) -> impl Iterator<Item = (JobId, &Estimate, bool)> {
        self.queue
            .iter()
            .map(|job| (job.id, &job.estimate, job.alone))
    }

    /// Starts queued job `id` on another machine (a farm node the caller chose), reserving here
    /// only `local_share`, if that fits beside what is reserved (or nothing runs at all: the
    /// build must go on) and nothing is stopped: memory is short then. It takes none of this
    /// machine's slots. Returns whether it started.
    pub fn start_elsewhere(&mut self, id: JobId, local_share: Estimate) -> bool {
        let fits = self.running.is_empty()
            || self.reservations().with(local_share.need()).bytes() <= self.jobs_budget();
        let Some(index) = self.queue.iter().position(|job| job.id == id) else {
            return false;
        };
        if !fits || self.running.iter().any(|job| job.suspended) {
            return false;
        }
        let job = self.queue.remove(index).expect("index is in the queue");
        self.running.push(Running {
            id: job.id,
            session: job.session,
            estimate: job.estimate,
            alone: job.alone,
            local_share: Some(local_share),
            current: 0,
            peak: 0,
            cpu_seconds: 0.0,
            fell_at: None,
            suspended: false,
        });
        true
    }

    /// The budget left to jobs to be admitted into: what runs outside them, and what other
    /// users' governors hold, take their parts first.
    pub fn jobs_budget(&self) -> u64 {
        self.limits
            .budget
            .saturating_sub(self.outside)
            .saturating_sub(self.held_elsewhere)
    }

    /// How many running jobs compile on this machine (not on a farm node).
    fn compiling_here(&self) -> usize {
        self.running
            .iter()
            .filter(|job| job.compiles_here())
            .count()
    }

    fn admit(&mut self, actions: &mut Vec<Action>) {
        if self.running.iter().any(|job| job.suspended || job.alone) {
            return;
        }
        // While several sessions have jobs waiting, they get their shares of the slots round
        // by round: in round n, each session that compiles fewer than n jobs here may start
        // one more, in queue order. A session that runs fewer jobs so has the first call on
        // the slots and the memory that free, and one that came later is not starved. The
        // slots left then go to whoever can use them.
        if let Some(share) = self.fair_share() {
            let running: Vec<usize> = self
                .waiting_sessions()
                .into_iter()
                .map(|session| self.compiling_here_of(session))
                .collect();
            let fewest = running.iter().copied().min().unwrap_or(0);
            let most = running.iter().copied().max().unwrap_or(0);
            for round in fewest + 1..=share {
                let before = actions.len();
                let fair = Pass {
                    defer_learning: true,
                    below: Some(round),
                };
                if !self.admit_pass(actions, fair) {
                    return;
                }
                // Once every waiting session took part, a round that started nothing says
                // that the next ones would not either.
                let full = self.compiling_here() >= self.limits.slots;
                if full || (round > most && actions.len() == before) {
                    break;
                }
            }
        }
        // Jobs that wait for their group go only into slots that nothing else can fill.
        let pass = Pass {
            defer_learning: true,
            below: None,
        };
        if self.admit_pass(actions, pass) {
            self.admit_pass(
                actions,
                Pass {
                    defer_learning: false,
                    ..pass
                },
            );
        }
    }

    /// The sessions with jobs queued, in the order of their first queued job.
    fn waiting_sessions(&self) -> Vec<SessionId> {
        let mut sessions: Vec<SessionId> = Vec::new();
        for job in &self.queue {
            if !sessions.contains(&job.session) {
                sessions.push(job.session);
            }
        }
        sessions
    }

    /// Each session's share of the slots while more than one session has jobs queued: the
    /// slots divided among those sessions, at least one each. `None` with one session.
    fn fair_share(&self) -> Option<usize> {
        let sessions = self.waiting_sessions().len();
        (sessions > 1).then(|| (self.limits.slots / sessions).max(1))
    }

    /// How many running jobs of `session` compile on this machine.
    fn compiling_here_of(&self, session: SessionId) -> usize {
        self.running
            .iter()
            .filter(|job| job.session == session && job.compiles_here())
            .count()
    }

    /// Whether `pass` is a round of the shares that `job`'s session has had its turn in: the
    /// job is left for a later pass, which is not being overtaken.
    fn not_its_turn(&self, pass: Pass, job: &Queued) -> bool {
        pass.below
            .is_some_and(|round| self.compiling_here_of(job.session) >= round)
    }

    /// Starts the queued jobs that fit, in queue order, leaving out those `pass` leaves for
    /// later (see [`Pass`]). Returns whether a later pass may start more: not once an alone
    /// job started or a job was overtaken too often to be passed again.
    fn admit_pass(&mut self, actions: &mut Vec<Action>, pass: Pass) -> bool {
        let budget = self.jobs_budget();
        let slack_for = self.slack_for();
        // The longest path of the jobs queued or running, found at the first start: starting
        // a job moves it from one to the other, so it holds for the whole round.
        let mut longest_path: Option<f64> = None;
        // Built on the first job whose peak does not fit beside the reservations.
        let mut plan: Option<Plan> = None;
        let mut index = 0;
        while index < self.queue.len() && self.compiling_here() < self.limits.slots {
            let candidate = &self.queue[index];
            if (pass.defer_learning && self.waits_for_its_group(&candidate.estimate))
                || self.not_its_turn(pass, candidate)
            {
                index += 1;
                continue;
            }
            // A job that fits nowhere still starts once nothing runs, so the build goes on.
            // Jobs on farm nodes are progress too: beside their local shares it waits for
            // room, or it starts only to be suspended and killed in the budget's last margin.
            let fits = if candidate.alone {
                self.compiling_here() == 0
            } else if self.running.is_empty()
                || self.reservations().with(candidate.estimate.need()).bytes() <= budget
            {
                true
            } else {
                let outlook = candidate.estimate.outlook(slack_for(&candidate.estimate));
                plan.get_or_insert_with(|| self.plan(slack_for))
                    .fits(&outlook, budget)
                    || self.may_start_in_falling_tails(&candidate.estimate)
            };
            if fits {
                let longest_path = *longest_path.get_or_insert_with(|| self.longest_path());
                let job = self.queue.remove(index).expect("index is in the queue");
                // Jobs left to wait for their group or their session's turn were not passed
                // for want of room: that does not count.
                let overtaken: Vec<bool> = self
                    .queue
                    .iter()
                    .take(index)
                    .map(|waiting| {
                        !self.waits_for_its_group(&waiting.estimate)
                            && !self.not_its_turn(pass, waiting)
                    })
                    .collect();
                for (waiting, overtaken) in self.queue.iter_mut().zip(overtaken) {
                    waiting.overtaken += usize::from(overtaken);
                }
                if let Some(plan) = plan.as_mut() {
                    plan.add(&job.estimate.outlook(slack_for(&job.estimate)));
                }
                actions.push(Action::Start {
                    id: job.id,
                    nice: chain::niceness(expected_seconds(&job.estimate), longest_path),
                });
                self.running.push(Running {
                    id: job.id,
                    session: job.session,
                    estimate: job.estimate,
                    alone: job.alone,
                    local_share: None,
                    current: 0,
                    peak: 0,
                    cpu_seconds: 0.0,
                    fell_at: None,
                    suspended: false,
                });
                if job.alone {
                    return false;
                }
                continue;
            }
            // A job that cannot start yet holds back the rest once it has been overtaken
            // enough; an alone job holds them back at once.
            if candidate.alone || candidate.overtaken >= self.thresholds.max_overtakes {
                return false;
            }
            index += 1;
        }
        true
    }

    /// Whether killing stopped job `job` would throw away too much to be worth its memory:
    /// it has done more than half the work of the oldest job compiling here (an LTO link a
    /// minute from its end, a kernel past its peak), and more than [`LITTLE_WORK`]. Jobs
    /// that started together (the first jobs of a build) are all as far along as the
    /// oldest, and the second condition still lets the young ones go. A farm node's job
    /// uses no CPU time here, so it is not the measure.
    fn loses_too_much(&self, job: &Running) -> bool {
        let oldest = self
            .running
            .iter()
            .find(|job| job.compiles_here())
            .map_or(0.0, |job| job.cpu_seconds);
        job.cpu_seconds > oldest / 2.0 && job.cpu_seconds > LITTLE_WORK
    }

    /// Whether killing stopped job `index` to take its memory back is worth its work: not when
    /// it would lose too much (`loses_too_much`), nor when every job running beside it has
    /// passed its peak phase. Their memory falls from then on, so the stopped job will have
    /// room by waiting (a kernel started in the tail of another of its size, whose cicc rose
    /// before the other's tail fell).
    fn gives_back_for_something(&self, index: usize) -> bool {
        let room_is_coming = self
            .running
            .iter()
            .enumerate()
            .all(|(i, job)| i == index || job.past_its_peak());
        !room_is_coming && !self.loses_too_much(&self.running[index])
    }

    /// Whether a job that no plan fits may start anyway because every job running here has
    /// passed its peak phase and holds less than 3/4 of it: their memory only falls from
    /// here, so the worst that can happen is that the safety net stops the new job before
    /// their needs meet, and it waits there with its work (`gives_back_for_something`), where
    /// it would otherwise have waited with none. Only for a job that does not know its own
    /// profile: one that does is placed by the plan better than by a stop (a cold kernel,
    /// whose group's jobs differ in length, starts in the tail of the one before it). Not in
    /// the tail of a job beyond the whole budget, which runs alone to its end (the report
    /// says a job predicted so "ran alone").
    fn may_start_in_falling_tails(&self, estimate: &Estimate) -> bool {
        let knows_its_profile = estimate.profile.is_some() && !estimate.borrowed_profile;
        !knows_its_profile
            && self.running.iter().all(|job| {
                job.compiles_here()
                    && !job.suspended
                    && job.past_its_peak()
                    && !job.beyond(self.limits.budget)
            })
    }

    /// Whether a job predicted by the default waits for a running job of its group to show
    /// what the group needs: two jobs of a size nobody knows, started together, may both turn
    /// out large and peak at the same time, and then one of them is stopped and re-run. Such
    /// a job starts only in a slot that no other job can fill, and waiting so does not count
    /// as being overtaken: it must not hold the others back in turn.
    fn waits_for_its_group(&self, estimate: &Estimate) -> bool {
        estimate.learning_group.is_some_and(|group| {
            self.running
                .iter()
                .any(|job| job.estimate.learning_group == Some(group))
        })
    }

    /// The longest expected path of any job queued or running.
    fn longest_path(&self) -> f64 {
        self.queue
            .iter()
            .map(|job| &job.estimate)
            .chain(self.running.iter().map(|job| &job.estimate))
            .map(expected_seconds)
            .fold(0.0, f64::max)
    }

    /// The running jobs' needs over the future, long enough for any queued job to end in.
    fn plan(&self, slack_for: impl Fn(&Estimate) -> f64) -> Plan {
        let running: Vec<Outlook<'_>> = self
            .running
            .iter()
            .map(|job| job.outlook(slack_for(&job.estimate)))
            .collect();
        let queued = self
            .queue
            .iter()
            .map(|job| job.estimate.outlook(slack_for(&job.estimate)));
        Plan::new(&running, queued)
    }

    /// The timing slack to plan each job with, as it stands now: the learned one along the
    /// job's own profile, the configured one along a borrowed profile.
    fn slack_for(&self) -> impl Fn(&Estimate) -> f64 + Copy {
        let learned = self.slack.get();
        let configured = self.thresholds.timing_slack;
        move |estimate| {
            if estimate.borrowed_profile {
                configured
            } else {
                learned
            }
        }
    }
}

/// `limits` with at least one slot: a build always makes progress.
fn with_a_slot(limits: Limits) -> Limits {
    Limits {
        budget: limits.budget,
        slots: limits.slots.max(1),
    }
}

/// Which queued jobs one pass of admission tries, in queue order.
#[derive(Debug, Clone, Copy)]
struct Pass {
    /// Leave out the jobs that wait for a running job of their group
    /// (`Scheduler::waits_for_its_group`).
    defer_learning: bool,
    /// Try only the jobs of sessions that compile fewer than this many jobs here: a round
    /// of the sessions' shares of the slots while several sessions wait.
    below: Option<usize>,
}

/// Whether `actions` stop or kill a job: then nothing more starts in the same decision.
pub fn stops(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|action| matches!(action, Action::Kill(_) | Action::Suspend(_)))
}

/// How long the build may go on from a job's start: its own expected length (0 when unknown)
/// and the work that waited on it.
fn expected_seconds(estimate: &Estimate) -> f64 {
    estimate.profile.as_ref().map_or(0.0, Profile::wall_seconds) + estimate.waiting_seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    /// The one session of the tests that are about one build.
    const SESSION: SessionId = 0;

    fn starts(actions: &[Action]) -> Vec<JobId> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn admits_by_predicted_peak_and_slots() {
        let mut s = Scheduler::new(Limits {
            budget: 3 * GIB,
            slots: 4,
        });
        s.submit(1, SESSION, Estimate::flat(2 * GIB), false);
        s.submit(2, SESSION, Estimate::flat(2 * GIB), false);
        s.submit(3, SESSION, Estimate::flat(GIB / 2), false);
        assert_eq!(starts(&s.decide(None)), vec![1, 3]);
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![2]);
    }

    /// What another user's governor holds in the same room keeps jobs out until it is let
    /// go; it never stops a job that runs, and the first job still starts, so the build goes
    /// on.
    #[test]
    fn what_other_users_governors_hold_is_left_to_them_by_admission_only() {
        let mut s = Scheduler::new(Limits {
            budget: 3 * GIB,
            slots: 4,
        });
        s.observe_held_elsewhere(2 * GIB);
        for id in 1..=3 {
            s.submit(id, SESSION, Estimate::flat(GIB), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1]);
        s.observe(1, GIB, 1.0);
        assert_eq!(
            s.decide(None),
            Vec::new(),
            "nothing stopped, nothing more started"
        );
        s.observe_held_elsewhere(0);
        assert_eq!(starts(&s.decide(None)), vec![2, 3]);
    }

    #[test]
    fn margins_on_last_peaks_pool_instead_of_adding_up() {
        let mut s = Scheduler::new(Limits {
            budget: 9 * GIB + 3 * GIB / 10,
            slots: 16,
        });
        // Ten jobs that each peaked at 1 GiB last time and may need 10% more: nine fit with
        // the margins pooled (9.3 GiB), where added up (9.9 GiB) only eight would.
        for id in 1..=10 {
            let estimate = Estimate {
                margin: GIB / 10,
                ..Estimate::flat(GIB + GIB / 10)
            };
            s.submit(id, SESSION, estimate, false);
        }
        assert_eq!(starts(&s.decide(None)), (1..=9).collect::<Vec<_>>());
        assert!(s.reserved() <= 9 * GIB + 3 * GIB / 10);
    }

    #[test]
    fn memory_outside_the_jobs_counts_against_the_budget() {
        let mut scheduler = Scheduler::new(Limits {
            budget: 4 * GIB,
            slots: 4,
        });
        scheduler.observe_outside(2 * GIB);
        for id in 0..3 {
            scheduler.submit(id, SESSION, Estimate::flat(GIB), false);
        }
        let started = scheduler
            .decide(None)
            .iter()
            .filter(|action| matches!(action, Action::Start { .. }))
            .count();
        assert_eq!(started, 2, "2 GiB outside leave room for two 1 GiB jobs");
        assert_eq!(
            scheduler.outside_action(None, false),
            OutsideAction::Nothing
        );
        // Past the budget with one job left, the outside process is stopped, never requeued.
        scheduler.observe(0, GIB, 1.0);
        scheduler.observe(1, GIB, 1.0);
        scheduler.observe_outside(3 * GIB + GIB / 2);
        let actions = scheduler.decide(None);
        assert!(matches!(actions[..], [Action::Kill(1)]), "{actions:?}");
        assert_eq!(
            scheduler.outside_action(None, false),
            OutsideAction::StopLargest
        );
        scheduler.observe_outside(GIB);
        assert_eq!(
            scheduler.outside_action(None, true),
            OutsideAction::ResumeAll
        );
        scheduler.finished(
            0,
            Ran {
                cpu_seconds: 1.0,
                wall_seconds: 1.0,
            },
        );
        scheduler.observe_outside(5 * GIB);
        assert_eq!(
            scheduler.outside_action(None, true),
            OutsideAction::ResumeAll,
            "with no job running, nothing would ever free memory for them"
        );
    }

    #[test]
    fn a_job_bigger_than_the_budget_runs_alone() {
        let mut s = Scheduler::new(Limits {
            budget: GIB,
            slots: 2,
        });
        s.submit(1, SESSION, Estimate::flat(5 * GIB), false);
        s.submit(2, SESSION, Estimate::flat(GIB / 4), false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        // Its falling tail, which a job without a profile could otherwise start in.
        s.observe(1, 5 * GIB, 10.0);
        s.observe(1, GIB / 2, 11.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![2]);
    }

    #[test]
    fn a_job_seen_beyond_the_budget_runs_alone_to_its_end() {
        let mut s = Scheduler::new(Limits {
            budget: GIB,
            slots: 2,
        });
        s.submit(1, SESSION, Estimate::flat(GIB / 2), false);
        s.submit(2, SESSION, Estimate::flat(GIB * 3 / 4), false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        s.observe(1, 2 * GIB, 10.0);
        s.decide(None);
        s.observe(1, GIB / 8, 11.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![2]);
    }

    /// A scheduler with 2 slots and 4 GiB, where a job that cannot start may be passed twice.
    fn two_slots_of_4_gib_passed_at_most_twice() -> Scheduler {
        let limits = Limits {
            budget: 4 * GIB,
            slots: 2,
        };
        let thresholds = Thresholds {
            max_overtakes: 2,
            ..Thresholds::for_limits(limits)
        };
        Scheduler::with_thresholds(limits, thresholds)
    }

    #[test]
    fn a_large_job_is_overtaken_only_a_bounded_number_of_times() {
        let mut s = two_slots_of_4_gib_passed_at_most_twice();
        s.submit(0, SESSION, Estimate::flat(3 * GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![0]);
        s.submit(1, SESSION, Estimate::flat(3 * GIB), false); // does not fit beside job 0
        for small in 2..10 {
            s.submit(small, SESSION, Estimate::flat(GIB / 2), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![2]);
        s.remove(2);
        assert_eq!(starts(&s.decide(None)), vec![3]);
        s.remove(3);
        // Job 1 has been overtaken twice: nothing else may pass it now.
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        s.remove(0);
        assert_eq!(starts(&s.decide(None)), vec![1, 4]);
    }

    #[test]
    fn jobs_of_a_group_nothing_is_known_of_start_after_the_others() {
        let mut s = two_slots_of_4_gib_passed_at_most_twice();
        let learning = Estimate {
            learning_group: Some(7),
            ..Estimate::flat(2 * GIB)
        };
        // Jobs 1 to 3 are of a group not seen yet; 4 to 8 of another group, already known.
        for id in 1..=3 {
            s.submit(id, SESSION, learning.clone(), false);
        }
        for small in 4..=8 {
            s.submit(small, SESSION, Estimate::flat(GIB / 4), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1, 4]);
        // Jobs 2 and 3 wait for job 1 while other jobs can use the slot, and waiting so does
        // not make them hold the others back, however many pass them.
        for small in 4..8 {
            s.remove(small);
            assert_eq!(starts(&s.decide(None)), vec![small + 1]);
        }
        // With nothing else to start, the slot does not stay empty.
        s.remove(8);
        assert_eq!(starts(&s.decide(None)), vec![2]);
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![3]);
    }

    /// Three jobs of 2 GiB predicted on a 10 GiB budget, seen at 4.25, 3 and 2.5 GiB with
    /// `progress` CPU seconds each: the net stops the youngest two, and they hold 5.5 GiB.
    fn three_jobs_two_stopped(progress: [f64; 3]) -> Scheduler {
        let mut s = Scheduler::new(Limits {
            budget: 10 * GIB,
            slots: 3,
        });
        for id in 1..=3 {
            s.submit(id, SESSION, Estimate::flat(2 * GIB), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1, 2, 3]);
        s.observe(1, 4 * GIB + GIB / 4, progress[0]);
        s.observe(2, 3 * GIB, progress[1]);
        s.observe(3, 2 * GIB + GIB / 2, progress[2]);
        assert_eq!(s.decide(None), vec![Action::Suspend(3)]);
        assert_eq!(s.decide(None), vec![Action::Suspend(2)]);
        s
    }

    #[test]
    fn a_stopped_job_far_along_stays_stopped_instead_of_losing_its_work() {
        let mut s = three_jobs_two_stopped([100.0, 90.0, 60.0]);
        // Stopped jobs hold over a quarter of the budget, but job 3 has done 60% of job 1's
        // work: it waits, stopped, under the budget.
        assert_eq!(s.decide(None), vec![]);
        assert!(!s.is_queued(3));
        // Had it done half or less, it would have given its memory back.
        s.observe(1, 4 * GIB + GIB / 4, 120.0);
        assert_eq!(s.decide(None), vec![Action::Kill(3)]);
    }

    #[test]
    fn jobs_that_started_together_still_give_their_memory_back_while_young() {
        // Every job is 20 CPU seconds in: as far along as the oldest, but little to lose.
        let mut s = three_jobs_two_stopped([20.0; 3]);
        assert_eq!(s.decide(None), vec![Action::Kill(3)]);
    }

    /// Two jobs predicted at 2 GiB on a 5 GiB budget: job 1 seen at 4 GiB and then at
    /// `job_1_now`, job 2 growing to `job_2_now`, into the budget's last margin, which stops it.
    fn a_job_stopped_beside_one(job_1_now: u64, job_2_now: u64) -> Scheduler {
        let mut s = Scheduler::new(Limits {
            budget: 5 * GIB,
            slots: 2,
        });
        s.submit(1, SESSION, Estimate::flat(2 * GIB), false);
        s.submit(2, SESSION, Estimate::flat(2 * GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1, 2]);
        s.observe(1, 4 * GIB, 20.0);
        s.observe(1, job_1_now, 40.0);
        s.observe(2, job_2_now, 10.0);
        assert_eq!(s.decide(None), vec![Action::Suspend(2)]);
        s
    }

    #[test]
    fn a_stopped_job_waits_for_the_room_that_jobs_past_their_peaks_will_free() {
        // Job 1 fell to 1.5 GiB from its 4 GiB peak: it only gives memory back from here.
        // Job 2 holds over a quarter of the budget, and keeps it, stopped, with its work.
        let mut s = a_job_stopped_beside_one(GIB + GIB / 2, 3 * GIB + GIB / 4);
        assert_eq!(s.decide(None), vec![]);
        s.remove(1);
        assert_eq!(s.decide(None), vec![Action::Resume(2)]);
        // Had job 1 still been near its peak, job 2 would have given its memory back.
        let mut s = a_job_stopped_beside_one(3 * GIB + GIB / 4, GIB + GIB / 2);
        assert_eq!(s.decide(None), vec![Action::Kill(2)]);
    }

    #[test]
    fn suspends_the_youngest_then_kills_and_requeues_it() {
        let mut s = three_jobs_two_stopped([0.0; 3]);
        // Stopped jobs now hold 5.5 GiB, over a quarter of the budget: the youngest gives it back.
        assert_eq!(s.decide(None), vec![Action::Kill(3)]);
        assert!(s.is_queued(3));
        // Room again: job 2 resumes and job 3 starts again at what it was seen to use.
        assert_eq!(
            s.decide(None),
            vec![Action::Resume(2), Action::Start { id: 3, nice: 0 }]
        );
        // Past the budget the youngest is killed outright; the oldest is never touched.
        s.observe(1, 6 * GIB, 0.0);
        s.observe(3, 2 * GIB, 0.0);
        assert_eq!(s.decide(None), vec![Action::Kill(3)]);
        s.remove(1);
        assert_eq!(s.decide(None), vec![Action::Start { id: 3, nice: 0 }]);
    }

    #[test]
    fn the_oldest_remaining_job_runs_even_if_it_was_suspended() {
        let mut s = Scheduler::new(Limits {
            budget: 10 * GIB,
            slots: 2,
        });
        s.submit(1, SESSION, Estimate::flat(GIB), false);
        s.submit(2, SESSION, Estimate::flat(GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1, 2]);
        s.observe(1, 7 * GIB, 0.0);
        s.observe(2, 2 * GIB + 3 * GIB / 4, 0.0);
        assert_eq!(s.decide(None), vec![Action::Suspend(2)]);
        s.remove(1);
        assert_eq!(s.decide(None), vec![Action::Resume(2)]);
    }

    #[test]
    fn a_better_prediction_lets_more_jobs_in() {
        let mut s = Scheduler::new(Limits {
            budget: 2 * GIB,
            slots: 4,
        });
        for id in 1..=3 {
            s.submit(id, SESSION, Estimate::flat(2 * GIB), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1]);
        for id in 1..=3 {
            s.repredict(id, Estimate::flat(GIB / 2));
        }
        assert_eq!(starts(&s.decide(None)), vec![2, 3]);
    }

    /// A single-threaded job of `seconds` that uses a tenth of its peak for its first three
    /// quarters.
    fn late_peak(seconds: f64, peak: u64) -> Estimate {
        let slices: Vec<u64> = (0..16).map(|i| if i < 12 { 1 } else { 10 }).collect();
        Estimate {
            peak,
            margin: 0,
            profile: Profile::new(crate::profile::ran(seconds, seconds), &slices),
            waiting_seconds: 0.0,
            borrowed_profile: false,
            learning_group: None,
        }
    }

    #[test]
    fn jobs_off_the_longest_path_start_nicer() {
        let mut s = Scheduler::new(Limits {
            budget: 16 * GIB,
            slots: 4,
        });
        let on_the_path = Estimate {
            waiting_seconds: 50.0,
            ..late_peak(100.0, GIB)
        };
        s.submit(1, SESSION, on_the_path, false);
        s.submit(2, SESSION, late_peak(30.0, GIB), false);
        s.submit(3, SESSION, Estimate::flat(GIB), false);
        // Paths of 150 s, 30 s and unknown: job 2 starts at 19 × (1 - 30/150) = 15.2, and
        // the job of unknown length at the normal priority.
        let expected = [(1, 0), (2, 15), (3, 0)].map(|(id, nice)| Action::Start { id, nice });
        assert_eq!(s.decide(None), expected);
    }

    #[test]
    fn jobs_whose_peaks_do_not_meet_share_the_budget() {
        let mut s = Scheduler::new(Limits {
            budget: 5 * GIB,
            slots: 4,
        });
        s.submit(1, SESSION, late_peak(100.0, 4 * GIB), false);
        s.submit(2, SESSION, late_peak(100.0, 4 * GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        // Both would peak at the same time: job 2 waits while job 1 is young.
        s.observe(1, GIB / 2, 10.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        // Job 1 has used nearly all its CPU time: it will be gone before job 2 peaks.
        s.observe(1, 4 * GIB, 95.0);
        assert_eq!(starts(&s.decide(None)), vec![2]);
        assert!(
            s.reserved() > 5 * GIB,
            "flat reservations would not have fitted"
        );
    }

    /// A group's profile as another job of the group left it: a single-threaded job of
    /// `seconds` that peaks in its first quarter and then holds a third of its peak.
    fn borrowed_early_peak(seconds: f64, peak: u64) -> Estimate {
        let slices: Vec<u64> = (0..16).map(|i| if i < 4 { 30 } else { 10 }).collect();
        Estimate {
            peak,
            margin: 0,
            profile: Profile::new(crate::profile::ran(seconds, seconds), &slices),
            waiting_seconds: 0.0,
            borrowed_profile: true,
            learning_group: None,
        }
    }

    /// Two 3 GiB jobs of a group on a 5 GiB budget, each with a 100 s profile borrowed from
    /// another job of the group: the first runs, the second waits.
    fn two_of_a_group_one_running() -> Scheduler {
        let mut s = Scheduler::new(Limits {
            budget: 5 * GIB,
            slots: 4,
        });
        s.submit(1, SESSION, borrowed_early_peak(100.0, 3 * GIB), false);
        s.submit(2, SESSION, borrowed_early_peak(100.0, 3 * GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        s
    }

    #[test]
    fn a_longer_job_of_a_group_is_placed_along_its_borrowed_profile_by_its_own_peak() {
        let mut s = two_of_a_group_one_running();
        // Job 1 is twice as long as the job its profile came from: it peaked at 40 CPU
        // seconds, not 20, and at 150 it has outrun that profile. It has fallen to a third of
        // its peak, so it is in the profile's tail, not off the map needing its peak again.
        s.observe(1, 3 * GIB, 40.0);
        s.observe(1, GIB, 150.0);
        assert_eq!(starts(&s.decide(None)), vec![2]);
    }

    /// A 3 GiB job of 100 s that rises for 12.5 s, peaks until 25 s, then holds a third:
    /// along a profile borrowed from its group, or along its own.
    fn kernel(borrowed_profile: bool) -> Estimate {
        let slices: Vec<u64> = (0..16)
            .map(|i| match i {
                0 => 5,
                1 => 10,
                2 | 3 => 30,
                _ => 10,
            })
            .collect();
        Estimate {
            peak: 3 * GIB,
            margin: 0,
            profile: Profile::new(crate::profile::ran(100.0, 100.0), &slices),
            waiting_seconds: 0.0,
            borrowed_profile,
            learning_group: None,
        }
    }

    /// A kernel along a borrowed profile runs on a 3.5 GiB budget, where `second` fits beside
    /// it only once its tail has ended: `second` waits.
    fn a_kernel_then(second: Estimate) -> Scheduler {
        let mut s = Scheduler::new(Limits {
            budget: 3 * GIB + GIB / 2,
            slots: 2,
        });
        s.submit(1, SESSION, kernel(true), false);
        s.submit(2, SESSION, second, false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        s
    }

    #[test]
    fn the_tail_of_a_borrowed_profile_is_planned_without_the_slack() {
        let mut s = a_kernel_then(kernel(false));
        // Job 1 peaked and fell 30 CPU seconds in, where the profile falls at 25: 90 s in,
        // it is 75 s along the profile, and its tail may still be there when job 2 peaks.
        s.observe(1, 3 * GIB, 20.0);
        s.observe(1, GIB, 30.0);
        s.observe(1, GIB, 90.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        // 95 s along, it ends before job 2's peak; with the 20% slack on its tail it might
        // not have until 120 s along.
        s.observe(1, GIB, 114.0);
        assert_eq!(starts(&s.decide(None)), vec![2]);
    }

    #[test]
    fn a_job_without_its_own_profile_starts_in_the_tails_of_jobs_past_their_peaks() {
        let mut s = a_kernel_then(kernel(true));
        // Job 1 at its peak: job 2 waits.
        s.observe(1, 3 * GIB, 20.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        // Job 1 has fallen, though its tail will still be there when job 2 peaks: job 2
        // starts all the same.
        s.observe(1, GIB, 30.0);
        assert_eq!(starts(&s.decide(None)), vec![2]);
        // Job 2 meets job 1's tail: it is stopped, and keeps its work until job 1 has ended.
        s.observe(2, 2 * GIB + GIB / 2, 10.0);
        assert_eq!(s.decide(None), vec![Action::Suspend(2)]);
        assert_eq!(s.decide(None), vec![]);
        s.remove(1);
        assert_eq!(s.decide(None), vec![Action::Resume(2)]);
    }

    #[test]
    fn a_job_that_has_not_fallen_from_its_peak_keeps_its_borrowed_peak() {
        let mut s = two_of_a_group_one_running();
        // Still near its highest use at 150 CPU seconds: its peak may not have passed.
        s.observe(1, 2 * GIB, 40.0);
        s.observe(1, 2 * GIB, 150.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
    }

    #[test]
    fn a_job_that_work_waited_on_queues_ahead_of_a_longer_one() {
        let mut s = Scheduler::new(Limits {
            budget: 5 * GIB,
            slots: 1,
        });
        s.submit(1, SESSION, late_peak(10.0, GIB), false);
        s.submit(2, SESSION, late_peak(100.0, GIB), false);
        let before_a_link = Estimate {
            waiting_seconds: 200.0,
            ..late_peak(20.0, GIB)
        };
        s.submit(3, SESSION, before_a_link, false);
        assert_eq!(starts(&s.decide(None)), vec![3]);
        s.remove(3);
        assert_eq!(starts(&s.decide(None)), vec![2]);
    }

    #[test]
    fn jobs_that_kept_to_their_own_profiles_narrow_the_slack() {
        let run = |earlier_kept_to_profiles: bool, borrowed_profile: bool| {
            let mut s = Scheduler::new(Limits {
                budget: 5 * GIB,
                slots: 4,
            });
            for id in 1..=10 {
                let estimate = Estimate {
                    borrowed_profile,
                    ..late_peak(100.0, 4 * GIB)
                };
                s.submit(id, SESSION, estimate, false);
            }
            // Eight jobs run one after another, enough for their strays to count.
            for id in 1..=8 {
                assert_eq!(starts(&s.decide(None)), vec![id]);
                if earlier_kept_to_profiles {
                    s.finished(id, crate::profile::ran(100.0, 100.0));
                } else {
                    s.remove(id);
                }
            }
            assert_eq!(starts(&s.decide(None)), vec![9]);
            // Job 9's peak is 35 to 60 s away; job 10's would come 75 s from now.
            s.observe(9, GIB / 2, 40.0);
            starts(&s.decide(None))
        };
        assert_eq!(
            run(false, false),
            Vec::<JobId>::new(),
            "20% slack: the peaks may meet"
        );
        assert_eq!(run(true, false), vec![10], "2% slack: they do not");
        // Along another job's profile (a group's), how jobs kept to it says nothing of how
        // this job will: the configured slack holds.
        assert_eq!(run(true, true), Vec::<JobId>::new());
    }

    #[test]
    fn reruns_in_earlier_builds_narrow_the_slack_from_the_first_job() {
        let run = |reruns: Vec<(Ran, Ran)>| {
            let mut s = Scheduler::new(Limits {
                budget: 5 * GIB,
                slots: 4,
            });
            s.note_reruns(reruns);
            s.submit(1, SESSION, late_peak(100.0, 4 * GIB), false);
            s.submit(2, SESSION, late_peak(100.0, 4 * GIB), false);
            assert_eq!(starts(&s.decide(None)), vec![1]);
            // As above: job 2 fits beside job 1 with a slack of a few percent, not with 20%.
            s.observe(1, GIB / 2, 40.0);
            starts(&s.decide(None))
        };
        let kept = (
            crate::profile::ran(100.0, 100.0),
            crate::profile::ran(101.0, 101.0),
        );
        assert_eq!(run(vec![kept; 7]), Vec::<JobId>::new(), "too few to go by");
        assert_eq!(run(vec![kept; 8]), vec![2]);
    }

    #[test]
    fn a_job_past_its_profiles_cpu_time_keeps_its_whole_peak() {
        let mut s = Scheduler::new(Limits {
            budget: 5 * GIB,
            slots: 2,
        });
        s.submit(1, SESSION, late_peak(100.0, 4 * GIB), false);
        s.submit(2, SESSION, late_peak(100.0, 4 * GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        // Job 1 has used more CPU time than its profile allows for: it is off the map.
        s.observe(1, GIB, 130.0);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
    }

    #[test]
    fn longer_jobs_queue_first_but_never_ahead_of_a_job_that_waited() {
        let mut s = Scheduler::new(Limits {
            budget: 4 * GIB,
            slots: 1,
        });
        s.submit(1, SESSION, Estimate::flat(GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1]);
        s.submit(2, SESSION, late_peak(10.0, GIB), false);
        s.submit(3, SESSION, late_peak(300.0, GIB), false);
        s.submit(4, SESSION, Estimate::flat(GIB), false);
        s.submit(5, SESSION, late_peak(50.0, GIB), false);
        let order: Vec<JobId> = s.queue.iter().map(|job| job.id).collect();
        assert_eq!(order, vec![3, 5, 2, 4]);
        s.queue[1].overtaken = 1;
        s.submit(6, SESSION, late_peak(600.0, GIB), false);
        let order: Vec<JobId> = s.queue.iter().map(|job| job.id).collect();
        assert_eq!(order, vec![3, 5, 6, 2, 4]);
    }

    #[test]
    fn a_machine_running_out_kills_the_youngest() {
        let mut s = Scheduler::new(Limits {
            budget: 10 * GIB,
            slots: 2,
        });
        s.submit(1, SESSION, Estimate::flat(GIB), false);
        s.submit(2, SESSION, Estimate::flat(GIB), false);
        s.decide(None);
        s.observe(1, GIB, 0.0);
        s.observe(2, GIB, 0.0);
        assert_eq!(s.decide(Some(1 << 20)), vec![Action::Kill(2)]);
    }

    #[test]
    fn an_alone_job_waits_for_the_others_and_blocks_new_ones() {
        let mut s = Scheduler::new(Limits {
            budget: 10 * GIB,
            slots: 4,
        });
        s.submit(1, SESSION, Estimate::flat(GIB), false);
        s.decide(None);
        s.submit(2, SESSION, Estimate::flat(GIB), true);
        s.submit(3, SESSION, Estimate::flat(GIB), false);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![2]);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        s.remove(2);
        assert_eq!(starts(&s.decide(None)), vec![3]);
    }
    #[test]
    fn a_later_session_gets_its_share_as_slots_free_without_stopping_the_first() {
        let mut s = Scheduler::new(Limits {
            budget: 16 * GIB,
            slots: 4,
        });
        // Session 1 came first and took every slot; more of its jobs wait.
        for id in 1..=8 {
            s.submit(id, 1, Estimate::flat(GIB), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1, 2, 3, 4]);
        // Session 2 comes: none of session 1's jobs is stopped or killed to make room.
        for id in 11..=14 {
            s.submit(id, 2, Estimate::flat(GIB), false);
        }
        assert_eq!(s.decide(None), Vec::<Action>::new());
        // Each slot that frees goes to session 2 until it holds its share, two of four.
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![11]);
        s.remove(2);
        assert_eq!(starts(&s.decide(None)), vec![12]);
        // Then the shares are kept: a slot session 1 leaves goes back to session 1.
        s.remove(3);
        assert_eq!(starts(&s.decide(None)), vec![5]);
        s.remove(11);
        assert_eq!(starts(&s.decide(None)), vec![13]);
    }

    #[test]
    fn a_session_below_its_share_is_considered_first_for_memory() {
        let mut s = Scheduler::new(Limits {
            budget: 4 * GIB,
            slots: 4,
        });
        // Session 1 came first and fills the budget with two jobs; its others queue ahead of
        // session 2's.
        for id in 1..=4 {
            s.submit(id, 1, Estimate::flat(2 * GIB), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1, 2]);
        s.submit(11, 2, Estimate::flat(2 * GIB), false);
        assert_eq!(starts(&s.decide(None)), Vec::<JobId>::new());
        // Memory frees: the session with no job running takes it, behind in the queue or not.
        s.remove(1);
        assert_eq!(starts(&s.decide(None)), vec![11]);
    }

    #[test]
    fn sessions_that_wait_together_start_in_turns() {
        let mut s = Scheduler::new(Limits {
            budget: 6 * GIB,
            slots: 8,
        });
        for id in 1..=4 {
            s.submit(id, 1, Estimate::flat(2 * GIB), false);
        }
        for id in 11..=14 {
            s.submit(id, 2, Estimate::flat(2 * GIB), false);
        }
        // Room for three: one each, then one more for the session first in the queue.
        assert_eq!(starts(&s.decide(None)), vec![1, 11, 2]);
    }

    #[test]
    fn idle_slots_go_to_whichever_session_can_use_them() {
        let mut s = Scheduler::new(Limits {
            budget: 16 * GIB,
            slots: 4,
        });
        s.submit(1, 1, Estimate::flat(GIB), false);
        for id in 11..=16 {
            s.submit(id, 2, Estimate::flat(GIB), false);
        }
        // Session 1 has one job: session 2 takes the slots it cannot use.
        assert_eq!(starts(&s.decide(None)), vec![1, 11, 12, 13]);
    }

    #[test]
    fn the_safety_net_stops_the_youngest_job_whichever_session_it_is_of() {
        let mut s = Scheduler::new(Limits {
            budget: 10 * GIB,
            slots: 4,
        });
        s.submit(1, 2, Estimate::flat(2 * GIB), false);
        s.submit(2, 1, Estimate::flat(2 * GIB), false);
        assert_eq!(starts(&s.decide(None)), vec![1, 2]);
        s.observe(1, 2 * GIB, 0.0);
        s.observe(2, 8 * GIB, 0.0);
        assert_eq!(s.decide(None), vec![Action::Suspend(2)]);
    }

    #[test]
    fn new_limits_keep_the_jobs_and_move_the_thresholds() {
        let mut s = Scheduler::new(Limits {
            budget: 8 * GIB,
            slots: 4,
        });
        for id in 1..=4 {
            s.submit(id, SESSION, Estimate::flat(GIB), false);
        }
        assert_eq!(starts(&s.decide(None)), vec![1, 2, 3, 4]);
        let smaller = Limits {
            budget: 4 * GIB,
            slots: 2,
        };
        s.set_limits(smaller);
        assert_eq!(s.limits(), smaller);
        assert_eq!(s.thresholds, Thresholds::for_limits(smaller));
        assert_eq!(
            s.running_count(),
            4,
            "running jobs are not stopped for new limits"
        );
        s.submit(5, SESSION, Estimate::flat(GIB), false);
        s.remove(1);
        s.remove(2);
        assert_eq!(
            starts(&s.decide(None)),
            Vec::<JobId>::new(),
            "2 slots, 2 run"
        );
        s.remove(3);
        assert_eq!(starts(&s.decide(None)), vec![5]);
    }
}
