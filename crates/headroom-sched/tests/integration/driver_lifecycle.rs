//! The `Driver`'s bookkeeping over random event sequences, played as the governor plays them:
//! jobs offered, memory sampled (sometimes past the budget, so jobs are stopped and resumed),
//! decisions asked for with the machine sometimes nearly full (so attempts are killed),
//! attempts ending in success, failure, an OOM kill or an unreachable farm node, and callers
//! going away. Whatever happens, every offered job ends exactly once, each call moves a job's
//! state only along the transitions written below, and no job is lost: the driver knows each
//! job until it ends, and when the events stop and memory is plentiful, every job ends.

use std::collections::{HashMap, HashSet};

use headroom_sched::{
    Action, AfterAttempt, Driver, Ended, Farm, JobId, JobState, Limits, NodeSpec, Offer, Reading,
};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;
const BUDGET: u64 = 8 * GIB;

#[derive(Debug, Clone)]
enum Event {
    Offer {
        session: u32,
        group: u64,
        lower_rungs: usize,
        farmable: bool,
    },
    /// Each running job reads `bytes[i % len]`.
    Sample {
        bytes: Vec<u64>,
    },
    Decide {
        machine_left: Option<u64>,
    },
    /// The `pick`-th live attempt ends as `outcome` says.
    End {
        pick: usize,
        outcome: Outcome,
        max_rss: u64,
    },
    /// The `pick`-th job not yet over loses its caller.
    Forget {
        pick: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Succeeded,
    Failed,
    OutOfMemory,
    NodeUnreachable,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0u32..3, 0u64..3, 0usize..3, any::<bool>()).prop_map(
            |(session, group, lower_rungs, farmable)| Event::Offer { session, group, lower_rungs, farmable }
        ),
        3 => prop::collection::vec(0..BUDGET, 1..4).prop_map(|bytes| Event::Sample { bytes }),
        4 => prop::option::weighted(0.7, 0..2 * GIB).prop_map(|machine_left| Event::Decide { machine_left }),
        4 => (
            any::<usize>(),
            prop_oneof![
                Just(Outcome::Succeeded),
                Just(Outcome::Failed),
                Just(Outcome::OutOfMemory),
                Just(Outcome::NodeUnreachable),
            ],
            0..BUDGET,
        )
            .prop_map(|(pick, outcome, max_rss)| Event::End { pick, outcome, max_rss }),
        1 => any::<usize>().prop_map(|pick| Event::Forget { pick }),
    ]
}

/// What moved a job's state: the driver's calls that change states.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Sample,
    Decide,
    BeginAttempt,
    AttemptEnded,
}

/// The legal one-step transitions, from `JobState` and `driver.rs`. `None` is "over": the
/// driver no longer knows the job.
fn step(call: Call, from: JobState, to: Option<JobState>) -> bool {
    use JobState::*;
    match call {
        // Readings change what jobs used, never where they are.
        Call::Sample => false,
        // The scheduler starts a queued job (here or on a node), or one whose killed attempt
        // has yet to end; stops and resumes admitted and running ones; kills a running
        // attempt (Killed) or a not-yet-begun one (back to Queued).
        Call::Decide => matches!(
            (from, to),
            (Queued, Some(Admitted { suspended: false }))
                | (Killed, Some(Admitted { suspended: false }))
                | (Admitted { .. }, Some(Admitted { .. }))
                | (Running { .. }, Some(Running { .. }))
                | (Admitted { .. }, Some(Queued))
                | (Running { .. }, Some(Killed))
        ),
        // The caller begins what the scheduler started, stopped or not as it was told.
        Call::BeginAttempt => matches!(
            (from, to),
            (Admitted { suspended: a }, Some(Running { suspended: b })) if a == b
        ),
        // A running attempt ends: the job is over, or queued again; a killed attempt's end
        // requeues it.
        Call::AttemptEnded => matches!(
            (from, to),
            (Running { .. }, None) | (Running { .. }, Some(Queued)) | (Killed, Some(Queued))
        ),
    }
}

/// Whether one `call` may move a job from `from` to `to`: unchanged, one step, or, for a
/// decision, two (the safety net acts, then admission: killed and started again).
fn legal(call: Call, from: JobState, to: Option<JobState>) -> bool {
    if to == Some(from) || step(call, from, to) {
        return true;
    }
    call == Call::Decide
        && all_states().any(|mid| step(call, from, Some(mid)) && step(call, mid, to))
}

