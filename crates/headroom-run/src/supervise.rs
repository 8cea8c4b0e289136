//! Runs one command and watches it: passes its output through byte for byte while scanning it
//! for stage starts, samples its whole process tree at a fixed interval, forwards Ctrl-C, and
//! collects how it ended and what the kernel says about its memory.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use headroom_diagnose::ExitInfo;
use headroom_govern::session::Session;
use headroom_probe::cgroup::Cgroup;
use headroom_probe::procs::count_shared_pages;
use headroom_probe::tracker::{Scope, TreeTracker};
use headroom_probe::{meminfo, psi, rusage};
use headroom_size::format_size;
use serde::Serialize;

use super::devices::Devices;
use super::stages::{StageDetector, StageScanner, StageStart};

/// How much of the command's output is kept for classifying a failure.
const TAIL_BYTES: usize = 256 * 1024;
/// The pipe size asked for CMD's stdout and stderr, and the most read from one at a time.
const PIPE_BYTES: usize = 1 << 20;
/// MemAvailable and PSI describe the whole machine and move slowly (PSI's shortest average is
/// 10 s): read them at most this often, whatever the interval.
const MACHINE_EVERY: Duration = Duration::from_millis(200);
/// How long to wait for output after the command exits (daemons may hold the pipes open).
const DRAIN_WAIT: Duration = Duration::from_millis(500);
const STATUS_EVERY: Duration = Duration::from_millis(250);
/// The least time between two samples taken for stage starts (a regular sample just before a
/// stage start does not count: the stage's entry memory is measured at its start).
const STAGE_SAMPLE_GAP: Duration = Duration::from_millis(5);

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

/// One reading of the tree and the machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the command started.
    pub t: f64,
    /// Resident memory of the whole tree.
    pub rss: u64,
    /// Memory of the whole tree as the kernel counts it: RSS, with the pages that forked
    /// processes share split between them (their PSS), as `headroom_probe::procs` counts it.
    pub counted: u64,
    pub processes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_usage: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_available: Option<u64>,
    /// System memory PSI `some avg10`, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi_some_avg10: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u64>,
    /// Seconds since the command started when `gpu` was read: NVML is read at most every
    /// 200 ms, so several samples share one reading, and it counts toward the stage it was
    /// taken in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_read_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron: Option<u64>,
    /// Resident memory by process name (`python3`, `cc1plus`, see [`process_name`]).
    pub by_command: Vec<(String, u64)>,
}

/// The kernel's own account, to cross-check sampled peaks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KernelPeaks {
    /// Largest peak RSS of any single finished descendant (`getrusage(RUSAGE_CHILDREN)`); over
    /// every rung so far.
    pub largest_process: u64,
    /// The command's own cgroup's peak usage (page cache included), with `--memory-limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<u64>,
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

/// One process of the tree and the largest RSS it was sampled at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessPeak {
    pub pid: i32,
    pub command: String,
    pub peak_rss: u64,
}

/// How many processes the report lists by their peak.
const LARGEST_PROCESSES: usize = 10;

/// Signals headroom forwards to the command instead of dying of them.
pub struct Signals {
    pending: Arc<AtomicUsize>,
}

impl Signals {
    pub fn install() -> anyhow::Result<Signals> {
        let pending = Arc::new(AtomicUsize::new(0));
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            signal_hook::flag::register_usize(signal, Arc::clone(&pending), signal as usize)
                .context("cannot install the Ctrl-C handler that forwards signals to CMD")?;
        }
        Ok(Signals { pending })
    }

    fn take(&self) -> Option<i32> {
        match self.pending.swap(0, Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as i32),
        }
    }
}

/// The command could not be started at all.
#[derive(Debug, thiserror::Error)]
#[error("cannot run `{program}`: {source}")]
pub struct SpawnError {
    pub program: String,
    #[source]
    pub source: std::io::Error,
}

impl SpawnError {
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == std::io::ErrorKind::NotFound
    }
}

/// Makes this process the reaper of orphaned descendants, so double-forked daemons stay in the
/// tree it samples (their parent becomes us, not init).
pub fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// The shared terminal: the live status line and the passed-through output take turns.
struct Terminal {
    lock: Mutex<()>,
    status_visible: AtomicBool,
    status_enabled: bool,
    /// CMD's last output ended a line. The status line is drawn only then, so it never erases
    /// a partial line such as CMD's own `\r` progress bar.
    at_line_start: AtomicBool,
}

impl Terminal {
    fn clear_status(&self, stderr: &mut impl Write) {
        if self.status_visible.swap(false, Ordering::SeqCst) {
            let _ = stderr.write_all(b"\r\x1b[2K");
        }
    }
}

