//! Simulated machines, named the way users describe theirs: `16c/64G` is 16 cores and 64 GiB;
//! and build farms of alike nodes beside them: `32x16c/64G` is 32 such nodes.

use std::fmt;
use std::str::FromStr;

use headroom_size::{format_size, parse_size};
use serde::Serialize;

use crate::SimError;

/// A machine: the one the build runs on, or one node of a farm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Machine {
    pub cores: usize,
    /// Bytes of memory the jobs can use.
    pub memory: u64,
}

impl FromStr for Machine {
    type Err = SimError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| SimError::Machine {
            input: text.to_string(),
            reason,
        };
        let (cores, memory) = text
            .split_once('/')
            .ok_or_else(|| invalid("there is no `/` between cores and memory".into()))?;
        let cores: usize = cores
            .trim()
            .trim_end_matches(['c', 'C'])
            .parse()
            .map_err(|_| invalid(format!("`{cores}` is not a number of cores")))?;
        if cores == 0 {
            return Err(invalid("a machine needs at least 1 core".into()));
        }
        // A bare number would be bytes, which no machine has: `16/32` means 32 GiB to the
        // person who wrote it, so it is refused rather than read as 32 bytes.
        if memory.trim().ends_with(|c: char| c.is_ascii_digit()) {
            return Err(invalid(format!(
                "the memory `{}` has no unit; write it with one, like `{}G`",
                memory.trim(),
                memory.trim()
            )));
        }
        let memory = parse_size(memory).map_err(|err| invalid(err.to_string()))?;
        if memory == 0 {
            return Err(invalid("a machine needs some memory".into()));
        }
        Ok(Machine { cores, memory })
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const GIB: u64 = 1 << 30;
        if self.memory % GIB == 0 {
            write!(f, "{}c/{}G", self.cores, self.memory / GIB)
        } else {
            write!(f, "{}c/{}", self.cores, format_size(self.memory))
        }
    }
}

/// A build farm beside the machine: `nodes` alike machines that a distributed compile engine
/// (distcc, sccache-dist, icecream) sends compiles to, each running one per core at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FarmSpec {
    pub nodes: usize,
    pub node: Machine,
}

impl FarmSpec {
    /// The cores and memory of all nodes together, and of `machine` beside them: what no
    /// schedule can do better than (see [`crate::LowerBound`]).
    pub fn with(&self, machine: Machine) -> Machine {
        Machine {
            cores: machine.cores + self.nodes * self.node.cores,
            memory: machine.memory + self.nodes as u64 * self.node.memory,
        }
    }

    /// Compile slots of the whole farm: the `-j` users give a build that uses it.
    pub fn slots(&self) -> usize {
        self.nodes * self.node.cores
    }
}

impl FromStr for FarmSpec {
    type Err = SimError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| SimError::Farm {
            input: text.to_string(),
            reason,
        };
        let (nodes, node) = text.split_once(['x', 'X']).ok_or_else(|| {
            invalid("there is no `x` between the nodes and each one's form".into())
        })?;
        let nodes: usize = nodes
            .trim()
            .parse()
            .map_err(|_| invalid(format!("`{nodes}` is not a number of nodes")))?;
        if nodes == 0 {
            return Err(invalid("a farm needs at least 1 node".into()));
        }
        let node = node.parse().map_err(|err| match err {
            SimError::Machine { reason, .. } => invalid(format!("each node's `{node}`: {reason}")),
            other => other,
        })?;
        Ok(FarmSpec { nodes, node })
    }
}

impl fmt::Display for FarmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.nodes, self.node)
    }
}

/// How reports name a machine with the farm beside it, when there is one:
/// `16c/32G + farm 4x16c/64G`.
pub fn site_name(machine: &str, farm: Option<&str>) -> String {
    match farm {
        Some(farm) => format!("{machine} + farm {farm}"),
        None => machine.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_cores_and_memory() {
        let machine: Machine = "16c/64G".parse().expect("valid machine");
        assert_eq!(
            machine,
            Machine {
                cores: 16,
                memory: 64 << 30
            }
        );
        assert_eq!(machine.to_string(), "16c/64G");
        let bare = "16/32".parse::<Machine>().unwrap_err().to_string();
        assert!(
            bare.contains("has no unit") && bare.contains("`32G`"),
            "{bare}"
        );
        assert_eq!("192/1T".parse::<Machine>().expect("valid").memory, 1 << 40);
        assert!("16c".parse::<Machine>().is_err());
        assert!("0c/8G".parse::<Machine>().is_err());
        assert!("4c/lots".parse::<Machine>().is_err());
    }

    #[test]
    fn parses_and_prints_farms_of_alike_nodes() {
        let farm: FarmSpec = "32x16c/64G".parse().expect("valid farm");
        assert_eq!(farm.nodes, 32);
        assert_eq!(farm.node, "16c/64G".parse().unwrap());
        assert_eq!(farm.to_string(), "32x16c/64G");
        assert_eq!(farm.slots(), 512);
        let beside = farm.with("8c/32G".parse().unwrap());
        assert_eq!((beside.cores, beside.memory), (520, (32 * 64 + 32) << 30));
        for bad in ["32", "0x16c/64G", "manyx16c/64G", "4x16c"] {
            let err = bad.parse::<FarmSpec>().unwrap_err().to_string();
            assert!(err.contains("32x16c/64G"), "{bad}: {err}");
        }
    }
}
