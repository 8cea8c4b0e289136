//! Invariants of every policy over random traces and machines, and runs whose peaks all grew
//! or shrank since the trace: memory never exceeds the machine without an OOM event, every
//! job completes, and no policy beats the lower bound.

use headroom_sim::{
    compare, BudgetSpec, JobKind, LowerBound, Machine, PolicySpec, SimConfig, Trace, TraceJob,
    Workload, ALL_POLICIES, SCHEMA,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn job(index: usize, largest: u64) -> impl Strategy<Value = TraceJob> {
    (
        MIB..largest,
        1.0f64..60.0,
        1.0f64..3.0,
        prop::collection::vec((0.0f64..1.0, 0u64..1000), 0..5),
        prop::collection::vec(0..index.max(1), 0..3),
        prop::bool::weighted(0.2),
    )
        .prop_map(move |(peak, duration, threads, shape, deps, link)| {
            let mut profile: Vec<(f64, u64)> = shape
                .into_iter()
                .map(|(at, share)| (at * duration, peak / 1000 * share))
                .collect();
            profile.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut deps: Vec<usize> = if index == 0 { Vec::new() } else { deps };
            deps.sort_unstable();
            deps.dedup();
            TraceJob {
                label: format!("job{index}"),
                group: format!("group{}", index % 3),
                kind: if link {
                    JobKind::Link
                } else {
                    JobKind::Compile
                },
                deps,
                peak,
                duration,
                cpu: duration * threads,
                profile,
                input_bytes: Some(peak / 4),
            }
        })
}

fn scenario() -> impl Strategy<Value = (Machine, Trace, SimConfig)> {
    let sizes = (1usize..6, 2u64..12, 1usize..25);
    // headroom's own budget, or `--budget` up to all of the machine's memory.
    let budget = prop_oneof![
        Just(BudgetSpec::Auto),
        (50.0f64..=100.0).prop_map(BudgetSpec::Percent)
    ];
    let config =
        (any::<u64>(), -0.2f64..0.1, budget).prop_map(|(seed, growth, budget)| SimConfig {
            seed,
            growth,
            budget,
            ..SimConfig::default()
        });
    (sizes, config).prop_flat_map(|((cores, gib, jobs), config)| {
        let memory = gib << 30;
        // Keep every job (after 10% growth and ±3% variation) below the machine, or no policy
        // could run it.
        let largest = memory / 10 * 8;
        let jobs: Vec<_> = (0..jobs).map(|index| job(index, largest)).collect();
        (Just(Machine { cores, memory }), jobs, Just(config)).prop_map(|(machine, jobs, config)| {
            let trace = Trace {
                schema: SCHEMA,
                name: "random".into(),
                source: None,
                recorded: None,
                jobs,
            };
            (machine, trace, config)
        })
    })
}

fn outcomes(machine: Machine, trace: &Trace, config: &SimConfig) -> Vec<headroom_sim::Outcome> {
    trace.validate().expect("the generator makes valid traces");
    let workload = Workload::new(trace, config);
    let mut policies = ALL_POLICIES.to_vec();
    policies.push(PolicySpec::Clairvoyant);
    let comparison = compare(&workload, machine, &policies, config).expect("every move is valid");
    assert_eq!(comparison.lower_bound, LowerBound::new(&workload, machine));
    comparison.outcomes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn memory_stays_within_the_machine_and_no_policy_beats_the_bound(
        (machine, trace, config) in scenario()
    ) {
        let bound = LowerBound::new(&Workload::new(&trace, &config), machine);
        for outcome in outcomes(machine, &trace, &config) {
            prop_assert!(
                outcome.peak_memory <= machine.memory,
                "{} used {} of {} bytes", outcome.policy, outcome.peak_memory, machine.memory
            );
            prop_assert!(
                !outcome.completed() || outcome.makespan >= bound.seconds * (1.0 - 1e-9),
                "{} finished in {}s, under the lower bound {:?}", outcome.policy, outcome.makespan, bound
            );
        }
    }

    #[test]
    fn every_baseline_completes_every_job((machine, trace, config) in scenario()) {
        for outcome in outcomes(machine, &trace, &config) {
            prop_assert!(
                outcome.family == "headroom" || outcome.completed(),
                "{}: {:?}", outcome.policy, outcome.stalled
            );
        }
    }

    /// This found the deadlock that `headroom_resumes_the_oldest_job_when_the_older_ones_finish`
    /// keeps fixed.
    #[test]
    fn headroom_completes_every_job((machine, trace, config) in scenario()) {
        for outcome in outcomes(machine, &trace, &config) {
            prop_assert!(outcome.completed(), "{}: {:?}", outcome.policy, outcome.stalled);
        }
    }
}
