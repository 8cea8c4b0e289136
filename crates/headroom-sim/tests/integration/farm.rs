//! Farms in the simulator: each node's memory and cores simulated apart, headroom's placement
//! against the engines' own, on hand-made traces whose heavy jobs cannot all share a node.

use crate::jobs::ramp_job;
use headroom_sched::{Action, JobId, NodeId};
use headroom_sim::{
    compare, simulate, FarmSpec, JobKind, Machine, Outcome, Policy, PolicySpec, SimConfig, SimJob,
    Trace, TraceJob, View, Workload, CLIENT_BYTES, SCHEMA,
};

const GIB: u64 = 1 << 30;

/// `count` independent compiles that each ramp to `peak` over `duration` seconds.
fn compiles(count: usize, peak: u64, duration: f64) -> Vec<TraceJob> {
    (0..count)
        .map(|index| TraceJob {
            group: "nvcc -O3".into(),
            ..ramp_job(&format!("unit{index}.o"), peak, duration)
        })
        .collect()
}

fn workload(jobs: Vec<TraceJob>) -> Workload {
    let trace = Trace {
        schema: SCHEMA,
        name: "farmed".into(),
        source: None,
        recorded: None,
        jobs,
    };
    Workload::new(&trace, &config(None))
}

fn config(farm: Option<&str>) -> SimConfig {
    SimConfig {
        variation: 0.0,
        farm: farm.map(|farm| farm.parse().expect("valid farm")),
        ..SimConfig::default()
    }
}

/// A policy under test, with the most jobs and bytes seen on any one node at a decision.
struct Watching {
    inner: Box<dyn Policy>,
    most_jobs: usize,
    most_used: u64,
}

impl Policy for Watching {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn family(&self) -> &'static str {
        self.inner.family()
    }
    fn needs_ticks(&self) -> bool {
        self.inner.needs_ticks()
    }
    fn offer(&mut self, job: &SimJob) {
        self.inner.offer(job);
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        for node in view.nodes {
            self.most_jobs = self.most_jobs.max(node.jobs);
            self.most_used = self.most_used.max(node.used);
        }
        self.inner.decide(view)
    }
    fn node_of(&self, id: JobId) -> Option<NodeId> {
        self.inner.node_of(id)
    }
    fn finished(&mut self, job: &SimJob, peak: u64, now: f64) {
        self.inner.finished(job, peak, now);
    }
    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        self.inner.oom_killed(job, peak);
    }
}

/// Runs `policy` on `workload` on a 4c/16G machine beside `farm`.
fn run(workload: &Workload, farm: &str, policy: &str) -> (Outcome, Watching) {
    let machine: Machine = "4c/16G".parse().expect("valid machine");
    let config = config(Some(farm));
    let spec: PolicySpec = policy.parse().expect("valid policy");
    let inner = spec
        .instantiate(machine, workload, &config)
        .expect("a farm policy")
        .remove(0);
    let mut watching = Watching {
        inner,
        most_jobs: 0,
        most_used: 0,
    };
    let outcome = simulate(workload, machine, &mut watching, &config).expect("valid run");
    (outcome, watching)
}

#[test]
fn headroom_never_plans_more_onto_a_node_than_it_has() {
    // 5 GiB jobs on 16 GiB nodes with 8 cores: three fit on a node, not four.
    let workload = workload(compiles(16, 5 * GIB, 10.0));
    let (outcome, watching) = run(&workload, "2x8c/16G", "headroom-warm");
    assert!(outcome.completed(), "{outcome:?}");
    assert_eq!(outcome.oom_events, 0, "{outcome:?}");
    assert_eq!(watching.most_jobs, 3, "three 5 GiB jobs per node");
    assert!(watching.most_used <= 16 * GIB);
}

#[test]
fn the_engines_alone_stack_heavy_jobs_until_a_node_runs_out() {
    let workload = workload(compiles(16, 5 * GIB, 10.0));
    for engine in ["sccache-dist", "icecream"] {
        let (outcome, watching) = run(&workload, "2x8c/16G", engine);
        assert!(outcome.completed(), "{engine}: {outcome:?}");
        assert!(outcome.node_oom_events > 0, "{engine}: {outcome:?}");
        assert!(
            watching.most_jobs > 3,
            "{engine} goes by cores: {outcome:?}"
        );
    }
}

#[test]
fn a_job_that_ran_out_of_memory_on_a_node_is_compiled_here() {
    // Two 10 GiB jobs on one 16 GiB node: the node kills one, and sccache-dist's client
    // compiles it here (16 GiB) after it ran 80% of the way: 8 s wasted, done at 18 s.
    let workload = workload(compiles(2, 10 * GIB, 10.0));
    let (outcome, _) = run(&workload, "1x2c/16G", "sccache-dist");
    assert_eq!((outcome.oom_events, outcome.node_oom_events), (1, 1));
    assert!((outcome.wasted_seconds - 8.0).abs() < 1e-6, "{outcome:?}");
    assert!((outcome.makespan - 18.0).abs() < 1e-6, "{outcome:?}");
    assert!(outcome.peak_memory >= 8 * GIB, "it ran here: {outcome:?}");
}

#[test]
fn a_farmed_job_holds_only_its_client_here_and_a_link_stays_here() {
    let mut jobs = compiles(4, 2 * GIB, 10.0);
    jobs.push(TraceJob {
        label: "lib.so".into(),
        group: "ld".into(),
        kind: JobKind::Link,
        deps: (0..4).collect(),
        ..compiles(1, GIB, 5.0).remove(0)
    });
    let workload = workload(jobs);
    for engine in ["sccache-dist", "icecream", "headroom-warm"] {
        let (outcome, _) = run(&workload, "1x4c/64G", engine);
        // All four compile on the node at once, then the link runs here.
        assert!(
            (outcome.makespan - 15.0).abs() < 1e-6,
            "{engine}: {outcome:?}"
        );
        assert_eq!(outcome.oom_events, 0, "{engine}");
        assert_eq!(
            outcome.peak_memory,
            4 * CLIENT_BYTES,
            "{engine}: {outcome:?}"
        );
    }
}

#[test]
fn a_farm_takes_only_the_policies_that_know_of_farms() {
    let workload = workload(compiles(2, GIB, 1.0));
    let machine: Machine = "4c/16G".parse().unwrap();
    let static_jobs: PolicySpec = "static".parse().unwrap();
    let err = compare(&workload, machine, &[static_jobs], &config(Some("2x4c/8G")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("sccache-dist"), "{err}");
    let engine: PolicySpec = "icecream".parse().unwrap();
    let err = compare(&workload, machine, &[engine], &config(None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--farm"), "{err}");
    let farm: FarmSpec = "2x4c/8G".parse().unwrap();
    let comparison = compare(&workload, machine, &[engine], &config(Some("2x4c/8G"))).unwrap();
    assert_eq!(comparison.farm, Some(farm.to_string()));
    assert_eq!(comparison.site(), "4c/16G + farm 2x4c/8G");
    assert!(comparison.lower_bound.seconds > 0.0);
}
