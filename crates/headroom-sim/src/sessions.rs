//! Several builds at once on one machine (two CI jobs on one runner, two terminals on one
//! box), each a session, governed three ways so that what one governor per machine buys can be
//! measured:
//!
//! - **shared**: one governor that every session joins: one driver, one budget, the slots
//!   shared fairly between sessions;
//! - **per session**: one governor per session, each sure that the whole budget and every
//!   core are its own, as headroom ran before sessions shared a governor: together they
//!   overcommit, and what stops them is the machine running out (each governor sees what the
//!   machine has left, the kernel's OOM killer the rest);
//! - **union**: one session over the union of the builds, the yardstick: what one governor
//!   does with the same jobs when nothing divides them.

use headroom_sched::{Action, JobId, SessionId};
use serde::Serialize;

use crate::engine::{simulate, Outcome, Policy, RunningJob, View};
use crate::machine::Machine;
use crate::policy::Headroom;
use crate::workload::{SimConfig, SimJob, Workload};
use crate::SimError;

/// How the sessions are governed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Governors {
    /// One session over the union of the builds.
    Union,
    /// One governor that every session joins.
    Shared,
    /// One governor per session, each with the whole budget.
    PerSession,
}

impl Governors {
    /// In report order: the yardstick first.
    pub const ALL: [Governors; 3] = [Governors::Union, Governors::Shared, Governors::PerSession];

    /// For people, in tables.
    pub fn name(self) -> &'static str {
        match self {
            Governors::Union => "one session over the union",
            Governors::Shared => "shared governor",
            Governors::PerSession => "per-session governors",
        }
    }
}

/// What one way of governing achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionsOutcome {
    pub governors: Governors,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Seconds from the start to each session's last job's end, by session.
    pub session_ends: Vec<f64>,
}

/// Every way of governing the sessions of one workload on one machine, with headroom cold or
/// warm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionsComparison {
    /// The sessions' traces, `A + B`.
    pub trace: String,
    pub sessions: usize,
    pub machine: String,
    pub machine_memory: u64,
    /// The budget of the shared governor, and of each per-session one.
    pub headroom_budget: u64,
    /// `headroom (cold)` or `headroom (warm)`.
    pub policy: String,
    pub outcomes: Vec<SessionsOutcome>,
}

impl SessionsComparison {
    /// The outcome of one way of governing.
    pub fn outcome(&self, governors: Governors) -> Option<&SessionsOutcome> {
        self.outcomes
            .iter()
            .find(|outcome| outcome.governors == governors)
    }
}

/// Simulates `workload`'s sessions ([`Workload::sessions`]) on `machine` governed each way
/// ([`Governors::ALL`]), by headroom `warm` or cold.
pub fn compare_sessions(
    workload: &Workload,
    machine: Machine,
    warm: bool,
    config: &SimConfig,
) -> Result<SessionsComparison, SimError> {
    let budget = config.budget.bytes(machine.memory);
    let sessions = workload.session_count();
    let one_session = workload.as_one_session();
    let mut outcomes = Vec::new();
    let mut policy_name = String::new();
    for governors in Governors::ALL {
        let (simulated, count) = match governors {
            Governors::Union => (&one_session, 1),
            Governors::Shared => (workload, 1),
            Governors::PerSession => (workload, sessions),
        };
        let mut policy = Sessions {
            governors: (0..count)
                .map(|_| Headroom::new(machine, simulated, warm, budget))
                .collect(),
            session_of: workload.jobs.iter().map(|job| job.session).collect(),
            session_ends: vec![0.0; sessions],
        };
        policy_name = policy.governors[0].name();
        let outcome = simulate(simulated, machine, &mut policy, config)?;
        outcomes.push(SessionsOutcome {
            governors,
            outcome,
            session_ends: policy.session_ends,
        });
    }
    Ok(SessionsComparison {
        trace: workload.name.clone(),
        sessions,
        machine: machine.to_string(),
        machine_memory: machine.memory,
        headroom_budget: budget,
        policy: policy_name,
        outcomes,
    })
}

/// The governors of one run: one for every session, or one per session. Each job goes to its
/// session's governor, which sees only its own jobs and what the machine has left.
struct Sessions {
    governors: Vec<Headroom>,
    /// The session of each job, by the simulator's id.
    session_of: Vec<SessionId>,
    session_ends: Vec<f64>,
}

impl Sessions {
    /// The governor of job `id`.
    fn governor_of(&self, id: JobId) -> usize {
        if self.governors.len() == 1 {
            0
        } else {
            self.session_of[id as usize] as usize
        }
    }
}

impl Policy for Sessions {
    fn name(&self) -> String {
        self.governors[0].name()
    }

