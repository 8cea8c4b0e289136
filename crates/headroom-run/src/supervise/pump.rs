//! CMD's output: copied to ours byte for byte, scanned for stage starts, its tail kept for
//! classifying a failure, sharing the terminal with the live status line.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::stages::{StageDetector, StageScanner, StageStart};
use headroom_process::OUTPUT_AFTER_EXIT;

/// How much of the command's output is kept for classifying a failure.
const TAIL_BYTES: usize = 256 * 1024;
/// The pipe size asked for CMD's stdout and stderr, and the most read from one at a time.
const PIPE_BYTES: usize = 1 << 20;

/// What the pumps tell the supervising loop.
pub(super) enum Event {
    Stage(StageStart),
    /// One of CMD's streams has ended.
    Closed,
}

/// The shared terminal: the live status line and the passed-through output take turns.
pub(super) struct Terminal {
    lock: Mutex<()>,
    status_visible: AtomicBool,
    status_enabled: bool,
    /// CMD's last output ended a line. The status line is drawn only then, so it never erases
    /// a partial line such as CMD's own `\r` progress bar.
    at_line_start: AtomicBool,
}

impl Terminal {
    /// Whether a status line may be drawn now: on a terminal, between CMD's lines.
    pub fn may_show_status(&self) -> bool {
        self.status_enabled && self.at_line_start.load(Ordering::SeqCst)
    }

    /// Draws `line` as the status line, replacing the one before.
    pub fn show_status(&self, line: &str) {
        let _guard = self.lock.lock();
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
        self.status_visible.store(true, Ordering::SeqCst);
    }

    fn clear_status(&self, stderr: &mut impl Write) {
        if self.status_visible.swap(false, Ordering::SeqCst) {
            let _ = stderr.write_all(b"\r\x1b[2K");
        }
    }
}

/// The two threads that copy CMD's stdout and stderr.
pub(super) struct Pumps {
    pub terminal: Arc<Terminal>,
    pub events: Receiver<Event>,
    stdout_tail: Arc<Mutex<Vec<u8>>>,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// Streams not yet ended.
    open: usize,
}

impl Pumps {
    /// Starts copying `child`'s piped stdout and stderr; stage times count from `started`.
    pub fn start(child: &mut Child, detector: &StageDetector, started: Instant) -> Pumps {
        let terminal = Arc::new(Terminal {
            lock: Mutex::new(()),
            status_visible: AtomicBool::new(false),
            status_enabled: std::io::stderr().is_terminal(),
            at_line_start: AtomicBool::new(true),
        });
        let (events, received) = mpsc::channel();
        let stdout_tail = Arc::new(Mutex::new(Vec::new()));
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let pump = |is_stderr, tail: &Arc<Mutex<Vec<u8>>>| Pump {
            is_stderr,
            detector: detector.clone(),
            started,
            events: events.clone(),
            tail: Arc::clone(tail),
            terminal: Arc::clone(&terminal),
        };
        if let Some(stdout) = child.stdout.take() {
            pump(false, &stdout_tail).spawn(stdout);
        }
        if let Some(stderr) = child.stderr.take() {
            pump(true, &stderr_tail).spawn(stderr);
        }
        Pumps {
            terminal,
            events: received,
            stdout_tail,
            stderr_tail,
            open: 2,
        }
    }

    /// One of the streams has ended ([`Event::Closed`]).
    pub fn one_closed(&mut self) {
        self.open -= 1;
    }

    /// Both pumps are gone (their channel is disconnected).
    pub fn all_closed(&mut self) {
        self.open = 0;
    }

    /// After CMD has exited: waits at most [`OUTPUT_AFTER_EXIT`] for output written just before its
    /// exit, and the stage lines in it, which go to `stage_starts`; then clears the status.
    pub fn drain(&mut self, stage_starts: &mut Vec<StageStart>) {
        let until = Instant::now() + OUTPUT_AFTER_EXIT;
        while self.open > 0 {
            match self
                .events
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(Event::Stage(start)) => stage_starts.push(start),
                Ok(Event::Closed) => self.open -= 1,
                Err(_) => break,
            }
        }
        let _guard = self.terminal.lock.lock();
        self.terminal.clear_status(&mut std::io::stderr());
    }

    /// The last part of stdout followed by the last part of stderr.
    pub fn output_tail(&self) -> Vec<u8> {
        let mut tail = take(&self.stdout_tail);
        tail.extend(take(&self.stderr_tail));
        tail
    }
}

/// The thread that copies one of CMD's streams, and what it shares.
struct Pump {
    is_stderr: bool,
    detector: StageDetector,
    started: Instant,
    events: Sender<Event>,
    tail: Arc<Mutex<Vec<u8>>>,
    terminal: Arc<Terminal>,
}

impl Pump {
    /// Copies `source` to ours, byte for byte, scanning it for stage starts and keeping the
    /// tail for classification. When ours has no reader any more, it stops reading and closes
    /// CMD's end, so CMD gets SIGPIPE (or EPIPE) as it would have writing there itself.
    fn spawn(self, source: impl Read + AsRawFd + Send + 'static) {
        std::thread::spawn(move || {
            let mut source = source;
            widen_pipe(&source);
            let mut scanner = StageScanner::new(self.detector);
            let mut send_stage = |name| {
                let t = self.started.elapsed().as_secs_f64();
                let _ = self.events.send(Event::Stage(StageStart { t, name }));
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
                // Only a reader gone away ends the pump: CMD would have got SIGPIPE. Other
                // errors (a closed descriptor, a full disk) CMD would have got as errors and
                // gone on.
                if let Err(e) = pass_through(chunk, self.is_stderr, &self.terminal) {
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        break;
                    }
                }
                keep_tail(&self.tail, chunk);
                scanner.feed(chunk, &mut send_stage);
            }
            drop(source);
            if let Some(name) = scanner.finish() {
                send_stage(name);
            }
            let _ = self.events.send(Event::Closed);
        });
    }
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
