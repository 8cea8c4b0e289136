//! Test support shared by every headroom crate's tests, as a dev-dependency: one place that
//! decides whether a test may skip for lack of something the machine does not have.
//!
//! A test that needs a tool or a capability this machine may lack calls [`skip`] with the
//! name of that requirement and why, then returns. Where `HEADROOM_TEST_REQUIRE` names the
//! requirement, [`skip`] panics instead, so a CI machine that installed the tool learns when
//! a test still did not run. The variable is a comma-separated list of requirement names, or
//! `all`: every requirement but [`NOT_IN_ALL`], those no one machine can meet together.
//!
//! The requirements the tests name:
//!
//! | requirement | what the test needs |
//! |---|---|
//! | the program's name: `python3`, `make`, `g++`, `c++`, `cc`, `clang`, `clang-19`, `cmake`, `ninja`, `bazel`, `script`, `stty`, `mount`, `umount` | that program on PATH |
//! | `node-trace` | node with the trace readers of `.ci/trace-consumer.sh` |
//! | `chromium` | headless Chromium (`.ci/chromium.sh`) |
//! | `distcc`, `sccache-dist` | the farm daemons (`.ci/farm.sh`) |
//! | `redis`, `s3`, `wsgidav` | the store servers (`.ci/stores.sh`): redis-server, moto, WebDAV |
//! | `nvcc`, `torch` | the CUDA toolkit and PyTorch of `.ci/cuda.sh` |
//! | `libc-static` | a static libc to link (libc6-dev) |
//! | `musl-shim` | headroom's compiler shim built without glibc: Rust's musl target and musl-tools |
//! | `cargo-cc` | the `cc` crate in the cargo registry cache |
//! | `cgroup`, `cgroup-cpu` | a memory-limited (or CPU-weighted) cgroup this process may make |
//! | `root` | root: mounting a tmpfs, writing the kernel log |
//! | `psi`, `smaps-rollup`, `task-children`, `statm`, `dev-full`, `kernel-log` | those kernel files |
//! | `linux` | not macOS, where other toolchains exist |
//! | `gpu` | an NVIDIA GPU with its driver, never demanded by `all` |
//! | `no-gpu` | a machine without one, never demanded by `all` |
//! | `unprivileged` | a user that file permissions hold, never demanded by `all` |

use std::fmt::Display;

/// The variable that turns skips into failures.
pub const VARIABLE: &str = "HEADROOM_TEST_REQUIRE";

/// Requirements `all` leaves out: each contradicts another, or needs hardware CI lacks.
pub const NOT_IN_ALL: [&str; 3] = ["gpu", "no-gpu", "unprivileged"];

/// Whether the list `demanded` (the variable's value) names `requirement`.
pub fn demands(demanded: &str, requirement: &str) -> bool {
    demanded
        .split(',')
        .map(str::trim)
        .any(|name| name == requirement || (name == "all" && !NOT_IN_ALL.contains(&requirement)))
}

/// Whether this run demands `requirement` (see [`VARIABLE`]).
pub fn required(requirement: &str) -> bool {
    std::env::var(VARIABLE).is_ok_and(|demanded| demands(&demanded, requirement))
}

/// Says on stderr that the calling test skips for lack of `requirement`, and `why`; the
/// caller then returns. Panics instead where [`VARIABLE`] demands `requirement`.
#[track_caller]
pub fn skip(requirement: &str, why: impl Display) {
    if required(requirement) {
        panic!(
            "{why}; this test needs `{requirement}`, and {VARIABLE} demands it: install it, \
             or leave `{requirement}` out of {VARIABLE}"
        );
    }
    eprintln!("skipping (needs `{requirement}`): {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_demands_what_it_names_and_all_what_one_machine_can_meet() {
        assert!(demands("cmake, nvcc", "nvcc"));
        assert!(!demands("cmake,nvcc", "torch"));
        assert!(!demands("", "cmake"));
        assert!(!demands("nvcc-extra", "nvcc"), "names match whole");
        assert!(demands("all", "chromium"));
        for requirement in NOT_IN_ALL {
            assert!(!demands("all", requirement), "{requirement}");
            assert!(demands(&format!("all,{requirement}"), requirement));
        }
    }

    #[test]
    #[should_panic(expected = "needs `redis`")]
    fn a_demanded_skip_fails() {
        // Only this test reads the variable it sets, in this process.
        std::env::set_var(VARIABLE, "redis");
        skip("redis", "redis-server is not installed");
    }
}
