//! The policies the simulator can compare, and how users name them on the command line.

mod baselines;
mod clairvoyant;
mod farm_engines;
mod headroom;

use std::fmt;
use std::str::FromStr;

pub use baselines::{
    BazelEstimate, BazelEstimates, Buck2Pressure, NinjaPools, ParallelMemfree, ParallelMemsuspend,
    StaticJobs,
};
pub use clairvoyant::Clairvoyant;
pub use farm_engines::{Engine, FarmEngine};
pub use headroom::Headroom;

use headroom_size::parse_size;

use crate::engine::Policy;
use crate::machine::Machine;
use crate::workload::{SimConfig, Workload};
use crate::SimError;

/// A policy as named by the user; some expand to several runs (`static` to every `-jN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicySpec {
    /// headroom with nothing known (`false`) or each job's own peak known (`true`).
    Headroom {
        warm: bool,
    },
    /// `-jN`, or every N from 1 to the machine's cores when `None`.
    Static(Option<usize>),
    Ninja,
    /// GNU parallel `--memfree`; the trace's largest peak when no size is given.
    ParallelMemfree(Option<u64>),
    /// GNU parallel `--memsuspend`; the trace's largest peak when no size is given.
    ParallelMemsuspend(Option<u64>),
    Buck2,
    Bazel(BazelEstimate),
    /// Not a policy anyone can run: greedy admission that knows every job's exact memory
    /// curve, to show how much of a gap is knowledge and how much is greedy admission.
    Clairvoyant,
    /// A distributed compile engine placing compiles on the farm by itself.
    Engine(Engine),
}

/// Every policy, in report order (the clairvoyant reference only when asked for).
pub const ALL_POLICIES: [PolicySpec; 9] = [
    PolicySpec::Headroom { warm: false },
    PolicySpec::Headroom { warm: true },
    PolicySpec::Static(None),
    PolicySpec::Ninja,
    PolicySpec::ParallelMemfree(None),
    PolicySpec::ParallelMemsuspend(None),
    PolicySpec::Buck2,
    PolicySpec::Bazel(BazelEstimate::Fixed),
    PolicySpec::Bazel(BazelEstimate::Inputs),
];

/// The policies compared on a farm, in report order: headroom's placement against each
/// engine's own.
pub const FARM_POLICIES: [PolicySpec; 4] = [
    PolicySpec::Headroom { warm: false },
    PolicySpec::Headroom { warm: true },
    PolicySpec::Engine(Engine::SccacheDist),
    PolicySpec::Engine(Engine::Icecream),
];

const POLICY_NAMES: &str = "headroom, headroom-warm, static, static=N, ninja, \
    parallel-memfree[=SIZE], parallel-memsuspend[=SIZE], buck2, bazel, bazel-inputs, clairvoyant, \
    and with a farm sccache-dist, icecream";

impl FromStr for PolicySpec {
    type Err = SimError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| SimError::Policy {
            input: text.to_string(),
            reason: format!("{reason}; known policies: {POLICY_NAMES}"),
        };
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value.trim())),
            None => (text.trim(), None),
        };
        let size = |value: Option<&str>| {
            value
                .map(|value| parse_size(value).map_err(|err| invalid(err.to_string())))
                .transpose()
        };
        let spec = match name {
            "headroom" => PolicySpec::Headroom { warm: false },
            "headroom-warm" => PolicySpec::Headroom { warm: true },
            "static" => PolicySpec::Static(
                value
                    .map(|value| match value.parse::<usize>() {
                        Ok(jobs) if jobs > 0 => Ok(jobs),
                        _ => Err(invalid(format!("`{value}` is not a job count above 0"))),
                    })
                    .transpose()?,
            ),
            "ninja" => PolicySpec::Ninja,
            "parallel-memfree" => PolicySpec::ParallelMemfree(size(value)?),
            "parallel-memsuspend" => PolicySpec::ParallelMemsuspend(size(value)?),
            "buck2" => PolicySpec::Buck2,
            "bazel" => PolicySpec::Bazel(BazelEstimate::Fixed),
            "bazel-inputs" => PolicySpec::Bazel(BazelEstimate::Inputs),
            "clairvoyant" => PolicySpec::Clairvoyant,
            "sccache-dist" => PolicySpec::Engine(Engine::SccacheDist),
            "icecream" => PolicySpec::Engine(Engine::Icecream),
            _ => return Err(invalid(format!("`{name}` is not a policy"))),
        };
        let takes_value = matches!(
            spec,
            PolicySpec::Static(_)
                | PolicySpec::ParallelMemfree(_)
                | PolicySpec::ParallelMemsuspend(_)
        );
        if value.is_some() && !takes_value {
            return Err(invalid(format!("`{name}` takes no `=` value")));
        }
        Ok(spec)
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicySpec::Headroom { warm: false } => write!(f, "headroom"),
            PolicySpec::Headroom { warm: true } => write!(f, "headroom-warm"),
            PolicySpec::Static(None) => write!(f, "static"),
            PolicySpec::Static(Some(jobs)) => write!(f, "static={jobs}"),
            PolicySpec::Ninja => write!(f, "ninja"),
            PolicySpec::ParallelMemfree(_) => write!(f, "parallel-memfree"),
            PolicySpec::ParallelMemsuspend(_) => write!(f, "parallel-memsuspend"),
            PolicySpec::Buck2 => write!(f, "buck2"),
            PolicySpec::Bazel(BazelEstimate::Fixed) => write!(f, "bazel"),
            PolicySpec::Bazel(BazelEstimate::Inputs) => write!(f, "bazel-inputs"),
            PolicySpec::Clairvoyant => write!(f, "clairvoyant"),
            PolicySpec::Engine(engine) => write!(f, "{}", engine.name()),
        }
    }
}

