//! Telling a governor that is busy from one that is hung, so that nothing ever waits on it
//! without a bound (headroom must never be why a build stalls).
//!
//! While the governor makes progress it sends [`Reply::Alive`] to every connection each
//! [`HEARTBEAT`]; its heartbeat thread first takes the governor's state lock, so a governor
//! stopped (`SIGSTOP`), deadlocked or stuck on I/O under that lock falls silent. A shim or the
//! CLI that hears nothing for the silence bound ([`silence_bound`]) takes the governor for
//! hung: a shim then runs its compiler ungoverned and records it in the session's ledger
//! ([`Ledger`]), which the CLI counts at the end; the CLI stops waiting for the governor's
//! report and ends it.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use headroom_sched::SessionId;

use crate::protocol::{read_frame_up_to, Reply, MAX_FRAME};

/// How often the governor tells every connection that it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// How long a shim or the CLI waits without a word from the governor before taking it for
/// hung, unless [`SILENCE_ENV`] says otherwise: twenty heartbeats, so a governor descheduled
/// for seconds on a loaded machine is not taken for hung.
const DEFAULT_SILENCE: Duration = Duration::from_secs(10);
/// Milliseconds of silence after which the governor counts as hung (for tests).
pub const SILENCE_ENV: &str = "HEADROOM_GOVERNOR_SILENCE_MS";

/// How long the governor may stay silent before it counts as hung.
pub fn silence_bound() -> Duration {
    std::env::var(SILENCE_ENV)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(DEFAULT_SILENCE, Duration::from_millis)
}

/// Whether an error from a read with the silence bound as its timeout means the governor
/// stayed silent (rather than went away).
pub fn is_silence(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Connects to the governor's socket without ever blocking for long: a governor that stopped
/// accepting has a full backlog, where a plain `connect` would wait for good. A full backlog
/// is retried until `bound` has passed, then reported as [`io::ErrorKind::WouldBlock`].
/// The stream returned reads with `bound` as its timeout.
pub fn connect(socket: &Path, bound: Duration) -> io::Result<UnixStream> {
    use rustix::net::{socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let address = SocketAddrUnix::new(socket)?;
    let deadline = Instant::now() + bound;
    loop {
        let fd = socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        match rustix::net::connect(&fd, &address) {
            Ok(()) => {
                let stream = UnixStream::from(fd);
                stream.set_nonblocking(false)?;
                stream.set_read_timeout(Some(bound))?;
                return Ok(stream);
            }
            Err(rustix::io::Errno::AGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Reads the governor's next answer, passing over its heartbeats. With the stream's read
/// timeout set to the silence bound, a governor that says nothing for that long ends the
/// wait with an error for which [`is_silence`] holds.
pub fn read_reply(stream: impl Read) -> io::Result<Reply> {
    read_reply_up_to(stream, MAX_FRAME)
}

/// [`read_reply`], for a reply that may be up to `limit` bytes (the build's report).
pub fn read_reply_up_to(mut stream: impl Read, limit: u32) -> io::Result<Reply> {
    loop {
        match read_frame_up_to::<Reply>(&mut stream, limit)? {
            Reply::Alive => continue,
            reply => return Ok(reply),
        }
    }
}

/// The session's record of compiler calls that ran ungoverned because the governor was
/// silent: a file beside the socket, one line per call, appended by shims. The first shim to
/// write it tells the user, so the build says it once.
pub struct Ledger {
    path: PathBuf,
}

impl Ledger {
    /// The ledger of session `session` of the governor that listens on `socket`.
    pub fn of(socket: &Path, session: SessionId) -> Ledger {
        let mut path = socket.as_os_str().to_owned();
        path.push(format!(".{session}.ungoverned"));
        Ledger {
            path: PathBuf::from(path),
        }
    }

    /// Records that `compiler` ran ungoverned; returns whether this was the first record
    /// (whoever gets `true` tells the user).
    pub fn record(&self, compiler: &Path) -> bool {
        let first = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path)
            .is_ok();
        if let Ok(mut file) = OpenOptions::new().append(true).open(&self.path) {
            // One write per line: appends of a few bytes never interleave.
            let _ = file.write_all(format!("{}\n", compiler.display()).as_bytes());
        }
        first
    }

    /// How long a new call waits for the governor: the silence bound, or, once a call of
    /// this session has found the governor silent, two heartbeats. A governor that is alive
    /// again answers that soon; one still hung must not cost every later call the whole bound.
    pub fn patience(&self) -> Duration {
        let bound = silence_bound();
        if self.path.exists() {
            bound.min(2 * HEARTBEAT)
        } else {
            bound
        }
    }

    /// How many calls ran ungoverned.
    pub fn count(&self) -> usize {
        std::fs::read(&self.path)
            .map(|text| text.iter().filter(|&&byte| byte == b'\n').count())
            .unwrap_or(0)
    }

    /// Removes the ledger, with its session.
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::write_frame;
    use std::os::unix::net::UnixListener;

    #[test]
    fn heartbeats_are_passed_over_and_silence_is_told_from_a_closed_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s");
        let listener = UnixListener::bind(&socket).unwrap();
        let stream = connect(&socket, Duration::from_millis(300)).unwrap();
        let (governor, _) = listener.accept().unwrap();
        write_frame(&governor, &Reply::Alive).unwrap();
        write_frame(&governor, &Reply::Alive).unwrap();
        write_frame(&governor, &Reply::Done).unwrap();
        assert_eq!(read_reply(&stream).unwrap(), Reply::Done);
        let silent = read_reply(&stream).unwrap_err();
        assert!(is_silence(&silent), "{silent:?}");
        drop(governor);
        let gone = read_reply(&stream).unwrap_err();
        assert!(!is_silence(&gone), "{gone:?}");
    }

    #[test]
    fn a_listener_that_never_accepts_does_not_hold_a_connect_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s");
        let _listener = UnixListener::bind(&socket).unwrap();
        let bound = Duration::from_millis(200);
        let started = Instant::now();
        // The backlog fills; a blocking connect would then wait for good.
        let held: Vec<_> = std::iter::from_fn(|| connect(&socket, bound).ok())
            .take(10_000)
            .collect();
        assert!(held.len() < 10_000, "the backlog never filled");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn the_ledger_counts_calls_and_names_one_first() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::of(&dir.path().join("governor.sock"), 7);
        assert_eq!(ledger.patience(), silence_bound());
        assert!(ledger.record(Path::new("/usr/bin/g++")));
        assert!(!ledger.record(Path::new("/usr/bin/g++")));
        assert!(ledger.patience() <= 2 * HEARTBEAT);
        assert_eq!(ledger.count(), 2);
        ledger.remove();
        assert_eq!(ledger.count(), 0, "removed");
    }
}
