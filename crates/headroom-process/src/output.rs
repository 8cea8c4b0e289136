//! A child's whole output, as `Command::output` gives it, except that it is read only until
//! [`OUTPUT_AFTER_EXIT`] after the child has exited: a process the child left holding its
//! pipes (a compile server or daemon a compiler wrapper started) would otherwise keep its
//! caller waiting for as long as that process lives.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, Pid, PidfdFlags};

use crate::OUTPUT_AFTER_EXIT;

/// Runs `command` with its stdout and stderr piped and returns its status and both outputs,
/// read to their ends or until [`OUTPUT_AFTER_EXIT`] after it exited. Past `within`, when
/// given, the child is killed and the error is [`std::io::ErrorKind::TimedOut`].
pub fn output_of(command: &mut Command, within: Option<Duration>) -> std::io::Result<Output> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = within.map(|within| Instant::now() + within);
    let read = read_outputs(&mut child, deadline);
    if read.is_err() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    let (stdout, stderr) = read?;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Reads `child`'s stdout and stderr as [`output_of`] says, and waits for it to exit where
/// the kernel tells when (a pidfd); an error past `deadline`.
fn read_outputs(
    child: &mut Child,
    deadline: Option<Instant>,
) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let as_file = |fd: Option<OwnedFd>| fd.map(File::from);
    let mut pipes = [
        as_file(child.stdout.take().map(OwnedFd::from)),
        as_file(child.stderr.take().map(OwnedFd::from)),
    ];
    let mut outputs = [Vec::new(), Vec::new()];
    // Readable once the child has exited (Linux 5.3 and later; before, the pipes' ends are
    // waited for, as `Command::output` does).
    let mut running =
        Pid::from_raw(child.id() as i32).and_then(|pid| pidfd_open(pid, PidfdFlags::empty()).ok());
    let mut exited_at: Option<Instant> = None;
    let mut chunk = [0u8; 8192];
    loop {
        if exited_at.is_some_and(|exited| exited.elapsed() >= OUTPUT_AFTER_EXIT) {
            pipes = [None, None];
        }
        if pipes.iter().all(Option::is_none) && running.is_none() {
            let [stdout, stderr] = outputs;
            return Ok((stdout, stderr));
        }
        // The open pipes, then the child while it runs.
        let mut ready: Vec<PollFd<'_>> = pipes
            .iter()
            .flatten()
            .map(File::as_fd)
            .chain(running.as_ref().map(OwnedFd::as_fd))
            .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
            .collect();
        let until = [exited_at.map(|exited| exited + OUTPUT_AFTER_EXIT), deadline]
            .into_iter()
            .flatten()
            .min();
        let timeout = until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .and_then(|wait| Timespec::try_from(wait).ok());
        match poll(&mut ready, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
        let woken: Vec<bool> = ready.iter().map(|fd| !fd.revents().is_empty()).collect();
        drop(ready);
        let mut woken = woken.into_iter();
        for (pipe, output) in pipes.iter_mut().zip(&mut outputs) {
            let Some(open) = pipe else { continue };
            if !woken.next().unwrap_or(false) {
                continue;
            }
            match open.read(&mut chunk) {
                Ok(0) => *pipe = None,
                Ok(read) => output.extend_from_slice(&chunk[..read]),
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        if running.is_some() && woken.next().unwrap_or(false) {
            running = None;
            exited_at = Some(Instant::now());
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        command
    }

    #[test]
    fn both_outputs_and_the_status_come_back_whole() {
        // More than a pipe holds on each stream, so neither may wait for the other.
        let script = "head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2; exit 3";
        let output = output_of(&mut sh(script), None).unwrap();
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stdout.len(), 300_000);
        assert_eq!(output.stderr.len(), 200_000);
    }

    #[test]
    fn a_process_left_holding_the_output_is_not_waited_for() {
        let start = Instant::now();
        let output = output_of(&mut sh("echo before; sleep 30 & echo after >&2"), None).unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout, b"before\n");
        assert_eq!(output.stderr, b"after\n");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_child_past_its_time_is_killed() {
        let start = Instant::now();
        let err =
            output_of(&mut sh("exec sleep 30"), Some(Duration::from_millis(200))).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }
}
