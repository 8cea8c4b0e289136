//! Starting CMD: in a session of its own, with the governor's interceptor in its environment,
//! in a memory cgroup of its own under `--memory-limit`; and what is then done to it (signals
//! passed on, the terminal's resizes followed, reaping) by the pid and cgroup it was started
//! with.

use std::os::fd::{AsFd, OwnedFd};
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use headroom_diagnose::ExitInfo;
use headroom_probe::cgroup::Cgroup;
use headroom_process::{terminal, Group, SpawnError};

use super::Launch;

/// CMD, started.
pub(super) struct Started {
    pub child: std::process::Child,
    /// CMD's pid, which is also its session's and process group's id.
    pub pid: i32,
    /// The memory cgroup of its own, with `--memory-limit`.
    pub cgroup: Option<Cgroup>,
    /// The cgroup's OOM-kill count before CMD started.
    pub oom_kills_before: u64,
    /// CMD's terminals for its stdout and its stderr, where ours are terminals.
    terminals: [Option<OwnedFd>; 2],
    pub started: Instant,
    pub started_unix: f64,
}

/// Starts CMD as `launch` says. The outer error is headroom's own (no cgroup for
/// `--memory-limit`); the inner one is CMD that could not start.
pub(super) fn start(launch: &Launch) -> anyhow::Result<Result<Started, SpawnError>> {
    let cgroup = match launch.memory_limit {
        Some(limit) => Some(
            Cgroup::create_under_self(
                &format!("headroom-run-{}-{}", std::process::id(), launch.rung),
                Some(limit),
            )
            .context("--memory-limit needs its own memory cgroup; run without --memory-limit to profile without one")?,
        ),
        None => None,
    };
    // CMD writes where we read: to a pipe, or where ours is a terminal to a terminal of its
    // own, so that it colours and buffers its output as it would on ours.
    let (stdout, stdout_reader) = terminal::for_child(std::io::stdout().as_fd());
    let (stderr, stderr_reader) = terminal::for_child(std::io::stderr().as_fd());
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .stdin(Stdio::inherit())
        .stdout(stdout)
        .stderr(stderr);
    for (key, value) in &launch.env {
        command.env(key, value);
    }
    // The interceptor in CMD's environment leads every compiler it starts to the governor;
    // CMD itself runs as it is. A run offers no jobs: the session sets no parallelism.
    if let Some(Err(why)) = launch.governor.map(|session| session.govern(&mut command)) {
        headroom_output::say!("headroom: warning: {why}; the compilers CMD starts run ungoverned");
    }
    // Stage markers from Python reach us when printed, not when a pipe buffer fills.
    if std::env::var_os("PYTHONUNBUFFERED").is_none() {
        command.env("PYTHONUNBUFFERED", "1");
    }
    if let Some(cgroup) = &cgroup {
        cgroup.attach(&mut command);
    }
    let oom_kills_before = cgroup.as_ref().map_or(0, Cgroup::oom_kills);
    let started = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    // A session of its own gives the tree an identity (its session id) that survives double
    // forks, and keeps the terminal's Ctrl-C for us to pass on.
    let spawned = headroom_process::spawn(&mut command, Group::Session);
    // The command's copies of the terminals' writing ends go: once CMD's processes close
    // theirs, the pumps see the end.
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return Ok(Err(err)),
    };
    // The pumps read the terminals; a copy of each stays here to resize it.
    let terminals = [&stdout_reader, &stderr_reader]
        .map(|reader| reader.as_ref().and_then(|reader| reader.try_clone().ok()));
    if let Some(reader) = stdout_reader {
        child.stdout = Some(ChildStdout::from(reader));
    }
    if let Some(reader) = stderr_reader {
        child.stderr = Some(ChildStderr::from(reader));
    }
    Ok(Ok(Started {
        pid: child.id() as i32,
        child,
        terminals,
        cgroup,
        oom_kills_before,
        started,
        started_unix,
    }))
}

impl Started {
    /// Sends `signal` to CMD's process group, and to every process of its cgroup when it has
    /// one.
    pub fn signal(&self, signal: i32) {
        headroom_process::signal_group(self.pid, signal);
        if let Some(cgroup) = &self.cgroup {
            headroom_process::signal_each(cgroup.pids().unwrap_or_default(), signal);
        }
    }

    /// Gives CMD's terminals the new window size of ours, and tells CMD as a terminal would:
    /// in a session of its own, CMD hears nothing of our terminal's resizes.
    pub fn follow_resize(&self) {
        let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
        let mut resized = false;
        for (ours, theirs) in [stdout.as_fd(), stderr.as_fd()]
            .into_iter()
            .zip(&self.terminals)
        {
            if let Some(theirs) = theirs {
                terminal::copy_window_size(ours, theirs.as_fd());
                resized = true;
            }
        }
        if resized {
            self.signal(libc::SIGWINCH);
        }
    }

    /// Reaps every finished child (orphans reparented to us included) and returns CMD's own
    /// exit once it has one.
    pub fn reap(&self) -> Option<ExitInfo> {
        headroom_process::reap_all(self.pid).map(|status| {
            use std::os::unix::process::ExitStatusExt;
            match status.signal() {
                Some(signal) => ExitInfo::signaled(signal),
                None => ExitInfo::exited(status.code().unwrap_or(0)),
            }
        })
    }
}

/// The user's signals passed on to CMD: the first as it is, any later one as SIGKILL.
#[derive(Default)]
pub(super) struct Forwarded {
    count: usize,
    /// The last signal the user sent.
    pub last: Option<i32>,
    /// headroom sent SIGKILL itself, at the user's second signal.
    pub sent_kill: bool,
}

impl Forwarded {
    pub fn pass_on(&mut self, signal: i32, cmd: &Started) {
        self.count += 1;
        self.last = Some(signal);
        // A second Ctrl-C means "now".
        self.sent_kill = self.count > 1;
        cmd.signal(if self.sent_kill {
            libc::SIGKILL
        } else {
            signal
        });
    }
}
