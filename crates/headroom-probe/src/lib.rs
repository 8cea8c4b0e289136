//! Memory readings: process RSS, cgroup v1/v2 usage, limits and OOM events, MemAvailable and
//! the room a new workload has (`room`), PSI,
//! the builds' own CPU cgroup,
//! the kernel log.

pub mod cgroup;
pub mod cpu_share;
pub mod kernel_log;
pub mod meminfo;
pub mod neuron;
pub mod nvml;
pub mod procmem;
pub mod procs;
pub mod psi;
pub mod room;
pub mod rusage;
pub mod tracker;

use std::path::PathBuf;

/// A reading that could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read /proc: {0}")]
    Proc(#[from] procfs::ProcError),
    #[error("{path} holds `{value}`, which is not a number of bytes")]
    Malformed { path: PathBuf, value: String },
    #[error("{0}")]
    Cgroup(String),
}

impl ProbeError {
    fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ProbeError::Io {
            path: path.into(),
            source,
        }
    }
}
