//! Memory readings: process RSS, cgroup v1/v2 usage, limits and OOM events, MemAvailable, PSI,
//! and the byte-size vocabulary (`6G`, `512MiB`) that every headroom command shares.

pub mod size;
