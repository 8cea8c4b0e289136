//! Pure scheduling policy: peak prediction, admission, suspend and kill choices. No I/O, no
//! clocks: the live governor and the simulator feed it the same events and carry out the same
//! actions, so what the simulator shows is what the governor does.

pub mod policy;
pub mod predict;

pub use policy::{Action, Limits, Scheduler, Thresholds};
pub use predict::{Prediction, PredictionSource, Predictor};

/// Identifies one job for as long as it is queued or running.
pub type JobId = u64;