enum Event {
    Stage(StageStart),
    Closed,
}

/// Runs `launch` to completion (or until interrupted) and returns what was seen.
pub fn run(
    launch: &Launch,
    signals: &Signals,
    devices: &mut Devices,
) -> anyhow::Result<Result<Outcome, SpawnError>> {
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
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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
    // SAFETY: setsid is async-signal-safe. A session of its own gives the tree an identity
    // (its session id) that survives double forks, and keeps the terminal's Ctrl-C for us to
    // forward.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    if let Some(cgroup) = &cgroup {
        cgroup.attach(&mut command);
    }
    let oom_kills_before = cgroup.as_ref().map_or(0, Cgroup::oom_kills);
    let started = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(source) => {
            return Ok(Err(SpawnError {
                program: launch.program.to_string_lossy().into_owned(),
                source,
            }))
        }
    };
    let child_pid = child.id() as i32;

    let terminal = Arc::new(Terminal {
        lock: Mutex::new(()),
        status_visible: AtomicBool::new(false),
        status_enabled: std::io::stderr().is_terminal(),
        at_line_start: AtomicBool::new(true),
    });
    let (events, received) = mpsc::channel();
    let stdout_tail = Arc::new(Mutex::new(Vec::new()));
    let stderr_tail = Arc::new(Mutex::new(Vec::new()));
    if let Some(stdout) = child.stdout.take() {
        spawn_pump(
            stdout,
            false,
            launch.detector.clone(),
            started,
            events.clone(),
            Arc::clone(&stdout_tail),
            Arc::clone(&terminal),
        );
    }
    if let Some(stderr) = child.stderr.take() {
        spawn_pump(
            stderr,
            true,
            launch.detector.clone(),
            started,
            events.clone(),
            Arc::clone(&stderr_tail),
            Arc::clone(&terminal),
        );
    }
    drop(events);

    let (scope, tracking) = match &cgroup {
        Some(cgroup) => (Scope::Cgroup(cgroup.dir().to_path_buf()), "cgroup"),
        None => (
            Scope::Descendants {
                ancestor: std::process::id() as i32,
                session: child_pid,
            },
            "descendants (subreaper) and session",
        ),
    };
    let mut tracker = TreeTracker::new(scope);
    for helper in devices.helper_pids() {
        tracker.exclude(helper);
    }
    // The governor is headroom's, not the command's.
    if let Some(session) = launch.governor {
        tracker.exclude(session.governor_pid() as i32);
    }

    let mut watch = Watch {
        started,
        tracker,
        cgroup: cgroup.as_ref(),
        samples: Vec::new(),
        names: HashMap::new(),
        machine: None,
        peak: 0,
        stage: None,
        process_peaks: HashMap::new(),
    };
    let mut stage_starts = Vec::new();
    let mut last_stage_sample: Option<Instant> = None;
    let mut interrupted = None;
    let mut sent_kill = false;
    let mut forwarded = 0;
    let mut exit = None;
    let mut open_streams = 2;
    let mut next_sample = Instant::now();
    let mut next_status = Instant::now();
    watch.sample(devices);
    while exit.is_none() {
        match received.recv_timeout(next_sample.saturating_duration_since(Instant::now())) {
            Ok(Event::Stage(start)) => {
                devices.stage_started();
                watch.stage = Some(start.name.clone());
                stage_starts.push(start);
                // Entry memory of the new stage, measured now rather than up to one interval
                // late; a regex that matches every line of a chatty log must not turn that into
                // thousands of samples a second.
                if last_stage_sample.is_none_or(|at: Instant| at.elapsed() >= STAGE_SAMPLE_GAP) {
                    watch.sample(devices);
                    last_stage_sample = Some(Instant::now());
                }
            }
            Ok(Event::Closed) => open_streams -= 1,
            Err(RecvTimeoutError::Timeout) => {
                watch.sample(devices);
                next_sample += launch.interval;
                if next_sample < Instant::now() {
                    next_sample = Instant::now() + launch.interval;
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                open_streams = 0;
                std::thread::sleep(next_sample.saturating_duration_since(Instant::now()));
                watch.sample(devices);
                next_sample = Instant::now() + launch.interval;
            }
        }
        if let Some(signal) = signals.take() {
            forwarded += 1;
            interrupted = Some(signal);
            // A second Ctrl-C means "now".
            sent_kill = forwarded > 1;
            let signal = if sent_kill { libc::SIGKILL } else { signal };
            forward(signal, child_pid, cgroup.as_ref());
        }
        exit = reap(child_pid);
        if terminal.status_enabled
            && terminal.at_line_start.load(Ordering::SeqCst)
            && Instant::now() >= next_status
        {
            watch.show_status(&terminal);
            next_status = Instant::now() + STATUS_EVERY;
        }
    }
    let duration_s = started.elapsed().as_secs_f64();
    // Samples taken after the tree was gone (between its exit and our reaping it) say nothing
    // about its memory: the last memory of the last stage is the last sample of a live tree.
    while watch.samples.len() > 1 && watch.samples.last().is_some_and(|s| s.rss == 0) {
        watch.samples.pop();
    }
    // Output written just before exit, and the stage lines in it, still arrive.
    let drain_until = Instant::now() + DRAIN_WAIT;
    while open_streams > 0 {
        match received.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
            Ok(Event::Stage(start)) => stage_starts.push(start),
            Ok(Event::Closed) => open_streams -= 1,
            Err(_) => break,
        }
    }
    {
        let _guard = terminal.lock.lock();
        terminal.clear_status(&mut std::io::stderr());
    }
    let mut exit = exit.unwrap_or_default();
    let mut notes = Vec::new();
    let killed_by_headroom = sent_kill && exit.signal == Some(libc::SIGKILL);
    if killed_by_headroom {
        notes.push(
            "headroom killed CMD with SIGKILL at the second Ctrl-C: that kill is headroom's, not the OOM killer's"
                .to_string(),
        );
    }
    let kernel = KernelPeaks {
        largest_process: rusage::children_max_rss(),
        cgroup: cgroup.as_ref().and_then(Cgroup::peak),
    };
    if let Some(cgroup) = &cgroup {
        let oom_kills = cgroup.oom_kills();
        if oom_kills > oom_kills_before {
            exit.kernel_oom_evidence = Some(format!(
                "the kernel OOM killer killed {} process(es) in the run's cgroup ({} oom_kill {oom_kills_before} -> {oom_kills}) at the {} limit",
                oom_kills - oom_kills_before,
                cgroup.dir().display(),
                format_size(launch.memory_limit.unwrap_or(0)),
            ));
        }
    }
    if exit.kernel_oom_evidence.is_none() && !exit.success() {
        match kernel_log_kill(watch.tracker.ever_seen(), started_unix) {
            Ok(Some(line)) => exit.kernel_oom_evidence = Some(format!("kernel log: {line}")),
            Ok(None) => {}
            Err(reason) => notes.push(reason),
        }
    }
    let survivors = watch.tracker.sample();
    if !survivors.is_empty() && cgroup.is_none() {
        notes.push(format!(
            "{} process(es) of the tree still run after CMD exited (pids {}); they were sampled while CMD ran",
            survivors.len(),
            survivors.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    notes.extend(devices.notes());
    let mut output_tail = take(&stdout_tail);
    output_tail.extend(take(&stderr_tail));
    Ok(Ok(Outcome {
        started_unix,
        duration_s,
        largest_processes: watch.largest_processes(),
        samples: watch.samples,
        stage_starts: stage_starts
            .into_iter()
            .filter(|s| s.t <= duration_s + DRAIN_WAIT.as_secs_f64())
            .collect(),
        exit,
        output_tail,
        kernel,
        tracking,
        interrupted,
        killed_by_headroom,
        notes,
    }))
}

/// The sampling state of one run.
struct Watch<'a> {
    started: Instant,
    tracker: TreeTracker,
    cgroup: Option<&'a Cgroup>,
    samples: Vec<Sample>,
    /// The name of each process seen, by pid and command name (see [`process_name`]).
    names: HashMap<(i32, String), String>,
    /// The last machine-wide reading: when, MemAvailable, PSI `some avg10`.
    machine: Option<(Instant, Option<u64>, Option<f64>)>,
    peak: u64,
    stage: Option<String>,
    /// Peak sampled RSS of every process seen, by pid.
    process_peaks: HashMap<i32, ProcessPeak>,
}

impl Watch<'_> {
    fn sample(&mut self, devices: &mut Devices) {
        let t = self.started.elapsed().as_secs_f64();
        let mut processes = self.tracker.sample();
        count_shared_pages(&mut processes);
        let rss: u64 = processes.iter().map(|p| p.rss_bytes).sum();
        let counted: u64 = processes.iter().map(|p| p.counted_bytes).sum();
        let mut by_command: Vec<(String, u64)> = Vec::new();
        for process in &processes {
            let name = self
                .names
                .entry((process.pid, process.comm.clone()))
                .or_insert_with(|| process_name(process.pid, &process.comm));
            let entry = self
                .process_peaks
                .entry(process.pid)
                .or_insert_with(|| ProcessPeak {
                    pid: process.pid,
                    command: name.clone(),
                    peak_rss: 0,
                });
            if process.rss_bytes > entry.peak_rss {
                entry.peak_rss = process.rss_bytes;
                // The name at the peak: a process that execs changes its name.
                entry.command.clone_from(name);
            }
            match by_command.iter_mut().find(|(known, _)| known == name) {
                Some(entry) => entry.1 += process.rss_bytes,
                None => by_command.push((name.clone(), process.rss_bytes)),
            }
        }
        by_command.retain(|(_, bytes)| *bytes > 0);
        let pids: HashSet<i32> = processes.iter().map(|p| p.pid).collect();
        let device = devices.read(&pids);
        let (mem_available, psi_some_avg10) = self.machine_reading();
        self.peak = self.peak.max(rss);
        self.samples.push(Sample {
            t,
            rss,
            counted,
            processes: processes.len(),
            cgroup_usage: self.cgroup.and_then(|c| c.usage().ok()),
            mem_available,
            psi_some_avg10,
            gpu: device.gpu,
            gpu_read_s: device
                .gpu_read_at
                .map(|at| at.saturating_duration_since(self.started).as_secs_f64()),
            neuron: device.neuron,
            by_command,
        });
    }

    fn largest_processes(&self) -> Vec<ProcessPeak> {
        let mut peaks: Vec<ProcessPeak> = self.process_peaks.values().cloned().collect();
        peaks.sort_by(|a, b| b.peak_rss.cmp(&a.peak_rss).then(a.pid.cmp(&b.pid)));
        peaks.truncate(LARGEST_PROCESSES);
        peaks
    }

    fn machine_reading(&mut self) -> (Option<u64>, Option<f64>) {
        match self.machine {
            Some((at, available, pressure)) if at.elapsed() < MACHINE_EVERY => {
                (available, pressure)
            }
            _ => {
                let available = meminfo::read_meminfo().ok().map(|m| m.available);
                let pressure = psi::system_memory_pressure().ok().map(|p| p.some.avg10);
                self.machine = Some((Instant::now(), available, pressure));
                (available, pressure)
            }
        }
    }

    fn show_status(&self, terminal: &Terminal) {
        let Some(last) = self.samples.last() else {
            return;
        };
        let line = format!(
            "headroom: {} now, {} peak, {} process(es){}{} · {:.1}s",
            format_size(last.rss),
            format_size(self.peak),
            last.processes,
            self.stage
                .as_ref()
                .map_or(String::new(), |s| format!(" · stage {s}")),
            last.mem_available.map_or(String::new(), |a| format!(
                " · {} available",
                format_size(a)
            )),
            last.t
        );
        let _guard = terminal.lock.lock();
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
        terminal.status_visible.store(true, Ordering::SeqCst);
    }
}

