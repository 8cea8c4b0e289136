//! Runs policies side by side on one trace and machine and says who won.

use serde::Serialize;

use crate::bound::LowerBound;
use crate::engine::{simulate, Outcome};
use crate::machine::{site_name, Machine};
use crate::policy::PolicySpec;
use crate::workload::{SimConfig, Workload};
use crate::SimError;

/// Every policy's outcome on one trace and machine (and farm), with the lower bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub trace: String,
    pub machine: String,
    /// The build farm beside the machine, when there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub farm: Option<String>,
    /// The machine's memory in bytes.
    pub machine_memory: u64,
    /// The bytes of it that headroom (and the clairvoyant reference) were given.
    pub headroom_budget: u64,
    /// The bound on the machine and its farm's nodes together, as if one machine.
    pub lower_bound: LowerBound,
    pub outcomes: Vec<Outcome>,
}

/// Simulates each policy of `specs` on `workload` and `machine`, beside `config`'s farm.
pub fn compare(
    workload: &Workload,
    machine: Machine,
    specs: &[PolicySpec],
    config: &SimConfig,
) -> Result<Comparison, SimError> {
    let mut outcomes = Vec::new();
    for spec in specs {
        for mut policy in spec.instantiate(machine, workload, config)? {
            outcomes.push(simulate(workload, machine, policy.as_mut(), config)?);
        }
    }
    Ok(Comparison {
        trace: workload.name.clone(),
        machine: machine.to_string(),
        farm: config.farm.map(|farm| farm.to_string()),
        machine_memory: machine.memory,
        headroom_budget: config.budget.bytes(machine.memory),
        lower_bound: LowerBound::new(
            workload,
            config.farm.map_or(machine, |farm| farm.with(machine)),
        ),
        outcomes,
    })
}

impl Comparison {
    /// The machine, and its farm when it had one ([`site_name`]).
    pub fn site(&self) -> String {
        site_name(&self.machine, self.farm.as_deref())
    }

    /// The outcome of the named headroom run (`headroom (cold)` or `headroom (warm)`).
    pub fn outcome(&self, policy: &str) -> Option<&Outcome> {
        self.outcomes
            .iter()
            .find(|outcome| outcome.policy == policy)
    }

    /// The fastest baseline (a policy people use: neither headroom's nor the clairvoyant
    /// reference) that had no OOM event.
    pub fn best_zero_oom_baseline(&self) -> Option<&Outcome> {
        self.outcomes
            .iter()
            .filter(|outcome| {
                !matches!(outcome.family.as_str(), "headroom" | "reference")
                    && outcome.oom_events == 0
                    && outcome.completed()
            })
            .min_by(|a, b| a.makespan.total_cmp(&b.makespan))
    }

    /// The outcomes a summary shows: each policy, but of the `-jN` sweep only the fastest
    /// zero-OOM N and the fastest N overall.
    pub fn summary(&self) -> Vec<&Outcome> {
        let statics: Vec<&Outcome> = self
            .outcomes
            .iter()
            .filter(|outcome| outcome.family == "static")
            .collect();
        let fastest = |candidates: &mut dyn Iterator<Item = &&Outcome>| {
            candidates
                .min_by(|a, b| a.makespan.total_cmp(&b.makespan))
                .map(|outcome| outcome.policy.clone())
        };
        let best_safe = fastest(
            &mut statics
                .iter()
                .filter(|outcome| outcome.oom_events == 0 && outcome.completed()),
        );
        let best_any = fastest(&mut statics.iter().filter(|outcome| outcome.completed()));
        self.outcomes
            .iter()
            .filter(|outcome| {
                outcome.family != "static"
                    || Some(&outcome.policy) == best_safe.as_ref()
                    || Some(&outcome.policy) == best_any.as_ref()
            })
            .collect()
    }
}
