//! Every integration test of the `headroom` binary, in one test binary, in the manner of the
//! `just` project: cargo links one executable instead of one per file, and the tests share
//! one `support` module instead of copies of it.
//!
//! Layout:
//! - `main.rs` (this file) names one module per topic; each is a file beside it, named as
//!   the test binary it once was (`build.rs` holds what `cargo test --test build` ran), and
//!   its tests are filtered by that name: `cargo test -p headroom --test integration build::`.
//! - `support/` is what the topics share: `support/mod.rs` runs the built binary in a
//!   project of the test's own, starts servers on ports they pick, and holds the locks that
//!   keep apart the tests that must not overlap; its submodules serve one kind of test each
//!   (`fakecc`, `farm`, `reliability`, `run`, `stores`).
//!
//! The tests run as threads of one process, so none may change what the process shares: no
//! `set_var`, `set_current_dir`, signal handler, umask or rlimit. Each test works in a
//! temporary directory of its own and passes its environment to the commands it starts.
//! `become_subreaper` is the one process-wide setting, and it holds for every test alike.

mod architecture;
mod build;
mod build_bazel;
mod build_cgroup;
mod build_cuda;
mod build_farm;
mod build_farm_sccache;
mod build_status;
mod cli;
mod compiler_families;
mod crash;
mod diagnose_cli;
mod doctor_cli;
mod fail_open;
mod full_disk;
mod history_faults;
mod html_pages;
mod kernels_cli;
mod kernels_hostile;
mod kernels_stores;
mod load;
mod run_cli;
mod run_fallback;
mod run_governed;
mod run_gpu;
mod run_oom;
mod run_stages;
mod run_torch_compile;
mod sessions;
mod settings_cli;
mod shared_history;
mod shim_early;
mod sim;
mod support;
