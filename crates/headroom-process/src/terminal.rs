//! A terminal for a child whose output its supervisor reads and passes on. Programs decide by
//! `isatty` how to write: compilers whether to colour their diagnostics (gcc, clang, nvcc,
//! rustc's `--color auto`) and how wide to make them, Python and C's stdio whether to buffer
//! by line, progress bars whether to draw. A child that writes to a pipe where its supervisor's
//! own stream is a terminal behaves as it would not without the supervisor. So there it gets a
//! pseudo-terminal instead of a pipe, with the same window size and in raw mode, so its bytes
//! reach the supervisor unchanged (no `\r` added before each `\n`). A supervisor that keeps
//! its child out of the terminal's sight (a session of its own) passes on the terminal's
//! resizes ([`Resizes`], [`copy_window_size`]).

use std::ffi::{CStr, OsStr};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The two ends of a pseudo-terminal: the supervisor reads `reader`; the child writes to
/// `writer`. Once every copy of `writer` is closed, reading `reader` fails with `EIO`, which
/// stands for the end of the output, as a pipe's end-of-file does.
struct Terminal {
    reader: OwnedFd,
    writer: OwnedFd,
}

/// Where a child writes a stream that its supervisor reads and passes on to `ours`: a
/// terminal like `ours` where `ours` is a terminal, else a pipe. Returns the child's end, and
/// for a terminal the supervisor's (a pipe's is the child's `stdout` or `stderr`).
pub fn for_child(ours: BorrowedFd<'_>) -> (Stdio, Option<OwnedFd>) {
    match like(ours) {
        Some(terminal) => (Stdio::from(terminal.writer), Some(terminal.reader)),
        None => (Stdio::piped(), None),
    }
}

/// A terminal like `ours`, or `None` when `ours` is not a terminal or none can be made (the
/// child then writes to a pipe, as it would anyway).
fn like(ours: BorrowedFd<'_>) -> Option<Terminal> {
    // SAFETY: isatty only reads the descriptor's state.
    if unsafe { libc::isatty(ours.as_raw_fd()) } != 1 {
        return None;
    }
    let terminal = open().ok()?;
    copy_window_size(ours, terminal.writer.as_fd());
    Some(terminal)
}

fn open() -> io::Result<Terminal> {
    // SAFETY: posix_openpt returns a new descriptor or -1; the descriptor is owned from here.
    let reader = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if reader < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `reader` is a new descriptor that nothing else owns.
    let reader = unsafe { OwnedFd::from_raw_fd(reader) };
    let fd = reader.as_raw_fd();
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: each call reads the descriptor; ptsname_r writes at most `name.len()` bytes.
    let ready = unsafe {
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0
    };
    if !ready {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ptsname_r wrote a NUL-terminated path into `name`.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) };
    let writer: OwnedFd = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(OsStr::from_bytes(path.to_bytes()))?
        .into();
    make_raw(&writer)?;
    Ok(Terminal { reader, writer })
}

/// No line discipline between the child's bytes and the reader: `\n` stays `\n`.
fn make_raw(terminal: &OwnedFd) -> io::Result<()> {
    // SAFETY: termios is plain data that tcgetattr fills before it is read.
    let mut settings: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: both calls read or write `settings`, which lives for the calls.
    let done = unsafe {
        libc::tcgetattr(terminal.as_raw_fd(), &mut settings) == 0 && {
            libc::cfmakeraw(&mut settings);
            libc::tcsetattr(terminal.as_raw_fd(), libc::TCSANOW, &settings) == 0
        }
    };
    if done {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The terminal's resizes, for a supervisor whose child writes to terminals of its own: the
/// terminal signals them (SIGWINCH) to its foreground process group, which is the
/// supervisor's and not the child's. A flag of its own, so that no resize takes the place of
/// a Ctrl-C caught at the same moment ([`crate::Interrupts`] keeps only the last signal).
pub struct Resizes {
    resized: Arc<AtomicBool>,
}

impl Resizes {
    pub fn install() -> io::Result<Resizes> {
        let resized = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(libc::SIGWINCH, Arc::clone(&resized))?;
        Ok(Resizes { resized })
    }

    /// Whether the terminal was resized since the last call.
    pub fn take(&self) -> bool {
        self.resized.swap(false, Ordering::SeqCst)
    }
}

/// Gives `to`, a child's terminal (either end), the window size of `from`. Best effort: a
/// child that finds no width keeps its default, as in a terminal without one.
pub fn copy_window_size(from: BorrowedFd<'_>, to: BorrowedFd<'_>) {
    // SAFETY: winsize is plain data; TIOCGWINSZ fills it and TIOCSWINSZ reads it.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(from.as_raw_fd(), libc::TIOCGWINSZ, &mut size) == 0 {
            libc::ioctl(to.as_raw_fd(), libc::TIOCSWINSZ, &size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn bytes_pass_unchanged_and_the_end_reads_as_an_error() {
        let terminal = open().expect("this machine can open a pseudo-terminal");
        // SAFETY: isatty only reads the descriptor's state.
        assert_eq!(unsafe { libc::isatty(terminal.writer.as_raw_fd()) }, 1);
        let mut writer = std::fs::File::from(terminal.writer);
        writer
            .write_all(b"\x1b[01;31merror:\x1b[m one\ntwo\n")
            .unwrap();
        drop(writer);
        let mut reader = std::fs::File::from(terminal.reader);
        let mut read = Vec::new();
        let mut chunk = [0u8; 64];
        loop {
            match reader.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => read.extend_from_slice(&chunk[..n]),
                Err(err) => {
                    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
                    break;
                }
            }
        }
        assert_eq!(read, b"\x1b[01;31merror:\x1b[m one\ntwo\n");
    }

    #[test]
    fn a_child_of_a_pipe_writes_to_a_pipe() {
        let (reader, _writer) = std::io::pipe().unwrap();
        assert!(for_child(reader.as_fd()).1.is_none());
    }
}
