//! Runs one command and watches it: passes its output through byte for byte while scanning it
//! for stage starts, samples its whole process tree at a fixed interval, forwards Ctrl-C, and
//! collects how it ended and what the kernel says about its memory. One loop ([`run`]) over
//! four parts: starting CMD (`spawn`), its output (`pump`), its tree's memory (`watch`), and
//! what its end shows (`evidence`).

mod evidence;
mod pump;
mod spawn;
mod watch;

use std::ffi::OsString;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use headroom_diagnose::ExitInfo;
use headroom_govern::session::Session;
use headroom_process::terminal::Resizes;
use headroom_process::{Interrupts, SpawnError};

use crate::devices::Devices;
use crate::stages::{StageDetector, StageStart};
pub use evidence::KernelPeaks;
use headroom_process::OUTPUT_AFTER_EXIT;
use pump::{Event, Pumps};
use spawn::Forwarded;
pub use watch::{ProcessPeak, Sample};

/// How often the live status line is redrawn.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// What to run and how to watch it.
pub struct Launch<'a> {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
    pub interval: Duration,
    pub memory_limit: Option<u64>,
    pub detector: &'a StageDetector,
    /// Distinguishes the cgroups of successive rungs.
    pub rung: usize,
    /// The governor of the compilers the command starts, if one runs.
    pub governor: Option<&'a Session>,
}

/// How a watched command went.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub started_unix: f64,
    pub duration_s: f64,
    pub samples: Vec<Sample>,
    pub stage_starts: Vec<StageStart>,
    pub exit: ExitInfo,
    /// The last part of stdout followed by the last part of stderr.
    pub output_tail: Vec<u8>,
    pub kernel: KernelPeaks,
    /// How the tree was followed.
    pub tracking: &'static str,
    /// The signal forwarded from the user (Ctrl-C), if any.
    pub interrupted: Option<i32>,
    /// headroom sent SIGKILL itself, at the user's second Ctrl-C: a SIGKILL exit is then
    /// headroom's doing, not the OOM killer's.
    pub killed_by_headroom: bool,
    pub notes: Vec<String>,
    /// The processes with the largest sampled RSS, largest first.
    pub largest_processes: Vec<ProcessPeak>,
}

/// Runs `launch` to completion (or until interrupted) and returns what was seen: every signal
/// in `interrupts` is passed on to CMD (a second one as SIGKILL), and each of the terminal's
/// `resizes` to CMD's terminals. The outer error is
/// headroom's own; the inner one is CMD that could not start.
pub fn run(
    launch: &Launch,
    interrupts: &Interrupts,
    resizes: Option<&Resizes>,
    devices: &mut Devices,
) -> anyhow::Result<Result<Outcome, SpawnError>> {
    let mut cmd = match spawn::start(launch)? {
        Ok(cmd) => cmd,
        Err(err) => return Ok(Err(err)),
    };
    let mut pumps = Pumps::start(&mut cmd.child, launch.detector, cmd.started);
    let mut watch = watch::Watch::new(&cmd, launch, devices);
    let mut stage_starts = Vec::new();
    let mut forwarded = Forwarded::default();
    let mut exit = None;
    let mut next_sample = Instant::now();
    let mut next_status = Instant::now();
    watch.sample(devices);
    while exit.is_none() {
        match pumps
            .events
            .recv_timeout(next_sample.saturating_duration_since(Instant::now()))
        {
            Ok(Event::Stage(start)) => {
                watch.stage_started(&start, devices);
                stage_starts.push(start);
            }
            Ok(Event::Closed) => pumps.one_closed(),
            Err(RecvTimeoutError::Timeout) => {
                watch.sample(devices);
                next_sample += launch.interval;
                if next_sample < Instant::now() {
                    next_sample = Instant::now() + launch.interval;
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                pumps.all_closed();
                std::thread::sleep(next_sample.saturating_duration_since(Instant::now()));
                watch.sample(devices);
                next_sample = Instant::now() + launch.interval;
            }
        }
        if let Some(signal) = interrupts.take() {
            forwarded.pass_on(signal, &cmd);
        }
        if resizes.is_some_and(Resizes::take) {
            cmd.follow_resize();
        }
        exit = cmd.reap();
        if pumps.terminal.may_show_status() && Instant::now() >= next_status {
            watch.show_status(&pumps.terminal);
            next_status = Instant::now() + STATUS_EVERY;
        }
    }
    let duration_s = cmd.started.elapsed().as_secs_f64();
    watch.forget_samples_after_exit();
    pumps.drain(&mut stage_starts);
    let exit = exit.unwrap_or_default();
    let mut evidence = evidence::gather(exit, &cmd, &forwarded, launch.memory_limit, &mut watch);
    evidence.notes.extend(devices.notes());
    Ok(Ok(Outcome {
        started_unix: cmd.started_unix,
        duration_s,
        largest_processes: watch.largest_processes(),
        samples: watch.samples,
        stage_starts: stage_starts
            .into_iter()
            .filter(|s| s.t <= duration_s + OUTPUT_AFTER_EXIT.as_secs_f64())
            .collect(),
        exit: evidence.exit,
        output_tail: pumps.output_tail(),
        kernel: evidence.kernel,
        tracking: watch.tracking,
        interrupted: forwarded.last,
        killed_by_headroom: evidence.killed_by_headroom,
        notes: evidence.notes,
    }))
}
