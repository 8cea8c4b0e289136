//! How much memory a build may use. By default: the smaller of what the system can hand out
//! (MemAvailable) and the room left under this process's cgroup limit, minus a reserve for
//! everything that is not a compiler (the build system, the page cache of fresh objects, the
//! desktop). `--budget 6G` or `--budget 70%` overrides it.

use headroom_probe::cgroup::Cgroup;
use headroom_probe::meminfo::read_meminfo;
use headroom_size::Size;

pub use headroom_sched::budget::{default_job_peak, reserve_for, BudgetSpec};

/// This machine's memory could not be read, so no budget can be derived from it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cannot read this machine's memory ({0}); pass --budget SIZE")]
pub struct Unreadable(String);

/// Memory facts the budget is derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFacts {
    pub mem_available: u64,
    /// The tightest cgroup limit over this process, and what that cgroup already uses.
    pub cgroup: Option<(u64, u64)>,
}

impl MemoryFacts {
    /// Reads the facts for this process, finding its cgroup first.
    pub fn read() -> Result<MemoryFacts, Unreadable> {
        Self::read_in(Cgroup::of_self().ok().flatten().as_ref())
    }

    /// Reads the facts with this process's cgroup already found: what a sampler calls every
    /// tick, so it does not parse `/proc/self/mountinfo` again each time.
    pub fn read_in(cgroup: Option<&Cgroup>) -> Result<MemoryFacts, Unreadable> {
        let mem_available = read_meminfo()
            .map_err(|e| Unreadable(e.to_string()))?
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
