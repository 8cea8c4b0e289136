//! headroom-sched's integration tests, one binary (cargo links one per file under `tests/`):
//! the `Driver`'s lifecycle and the scheduler's invariants, over random event sequences.

mod driver_lifecycle;
mod properties;
