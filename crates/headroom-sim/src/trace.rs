//! The trace format: what a recorded (or generated) build tells the simulator about each job.
//! It is plain JSON so that `headroom build` history can be exported to it with no special
//! tooling, and it carries a `schema` number so old traces keep loading when fields are added.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::SimError;

/// The trace schema this crate writes and reads.
pub const SCHEMA: u32 = 1;
/// The most cores one job of a trace may keep busy at once (`cpu` / `duration`): far above
/// any compiler, low enough that a corrupt trace cannot stall the simulator.
pub const MAX_THREADS: f64 = 256.0;

/// One build: its jobs in the order the build system offered them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Always [`SCHEMA`].
    pub schema: u32,
    /// A short name for reports (`flash-attention`).
    pub name: String,
    /// Where the trace came from: a generator and its seed, or a real build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Set when the trace was recorded from a real build: how that build ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Recording>,
    /// Jobs in offer order; a job's index in this list is its id.
    pub jobs: Vec<TraceJob>,
}

/// How a recorded build really ran, so the simulator can be checked against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    /// CPU cores of the machine the build ran on.
    pub cores: usize,
    /// Memory of that machine, in bytes.
    pub memory: u64,
    /// The `-j` the build system ran with.
    pub jobs_flag: usize,
    /// Wall-clock time of the whole build, in seconds.
    pub wall_seconds: f64,
    /// The command that was recorded.
    pub command: String,
}

/// Broad kinds of job: ninja's link pool and Bazel's estimates treat them differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    #[default]
    Compile,
    Link,
    Other,
}

/// One compiler or linker invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    /// What the job produces (`obj/attention.o`).
    pub label: String,
    /// Jobs with the same group key (compiler and flags) are expected to use similar memory.
    pub group: String,
    #[serde(default)]
    pub kind: JobKind,
    /// Indices of jobs that must finish before this one is offered; all smaller than its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<usize>,
    /// Measured peak memory in bytes.
    pub peak: u64,
    /// Wall-clock seconds the job took with a core to itself.
    pub duration: f64,
    /// CPU seconds; more than `duration` means the job used several cores.
    pub cpu: f64,
    /// Memory over the job's life as (seconds since start, bytes) points. Only its shape is
    /// used: it is scaled so its highest point equals `peak`. Empty means a straight ramp.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profile: Vec<(f64, u64)>,
    /// Bytes of input files, for Bazel-style estimates of compiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_bytes: Option<u64>,
}

impl Trace {
    /// Reads and checks a trace file.
    pub fn load(path: &Path) -> Result<Trace, SimError> {
        let read_error = |source| SimError::Read {
            path: path.to_path_buf(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(read_error)?;
        Trace::parse(&text, path)
    }

    /// Parses and checks the text of the trace file at `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Trace, SimError> {
        let trace: Trace = serde_json::from_str(text).map_err(|source| SimError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        trace.validate()?;
        Ok(trace)
    }

    /// The trace as compact JSON, one line (the large traces stay small in the repository).
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string(self).expect("traces always serialize");
        text.push('\n');
        text
    }

    /// Checks what the simulator relies on: a known schema, dependencies that point back in
    /// offer order, positive, finite sizes and durations, and CPU time a machine could give
    /// (at most [`MAX_THREADS`] cores at once: a job wanting more would be simulated tick by
    /// tick for thousands of times its duration).
    pub fn validate(&self) -> Result<(), SimError> {
        let invalid = |job: usize, reason: String| SimError::InvalidTrace {
            trace: self.name.clone(),
            job,
            reason,
        };
        if self.schema != SCHEMA {
            return Err(SimError::Schema {
                trace: self.name.clone(),
                found: self.schema,
            });
        }
        for (index, job) in self.jobs.iter().enumerate() {
            if let Some(dep) = job.deps.iter().find(|&&dep| dep >= index) {
                return Err(invalid(
                    index,
                    format!("dependency {dep} is not an earlier job; list jobs in offer order"),
                ));
            }
            if job.peak == 0 {
                return Err(invalid(index, "`peak` must be above 0 bytes".into()));
            }
            if !(job.duration.is_finite() && job.duration > 0.0) {
                return Err(invalid(index, "`duration` must be above 0 seconds".into()));
            }
            if !(job.cpu.is_finite() && job.cpu >= 0.0) {
                return Err(invalid(index, "`cpu` must be 0 seconds or more".into()));
            }
            if job.cpu > job.duration * MAX_THREADS {
                return Err(invalid(
                    index,
                    format!(
                        "`cpu` {:.1} s in {:.1} s of `duration` would take {:.0} cores at once; a job uses at most {MAX_THREADS:.0}",
                        job.cpu,
                        job.duration,
                        job.cpu / job.duration
                    ),
                ));
            }
            if job
                .profile
                .iter()
                .any(|&(seconds, _)| !(seconds.is_finite() && seconds >= 0.0))
            {
                return Err(invalid(
                    index,
                    "`profile` times must be seconds since the job started (0 or more)".into(),
                ));
            }
            if job.profile.windows(2).any(|pair| pair[0].0 > pair[1].0) {
                return Err(invalid(index, "`profile` must be sorted by time".into()));
            }
        }
        Ok(())
    }
}