/// What torch's Inductor names its compile workers' entry point: `python …/torch/_inductor/
/// compile_worker/__main__.py`, or `python -m torch._inductor.compile_worker`.
const INDUCTOR_COMPILE_WORKER: [&str; 2] = [
    "torch/_inductor/compile_worker",
    "torch._inductor.compile_worker",
];

/// The name a process is shown by: its command name (`cc1plus`), except for a Python process
/// that is a compile worker of torch's Inductor, named `torch._inductor…compile_worker`: the
/// sidecar and the workers it forks are what a torch.compile run holds most of its memory in,
/// and `python3` does not say so. Reads `/proc/PID/cmdline` of Python processes only.
fn process_name(pid: i32, comm: &str) -> String {
    let is_compile_worker = comm.starts_with("python")
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let cmdline = String::from_utf8_lossy(&cmdline);
            INDUCTOR_COMPILE_WORKER
                .iter()
                .any(|entry| cmdline.contains(entry))
        });
    if is_compile_worker {
        "torch._inductor…compile_worker".to_string()
    } else {
        comm.to_string()
    }
}

/// Copies one of the command's streams to ours, byte for byte, scanning it for stage starts
/// and keeping the tail for classification. When ours has no reader any more, it stops
/// reading and closes CMD's end, so CMD gets SIGPIPE (or EPIPE) as it would have writing there
/// itself.
fn spawn_pump(
    source: impl Read + AsRawFd + Send + 'static,
    is_stderr: bool,
    detector: StageDetector,
    started: Instant,
    events: Sender<Event>,
    tail: Arc<Mutex<Vec<u8>>>,
    terminal: Arc<Terminal>,
) {
    std::thread::spawn(move || {
        let mut source = source;
        widen_pipe(&source);
        let mut scanner = StageScanner::new(detector);
        let mut send_stage = |name| {
            let t = started.elapsed().as_secs_f64();
            let _ = events.send(Event::Stage(StageStart { t, name }));
        };
        let mut buffer = vec![0u8; PIPE_BYTES];
        loop {
            let n = match source.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let chunk = &buffer[..n];
            // Only a reader gone away ends the pump: CMD would have got SIGPIPE. Other errors
            // (a closed descriptor, a full disk) CMD would have got as errors and gone on.
            if let Err(e) = pass_through(chunk, is_stderr, &terminal) {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    break;
                }
            }
            keep_tail(&tail, chunk);
            scanner.feed(chunk, &mut send_stage);
        }
        drop(source);
        if let Some(name) = scanner.finish() {
            send_stage(name);
        }
        let _ = events.send(Event::Closed);
    });
}

