//! Invariants of the policy over random workloads: reservations never exceed the budget except
//! for a lone job, and every submitted job eventually runs.

use headroom_sched::{Action, Estimate, Limits, Scheduler};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Job {
    predicted: u64,
    /// Fraction (in percent) of the prediction the job really uses.
    use_percent: u64,
    alone: bool,
}

fn job(budget: u64) -> impl Strategy<Value = Job> {
    (1..budget * 2, 0u64..=100, prop::bool::weighted(0.1)).prop_map(
        |(predicted, use_percent, alone)| Job {
            predicted,
            use_percent,
            alone,
        },
    )
}

fn workload() -> impl Strategy<Value = (Limits, Vec<Job>, Vec<usize>)> {
    (1u64 << 20..1 << 34, 1usize..16).prop_flat_map(|(budget, slots)| {
        (
            Just(Limits { budget, slots }),
            prop::collection::vec(job(budget), 1..60),
            prop::collection::vec(any::<usize>(), 200),
        )
    })
}

proptest! {
    #[test]
    fn reservations_fit_and_every_job_runs((limits, jobs, picks) in workload()) {
        let mut scheduler = Scheduler::new(limits);
        let mut started = vec![false; jobs.len()];
        let mut running: Vec<usize> = Vec::new();
        let mut submitted = 0;
        let mut pick = picks.iter().cycle();
        for _step in 0..10_000 {
            // Jobs arrive a few at a time, as a build system offers them.
            let arrivals = (pick.next().unwrap() % 3).min(jobs.len() - submitted);
            for (id, job) in jobs.iter().enumerate().skip(submitted).take(arrivals) {
                scheduler.submit(id as u64, Estimate::flat(job.predicted), job.alone);
            }
            submitted += arrivals;

            for action in scheduler.decide(None) {
                match action {
                    Action::Start { id, .. } => {
                        let id = id as usize;
                        started[id] = true;
                        running.push(id);
                        let job = &jobs[id];
                        scheduler.observe(id as u64, job.predicted * job.use_percent / 100, 0.0);
                    }
                    Action::Kill(id) => running.retain(|&r| r != id as usize),
                    Action::Suspend(_) | Action::Resume(_) => {}
                }
            }
            prop_assert!(
                scheduler.reserved() <= limits.budget || scheduler.running_count() == 1,
                "reserved {} over budget {} with {} running", scheduler.reserved(), limits.budget, scheduler.running_count()
            );
            prop_assert!(scheduler.running_count() <= limits.slots);
            if submitted == jobs.len() && scheduler.queued_count() == 0 && running.is_empty() {
                break;
            }
            prop_assert!(
                !running.is_empty() || submitted < jobs.len() || scheduler.queued_count() == 0,
                "jobs wait while nothing runs"
            );
            // Some running job finishes.
            if !running.is_empty() {
                let done = running.remove(pick.next().unwrap() % running.len());
                scheduler.remove(done as u64);
            }
        }
        prop_assert!(started.iter().all(|&s| s), "some jobs never ran: {started:?}");
    }
}
