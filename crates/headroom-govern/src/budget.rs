//! How much memory a build may use. By default: the smaller of what the system can hand out
//! (MemAvailable) and the room left under this process's cgroup limit, minus a reserve for
//! everything that is not a compiler (the build system, the page cache of fresh objects, the
//! desktop). `--budget 6G` or `--budget 70%` overrides it.

use headroom_probe::cgroup::Cgroup;
use headroom_probe::meminfo::read_meminfo;
use headroom_size::{parse_size, Size};

pub use headroom_sched::budget::{default_job_peak, reserve_for, BudgetSpec};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error("invalid --budget `{0}`: valid forms are `auto`, a size such as `6G`, `1.5GiB`, `800M`, or a percentage of available memory such as `70%`")]
    Invalid(String),
    #[error("invalid --budget `{0}`: the percentage must be above 0 and at most 100")]
    Percent(String),
    #[error("invalid --budget `{0}`: no job fits in no memory; give a size such as `6G`, or leave --budget out to use what is available")]
    Zero(String),
    #[error("cannot read this machine's memory ({0}); pass --budget SIZE")]
    Unreadable(String),
}

/// Parses `--budget`.
pub fn parse_budget(text: &str) -> Result<BudgetSpec, BudgetError> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("auto") {
        return Ok(BudgetSpec::Auto);
    }
    if let Some(number) = text.strip_suffix('%') {
        let percent: f64 = number
            .trim()
            .parse()
            .map_err(|_| BudgetError::Invalid(text.into()))?;
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(BudgetError::Percent(text.into()));
        }
        return Ok(BudgetSpec::Percent(percent));
    }
    match parse_size(text) {
        Ok(0) => Err(BudgetError::Zero(text.into())),
        Ok(bytes) => Ok(BudgetSpec::Bytes(bytes)),
        Err(_) => Err(BudgetError::Invalid(text.into())),
    }
}

/// Memory facts the budget is derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFacts {
    pub mem_available: u64,
    /// The tightest cgroup limit over this process, and what that cgroup already uses.
    pub cgroup: Option<(u64, u64)>,
}

impl MemoryFacts {
    /// Reads the facts for this process, finding its cgroup first.
    pub fn read() -> Result<MemoryFacts, BudgetError> {
        Self::read_in(Cgroup::of_self().ok().flatten().as_ref())
    }

    /// Reads the facts with this process's cgroup already found: what a sampler calls every
    /// tick, so it does not parse `/proc/self/mountinfo` again each time.
    pub fn read_in(cgroup: Option<&Cgroup>) -> Result<MemoryFacts, BudgetError> {
        let mem_available = read_meminfo()
            .map_err(|e| BudgetError::Unreadable(e.to_string()))?
            .available;
        let cgroup = cgroup.and_then(|cgroup| {
            let limit = cgroup.effective_limit()?;
            Some((limit, cgroup.working_set().unwrap_or(0)))
        });
        Ok(MemoryFacts {
            mem_available,
            cgroup,
        })
    }

    /// What a new workload can get: the smaller of MemAvailable and the room under the cgroup
    /// limit, with a description of which one it was.
    pub fn room(&self) -> (u64, String) {
        let system = (
            self.mem_available,
            format!("MemAvailable {}", Size(self.mem_available)),
        );
        match self.cgroup {
            Some((limit, used)) if limit.saturating_sub(used) < self.mem_available => {
                let room = limit.saturating_sub(used);
                (
                    room,
                    format!("cgroup limit {} with {} in use", Size(limit), Size(used)),
                )
            }
            _ => system,
        }
    }
}

/// The budget in bytes and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub source: String,
}

/// Turns the user's request and the machine's memory into a budget.
pub fn resolve(spec: BudgetSpec, facts: &MemoryFacts) -> Budget {
    let (room, room_source) = facts.room();
    let source = match spec {
        BudgetSpec::Bytes(bytes) => format!("--budget {}", Size(bytes)),
        BudgetSpec::Percent(percent) => format!("--budget {percent}% of {room_source}"),
        BudgetSpec::Auto => format!(
            "{room_source}, minus a reserve of {}",
            Size(reserve_for(room))
        ),
    };
    Budget {
        bytes: spec.bytes(room),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn parses_sizes_percentages_and_auto() {
        assert_eq!(parse_budget("6G"), Ok(BudgetSpec::Bytes(6 * GIB)));
        assert_eq!(parse_budget("70%"), Ok(BudgetSpec::Percent(70.0)));
        assert_eq!(parse_budget("auto"), Ok(BudgetSpec::Auto));
        for bad in ["six", "0", "150%", "-3%", "%", "6Q"] {
            let err = parse_budget(bad).unwrap_err().to_string();
            assert!(err.contains("--budget") && err.contains(bad), "{err}");
        }
        assert_eq!(parse_budget("0M"), Err(BudgetError::Zero("0M".into())));
    }

    #[test]
    fn auto_takes_the_tighter_of_system_and_cgroup_minus_a_reserve() {
        let roomy = MemoryFacts {
            mem_available: 20 * GIB,
            cgroup: None,
        };
        assert_eq!(resolve(BudgetSpec::Auto, &roomy).bytes, 18 * GIB);
        let capped = MemoryFacts {
            mem_available: 20 * GIB,
            cgroup: Some((3 * GIB / 2, 0)),
        };
        let budget = resolve(BudgetSpec::Auto, &capped);
        assert_eq!(budget.bytes, 3 * GIB / 2 - 256 * (1 << 20));
        assert!(budget.source.contains("cgroup limit"), "{}", budget.source);
        let huge = MemoryFacts {
            mem_available: 500 * GIB,
            cgroup: None,
        };
        assert_eq!(resolve(BudgetSpec::Auto, &huge).bytes, 498 * GIB);
        assert_eq!(
            resolve(BudgetSpec::Percent(50.0), &capped).bytes,
            3 * GIB / 4
        );
    }
}
