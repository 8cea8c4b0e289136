//! `headroom-shim`: the compiler shim alone, as its own small binary. Every compiler call of a
//! governed build starts it, so it should load fast: the full CLI binary carries tens of
//! thousands of relocations the shim has no use for. `headroom build` links the shim names to
//! this binary when it sits next to `headroom`, and to `headroom` itself otherwise.
//!
//! It skips the Rust runtime's start-up, which reads `/proc/self/maps` to find the main
//! thread's stack: about 0.15 ms of every compiler call on our VMs (BENCHMARKS.md, "Cost of
//! interception").
// Under `cargo test` the test harness brings its own `main`.
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    // As the Rust runtime would: a governor or build system that went away shows up as an
    // error from `write`, not as a signal that kills the compile.
    // SAFETY: setting a signal's disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    headroom_govern::shim::main(std::env::args_os().collect())
}
