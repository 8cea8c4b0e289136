//! Simulated machines, named the way users describe theirs: `16c/64G` is 16 cores and 64 GiB.

use std::fmt;
use std::str::FromStr;

use headroom_size::{format_size, parse_size};
use serde::Serialize;

use crate::SimError;

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
}
