//! The one child in a process's foreground, with every signal the process gets passed on to it.
//!
//! The shim runs its compiler in a process group of its own (so the governor can stop and kill
//! the attempt whole), which takes it out of the terminal's foreground group: what the
//! terminal sends reaches the shim only. Its handlers pass it on at once, from the handler
//! itself, so a compiler never outlives its shim: Ctrl-C, Ctrl-\, SIGTERM and SIGHUP end the
//! child (woken too, in case it is stopped), and a shim with no child running exits at once
//! with `128 + signal`, as it would have without a handler. Ctrl-Z (and a background read or
//! write) stops the child, then the shim; SIGCONT (`fg`, `bg`) resumes the child stopped so.
//! SIGWINCH is passed on as it is. A signal the shim was started ignoring (`nohup`) is left
//! ignored, as the compiler would have it without the shim. State is process-wide, as signal
//! dispositions are.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::{Group, InstallError, SpawnError};

/// Process group of the child now running, for the handlers; 0 when none, `STARTING` while
/// it is being started.
static RUNNING_GROUP: AtomicI32 = AtomicI32::new(0);
/// `RUNNING_GROUP` between starting a child and knowing its group: a signal that comes then
/// waits in `PENDING_SIGNAL` and is passed on once the group is known, so the process never
/// exits and leaves a child it has just started running on.
const STARTING: i32 = -1;
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Whether a signal that ends the child (Ctrl-C, SIGTERM…) was passed on to it.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Whether a terminal's stop (Ctrl-Z) was passed on to the running child, which the next
/// SIGCONT then resumes. A child stopped by anyone else (the governor, for memory) stays
/// stopped.
static STOPPED_BY_TERMINAL: AtomicBool = AtomicBool::new(false);
/// The signals that end the child, and this process when no child runs.
const ENDING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
/// The signals of a terminal's job control that stop the child, then this process.
const STOPPING: [i32; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// Installs the one handler that passes every signal on to the foreground child, for each
/// signal the process was not started ignoring: one the build ignores (`nohup` ignores
/// SIGHUP) stays ignored, and the child inherits that as it would without the shim.
///
/// Installed with sigaction(2) directly: the shim starts on every compiler call, and
/// signal-hook's registry, which allocates for every signal it takes, made this 70 µs of
/// the call (BENCHMARKS.md, "Cost of interception").
pub fn install() -> Result<(), InstallError> {
    let handled = STOPPING
        .into_iter()
        .chain([libc::SIGCONT, libc::SIGWINCH])
        .chain(ENDING);
    for signal in handled.filter(|&signal| !crate::is_ignored(signal)) {
        // SAFETY: a zeroed sigaction is a valid one with no flags and an empty mask.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: a valid action, whose handler only uses atomics and async-signal-safe calls.
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            let source = std::io::Error::last_os_error();
            return Err(InstallError { signal, source });
        }
    }
    Ok(())
}

/// The handler of every signal [`install`] takes.
extern "C" fn pass_on(signal: libc::c_int) {
    // SAFETY: this thread's errno, kept for the code the signal interrupted.
    let errno = unsafe { *libc::__errno_location() };
    if STOPPING.contains(&signal) {
        let group = RUNNING_GROUP.load(Ordering::SeqCst);
        if group > 0 {
            STOPPED_BY_TERMINAL.store(true, Ordering::SeqCst);
            crate::signal_group(group, signal);
        }
        // SAFETY: kill(2) on this process: stop as the signal's default action would.
        unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
    } else if signal == libc::SIGCONT {
        if STOPPED_BY_TERMINAL.swap(false, Ordering::SeqCst) {
            self::signal(libc::SIGCONT);
        }
    } else if signal == libc::SIGWINCH {
        self::signal(libc::SIGWINCH);
    } else {
        match RUNNING_GROUP.load(Ordering::SeqCst) {
            STARTING => {
                PENDING_SIGNAL.store(signal, Ordering::SeqCst);
                // The start may have finished in between; then nobody else would pass it on.
                let group = RUNNING_GROUP.load(Ordering::SeqCst);
                if group > 0 {
                    wake_and_end(group, signal);
                }
            }
            group if group > 0 => wake_and_end(group, signal),
            // SAFETY: _exit is async-signal-safe.
            _ => unsafe { libc::_exit(128 + signal) },
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Starts `command` as the foreground child, in a process group of its own. A signal that
/// ends it and comes while it starts is passed on once it has; where it could not start, this
/// process exits of that signal's code, as it would have without a handler.
pub fn spawn(command: &mut Command) -> Result<Child, SpawnError> {
    RUNNING_GROUP.store(STARTING, Ordering::SeqCst);
    let spawned = crate::spawn(command, Group::Own);
    let pid = spawned.as_ref().map_or(0, |child| child.id() as i32);
    RUNNING_GROUP.store(pid, Ordering::SeqCst);
    match PENDING_SIGNAL.swap(0, Ordering::SeqCst) {
        0 => {}
        ending if pid > 0 => wake_and_end(pid, ending),
        ending => std::process::exit(128 + ending),
    }
    spawned
}

/// The foreground child has ended and been waited for: signals are no longer passed on.
pub fn ended() {
    RUNNING_GROUP.store(0, Ordering::SeqCst);
}

/// Sends `signal` to the foreground child's group, if one runs.
pub fn signal(signal: i32) {
    let group = RUNNING_GROUP.load(Ordering::SeqCst);
    if group > 0 {
        crate::signal_group(group, signal);
    }
}

/// Whether a signal that ends the child was passed on to it: its end is then the user's
/// doing, and nothing should start it again.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Passes the ending `signal` on to group `group`, then wakes it in case it is stopped: the
/// signal is then the first thing it handles.
fn wake_and_end(group: i32, signal: i32) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    crate::signal_group(group, signal);
    crate::signal_group(group, libc::SIGCONT);
}
