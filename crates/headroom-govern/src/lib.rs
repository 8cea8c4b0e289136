//! The build governor: the per-build daemon, its wire protocol, the compiler shims, job
//! supervision, OOM retries and the lower-memory flag ladder.
//!
//! Data flow for `headroom build -- make`: the CLI binds a private socket and starts the
//! governor process on it, and runs `make` with the interceptor preloaded. Each compiler
//! that make starts, by name or by path, becomes the shim: it asks the governor for
//! admission, runs the real compiler in its own process group, and reports how it ended. The governor predicts peaks,
//! samples the running jobs, suspends, resumes or kills them as `headroom-sched` decides, and
//! writes the history.

pub mod budget;
pub mod governor;
pub mod intercept;
pub mod job;
pub mod ladder;
pub mod last_build;
pub mod liveness;
pub mod oom;
pub mod outside;
pub mod portable;
pub mod protocol;
pub mod response;
pub mod session;
pub mod shim;
pub mod shimdir;
pub mod state;
