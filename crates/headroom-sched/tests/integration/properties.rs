//! Invariants of the policy over random workloads: reservations never exceed the budget except
//! for a lone job, every submitted job eventually runs, whichever of several sessions it is
//! of, and sessions that both wait share the slots.

use headroom_sched::{Action, Estimate, JobId, Limits, Scheduler, SessionId};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Job {
    predicted: u64,
    /// Fraction (in percent) of the prediction the job really uses.
    use_percent: u64,
    alone: bool,
    session: SessionId,
}

fn job(budget: u64) -> impl Strategy<Value = Job> {
    (
        1..budget * 2,
        0u64..=100,
        prop::bool::weighted(0.1),
        0 as SessionId..3,
    )
        .prop_map(|(predicted, use_percent, alone, session)| Job {
            predicted,
            use_percent,
            alone,
            session,
        })
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
                let estimate = Estimate::flat(job.predicted);
                scheduler.submit(id as u64, job.session, estimate, job.alone);
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

    #[test]
    fn two_waiting_sessions_each_get_a_slot_as_slots_free(
        slots in 2usize..12,
        sessions in prop::collection::vec(0 as SessionId..2, 1..80),
        picks in prop::collection::vec(any::<usize>(), 200),
    ) {
        // Jobs small enough that memory never holds any back: only the slots are shared.
        let budget = 64u64 << 30;
        let peak = budget / (4 * slots as u64);
        let mut scheduler = Scheduler::new(Limits { budget, slots });
        let mut running: Vec<(JobId, SessionId)> = Vec::new();
        let mut queued = [0usize; 2];
        let mut submitted = 0;
        let mut pick = picks.iter().cycle();
        let decide = |scheduler: &mut Scheduler,
                          running: &mut Vec<(JobId, SessionId)>,
                          queued: &mut [usize; 2]| {
            for action in scheduler.decide(None) {
                let Action::Start { id, .. } = action else {
                    panic!("small jobs are never stopped: {action:?}");
                };
                let session = sessions[id as usize];
                queued[session as usize] -= 1;
                running.push((id, session));
                scheduler.observe(id, peak, 0.0);
            }
        };
        while submitted < sessions.len() || !running.is_empty() {
            let arrivals = (pick.next().unwrap() % 4).min(sessions.len() - submitted);
            for (id, &session) in sessions.iter().enumerate().skip(submitted).take(arrivals) {
                scheduler.submit(id as JobId, session, Estimate::flat(peak), false);
                queued[session as usize] += 1;
            }
            submitted += arrivals;
            decide(&mut scheduler, &mut running, &mut queued);
            if running.is_empty() {
                prop_assert_eq!(queued, [0, 0], "jobs wait while nothing runs");
                continue;
            }
            let (done, _) = running.remove(pick.next().unwrap() % running.len());
            scheduler.remove(done);
            decide(&mut scheduler, &mut running, &mut queued);
            if queued.iter().all(|&waiting| waiting > 0) {
                let holding = |session: SessionId| {
                    running.iter().filter(|&&(_, of)| of == session).count()
                };
                prop_assert!(
                    holding(0) > 0 && holding(1) > 0,
                    "both sessions wait, yet one holds {} slots and the other {} of {slots}",
                    holding(0),
                    holding(1)
                );
            }
        }
    }
}
