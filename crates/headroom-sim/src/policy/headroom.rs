//! headroom's own policy, driven exactly as the live governor drives it: the same
//! `headroom_sched` predictor and scheduler, the same default budget, slots and default
//! prediction, the same calls on offers, ticks, finishes and OOM kills.

use headroom_sched::{Action, Limits, Predictor, Scheduler};

use crate::engine::{Policy, View};
use crate::machine::Machine;
use crate::workload::SimJob;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The governor's default budget: the memory the machine can hand out, less a reserve of 10%
/// kept between 256 MiB and 2 GiB.
pub fn default_budget(available: u64) -> u64 {
    let reserve = (available / 10).clamp(256 * MIB, 2 * GIB);
    available.saturating_sub(reserve)
}

/// The governor's prediction for a job with no history and no finished job of its group:
/// an equal share of the budget per slot, at least 512 MiB and at most the budget.
pub fn default_prediction(budget: u64, slots: usize) -> u64 {
    (budget / slots.max(1) as u64).max(512 * MIB).min(budget)
}

pub struct Headroom {
    scheduler: Scheduler,
    predictor: Predictor,
    /// Whether each job's own peak from a previous run is known.
    warm: bool,
}

impl Headroom {
    pub fn new(machine: Machine, warm: bool) -> Self {
        let limits = Limits {
            budget: default_budget(machine.memory),
            slots: machine.cores,
        };
        Headroom {
            scheduler: Scheduler::new(limits),
            predictor: Predictor::new(default_prediction(limits.budget, limits.slots)),
            warm,
        }
    }

    fn predicted(&self, job: &SimJob) -> u64 {
        let history = self.warm.then_some(job.history_peak);
        self.predictor.predict(history, job.group).peak
    }
}

impl Policy for Headroom {
    fn name(&self) -> String {
        if self.warm {
            "headroom (warm)"
        } else {
            "headroom (cold)"
        }
        .to_string()
    }

    fn family(&self) -> &'static str {
        "headroom"
    }

    fn offer(&mut self, job: &SimJob) {
        let predicted = self.predicted(job);
        self.scheduler.submit(job.id, predicted, false);
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        if view.tick {
            for job in view.running {
                self.scheduler.observe(job.id, job.bytes);
            }
        }
        self.scheduler.decide(Some(view.free()))
    }

    fn finished(&mut self, job: &SimJob, peak: u64) {
        self.scheduler.remove(job.id);
        self.predictor.learn(job.group, peak);
    }

    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        // The governor retries a job the kernel killed on its own, sized by what it reached.
        self.scheduler.remove(job.id);
        let predicted = self.predicted(job).max(peak);
        self.scheduler.submit(job.id, predicted, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_and_default_prediction_follow_the_governor() {
        assert_eq!(default_budget(32 * GIB), 30 * GIB);
        assert_eq!(default_budget(2 * GIB), 2 * GIB - 256 * MIB);
        assert_eq!(default_budget(10 * GIB), 9 * GIB);
        assert_eq!(default_prediction(30 * GIB, 16), 30 * GIB / 16);
        assert_eq!(default_prediction(30 * GIB, 192), 512 * MIB);
        assert_eq!(default_prediction(256 * MIB, 4), 256 * MIB);
    }
}
