//! Messages to the user on stderr that never fail the command. `eprintln!` panics when
//! stderr cannot be written, as when it is a pipe whose reader has gone (`headroom build …
//! 2>&1 | head`), and that panic replaced the build's own exit status with 101. A message
//! nobody can read any more is dropped instead: what headroom does and the exit status it
//! returns never depend on whether anyone still reads stderr.
//!
//! `headroom_output::say!("headroom: {what}")` is `eprintln!` without the panic.

use std::fmt;
use std::io::Write;

/// Writes `message` and a newline to stderr in one write, ignoring a failure to write it.
pub fn say(message: fmt::Arguments<'_>) {
    let line = format!("{message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!` that never panics: writes a line to stderr and ignores a failure to write it.
#[macro_export]
macro_rules! say {
    () => {
        $crate::say(::std::format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::say(::std::format_args!($($arg)*))
    };
}