fn all_states() -> impl Iterator<Item = JobState> {
    [false, true]
        .into_iter()
        .flat_map(|suspended| {
            [
                JobState::Admitted { suspended },
                JobState::Running { suspended },
            ]
        })
        .chain([JobState::Queued, JobState::Killed])
}

/// The governor's side: the jobs offered, their attempts, and how each job ended.
#[derive(Default)]
struct Caller {
    offered: Vec<JobId>,
    /// Jobs with an attempt begun that has not ended, and whether the driver killed it.
    live: HashMap<JobId, bool>,
    /// Jobs the scheduler started while their killed attempt had yet to end: the caller
    /// begins the new attempt once the old one has ended.
    start_after_end: HashSet<JobId>,
    /// How many times each job ended (finished or forgotten).
    ended: HashMap<JobId, u32>,
    now: f64,
}

impl Caller {
    fn states(&self, driver: &Driver) -> HashMap<JobId, Option<JobState>> {
        self.offered
            .iter()
            .filter(|id| !self.ended.contains_key(id))
            .map(|&id| (id, driver.job(id).map(|job| job.state)))
            .collect()
    }

    /// Runs `act` on the driver and checks that every job not over moved legally.
    fn checked<T>(
        &mut self,
        driver: &mut Driver,
        call: Call,
        act: impl FnOnce(&mut Caller, &mut Driver) -> T,
    ) -> T {
        let before = self.states(driver);
        let result = act(self, driver);
        for (id, from) in before {
            let from =
                from.unwrap_or_else(|| panic!("job {id} is lost: not over, unknown to the driver"));
            let to = if self.ended.contains_key(&id) {
                None
            } else {
                driver.job(id).map(|job| job.state)
            };
            assert!(
                legal(call, from, to),
                "job {id}: {call:?} moved it from {from:?} to {to:?}"
            );
            if to.is_none() {
                assert!(
                    self.ended.contains_key(&id),
                    "job {id} left the driver without ending ({call:?})"
                );
            }
        }
        result
    }

    fn end_once(&mut self, id: JobId) {
        let times = self.ended.entry(id).or_default();
        *times += 1;
        assert_eq!(*times, 1, "job {id} ended twice");
    }

    fn decide(&mut self, driver: &mut Driver, machine_left: Option<u64>) {
        self.now += 0.1;
        let now = self.now;
        let actions = self.checked(driver, Call::Decide, |_, driver| {
            driver.decide(machine_left, now)
        });
        for action in actions {
            match action {
                Action::Start { id, .. } => {
                    if self.live.contains_key(&id) {
                        assert!(
                            self.live[&id],
                            "job {id} started while its attempt runs unkilled"
                        );
                        self.start_after_end.insert(id);
                    } else {
                        self.begin(driver, id);
                    }
                }
                Action::Kill(id) => {
                    let killed = self
                        .live
                        .get_mut(&id)
                        .unwrap_or_else(|| panic!("job {id} killed with no attempt running"));
                    *killed = true;
                }
                Action::Suspend(id) | Action::Resume(id) => {
                    assert!(
                        driver.job(id).is_some(),
                        "job {id} stopped or resumed, unknown"
                    );
                }
            }
        }
    }

    fn begin(&mut self, driver: &mut Driver, id: JobId) {
        let began = self.checked(driver, Call::BeginAttempt, |_, driver| {
            driver.begin_attempt(id).is_some()
        });
        assert!(began, "job {id} was started but cannot begin");
        self.live.insert(id, false);
    }

    fn end(&mut self, driver: &mut Driver, id: JobId, outcome: Outcome, max_rss: u64) {
        let killed = self.live.remove(&id).expect("a live attempt");
        let on_node = driver.job(id).and_then(|job| job.node).is_some();
        let ended = Ended {
            succeeded: matches!(outcome, Outcome::Succeeded),
            out_of_memory: matches!(outcome, Outcome::OutOfMemory),
            cpu_seconds: 0.5,
            max_rss,
            node_unreachable: on_node && matches!(outcome, Outcome::NodeUnreachable),
        };
        self.now += 0.1;
        let now = self.now;
        let after = self.checked(driver, Call::AttemptEnded, |caller, driver| {
            let (after, _) = driver.attempt_ended(id, ended, now);
            if let AfterAttempt::Done(finished) = &after {
                assert_eq!(finished.succeeded, ended.succeeded, "job {id}");
                caller.end_once(id);
            }
            after
        });
        if killed {
            assert!(
                matches!(after, AfterAttempt::Retry),
                "job {id}'s killed attempt ended it: {after:?}"
            );
        }
        // The scheduler may have withdrawn that start since (a kill before the attempt
        // began is only a requeue, and not returned): then there is nothing to begin.
        let withdrawn = driver.job(id).map(|job| job.state) == Some(JobState::Queued);
        if self.start_after_end.remove(&id) && !withdrawn {
            self.begin(driver, id);
        }
    }