/// Asks for a pipe of `PIPE_BYTES`, so a chatty command is read in a few large chunks rather
/// than many 64 KiB ones. Where the system caps pipe sizes lower the default stays.
fn widen_pipe(pipe: &impl AsRawFd) {
    // SAFETY: fcntl on a descriptor we own; F_SETPIPE_SZ takes an integer.
    unsafe {
        libc::fcntl(
            pipe.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            PIPE_BYTES as libc::c_int,
        );
    }
}

/// Writes a chunk of CMD's output to our stdout or stderr, clearing the status line first.
fn pass_through(chunk: &[u8], is_stderr: bool, terminal: &Terminal) -> std::io::Result<()> {
    let _guard = terminal.lock.lock();
    let mut stderr = std::io::stderr().lock();
    terminal.clear_status(&mut stderr);
    if is_stderr {
        stderr.write_all(chunk)?;
        stderr.flush()?;
    } else {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(chunk)?;
        stdout.flush()?;
    }
    terminal
        .at_line_start
        .store(chunk.ends_with(b"\n"), Ordering::SeqCst);
    Ok(())
}

/// Keeps at least the last `TAIL_BYTES` of a stream; trimming only past twice that moves each
/// byte at most once.
fn keep_tail(tail: &Mutex<Vec<u8>>, chunk: &[u8]) {
    if let Ok(mut tail) = tail.lock() {
        tail.extend_from_slice(&chunk[chunk.len().saturating_sub(TAIL_BYTES)..]);
        if tail.len() > 2 * TAIL_BYTES {
            let excess = tail.len() - TAIL_BYTES;
            tail.drain(..excess);
        }
    }
}

