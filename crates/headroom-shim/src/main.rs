//! `headroom-shim`: the compiler shim alone, as its own small binary. Every compiler call of a
//! governed build starts it, so it should start fast: headroom builds it as a static program
//! without glibc where it can (`headroom-govern`'s build.rs), carries it inside its own binary,
//! and writes it out for each build (`headroom_govern::shim_binary`).
//!
//! It skips the Rust runtime's start-up, which reads `/proc/self/maps` to find the main
//! thread's stack: about 0.15 ms of every compiler call on our VMs (BENCHMARKS.md, "Cost of
//! interception"). So it takes its arguments from `main`'s own: without that start-up the
//! standard library does not know them on every C library.
// Under `cargo test` the test harness brings its own `main`.
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    use std::os::unix::ffi::OsStrExt;
    // As the Rust runtime would: a governor or build system that went away shows up as an
    // error from `write`, not as a signal that kills the compile.
    // SAFETY: setting a signal's disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let argc = usize::try_from(argc).unwrap_or(0);
    // SAFETY: the C runtime passes `argc` pointers to NUL-terminated strings in `argv`, which
    // live as long as the process.
    let args = (0..argc)
        .map(|i| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) })
        .map(|arg| std::ffi::OsStr::from_bytes(arg.to_bytes()).to_os_string())
        .collect();
    headroom_govern::shim::main(args)
}
