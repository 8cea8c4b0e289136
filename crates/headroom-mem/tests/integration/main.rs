//! headroom-mem's integration tests, one binary (cargo links one per file under `tests/`): one
//! module per area. `cuda` is built only with `--features cuda` and runs on its own with the
//! filter `cuda::` (`.ci/run`, `bench/mem/gpu.sh`).

mod cuda;
mod offload;
mod pool;
mod properties;
mod snapshot;
mod threads;
