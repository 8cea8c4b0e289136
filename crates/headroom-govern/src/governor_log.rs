//! The governor's log, followed by its sessions. A governor outlives the session that
//! started it, so it must not hold that session's terminal or pipes: it writes everything,
//! at debug level, to a log file beside its socket, and each session's CLI copies the lines
//! written while it lives to its own stderr, at its own verbosity (`-v`, `HEADROOM_LOG`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The variable that sets the log's level, in the governor as in every headroom process.
pub const LOG_ENV: &str = "HEADROOM_LOG";
/// The governor always logs this much; each session picks what it shows.
pub const GOVERNOR_LEVEL: &str = "debug";
/// How often a session looks for new lines.
const POLL: Duration = Duration::from_millis(100);

/// The levels of `tracing`, least verbose first.
const LEVELS: [&str; 5] = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];

/// Follows the governor's log from where it ends now, copying new lines to stderr.
pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Follower {
    /// Starts following `log` from its present end.
    pub fn start(log: &Path) -> Follower {
        let from = std::fs::metadata(log).map_or(0, |meta| meta.len());
        let shown = shown_levels(std::env::var(LOG_ENV).ok().as_deref());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (log, stop) = (log.to_path_buf(), Arc::clone(&stop));
            std::thread::spawn(move || follow(&log, from, shown, &stop))
        };
        Follower {
            stop,
            thread: Some(thread),
        }
    }

    /// Copies what is left and stops.
    pub fn finish(self) {}
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // Woken at once: a session's end never waits out a poll.
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// How many of [`LEVELS`] a session with `HEADROOM_LOG` set to `filter` shows: warnings and
/// errors by default, information at `info` (`-v`), everything at `debug` (`-vv`).
fn shown_levels(filter: Option<&str>) -> usize {
    let filter = filter.unwrap_or("").to_ascii_lowercase();
    if filter.contains("trace") {
        5
    } else if filter.contains("debug") {
        4
    } else if filter.contains("info") {
        3
    } else {
        2
    }
}

/// Whether a session that shows `shown` levels shows `line`: a line of `tracing`'s format
/// (`TIME  LEVEL target: message`) by its level; any other line (what the governor says to
/// users) always.
fn shows(line: &str, shown: usize) -> bool {
    let level = line.split_whitespace().nth(1);
    match level.and_then(|level| LEVELS.iter().position(|known| *known == level)) {
        Some(rank) => rank < shown,
        None => true,
    }
}

/// Copies the lines of `log` past byte `from` that `shown` levels let through, until `stop`
/// is set and nothing is left to read. The file stays open: a governor that leaves removes
/// its log, and its last lines are still read. A new governor's log, under the same name,
/// is read from its start.
fn follow(log: &Path, mut from: u64, shown: usize, stop: &AtomicBool) {
    use std::os::unix::fs::MetadataExt;
    let mut open: Option<(File, u64)> = None;
    let mut partial = String::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if let Some((file, _)) = open.as_mut() {
            // A log begun afresh in place (a new governor truncated it).
            if file.metadata().is_ok_and(|meta| meta.len() < from) {
                from = 0;
            }
            let mut bytes = Vec::new();
            if file.seek(SeekFrom::Start(from)).is_ok() && file.read_to_end(&mut bytes).is_ok() {
                from += bytes.len() as u64;
                partial.push_str(&String::from_utf8_lossy(&bytes));
                while let Some(end) = partial.find('\n') {
                    let line: String = partial.drain(..=end).collect();
                    if shows(&line, shown) {
                        headroom_output::say!("{}", line.trim_end());
                    }
                }
            }
        }
        let at_path = std::fs::metadata(log).ok().map(|meta| meta.ino());
        let current = open.as_ref().map(|&(_, ino)| ino);
        if at_path.is_some() && at_path != current {
            // The log appeared, or a new governor's replaced the one read to its end above.
            if let Ok(file) = File::open(log) {
                if open.is_some() {
                    from = 0;
                }
                let ino = file.metadata().map_or(0, |meta| meta.ino());
                open = Some((file, ino));
                continue;
            }
        }
        if stopping {
            return;
        }
        std::thread::park_timeout(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_by_the_sessions_verbosity_and_users_lines_always() {
        let info = "2026-11-27T14:51:02.123456Z  INFO headroom_sched::driver: start job 3";
        let debug = "2026-11-27T14:51:02.123456Z DEBUG headroom_sched::driver: job 3 offered";
        let warn = "2026-11-27T14:51:02.123456Z  WARN headroom_govern::outside: stopping 42";
        let said = "headroom: warning: farm node a:1 is unreachable";
        let quiet = shown_levels(None);
        assert!(shows(warn, quiet) && shows(said, quiet));
        assert!(!shows(info, quiet) && !shows(debug, quiet));
        let verbose = shown_levels(Some("info"));
        assert!(shows(info, verbose) && !shows(debug, verbose));
        assert!(shows(debug, shown_levels(Some("debug"))));
    }
}
