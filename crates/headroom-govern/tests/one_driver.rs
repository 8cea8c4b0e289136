//! The live governor and the simulator drive one policy: a recorded build's events, fed by
//! the simulator once into the driver the simulator builds and once into the driver the
//! governor builds from its configuration, give the same decisions in the same order. A
//! difference in how either sets the driver up (budget, slots, thresholds, priorities,
//! prediction) shows here as a different decision.
//!
//! Both also warm-start the driver from the same recorded build: the governor from the rows
//! of its history, the simulator from the trace it imports of that build. They must hand the
//! driver the same `WarmStart`, and the drivers must then decide alike.

use std::path::Path;

use headroom_govern::governor::{driver_for, open_history, warm_start, Past};
use headroom_govern::protocol::GovernorConfig;
use headroom_sched::bursts::Bursts;
use headroom_sched::{Action, Driver, Limits, Offer, PastRun};
use headroom_sim::import::{trace_from_report, ImportOptions};
use headroom_sim::policy::Headroom;
use headroom_sim::{simulate, Machine, Policy, SimConfig, SimJob, Trace, View, Workload};
use headroom_store::{BuildRecord, History, JobRecord};

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

const GIB: u64 = 1 << 30;

/// One build of four compiles offered together, as `make -j4` runs them: each uses two cores
/// (so the simulator's one core at least changes nothing) for a power of two of seconds, so
/// the times read back from milliseconds are exact, and they end in the order they were
/// offered, with no stretch where none ran (which the trace would fill with ungoverned work).
fn recorded_jobs() -> Vec<JobRecord> {
    (0..4u64)
        .map(|index| {
            let wall_ms = 1000 << index;
            JobRecord {
                job_id: index,
                key: format!("unit{index}.o"),
                group: "cc".into(),
                label: format!("unit{index}.o"),
                compiler: "cc".into(),
                command: format!("cc -c unit{index}.c -o unit{index}.o"),
                cwd: "/src".into(),
                end_ms: wall_ms,
                peak: (index + 1) * GIB / 2,
                cpu_ms: 2 * wall_ms,
                exit_code: Some(0),
                attempts: 1,
                ..JobRecord::default()
            }
        })
        .collect()
}

#[test]
fn the_governor_and_the_simulator_warm_start_alike_from_one_recorded_build() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("history.sqlite");
    let machine: Machine = "4c/8G".parse().expect("a valid machine");
    let budget = 2 * GIB;
    let jobs = recorded_jobs();
    // The same build twice: the simulator's run before the trace's is the trace's own with no
    // variation, and the governor pairs each job's two newest clean runs.
    let mut history = History::open(&path).expect("the history opens");
    let mut recorded = 0;
    for started_unix_ms in [1_000, 2_000] {
        let build = BuildRecord {
            id: 0,
            started_unix_ms,
            duration_ms: None,
            command: "make -j4".into(),
            cwd: "/src".into(),
            budget,
            budget_source: "test".into(),
            slots: machine.cores as u32,
            exit_code: None,
            peak_total: None,
            parallelism_set: Vec::new(),
        };
        recorded = history.begin_build(&build).expect("the build begins");
        for job in &jobs {
            history
                .record_job(recorded, job, &job.key, None)
                .expect("the job is recorded");
        }
        history
            .finish_build(recorded, 8_000, Some(0), 2 * GIB)
            .expect("the build ends");
    }
    let report = history
        .load_build(recorded)
        .expect("the newest build loads");
    drop(history);

    let config = GovernorConfig {
        history: Some(path),
        ..governor_config(budget, machine.cores)
    };
    let mut warnings = Vec::new();
    let past = open_history(&config, &mut warnings);
    assert!(warnings.is_empty(), "{warnings:?}");
    let in_governor = warm_start(&past);

    let options = ImportOptions {
        name: "recorded".into(),
        machine,
        jobs_flag: 4,
        named_inputs: vec![Vec::new(); jobs.len()],
    };
    let trace = trace_from_report(&report, &options);
    let sim_config = SimConfig {
        variation: 0.0,
        ..SimConfig::default()
    };
    let workload = Workload::new(&trace, &sim_config);
    let in_simulator = Headroom::warm_start(&workload);

    assert_eq!(in_governor.peak_reruns.len(), jobs.len(), "{in_governor:?}");
    assert_eq!(in_governor.time_reruns.len(), jobs.len(), "{in_governor:?}");
    // A trace does not say when jobs were offered, so the simulator knows no bursts; it
    // decides on every tick, where bursts would only tell the governor to wait for one.
    assert_ne!(
        in_governor.bursts,
        Bursts::default(),
        "the four came together"
    );
    let without_bursts = headroom_sched::WarmStart {
        bursts: Bursts::default(),
        ..in_governor.clone()
    };
    assert_eq!(without_bursts, in_simulator);

    // The drivers each warm start builds decide alike on the build's jobs offered again.
    let mut governed = driver_for(&config, &past);
    let mut simulated = Driver::new(
        Limits {
            budget,
            slots: machine.cores,
        },
        true,
    );
    simulated.warm_start(in_simulator);
    let first_decisions = |driver: &mut Driver| {
        for job in &jobs {
            driver.offer(Offer {
                session: 0,
                key: job.key.clone(),
                label: job.label.clone(),
                group: 0,
                past: Some(PastRun {
                    peak: job.peak,
                    profile: None,
                    shared: false,
                }),
                waiting_seconds: 0.0,
                lower_rungs: 0,
                farmable: false,
                local_share: None,
            });
        }
        driver.decide(None, 0.0)
    };
    let decided = first_decisions(&mut governed);
    assert!(
        !decided.is_empty() && decided.len() < jobs.len(),
        "the budget starts some of the jobs, not all: {decided:?}"
    );
    assert_eq!(decided, first_decisions(&mut simulated));
}
