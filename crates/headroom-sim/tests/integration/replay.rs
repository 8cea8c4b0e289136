//! Recorded traces replayed on the machine and `-j` they were recorded with must take about
//! the wall time the real build took: the check that the simulator models real builds. A
//! static `-j` that runs the recorded machine out of memory (a build recorded under a cap
//! that kills it, such as flash-attn) is not how that build ran, and is not compared.
//! headroom's own replay runs today's policy, which may have learned to do better than the
//! one the build was recorded with: it must not take longer than the real build.

use std::path::Path;

use headroom_sim::{simulate, Machine, PolicySpec, SimConfig, Trace, Workload};

/// How far a replay may drift from the real wall time (the real builds ran on a shared,
/// loaded machine).
const TOLERANCE: f64 = 0.10;

#[test]
fn recorded_traces_replay_within_tolerance_of_their_wall_time() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/recorded");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("traces/recorded exists") {
        let path = entry.expect("readable directory").path();
        if path.extension().and_then(|ext| ext.to_str()) != Some("json") {
            continue;
        }
        let trace = Trace::load(&path).expect("a valid recorded trace");
        let recording = trace
            .recorded
            .clone()
            .expect("a recorded trace says how it ran");
        let machine = Machine {
            cores: recording.cores,
            memory: recording.memory,
        };
        let config = SimConfig {
            variation: 0.0,
            ..SimConfig::default()
        };
        let workload = Workload::new(&trace, &config);
        let mut compared = 0;
        for spec in [
            PolicySpec::Static(Some(recording.jobs_flag)),
            PolicySpec::Headroom { warm: false },
        ] {
            let mut policies = spec
                .instantiate(machine, &workload, &config)
                .expect("no farm");
            let outcome =
                simulate(&workload, machine, policies[0].as_mut(), &config).expect("runs");
            if outcome.oom_events > 0 {
                continue;
            }
            compared += 1;
            let drift = (outcome.makespan - recording.wall_seconds) / recording.wall_seconds;
            let drift = match spec {
                PolicySpec::Headroom { .. } => drift.max(0.0),
                _ => drift.abs(),
            };
            assert!(
                drift <= TOLERANCE,
                "{}: {} replays in {:.1}s, the real build took {:.1}s",
                trace.name,
                outcome.policy,
                outcome.makespan,
                recording.wall_seconds
            );
        }
        assert!(
            compared > 0,
            "{}: no policy replays it without OOM",
            trace.name
        );
        replayed += 1;
    }
    assert!(replayed > 0, "no recorded trace in {}", dir.display());
}
