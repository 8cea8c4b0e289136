//! headroom's own policy, driven exactly as the live governor drives it: the same
//! `headroom_sched` predictor and scheduler, the same budget rule, slots and default
//! prediction, the same calls on offers, ticks, finishes and OOM kills, and the same profile
//! recording on every tick. A warm run knows what a previous run of the same build showed, as
//! the governor learns it from its history: each job's own peak and profile, the chains of
//! jobs that waited on it (the trace's dependencies standing for the files the last build's
//! commands named), and how far each job strayed in time and peak between the last two
//! builds (the trace's run against one more run with a variation of its own).

use std::collections::HashMap;

use headroom_sched::budget::default_job_peak;
use headroom_sched::chain::{self, Finished};
use headroom_sched::{
    Action, Estimate, JobId, Limits, PastRun, Predictor, Profile, ProfileRecorder, Ran, Scheduler,
};

use crate::engine::{Policy, View};
use crate::machine::Machine;
use crate::workload::{SimJob, Workload};

pub struct Headroom {
    scheduler: Scheduler,
    predictor: Predictor,
    /// For a warm run, the seconds of work that waited on each job (by index) in the previous
    /// run; each job's own history is in the workload.
    waiting_seconds: Option<Vec<f64>>,
    /// The memory profile of each running job's current attempt, and the seconds it has run
    /// unstopped, counted on ticks as the governor's sampler counts them.
    profiles: HashMap<JobId, (ProfileRecorder, f64)>,
    last_tick: f64,
}

impl Headroom {
    /// headroom on `workload` with `budget` bytes, with no history, or `warm` with what a
    /// previous run left.
    pub fn new(machine: Machine, workload: &Workload, warm: bool, budget: u64) -> Self {
        let waiting_seconds = warm.then(|| {
            let last_build: Vec<Finished> = workload
                .jobs
                .iter()
                .map(|job| Finished {
                    seconds: job
                        .history_profile
                        .as_ref()
                        .map_or(0.0, Profile::wall_seconds),
                    inputs: job.deps.clone(),
                })
                .collect();
            chain::waiting_seconds(&last_build)
        });
        let limits = Limits {
            budget,
            slots: machine.cores,
        };
        let mut scheduler = Scheduler::new(limits);
        let mut predictor = Predictor::new(default_job_peak(limits.budget, limits.slots));
        if warm {
            predictor.note_peak_reruns(
                workload
                    .jobs
                    .iter()
                    .map(|job| (job.earlier_peak, job.history_peak)),
            );
            scheduler.note_reruns(workload.jobs.iter().filter_map(|job| {
                let earlier = Ran {
                    cpu_seconds: job.earlier_duration * job.threads,
                    wall_seconds: job.earlier_duration,
                };
                Some((earlier, job.history_profile.as_ref()?.ran()))
            }));
        }
        Headroom {
            scheduler,
            predictor,
            waiting_seconds,
            profiles: HashMap::new(),
            last_tick: 0.0,
        }
    }

    fn predicted(&mut self, job: &SimJob) -> Estimate {
        let Some(waiting_seconds) = &self.waiting_seconds else {
            return self.predictor.predict(job.id, None, job.group).estimate;
        };
        let history = PastRun {
            peak: job.history_peak,
            profile: job.history_profile.clone(),
        };
        Estimate {
            waiting_seconds: waiting_seconds[job.id as usize],
            ..self
                .predictor
                .predict(job.id, Some(&history), job.group)
                .estimate
        }
    }
}

impl Policy for Headroom {
    fn name(&self) -> String {
        if self.waiting_seconds.is_some() {
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
            let since_last = view.now - self.last_tick;
            self.last_tick = view.now;
            for job in view.running {
                let (profile, active) = self.profiles.entry(job.id).or_default();
                if !job.suspended {
                    *active += since_last.min(view.now - job.started);
                }
                profile.record(job.cpu_seconds, job.bytes);
                self.scheduler.observe(job.id, job.bytes, job.cpu_seconds);
            }
        }
        let actions = self.scheduler.decide(Some(view.free()));
        for action in &actions {
            if let Action::Start { id, .. } = action {
                self.profiles.insert(*id, Default::default());
            }
        }
        actions
    }

    fn finished(&mut self, job: &SimJob, peak: u64, now: f64) {
        let (recorder, active) = self.profiles.remove(&job.id).unwrap_or_default();
        let ran = Ran {
            cpu_seconds: job.core_seconds(),
            wall_seconds: active + (now - self.last_tick),
        };
        self.scheduler.finished(job.id, ran);
        let run = PastRun {
            peak,
            profile: recorder.finish(ran),
        };
        for (id, prediction) in self.predictor.learn(job.id, job.group, run) {
            self.scheduler.repredict(id, prediction.estimate);
        }
    }

    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        // The governor retries a job the kernel killed on its own, sized by what it reached.
        self.scheduler.remove(job.id);
        let estimate = self.predicted(job).at_least(peak);
        self.scheduler.submit(job.id, estimate, true);
    }
}
