//! headroom-kernels' integration tests, one binary (cargo links one per file under `tests/`):
//! one module per area, and the hand-made bundles of `hostile`, which the `headroom` crate's
//! tests also use through its path.

#[macro_use]
#[path = "../hostile/mod.rs"]
mod hostile;

mod bundles;
mod clang_builds;
mod fake_toolchains;
mod gpu_launch;
mod hostile_bundles;
mod real_nvcc;