impl PolicySpec {
    /// The policies to run for this spec on `machine`, fresh for one simulation each; headroom
    /// and the clairvoyant reference get the budget `config` asks for. With a farm in
    /// `config`, only headroom and the engines run (the others know nothing of farms); the
    /// engines run only with one.
    pub fn instantiate(
        &self,
        machine: Machine,
        workload: &Workload,
        config: &SimConfig,
    ) -> Result<Vec<Box<dyn Policy>>, SimError> {
        let invalid = |reason: &str| SimError::Policy {
            input: self.to_string(),
            reason: reason.to_string(),
        };
        let largest = workload.largest_peak();
        let budget = config.budget.bytes(machine.memory);
        let policies: Vec<Box<dyn Policy>> = match (*self, config.farm) {
            (PolicySpec::Headroom { warm }, farm) => {
                let headroom = Headroom::new(machine, workload, warm, budget);
                vec![Box::new(match farm {
                    Some(farm) => headroom.with_farm(farm),
                    None => headroom,
                })]
            }
            (PolicySpec::Engine(engine), Some(farm)) => {
                vec![Box::new(FarmEngine::new(engine, farm))]
            }
            (PolicySpec::Engine(_), None) => return Err(invalid(
                "it places jobs on a build farm; give one with `--farm`, like `--farm 4x16c/64G`",
            )),
            (_, Some(_)) => {
                return Err(invalid(
                    "it knows nothing of build farms; with `--farm`, compare headroom, \
                     headroom-warm, sccache-dist and icecream",
                ))
            }
            (PolicySpec::Static(Some(jobs)), None) => vec![Box::new(StaticJobs::new(jobs))],
            (PolicySpec::Static(None), None) => (1..=machine.cores)
                .map(|jobs| Box::new(StaticJobs::new(jobs)) as Box<dyn Policy>)
                .collect(),
            (PolicySpec::Ninja, None) => vec![Box::new(NinjaPools::new(machine))],
            (PolicySpec::ParallelMemfree(size), None) => vec![Box::new(ParallelMemfree::new(
                machine,
                size.unwrap_or(largest),
            ))],
            (PolicySpec::ParallelMemsuspend(size), None) => vec![Box::new(
                ParallelMemsuspend::new(machine, size.unwrap_or(largest)),
            )],
            (PolicySpec::Buck2, None) => vec![Box::new(Buck2Pressure::new(machine))],
            (PolicySpec::Bazel(estimate), None) => {
                vec![Box::new(BazelEstimates::new(machine, estimate))]
            }
            (PolicySpec::Clairvoyant, None) => {
                vec![Box::new(Clairvoyant::new(machine, workload, budget))]
            }
        };
        Ok(policies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_name_round_trips() {
        let every = || {
            ALL_POLICIES
                .into_iter()
                .chain(FARM_POLICIES)
                .chain([PolicySpec::Clairvoyant])
        };
        for spec in every() {
            assert_eq!(spec.to_string().parse::<PolicySpec>().ok(), Some(spec));
        }
        assert_eq!(
            "static=8".parse::<PolicySpec>().ok(),
            Some(PolicySpec::Static(Some(8)))
        );
        assert_eq!(
            "parallel-memfree=4G".parse::<PolicySpec>().ok(),
            Some(PolicySpec::ParallelMemfree(Some(4 << 30)))
        );
        assert!("static=0".parse::<PolicySpec>().is_err());
        assert!("ninja=3".parse::<PolicySpec>().is_err());
        let unknown = "make".parse::<PolicySpec>().unwrap_err().to_string();
        for spec in every() {
            let name = spec.to_string();
            assert!(unknown.contains(&name), "{name} missing from: {unknown}");
        }
    }
}
