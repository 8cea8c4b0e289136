//! Simulates build scheduling policies on recorded build traces, so headroom's policy can be
//! shown (not hoped) to hold on machines with 16 to 192 cores and 32 GiB to 1 TiB, against
//! what people use today.
//!
//! The simulator drives `headroom_sched` exactly as the live governor does (see
//! [`policy::Headroom`]); there is no second copy of the policy here.
//!
//! # Trace format (schema 1)
//!
//! A trace is one JSON object:
//!
//! ```json
//! {
//!   "schema": 1,
//!   "name": "flash-attention",
//!   "source": "headroom sim generate --seed 1",
//!   "recorded": { "cores": 2, "memory": 25769803776, "jobs_flag": 2,
//!                 "wall_seconds": 41.3, "command": "make -j2" },
//!   "jobs": [
//!     { "label": "obj/flash_fwd_hdim128.o", "group": "nvcc -O3 -gencode sm_80",
//!       "kind": "compile", "deps": [], "peak": 4500000000, "duration": 212.0,
//!       "cpu": 208.5, "profile": [[0.5, 300000000], [150.0, 4500000000], [212.0, 900000000]],
//!       "input_bytes": 3000000 }
//!   ]
//! }
//! ```
//!
//! - `jobs` are listed in the order the build system offered them; a job's index is its id.
//! - `deps` (optional) are indices of earlier jobs that must finish first. Without them a job
//!   is offered at once, as a flat `make -j` of independent compiles would.
//! - `peak` is the measured peak in bytes; `duration` the wall seconds the job took with a
//!   core to itself; `cpu` its CPU seconds (more than `duration` means several threads).
//! - `profile` (optional) is memory over the job's life as `[seconds since start, bytes]`
//!   points; only its shape counts, scaled so its highest point is `peak`. Without it memory
//!   ramps linearly from 0 to `peak`.
//! - `group` is the compiler and its flags: jobs of a group are predicted from each other.
//! - `kind` (`compile`, `link`, `other`; default `compile`) and `input_bytes` (optional) feed
//!   ninja's link pool and Bazel's estimates.
//! - `recorded` (optional) says how a real build ran, so a replay can be checked against it.
//!
//! # Model
//!
//! A machine has cores and memory. A running job progresses at full speed unless the jobs
//! want more cores than there are, then all slow down alike. Its memory follows its profile
//! as it progresses; a suspended job keeps its memory and makes no progress; a killed job
//! loses its progress (counted as wasted work) and starts from zero when started again. When
//! the jobs would take more memory than the machine has, the kernel's OOM killer kills the
//! job using the most, and an OOM event is counted. Runs are deterministic: the same trace,
//! machine, policy and [`SimConfig`] (seed included) give the same outcome.

pub mod bound;
pub mod compare;
pub mod engine;
pub mod generate;
pub mod import;
pub mod machine;
pub mod policy;
pub mod report;
pub mod sessions;
pub mod trace;
pub mod workload;

use std::path::PathBuf;

pub use bound::LowerBound;
pub use compare::{compare, Comparison};
pub use engine::{simulate, NodeLoad, Outcome, Policy, RunningJob, View, CLIENT_BYTES};
pub use headroom_sched::budget::BudgetSpec;
pub use machine::{site_name, FarmSpec, Machine};
pub use policy::{Engine, PolicySpec, ALL_POLICIES, FARM_POLICIES};
pub use sessions::{compare_sessions, Governors, SessionsComparison, SessionsOutcome};
pub use trace::{JobKind, Recording, Trace, TraceJob, SCHEMA};
pub use workload::{SimConfig, SimJob, Workload};

/// Everything that can go wrong in a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not a valid trace (see the trace format in the headroom-sim docs): {source}"
    )]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("trace `{trace}` has schema {found}, but this headroom reads schema {SCHEMA}; re-export it with this headroom version")]
    Schema { trace: String, found: u32 },
    #[error("trace `{trace}`, job {job}: {reason}")]
    InvalidTrace {
        trace: String,
        job: usize,
        reason: String,
    },
    #[error("invalid machine `{input}`: {reason}; write cores and memory like `16c/64G`")]
    Machine { input: String, reason: String },
    #[error("invalid farm `{input}`: {reason}; write the nodes and each one's cores and memory like `32x16c/64G`")]
    Farm { input: String, reason: String },
    #[error("invalid policy `{input}`: {reason}")]
    Policy { input: String, reason: String },
    #[error("machine {machine} is too small for trace `{trace}`: job `{job}` alone peaks at {peak} bytes; pick a `--machine` with more memory")]
    MachineTooSmall {
        trace: String,
        machine: String,
        job: String,
        peak: u64,
    },
    #[error("policy `{policy}` made an impossible move: {action}")]
    InvalidAction { policy: String, action: String },
}
