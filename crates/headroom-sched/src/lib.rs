//! Pure scheduling policy: peak and profile prediction, admission, suspend and kill choices.
//! No I/O and no clock of its own (callers pass the time in): the live governor and the
//! simulator feed it the same events and carry out the same actions, so what the simulator
//! shows is what the governor does.

pub mod budget;
pub mod bursts;
pub mod chain;
pub mod driver;
pub mod farm;
pub mod ladder;
mod plan;
pub mod policy;
pub mod predict;
pub mod profile;
mod slack;
mod strays;
pub mod warm;

pub use driver::{AfterAttempt, Driver, Ended, Finished, Job, JobState, Offer, Reading};
pub use farm::{Farm, NodeId, NodeSpec};
pub use policy::{Action, Estimate, Limits, OutsideAction, Scheduler, Thresholds};
pub use predict::{PastRun, Prediction, PredictionSource, Predictor};
pub use profile::{Profile, ProfileRecorder, Ran};
pub use warm::WarmStart;

/// Identifies one job for as long as it is queued or running.
pub type JobId = u64;

/// Identifies one session of a governor (a `headroom build`, a `headroom run`) while it lasts.
pub type SessionId = u32;
