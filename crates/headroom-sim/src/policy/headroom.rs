//! headroom's own policy, driven by the live governor's own driver
//! (`headroom_sched::driver`): this adapter only turns the simulator's events into the
//! driver's calls and its actions back. A warm run knows what a previous run of the same build
//! showed, as the governor learns it from its history: each job's own peak and profile, the
//! chains of jobs that waited on it (the trace's dependencies standing for the files the last
//! build's commands named), and how far each job strayed in time and peak between the last two
//! builds (the trace's run against one more run with a variation of its own).
//!
//! With a farm, the driver places every compile on the farm's nodes as the governor does
//! beside a distributed compile engine; links and other jobs run here.
//!
//! Each job is offered as its session's ([`SimJob::session`]): several sessions at once on one
//! driver share it as the governor's sessions do (`crate::sessions`).

use std::collections::HashMap;

use headroom_sched::bursts::Bursts;
use headroom_sched::chain::{self, Finished};
use headroom_sched::{
    Action, AfterAttempt, Driver, Ended, Farm, JobId, Limits, NodeId, NodeSpec, Offer, PastRun,
    Profile, Ran, Reading, WarmStart,
};

use crate::engine::{Policy, View};
use crate::machine::{FarmSpec, Machine};
use crate::trace::JobKind;
use crate::workload::{SimJob, Workload};

pub struct Headroom {
    driver: Driver,
    /// For a warm run, the seconds of work that waited on each job (by index) in the previous
    /// run; each job's own history is in the workload.
    waiting_seconds: Option<Vec<f64>>,
    /// The driver's id of each offered job, by the simulator's, and back.
    driver_ids: HashMap<JobId, JobId>,
    sim_ids: HashMap<JobId, JobId>,
    /// The simulated second of the last decision.
    now: f64,
}

impl Headroom {
    /// headroom on `workload` with `budget` bytes, with no history, or `warm` with what a
    /// previous run left.
    pub fn new(machine: Machine, workload: &Workload, warm: bool, budget: u64) -> Self {
        let limits = Limits {
            budget,
            slots: machine.cores,
        };
        Headroom::around(Driver::new(limits, true), workload, warm)
    }

    /// headroom with `driver` (the live governor's, in a test), given what a previous run
    /// left when `warm`.
    pub fn around(mut driver: Driver, workload: &Workload, warm: bool) -> Self {
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
        if warm {
            driver.warm_start(Headroom::warm_start(workload));
        }
        Headroom {
            driver,
            waiting_seconds,
            driver_ids: HashMap::new(),
            sim_ids: HashMap::new(),
            now: 0.0,
        }
    }

    /// What a previous run of `workload` showed, as the governor reads it from its last two
    /// builds: how far each job strayed in peak and time between the run before the trace's
    /// and the trace's. A trace does not say when jobs were offered, so it knows no bursts.
    pub fn warm_start(workload: &Workload) -> WarmStart {
        WarmStart {
            peak_reruns: workload
                .jobs
                .iter()
                .map(|job| (job.earlier_peak, job.history_peak))
                .collect(),
            time_reruns: workload
                .jobs
                .iter()
                .filter_map(|job| {
                    let earlier = Ran {
                        cpu_seconds: job.earlier_duration * job.threads,
                        wall_seconds: job.earlier_duration,
                    };
                    Some((earlier, job.history_profile.as_ref()?.ran()))
                })
                .collect(),
            bursts: Bursts::default(),
        }
    }

    /// headroom placing compiles on `farm`'s nodes, each with all its memory and a slot per
    /// core.
    pub fn with_farm(mut self, farm: FarmSpec) -> Self {
        let nodes = (0..farm.nodes)
            .map(|node| NodeSpec {
                name: format!("node{node}"),
                memory: farm.node.memory,
                slots: farm.node.cores,
            })
            .collect();
        self.driver.set_farm(Farm::new(nodes));
        self
    }