/// The last `TAIL_BYTES` kept of a stream.
fn take(tail: &Mutex<Vec<u8>>) -> Vec<u8> {
    tail.lock()
        .map(|mut tail| {
            let excess = tail.len().saturating_sub(TAIL_BYTES);
            tail.split_off(excess)
        })
        .unwrap_or_default()
}

/// Sends `signal` to the command's process group (it leads its own session), and to every
/// process of its cgroup when it has one.
fn forward(signal: i32, child_pid: i32, cgroup: Option<&Cgroup>) {
    // SAFETY: plain kill(2) calls with pids we started.
    unsafe {
        libc::kill(-child_pid, signal);
    }
    if let Some(cgroup) = cgroup {
        for pid in cgroup.pids().unwrap_or_default() {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// Reaps every finished child (orphans reparented to us included) and returns the command's
/// own exit once it has one.
fn reap(child_pid: i32) -> Option<ExitInfo> {
    let mut exit = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return exit;
        }
        if pid == child_pid {
            exit = Some(if libc::WIFSIGNALED(status) {
                ExitInfo::signaled(libc::WTERMSIG(status))
            } else {
                ExitInfo::exited(libc::WEXITSTATUS(status))
            });
        }
    }
}

/// A kernel-log OOM kill of one of the tree's processes since the run started.
fn kernel_log_kill(pids: &HashSet<i32>, started_unix: f64) -> Result<Option<String>, String> {
    let log = headroom_probe::kernel_log::read().map_err(|e| {
        format!("no cgroup watched this run and {e}, so an OOM kill cannot be confirmed")
    })?;
    Ok(headroom_diagnose::kills_in_log(&log)
        .into_iter()
        .filter(|logged| {
            let pid = logged.kill.victim.as_ref().and_then(|victim| victim.pid);
            pid.is_some_and(|pid| pids.contains(&(pid as i32)))
        })
        // Keep kills from after the run started, with a second of slack for clock granularity.
        .filter(|logged| {
            logged
                .unix_s
                .is_none_or(|unix_s| unix_s >= started_unix - 1.0)
        })
        .map(|logged| logged.kill.evidence)
        .next_back())
}
