//! A reference, not a policy anyone can run: it knows every job's exact memory curve and
//! duration in this run, and admits greedily, as headroom does, in headroom's warm order
//! (longest path first), whenever a job fits beside the running ones in every step of the
//! future. Where it too stays above 1.10× of the lower bound, the gap belongs to greedy
//! admission in that order and to the bound, not to what headroom does not know; the rest of
//! headroom's gap is the price of planning from an earlier run's profiles with a slack.

use headroom_sched::{Action, JobId};

use crate::engine::{Policy, View};
use crate::machine::Machine;
use crate::workload::{SimJob, Workload};

/// Seconds per step of the plan: finer than any job's rise to its peak in the corpus.
const STEP: f64 = 0.25;

pub struct Clairvoyant {
    budget: f64,
    slots: usize,
    /// For each job (by id), the most bytes it uses in each step of its progress.
    needs: Vec<Vec<f64>>,
    threads: Vec<f64>,
    /// Each job's own seconds plus the longest chain of work that waits on it.
    path_seconds: Vec<f64>,
    /// Offered jobs, longest path first, ties in offer order.
    queue: Vec<JobId>,
    last_plan: f64,
    /// Whether a job was offered, finished or killed since the last plan: then the next
    /// decision plans again, whenever it comes.
    changed: bool,
}

impl Clairvoyant {
    /// The reference on `machine`, with headroom's `budget` (bytes) and slots.
    pub fn new(machine: Machine, workload: &Workload, budget: u64) -> Self {
        let needs = workload
            .jobs
            .iter()
            .map(|job| {
                let steps = (job.duration / STEP).ceil() as usize;
                (0..steps)
                    .map(|step| job.highest_between(step as f64 * STEP, (step + 1) as f64 * STEP))
                    .collect()
            })
            .collect();
        Clairvoyant {
            budget: budget as f64,
            slots: machine.cores,
            needs,
            threads: workload.jobs.iter().map(|job| job.threads).collect(),
            path_seconds: workload.chains(),
            queue: Vec::new(),
            last_plan: f64::NEG_INFINITY,
            changed: false,
        }
    }

    /// The most bytes job `id` needs in each step from now, `progress` seconds into its work.
    fn needs_from(&self, id: JobId, progress: f64) -> impl Iterator<Item = f64> + '_ {
        let needs = &self.needs[id as usize];
        // A step of the plan straddles two of the job's steps unless progress is a whole step.
        let first = (progress / STEP) as usize;
        (first..needs.len()).map(move |step| {
            let next = needs.get(step + 1).copied().unwrap_or(0.0);
            needs[step].max(next)
        })
    }
}

/// Adds `needs` to `plan` step by step, growing it as needed.
fn add(plan: &mut Vec<f64>, needs: impl Iterator<Item = f64>) {
    for (step, bytes) in needs.enumerate() {
        if step == plan.len() {
            plan.push(0.0);
        }
        plan[step] += bytes;
    }
}

impl Policy for Clairvoyant {
    fn name(&self) -> String {
        "clairvoyant greedy (reference)".to_string()
    }

    fn family(&self) -> &'static str {
        "reference"
    }

    fn offer(&mut self, job: &SimJob) {
        let seconds = self.path_seconds[job.id as usize];
        let position = self
            .queue
            .iter()
            .position(|&queued| self.path_seconds[queued as usize] < seconds)
            .unwrap_or(self.queue.len());
        self.queue.insert(position, job.id);
        self.changed = true;
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        // Between events, plan once a step: no job's outlook changes faster.
        if view.tick && !self.changed && view.now - self.last_plan < STEP {
            return Vec::new();
        }
        self.last_plan = view.now;
        self.changed = false;
        let mut running = view.running.len();
        let mut plan = Vec::new();
        for job in view.running {
            let progress = job.cpu_seconds / self.threads[job.id as usize];
            add(&mut plan, self.needs_from(job.id, progress));
        }
        let mut actions = Vec::new();
        let mut index = 0;
        while index < self.queue.len() && running < self.slots {
            let id = self.queue[index];
            let fits = running == 0
                || self.needs_from(id, 0.0).enumerate().all(|(step, bytes)| {
                    plan.get(step).copied().unwrap_or(0.0) + bytes <= self.budget
                });
            if fits {
                add(&mut plan, self.needs_from(id, 0.0));
                self.queue.remove(index);
                // Its plan has every job run at full speed: no job starts nicer than another.
                actions.push(Action::Start { id, nice: 0 });
                running += 1;
            } else {
                index += 1;
            }
        }
        actions
    }

    fn finished(&mut self, _job: &SimJob, _peak: u64, _now: f64) {
        self.changed = true;
    }

    fn oom_killed(&mut self, job: &SimJob, _peak: u64) {
        // Only when jobs wanted more cores than there are and so drifted from the plan.
        self.queue.insert(0, job.id);
        self.changed = true;
    }
}
