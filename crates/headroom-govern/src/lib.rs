//! The build governor: the daemon that every session of a user, memory domain and history
//! shares, its wire protocol, the compiler shims, job supervision, OOM retries and the
//! lower-memory flag ladder.
//!
//! Data flow for `headroom build -- make`: the CLI joins the governor (starting it on a
//! socket in a private directory when none runs), and runs `make` with the interceptor
//! preloaded. Each compiler
//! that make starts, by name or by path, becomes the shim: it asks the governor for
//! admission, runs the real compiler in its own process group, and reports how it ended. The governor predicts peaks,
//! samples the running jobs, suspends, resumes or kills them as `headroom-sched` decides, and
//! writes the history.

pub mod compiler;
#[cfg(feature = "governor")]
pub mod governor;
pub mod governor_log;
pub mod intercept;
pub mod job;
pub mod last_build;
pub mod ledger;
pub mod liveness;
pub mod oom;
pub mod outside;
pub mod portable;
pub mod protocol;
pub mod session;
pub mod shim;
#[cfg(feature = "governor")]
pub mod shim_binary;
pub mod shimdir;
pub mod start;
pub mod state;
pub mod status_line;
