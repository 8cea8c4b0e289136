//! Writes a running build into the history from a thread of its own, so that nothing a build
//! waits for (an admission, a compiler's result) ever waits on SQLite: another process may hold
//! the history's lock for minutes, or its disk may fill. What cannot be written is kept and
//! tried again; at the build's end the recorder gets a grace period, and then says once what
//! never reached the history. The build's summary does not depend on it: the governor keeps
//! the build's report in memory.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use headroom_sched::Profile;

use crate::history::{History, StoreError};
use headroom_report::{JobEvent, JobRecord, OutsideProcess, Room, Sample};

/// How long the recorder waits before trying again what it could not write.
const RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// A finished job not yet in the history: its row, its portable key and its profile.
#[derive(Debug, Clone)]
pub struct Unwritten {
    pub record: JobRecord,
    pub portable_key: String,
    pub profile: Option<Profile>,
}

/// What a running build has to write: [`History::record_batch`] writes it in one transaction.
#[derive(Debug, Default)]
pub struct Batch {
    pub jobs: Vec<Unwritten>,
    pub samples: Vec<Sample>,
    pub events: Vec<JobEvent>,
    pub room: Vec<Room>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.samples.is_empty()
            && self.events.is_empty()
            && self.room.is_empty()
    }

    fn add(&mut self, other: Batch) {
        self.jobs.extend(other.jobs);
        self.samples.extend(other.samples);
        self.events.extend(other.events);
        self.room.extend(other.room);
    }
}

/// How a build ended, for its row.
#[derive(Debug, Clone)]
pub struct Ending {
    pub outside: Vec<OutsideProcess>,
    pub duration_ms: u64,
    pub exit_code: Option<i32>,
    pub peak_total: u64,
}

enum Message {
    Write(Batch),
    End(Ending),
}

/// What the writing thread has done so far, for the end.
#[derive(Debug, Default)]
struct Progress {
    jobs_given: usize,
    jobs_written: usize,
    /// The first error a write met; the later ones are most often the same.
    first_error: Option<String>,
}

/// What of a build never reached the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrecorded {
    pub history: String,
    /// Jobs not written, of all the build's jobs.
    pub jobs: usize,
    pub of_jobs: usize,
    /// Why, as the first failed write said; `None` when no write had failed yet (it was still
    /// waiting for the history's lock).
    pub why: Option<String>,
}

impl std::fmt::Display for Unrecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = self
            .why
            .as_deref()
            .unwrap_or("another process held its lock to the end");
        write!(
            f,
            "the history {} did not take all of this build ({why}): ",
            self.history
        )?;
        if self.jobs > 0 {
            write!(
                f,
                "{} of its {} jobs are not in it, so the next build predicts them as if they \
                 had never run, and ",
                self.jobs, self.of_jobs
            )?;
        }
        write!(
            f,
            "`headroom report` shows it incomplete (this summary comes from memory)"
        )
    }
}

/// The writing thread of one build, and what is sent to it.
pub struct Recorder {
    send: Sender<Message>,
    progress: Arc<Mutex<Progress>>,
    /// Answers once the end is written, or with why it cannot be.
    ended: Receiver<Result<(), String>>,
    history: String,
}

impl Recorder {
    /// Starts writing build `build_id` into `history`, from a thread of its own.
    pub fn start(mut history: History, build_id: i64) -> Recorder {
        let (send, receive) = channel();
        let (tell_ended, ended) = channel();
        let progress = Arc::new(Mutex::new(Progress::default()));
        let shown = history.path().display().to_string();
        let writer = Arc::clone(&progress);
        std::thread::spawn(move || {
            let ended = write_until_ended(&mut history, build_id, &receive, &writer);
            let _ = tell_ended.send(ended);
        });
        Recorder {
            send,
            progress,
            ended,
            history: shown,
        }
    }

    /// Hands over a finished job; never waits.
    pub fn job(&self, job: Unwritten) {
        lock(&self.progress).jobs_given += 1;
        let _ = self.send.send(Message::Write(Batch {
            jobs: vec![job],
            ..Batch::default()
        }));
    }

    /// Hands over what the sampler saw; never waits.
    pub fn samples(&self, samples: Vec<Sample>, events: Vec<JobEvent>, room: Vec<Room>) {
        let _ = self.send.send(Message::Write(Batch {
            samples,
            events,
            room,
            ..Batch::default()
        }));
    }

    /// Hands over how the build ended and waits, at most `grace`, until everything is written;
    /// else says what is not.
    pub fn finish(self, ending: Ending, grace: Duration) -> Result<(), Unrecorded> {
        let _ = self.send.send(Message::End(ending));
        let ended = self
            .ended
            .recv_timeout(grace)
            .unwrap_or_else(|_| Err(String::new()));
        let progress = lock(&self.progress);
        ended.map_err(|why| Unrecorded {
            history: self.history.clone(),
            jobs: progress.jobs_given - progress.jobs_written,
            of_jobs: progress.jobs_given,
            why: progress
                .first_error
                .clone()
                .or_else(|| Some(why).filter(|why| !why.is_empty())),
        })
    }
}