    /// What the governor would know of `job` when the build system starts it.
    fn offer_of(&self, job: &SimJob) -> Offer {
        let (past, waiting_seconds) = match &self.waiting_seconds {
            Some(waiting_seconds) => (
                Some(PastRun {
                    peak: job.history_peak,
                    profile: job.history_profile.clone(),
                    shared: false,
                }),
                waiting_seconds[job.id as usize],
            ),
            None => (None, 0.0),
        };
        Offer {
            session: job.session,
            key: job.label.clone(),
            label: job.label.clone(),
            group: job.group,
            past,
            waiting_seconds,
            lower_rungs: 0,
            farmable: self.driver.farm().is_some() && job.kind == JobKind::Compile,
            local_share: None,
        }
    }

    fn driver_id(&self, job: &SimJob) -> JobId {
        self.driver_ids[&job.id]
    }

    /// The simulator's action for the driver's.
    fn for_simulator(&self, action: Action) -> Action {
        let sim = |id: JobId| self.sim_ids[&id];
        match action {
            Action::Start { id, nice } => Action::Start { id: sim(id), nice },
            Action::Suspend(id) => Action::Suspend(sim(id)),
            Action::Resume(id) => Action::Resume(sim(id)),
            Action::Kill(id) => Action::Kill(sim(id)),
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
        // A burst's jobs all come before the engine asks for a decision, so the driver's
        // wish to hold the decision for the rest of the burst is met without waiting.
        let (id, _decide_now) = self.driver.offer(self.offer_of(job));
        self.driver_ids.insert(job.id, id);
        self.sim_ids.insert(id, job.id);
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        self.now = view.now;
        if view.tick {
            let readings: Vec<Reading> = view
                .running
                .iter()
                .map(|job| Reading {
                    id: self.driver_ids[&job.id],
                    bytes: job.bytes,
                    cpu_seconds: job.cpu_seconds,
                })
                .collect();
            self.driver.sample(&readings, 0, view.now);
        }
        let actions = self.driver.decide(Some(view.free()), view.now);
        for action in &actions {
            match *action {
                // The engine starts the job at once.
                Action::Start { id, .. } => {
                    self.driver.begin_attempt(id);
                }
                // The engine ends the attempt at once, and the driver has requeued the job.
                Action::Kill(id) => {
                    let cpu_seconds = view
                        .running
                        .iter()
                        .find(|job| job.id == self.sim_ids[&id])
                        .map_or(0.0, |job| job.cpu_seconds);
                    let ended = Ended {
                        succeeded: false,
                        out_of_memory: false,
                        cpu_seconds,
                        max_rss: 0,
                        node_unreachable: false,
                    };
                    self.driver.attempt_ended(id, ended, view.now);
                }
                Action::Suspend(_) | Action::Resume(_) => {}
            }
        }
        actions
            .into_iter()
            .map(|action| self.for_simulator(action))
            .collect()
    }

    fn node_of(&self, id: JobId) -> Option<NodeId> {
        self.driver.job(*self.driver_ids.get(&id)?)?.node
    }

    fn finished(&mut self, job: &SimJob, peak: u64, now: f64) {
        let ended = Ended {
            succeeded: true,
            out_of_memory: false,
            cpu_seconds: job.core_seconds(),
            max_rss: peak,
            node_unreachable: false,
        };
        self.driver.attempt_ended(self.driver_id(job), ended, now);
    }

    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        // The driver retries a job the kernel killed alone, sized by what it reached; once
        // alone it has nothing left to try (the simulator has no flag ladder), and the
        // simulated build stalls as the real one fails. A job killed on a farm node goes to a
        // node with more room, or here alone.
        let ended = Ended {
            succeeded: false,
            out_of_memory: true,
            cpu_seconds: 0.0,
            max_rss: peak,
            node_unreachable: false,
        };
        let id = self.driver_id(job);
        if let (AfterAttempt::Done(_), _) = self.driver.attempt_ended(id, ended, self.now) {
            self.sim_ids.remove(&id);
        }
    }
}
