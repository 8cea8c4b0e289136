//! The room a new workload has on this machine: the smaller of what the system can hand out
//! (MemAvailable) and what is left under this process's tightest cgroup limit. Machine facts
//! only; what a build may use out of that room is `headroom_sched::budget`'s rule.

use headroom_size::Size;

use crate::cgroup::Cgroup;
use crate::meminfo::read_meminfo;

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

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_room_is_the_tighter_of_the_system_and_the_cgroup() {
        let roomy = MemoryFacts {
            mem_available: 20 * GIB,
            cgroup: Some((40 * GIB, 10 * GIB)),
        };
        assert_eq!(roomy.room(), (20 * GIB, "MemAvailable 20.0 GiB".into()));
        let capped = MemoryFacts {
            mem_available: 20 * GIB,
            cgroup: Some((3 * GIB, GIB)),
        };
        let (room, source) = capped.room();
        assert_eq!(room, 2 * GIB);
        assert!(source.contains("cgroup limit"), "{source}");
    }

    #[test]
    fn reads_this_machine() {
        let facts = MemoryFacts::read().unwrap();
        assert!(facts.mem_available > 0, "{facts:?}");
        assert!(facts.room().0 <= facts.mem_available, "{facts:?}");
    }
}