/// The writing thread: writes what arrives, keeps what it could not write and tries it again,
/// until the build's end is written. Gives up on an error other than a busy history once the
/// end has arrived: nothing would change it before the governor exits.
fn write_until_ended(
    history: &mut History,
    build_id: i64,
    receive: &Receiver<Message>,
    progress: &Mutex<Progress>,
) -> Result<(), String> {
    let mut pending = Batch::default();
    let mut ending: Option<Ending> = None;
    loop {
        let first = if pending.is_empty() && ending.is_none() {
            receive.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            receive.recv_timeout(RETRY_INTERVAL)
        };
        let messages = match first {
            Ok(message) => std::iter::once(message)
                .chain(receive.try_iter())
                .collect::<Vec<_>>(),
            Err(RecvTimeoutError::Timeout) => Vec::new(),
            // The governor is gone without an end: nothing more will come.
            Err(RecvTimeoutError::Disconnected) if ending.is_none() => {
                return Err("the governor stopped before the build's end".into())
            }
            Err(RecvTimeoutError::Disconnected) => Vec::new(),
        };
        for message in messages {
            match message {
                Message::Write(batch) => pending.add(batch),
                Message::End(end) => ending = Some(end),
            }
        }
        let written = if pending.is_empty() {
            Ok(())
        } else {
            history.record_batch(build_id, &pending).map(|()| {
                lock(progress).jobs_written += pending.jobs.len();
                pending = Batch::default();
            })
        };
        let written = written.and_then(|()| match &ending {
            Some(end) => record_end(history, build_id, end).map(|()| true),
            None => Ok(false),
        });
        match written {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(err) => {
                let busy = err.is_busy();
                let why = err.to_string();
                lock(progress).first_error.get_or_insert(why.clone());
                if ending.is_some() && !busy {
                    return Err(why);
                }
            }
        }
    }
}

fn record_end(history: &mut History, build_id: i64, end: &Ending) -> Result<(), StoreError> {
    history.record_outside(build_id, &end.outside)?;
    history.finish_build(build_id, end.duration_ms, end.exit_code, end.peak_total)
}

fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::tests::{build, job};

    fn ending() -> Ending {
        Ending {
            outside: Vec::new(),
            duration_ms: 1000,
            exit_code: Some(0),
            peak_total: 5,
        }
    }

    fn unwritten(job_id: u64) -> Unwritten {
        Unwritten {
            record: job(job_id, &format!("k{job_id}"), 100),
            portable_key: "-".into(),
            profile: None,
        }
    }

    /// A history in a directory of its own (kept while the returned guard lives) with a build
    /// begun in it: the directory, the history's path, the history and the build's id.
    fn begun() -> (tempfile::TempDir, std::path::PathBuf, History, i64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let history = History::open(&path).unwrap();
        let id = history.begin_build(&build()).unwrap();
        (dir, path, history, id)
    }

    #[test]
    fn everything_handed_over_is_written() {
        let (_dir, path, history, id) = begun();
        let recorder = Recorder::start(history, id);
        for job_id in 0..3 {
            recorder.job(unwritten(job_id));
        }
        recorder.samples(
            vec![Sample {
                t_ms: 1,
                job_id: 0,
                bytes: 7,
            }],
            Vec::new(),
            Vec::new(),
        );
        recorder.finish(ending(), Duration::from_secs(60)).unwrap();
        let report = History::open(&path).unwrap().load_build(id).unwrap();
        assert_eq!(report.jobs.len(), 3);
        assert_eq!(report.samples.len(), 1);
        assert_eq!(report.build.exit_code, Some(0));
    }

    /// A history another process holds locked: handing over never waits, the end waits only
    /// the grace, and says what is missing; what was kept is written once the lock is gone.
    #[test]
    fn a_locked_history_costs_no_wait_and_is_written_when_it_can_be() {
        let (_dir, path, history, id) = begun();
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();

        let recorder = Recorder::start(history, id);
        let start = std::time::Instant::now();
        for job_id in 0..40 {
            recorder.job(unwritten(job_id));
        }
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        let unrecorded = recorder
            .finish(ending(), Duration::from_millis(300))
            .unwrap_err();
        assert_eq!((unrecorded.jobs, unrecorded.of_jobs), (40, 40));
        let told = unrecorded.to_string();
        assert!(told.contains("40 of its 40 jobs are not in it"), "{told}");
        holder.execute_batch("ROLLBACK").unwrap();
    }

    #[test]
    fn kept_writes_go_in_once_the_lock_is_released() {
        let (_dir, path, history, id) = begun();
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let recorder = Recorder::start(history, id);
        recorder.job(unwritten(0));
        // Released while the recorder waits: it then writes everything, the end included.
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            holder.execute_batch("ROLLBACK").unwrap();
        });
        recorder.finish(ending(), Duration::from_secs(60)).unwrap();
        release.join().unwrap();
        let report = History::open(&path).unwrap().load_build(id).unwrap();
        assert_eq!(
            (report.jobs.len(), report.build.duration_ms),
            (1, Some(1000))
        );
    }
}
