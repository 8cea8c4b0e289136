//! headroom-sim's integration tests, one binary (cargo links one per file under `tests/`): one
//! module per area, and `jobs`, the trace jobs several of them build workloads from.

mod farm;
mod invariants;
mod jobs;
mod replay;
mod report;
mod simulator;