    fn forget(&mut self, driver: &mut Driver, id: JobId) {
        self.live.remove(&id);
        self.start_after_end.remove(&id);
        assert!(
            driver.forget(id).is_some(),
            "job {id} is lost before its caller went away"
        );
        self.end_once(id);
        assert!(
            driver.job(id).is_none(),
            "job {id} is still known after it was forgotten"
        );
    }

    fn play(&mut self, driver: &mut Driver, event: Event) {
        match event {
            Event::Offer {
                session,
                group,
                lower_rungs,
                farmable,
            } => {
                let key = format!("job-{}", self.offered.len());
                let (id, _) = driver.offer(Offer {
                    session,
                    label: key.clone(),
                    key,
                    group,
                    past: None,
                    waiting_seconds: 0.0,
                    lower_rungs,
                    farmable,
                    local_share: None,
                });
                assert!(!self.offered.contains(&id), "id {id} given twice");
                assert_eq!(driver.job(id).map(|job| job.state), Some(JobState::Queued));
                self.offered.push(id);
            }
            Event::Sample { bytes } => {
                self.now += 0.1;
                let readings: Vec<Reading> = self
                    .live
                    .keys()
                    .enumerate()
                    .map(|(i, &id)| Reading {
                        id,
                        bytes: bytes[i % bytes.len()],
                        cpu_seconds: 0.1,
                    })
                    .collect();
                let now = self.now;
                self.checked(driver, Call::Sample, |_, driver| {
                    driver.sample(&readings, 0, now)
                });
            }
            Event::Decide { machine_left } => self.decide(driver, machine_left),
            Event::End {
                pick,
                outcome,
                max_rss,
            } => {
                let mut live: Vec<JobId> = self.live.keys().copied().collect();
                live.sort_unstable();
                if let Some(&id) = live.get(pick % live.len().max(1)) {
                    self.end(driver, id, outcome, max_rss);
                }
            }
            Event::Forget { pick } => {
                let open: Vec<JobId> = self
                    .offered
                    .iter()
                    .copied()
                    .filter(|id| !self.ended.contains_key(id))
                    .collect();
                if let Some(&id) = open.get(pick % open.len().max(1)) {
                    self.forget(driver, id);
                }
            }
        }
    }

    /// No more events: memory is plentiful, every attempt succeeds. Every job must end.
    fn drain(&mut self, driver: &mut Driver) {
        for _ in 0..10_000 {
            if self.ended.len() == self.offered.len() {
                return;
            }
            self.now += 0.1;
            let readings: Vec<Reading> = self
                .live
                .keys()
                .map(|&id| Reading {
                    id,
                    bytes: 0,
                    cpu_seconds: 0.1,
                })
                .collect();
            let now = self.now;
            driver.sample(&readings, 0, now);
            self.decide(driver, None);
            let mut live: Vec<JobId> = self.live.keys().copied().collect();
            live.sort_unstable();
            for id in live {
                self.end(driver, id, Outcome::Succeeded, 0);
            }
        }
        let open: Vec<_> = self
            .offered
            .iter()
            .filter(|id| !self.ended.contains_key(id))
            .map(|id| (id, driver.job(*id).map(|job| job.state)))
            .collect();
        panic!("jobs never ended: {open:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_offered_job_ends_exactly_once_along_legal_transitions(
        events in prop::collection::vec(event(), 1..120),
        nodes in 0usize..3,
    ) {
        let mut driver = Driver::new(Limits { budget: BUDGET, slots: 4 }, true);
        if nodes > 0 {
            driver.set_farm(Farm::new(
                (0..nodes)
                    .map(|i| NodeSpec { name: format!("node{i}"), memory: 4 * GIB, slots: 2 })
                    .collect(),
            ));
        }
        let mut caller = Caller::default();
        for event in events {
            caller.play(&mut driver, event);
        }
        caller.drain(&mut driver);
        for id in &caller.offered {
            prop_assert_eq!(caller.ended.get(id), Some(&1), "job {} ended once", id);
            prop_assert!(driver.job(*id).is_none());
        }
    }
}