    fn family(&self) -> &'static str {
        self.governors[0].family()
    }

    fn offer(&mut self, job: &SimJob) {
        let governor = self.governor_of(job.id);
        self.governors[governor].offer(job);
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        if self.governors.len() == 1 {
            return self.governors[0].decide(view);
        }
        let mut actions = Vec::new();
        for governor in 0..self.governors.len() {
            let (own, others): (Vec<RunningJob>, Vec<RunningJob>) = view
                .running
                .iter()
                .partition(|job| self.governor_of(job.id) == governor);
            // To this governor, what the other sessions' jobs take is memory the machine
            // does not have.
            let others_use: u64 = others.iter().map(|job| job.bytes).sum();
            let machine = Machine {
                memory: view.machine.memory.saturating_sub(others_use),
                ..view.machine
            };
            let own_view = View {
                machine,
                running: &own,
                ..*view
            };
            actions.extend(self.governors[governor].decide(&own_view));
        }
        actions
    }

    fn finished(&mut self, job: &SimJob, peak: u64, now: f64) {
        let session = self.session_of[job.id as usize] as usize;
        self.session_ends[session] = self.session_ends[session].max(now);
        let governor = self.governor_of(job.id);
        self.governors[governor].finished(job, peak, now);
    }

    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        let governor = self.governor_of(job.id);
        self.governors[governor].oom_killed(job, peak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{JobKind, Trace, TraceJob, SCHEMA};

    const GIB: u64 = 1 << 30;

    /// A build of `jobs` independent compiles of 10 s that each reach 3 GiB within a second
    /// and hold it to the end.
    fn heavy_build(name: &str, jobs: usize) -> Trace {
        let job = TraceJob {
            label: "unit.o".into(),
            group: "c++ -O2".into(),
            kind: JobKind::Compile,
            deps: vec![],
            peak: 3 * GIB,
            duration: 10.0,
            cpu: 10.0,
            profile: vec![(1.0, 3 * GIB), (10.0, 3 * GIB)],
            input_bytes: None,
        };
        Trace {
            schema: SCHEMA,
            name: name.into(),
            source: None,
            recorded: None,
            jobs: vec![job; jobs],
        }
    }

    #[test]
    fn sessions_keep_their_own_jobs_and_dependencies() {
        let mut second = heavy_build("b", 2);
        second.jobs[1].deps = vec![0];
        let workload = Workload::sessions(&[heavy_build("a", 2), second], &SimConfig::default());
        assert_eq!(workload.name, "a + b");
        assert_eq!(workload.session_count(), 2);
        let sessions: Vec<SessionId> = workload.jobs.iter().map(|job| job.session).collect();
        assert_eq!(sessions, vec![0, 0, 1, 1]);
        assert_eq!(workload.jobs[3].deps, vec![2]);
        assert_eq!(workload.jobs[3].label, "1:unit.o");
        assert_eq!(workload.as_one_session().session_count(), 1);
    }

    #[test]
    fn one_governor_for_all_sessions_never_overcommits_where_one_each_does() {
        // Two builds of four 3 GiB compiles on 8 cores and 8 GiB: each alone fits two at
        // once in its budget; two governors each sure of it start four.
        let traces = [heavy_build("a", 4), heavy_build("b", 4)];
        let config = SimConfig {
            variation: 0.0,
            ..SimConfig::default()
        };
        let workload = Workload::sessions(&traces, &config);
        let machine = Machine {
            cores: 8,
            memory: 8 * GIB,
        };
        let comparison = compare_sessions(&workload, machine, true, &config).unwrap();
        let of = |governors| comparison.outcome(governors).unwrap();
        let (union, shared, apart) = (
            of(Governors::Union),
            of(Governors::Shared),
            of(Governors::PerSession),
        );
        assert_eq!(shared.outcome.oom_events, 0);
        assert_eq!(shared.outcome.policy_kills, 0);
        assert!(shared.outcome.completed());
        assert!(
            shared.outcome.makespan <= 1.10 * union.outcome.makespan,
            "shared {} against union {}",
            shared.outcome.makespan,
            union.outcome.makespan
        );
        assert!(
            apart.outcome.oom_events + apart.outcome.policy_kills > 0,
            "per-session governors overcommit: {apart:?}"
        );
        // Both sessions progress under the shared governor: neither waits for the other to
        // end.
        let ends = &shared.session_ends;
        assert!(ends.iter().all(|&end| end > 0.0), "{ends:?}");
        assert!(
            ends[0].min(ends[1]) > 0.5 * shared.outcome.makespan,
            "a session finished long before the other: {ends:?}"
        );
    }
}
