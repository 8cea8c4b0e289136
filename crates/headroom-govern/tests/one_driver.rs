//! The live governor and the simulator drive one policy: a recorded build's events, fed by
//! the simulator once into the driver the simulator builds and once into the driver the
//! governor builds from its configuration, give the same decisions in the same order. A
//! difference in how either sets the driver up (budget, slots, thresholds, priorities,
//! prediction) shows here as a different decision.

use std::path::Path;

use headroom_govern::governor::{driver_for, Past};
use headroom_govern::protocol::GovernorConfig;
use headroom_sched::Action;
use headroom_sim::policy::Headroom;
use headroom_sim::{simulate, Machine, Policy, SimConfig, SimJob, Trace, View, Workload};

/// A policy that notes every decision of the one it wraps.
struct Noting<P> {
    policy: P,
    decisions: Vec<(f64, Action)>,
}

impl<P: Policy> Policy for Noting<P> {
    fn name(&self) -> String {
        self.policy.name()
    }
    fn family(&self) -> &'static str {
        self.policy.family()
    }
    fn offer(&mut self, job: &SimJob) {
        self.policy.offer(job)
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        let actions = self.policy.decide(view);
        self.decisions
            .extend(actions.iter().map(|&action| (view.now, action)));
        actions
    }
    fn finished(&mut self, job: &SimJob, peak: u64, now: f64) {
        self.policy.finished(job, peak, now)
    }
    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        self.policy.oom_killed(job, peak)
    }
}

fn governor_config(budget: u64, slots: usize) -> GovernorConfig {
    GovernorConfig {
        budget,
        budget_source: "test".into(),
        slots,
        history: None,
        command: "make".into(),
        cwd: ".".into(),
        started_unix_ms: 0,
        ladder: Vec::new(),
        sample_interval_ms: 100,
        priorities: true,
        parallelism_set: Vec::new(),
        project_root: "/src".into(),
        farm: None,
        session_id: None,
    }
}

#[test]
fn the_governor_and_the_simulator_decide_alike_on_a_recorded_build() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/recorded/template-heavy.json");
    let trace = Trace::load(&path).expect("the recorded trace loads");
    let config = SimConfig {
        variation: 0.0,
        ..SimConfig::default()
    };
    let workload = Workload::new(&trace, &config);
    // Tight enough that jobs wait, are stopped and are requeued: every kind of decision.
    let machine: Machine = "2c/2G".parse().expect("a valid machine");
    let budget = config.budget.bytes(machine.memory);
    let run = |policy: Headroom| {
        let mut noting = Noting {
            policy,
            decisions: Vec::new(),
        };
        let outcome = simulate(&workload, machine, &mut noting, &config).expect("it runs");
        (outcome, noting.decisions)
    };
    for warm in [false, true] {
        let (simulated, in_simulator) = run(Headroom::new(machine, &workload, warm, budget));
        let live = driver_for(&governor_config(budget, machine.cores), &Past::default());
        let (governed, in_governor) = run(Headroom::around(live, &workload, warm));
        assert!(simulated.completed(), "{simulated:?}");
        let starts = in_simulator
            .iter()
            .filter(|(_, action)| matches!(action, Action::Start { .. }))
            .count();
        let niced = in_simulator
            .iter()
            .filter(|(_, action)| matches!(action, Action::Start { nice, .. } if *nice > 0))
            .count();
        eprintln!(
            "warm {warm}: {} decisions ({starts} starts, {niced} of them niced), makespan {:.1} s",
            in_simulator.len(),
            simulated.makespan
        );
        assert!(
            starts > workload.jobs.len(),
            "some job is stopped and started again"
        );
        assert_eq!(in_simulator, in_governor, "warm {warm}");
        assert_eq!(simulated.makespan, governed.makespan, "warm {warm}");
    }
}
