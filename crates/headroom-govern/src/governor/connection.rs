//! The governor's connections: a thread per connected shim or CLI, reused from one to the
//! next; reading requests and sending replies; sessions joining, being adopted, asking how
//! they stand, and leaving; and the heartbeat that tells every connection the governor lives.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headroom_process::signal_group;
use headroom_process::slice::Slice;
use headroom_sched::{Driver, Job, JobId, JobState, Limits, SessionId};

use crate::liveness::HEARTBEAT;
use crate::protocol::{
    read_frame, write_frame, BuildStatus, GovernorConfig, GovernorStatus, LiveJob, Reply, Request,
    SessionStatus, Waiting, PROTOCOL,
};

use super::record::{learn_from, open_history, Past};
use super::sampler::started_jobs;
use super::state::{held_by, new_session, shared_limits, JobIo, SessionState, State};
use super::{lock_ignoring_poison, Governor};

/// How long a session's end waits for the reports of its jobs that ended just before its build.
const REPORT_GRACE: Duration = Duration::from_secs(2);

/// The writing ends of the open connections, which the heartbeat reaches as well as each
/// connection's own thread: a connection's frames are written one at a time, never mixed.
#[derive(Default)]
pub(super) struct Connections {
    pub(super) next: AtomicU64,
    pub(super) open: Mutex<HashMap<u64, Writer>>,
}

pub(super) type Writer = Arc<Mutex<UnixStream>>;

impl Connections {
    /// Registers `stream`; returns its key and its writing end.
    pub(super) fn open(&self, stream: &UnixStream) -> io::Result<(u64, Writer)> {
        let writer = Arc::new(Mutex::new(stream.try_clone()?));
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        lock_ignoring_poison(&self.open).insert(key, Arc::clone(&writer));
        Ok((key, writer))
    }

    fn close(&self, key: u64) {
        lock_ignoring_poison(&self.open).remove(&key);
    }

    fn writers(&self) -> Vec<Writer> {
        lock_ignoring_poison(&self.open).values().cloned().collect()
    }
}

/// Writes `reply` on a connection.
pub(super) fn send(writer: &Writer, reply: &Reply) -> io::Result<()> {
    write_frame(&*lock_ignoring_poison(writer), reply)
}

/// The threads that talk with shims, one per connected shim. A thread whose shim is done
/// waits for the next connection: every compiler call waits for the governor's first reply,
/// and starting a thread costs about 60 µs on our VMs where waking one costs a few
/// (BENCHMARKS.md, "Cost of interception").
pub(super) struct Handlers {
    /// Connections for idle threads. Only the accepting thread sends, and only after it has
    /// counted an idle thread off `idle`, so a connection never waits for a busy thread.
    pub(super) send: Sender<UnixStream>,
    pub(super) queue: Arc<Mutex<Receiver<UnixStream>>>,
    pub(super) idle: Arc<AtomicUsize>,
    /// The slice the governor had before its accepting thread shortened it, which the threads
    /// inherit; `None` where the kernel has no per-task slices.
    pub(super) build_slice: Option<Slice>,
}

impl Handlers {
    pub(super) fn new(build_slice: Option<Slice>) -> Handlers {
        let (send, receive) = std::sync::mpsc::channel();
        Handlers {
            send,
            queue: Arc::new(Mutex::new(receive)),
            idle: Arc::default(),
            build_slice,
        }
    }

    /// Gives `stream` to an idle thread, or to a new one when none is idle.
    pub(super) fn hand(&self, stream: UnixStream, governor: &Arc<Governor>) {
        let idle_one = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |idle| {
                idle.checked_sub(1)
            });
        if idle_one.is_ok() {
            self.send
                .send(stream)
                .expect("idle threads hold the receiver");
            return;
        }
        let (governor, queue, idle, build_slice) = (
            Arc::clone(governor),
            Arc::clone(&self.queue),
            Arc::clone(&self.idle),
            self.build_slice,
        );
        std::thread::spawn(move || {
            let mut stream = stream;
            loop {
                governor.handle(stream, build_slice);
                idle.fetch_add(1, Ordering::SeqCst);
                let next = queue.lock().ok().and_then(|queue| queue.recv().ok());
                match next {
                    Some(next) => stream = next,
                    None => return,
                }
            }
        });
    }
}

/// A job that has not ended, for `headroom status -v`.
fn live_job(job: &Job) -> LiveJob {
    let state = match job.state {
        JobState::Queued => "waiting",
        JobState::Killed => "requeued",
        _ if job.suspended() => "stopped",
        _ => "running",
    };
    LiveJob {
        label: job.label.clone(),
        state: state.to_string(),
        predicted: job.estimate.peak,
        peak: job.peak,
    }
}

/// How session `id` stands; its jobs that wait because other sessions hold the slots or the
/// memory they need say so.
fn session_status(state: &State, id: SessionId) -> BuildStatus {
    let limits = state.driver.limits();
    let own = state
        .jobs
        .iter()
        .filter(|(_, io)| io.session == id)
        .map(|(&job_id, _)| job_id);
    let (used, done) = state.sessions.get(&id).map_or((0, 0), |s| {
        (s.used, s.report.jobs.len() + s.unwritten_jobs.len())
    });
    let mut status = build_status(&state.driver, own, done, used, limits);
    // A session whose jobs wait while only other sessions' run waits for those, whatever
    // its own jobs alone would say; one whose own job runs alone waits for that.
    if status.waiting > 0 && status.waiting_for != Some(Waiting::Alone) {
        let others = |io: &JobIo| io.session != id;
        let jobs = started_jobs(state, others).count();
        if jobs > 0 {
            status.waiting_for = Some(Waiting::OtherSessions {
                jobs,
                held: held_by(state, others),
            });
        }
    }
    status
}

/// How a build stands whose jobs not yet over are `live` (known to `driver`), with `done` jobs
/// over and `used` bytes in use. Why jobs wait is told from the jobs alone: a job that runs
/// or waits to run alone holds every other back; otherwise full slots do; otherwise memory,
/// where the smallest waiting job does not fit.
fn build_status(
    driver: &Driver,
    live: impl Iterator<Item = JobId>,
    done: usize,
    used: u64,
    limits: Limits,
) -> BuildStatus {
    let jobs: Vec<&Job> = live.filter_map(|id| driver.job(id)).collect();
    let started = |job: &&&Job| {
        matches!(
            job.state,
            JobState::Admitted { .. } | JobState::Running { .. }
        )
    };
    let waiting: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|job| matches!(job.state, JobState::Queued | JobState::Killed))
        .collect();
    let running_here = jobs
        .iter()
        .filter(started)
        .filter(|job| job.node.is_none())
        .count();
    let anything_started = jobs.iter().any(|job| started(&job));
    let waiting_for = if waiting.is_empty() || !anything_started {
        None
    } else if jobs.iter().any(|job| job.alone) {
        Some(Waiting::Alone)
    } else if running_here >= limits.slots {
        Some(Waiting::Slots)
    } else {
        waiting
            .iter()
            .map(|job| job.estimate.peak)
            .min()
            .map(|need| Waiting::Memory { need })
    };
    BuildStatus {
        running: jobs
            .iter()
            .filter(started)
            .filter(|job| !job.suspended())
            .count(),
        stopped: jobs.iter().filter(|job| job.suspended()).count(),
        waiting: waiting.len(),
        done,
        used,
        budget: limits.budget,
        slots: limits.slots,
        waiting_for,
    }
}

impl Governor {
    /// Serves one connection on a thread that answers compiler calls on the short slice.
    fn handle(&self, stream: UnixStream, build_slice: Option<Slice>) {
        match read_frame::<Request>(&stream) {
            // A session's thread answers no compiler call for as long as its build runs, and
            // starts the session's history writer, which must not preempt the build's work
            // each time a job ends: both have the slice the build has.
            Ok(Request::Join {
                config,
                root,
                protocol: PROTOCOL,
            }) => {
                let serve = || self.serve_session(*config, root, &stream);
                match build_slice {
                    Some(slice) => slice.while_given_back(serve),
                    None => serve(),
                }
            }
            // A CLI of another version, whose shims would not understand this governor:
            // closing refuses it, and it runs a governor of its own.
            Ok(Request::Join { protocol, .. }) => {
                tracing::warn!("a session of protocol {protocol} was refused (this is {PROTOCOL})")
            }
            Ok(Request::Job {
                session,
                compiler,
                args,
                cwd,
            }) => {
                let (key, writer) = match self.connections.open(&stream) {
                    Ok(opened) => opened,
                    Err(err) => return tracing::warn!("cannot take a connection: {err}"),
                };
                // A session this governor does not know (one whose governor was replaced)
                // has its compiler run as if there were no governor: closing says so.
                if let Some(id) = self.offer(session, compiler, &args, cwd) {
                    if self.supervise(id, &stream, &writer).is_err() {
                        self.abandon(id);
                    }
                }
                self.connections.close(key);
            }
            Ok(Request::Status { session }) => {
                // A CLI that has stopped waiting for the answer is no matter.
                let status = self.status(session);
                let _ = write_frame(&stream, &Reply::Status(status));
            }
            Ok(Request::Sessions) => {
                let _ = write_frame(&stream, &Reply::Sessions(self.sessions_status()));
            }
            Ok(other) => tracing::warn!("unexpected first message {other:?}"),
            Err(err) => tracing::debug!("connection closed before a request: {err}"),
        }
    }

    /// Runs one session from its join to its end, on its CLI's connection: the session ends
    /// when the CLI asks, or when the connection closes (the CLI died).
    fn serve_session(&self, config: GovernorConfig, root: i32, stream: &UnixStream) {
        let (id, warnings) = self.join(config, root);
        let joined = Reply::Joined {
            session: id,
            governor: std::process::id(),
            warnings,
            protocol: PROTOCOL,
            cpu_group: self.cpu_group(),
        };
        if write_frame(stream, &joined).is_err() {
            return self.end_session(id, None, false, None);
        }
        match read_frame::<Request>(stream) {
            Ok(Request::Shutdown {
                exit_code,
                kill_jobs,
            }) => {
                // Heartbeats from here on: the end may take the history's grace.
                let opened = self.connections.open(stream);
                let writer = opened.as_ref().ok().map(|(_, writer)| writer);
                self.end_session(id, exit_code, kill_jobs, writer);
                if let Ok((key, _)) = opened {
                    self.connections.close(key);
                }
            }
            other => {
                tracing::info!("session {id} ended without a shutdown: {other:?}");
                self.end_session(id, None, false, None);
            }
        }
    }

    /// Begins a session whose CLI is `root`: its build in the history, and the shared limits.
    /// Returns its id (the one its config asks for when free, else `root`) and what its user
    /// must hear.
    pub(super) fn join(&self, config: GovernorConfig, root: i32) -> (SessionId, Vec<String>) {
        let mut warnings = Vec::new();
        self.lock().sessions_joining += 1;
        let past = open_history(&config, &mut warnings);
        let mut state = self.lock();
        state.sessions_joining -= 1;
        let id = config
            .session_id
            .filter(|wanted| !state.sessions.contains_key(wanted))
            .unwrap_or(root as SessionId);
        if !state.warmed {
            learn_from(&mut state.driver, &past);
            state.warmed = true;
        }
        let session = SessionState {
            used_elsewhere_at_start: state.elsewhere.used,
            ..new_session(config, root, past)
        };
        tracing::info!(
            "session {id} joined: {} ({} sessions)",
            session.config.command,
            state.sessions.len() + 1
        );
        state.sessions.insert(id, session);
        self.share_limits(&mut state);
        (id, warnings)
    }

    /// Takes on session `id`, which joined a governor that has died since: its build goes on,
    /// and its compilers come here now. It is governed with the first session's settings and
    /// without history, and ends when its CLI (whose process id is the session's) does.
    /// `None` when that CLI is gone too.
    pub(super) fn adopt(&self, state: &mut State, id: SessionId) -> Option<()> {
        // Ids the CLI chose (`session_id`) are no process's: such a session is not taken on.
        let root = i32::try_from(id).ok().filter(|&root| root > 0)?;
        if !Path::new(&format!("/proc/{root}")).exists() {
            return None;
        }
        tracing::info!("session {id} lost its governor: this one takes it on");
        let config = GovernorConfig {
            history: None,
            session_id: None,
            command: format!("(session {id}, taken on from a governor that died)"),
            started_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as i64),
            ..self.defaults.clone()
        };
        let session = new_session(config, root, Past::default());
        state.sessions.insert(
            id,
            SessionState {
                adopted: true,
                ..session
            },
        );
        self.share_limits(state);
        Some(())
    }

    /// Sets the limits every session shares: the smallest budget and the fewest slots of the
    /// sessions running, so no session's promise is broken by another's.
    fn share_limits(&self, state: &mut State) {
        let limits = shared_limits(state.sessions.values()).unwrap_or(Limits {
            budget: self.defaults.budget,
            slots: self.defaults.slots,
        });
        state.driver.set_limits(limits);
    }

    /// Ends session `id`: waits a moment for its jobs' last reports (unless they are to be
    /// killed), resumes or kills what it still runs, completes its report and history, and
    /// sends the report on `writer`. The governor exits with its last session.
    pub(super) fn end_session(
        &self,
        id: SessionId,
        exit_code: Option<i32>,
        kill_jobs: bool,
        writer: Option<&Writer>,
    ) {
        self.lock().sessions_ending += 1;
        if !kill_jobs {
            self.wait_for_reports(id);
        }
        self.release_jobs(id, kill_jobs);
        let ended = self.finish_history(id, exit_code);
        if let (Some(writer), Some((report, warnings))) = (writer, ended) {
            let _ = send(
                writer,
                &Reply::ShutDown {
                    report: Box::new(report),
                    warnings,
                },
            );
        }
        let mut state = self.lock();
        state.sessions_ending -= 1;
        // Another session's report may still be on its way: the last end to be sent leaves.
        let idle = state.sessions_ending == 0 && state.sessions_joining == 0;
        if state.sessions.is_empty() && idle && !state.shutting_down {
            state.shutting_down = true;
            self.admitted.notify_all();
            let _ = std::fs::remove_dir_all(&self.farm_state);
            self.remove_cpu_share();
            tracing::info!("the last session has ended: the governor exits");
            self.leave();
        }
        self.share_limits(&mut state);
        self.decide(&mut state, None);
    }

    /// How session `id` stands now, for its CLI's live status: cheap enough to answer a few
    /// times a second.
    fn status(&self, id: SessionId) -> BuildStatus {
        session_status(&self.lock(), id)
    }

    /// Every session and what each holds, for `headroom status`.
    fn sessions_status(&self) -> GovernorStatus {
        let state = self.lock();
        let limits = state.driver.limits();
        let mut sessions: Vec<SessionStatus> = state
            .sessions
            .iter()
            .map(|(&id, session)| {
                let jobs = state
                    .jobs
                    .iter()
                    .filter(|(_, io)| io.session == id)
                    .filter_map(|(&job_id, _)| state.driver.job(job_id))
                    .map(live_job)
                    .collect();
                SessionStatus {
                    id,
                    command: session.config.command.clone(),
                    cwd: session.config.cwd.clone(),
                    started_unix_ms: session.config.started_unix_ms,
                    held: held_by(&state, |io| io.session == id),
                    status: session_status(&state, id),
                    jobs,
                }
            })
            .collect();
        sessions.sort_by_key(|session| session.started_unix_ms);
        GovernorStatus {
            pid: std::process::id(),
            budget: limits.budget,
            slots: limits.slots,
            used: state.sessions.values().map(|s| s.used).sum(),
            sessions,
        }
    }

    /// Tells every connection, each [`HEARTBEAT`], that the governor makes progress. The
    /// state's lock is taken first: a governor stuck under it falls silent, and its shims
    /// stop waiting for it (`crate::liveness`).
    pub(super) fn beat(&self) {
        loop {
            std::thread::sleep(HEARTBEAT);
            drop(self.lock());
            for writer in self.connections.writers() {
                // A connection whose peer has gone ends on its own thread.
                let _ = send(&writer, &Reply::Alive);
            }
        }
    }

    /// Ends session `id`'s jobs: resumes every suspended one, and kills every running one if
    /// asked; no process is ever left stopped behind the governor. The jobs leave the driver,
    /// so they hold nothing of the other sessions' budget.
    pub(super) fn release_jobs(&self, id: SessionId, kill: bool) {
        let mut state = self.lock();
        if let Some(own) = state.sessions.get_mut(&id) {
            own.ending = true;
            own.outside.resume_all();
        }
        let ids: Vec<JobId> = state
            .jobs
            .iter()
            .filter(|(_, io)| io.session == id)
            .map(|(&job_id, _)| job_id)
            .collect();
        for job_id in ids {
            let io = state.jobs.remove(&job_id).expect("listed above");
            state.driver.forget(job_id);
            if let Some(pgid) = io.pgid {
                if kill {
                    signal_group(pgid, libc::SIGKILL);
                }
                signal_group(pgid, libc::SIGCONT);
            }
        }
        self.admitted.notify_all();
    }

    /// Waits, at most `REPORT_GRACE`, until every job of session `id` has reported how it
    /// ended: its build has ended, so its shims have, but the last reports may still be on
    /// their way through their connections, and a job not yet reported would be missing from
    /// the history.
    fn wait_for_reports(&self, id: SessionId) {
        let deadline = Instant::now() + REPORT_GRACE;
        let pending = || self.lock().jobs.values().any(|io| io.session == id);
        while pending() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use headroom_sched::{Action, AfterAttempt, Ended, Offer};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn offer(driver: &mut Driver, key: &str, peak: u64) -> JobId {
        driver
            .offer(Offer {
                session: 0,
                key: key.into(),
                label: key.into(),
                group: key.len() as u64 + peak,
                past: Some(headroom_sched::PastRun {
                    peak,
                    profile: None,
                    shared: false,
                }),
                waiting_seconds: 0.0,
                lower_rungs: 0,
                farmable: false,
                local_share: None,
            })
            .0
    }

    /// Offers jobs of `peaks`, lets the driver start what fits and begins those attempts.
    fn started(limits: Limits, peaks: &[u64]) -> (Driver, Vec<JobId>) {
        let mut driver = Driver::new(limits, false);
        let ids: Vec<JobId> = peaks
            .iter()
            .enumerate()
            .map(|(i, &peak)| offer(&mut driver, &format!("job{i}"), peak))
            .collect();
        for action in driver.decide(None, 0.0) {
            if let Action::Start { id, .. } = action {
                driver.begin_attempt(id);
            }
        }
        (driver, ids)
    }

    #[test]
    fn jobs_beyond_the_slots_wait_for_a_slot() {
        let limits = Limits {
            budget: 4000 * MIB,
            slots: 2,
        };
        let (driver, ids) = started(limits, &[100 * MIB; 3]);
        let status = build_status(&driver, ids.into_iter(), 5, 250 * MIB, limits);
        assert_eq!(
            status,
            BuildStatus {
                running: 2,
                stopped: 0,
                waiting: 1,
                done: 5,
                used: 250 * MIB,
                budget: 4000 * MIB,
                slots: 2,
                waiting_for: Some(Waiting::Slots),
            }
        );
    }

    #[test]
    fn a_job_that_does_not_fit_waits_for_memory_and_says_what_it_needs() {
        let limits = Limits {
            budget: 1000 * MIB,
            slots: 4,
        };
        let (driver, ids) = started(limits, &[700 * MIB, 600 * MIB]);
        let status = build_status(&driver, ids.into_iter(), 0, 0, limits);
        assert_eq!((status.running, status.waiting), (1, 1), "{status:?}");
        let Some(Waiting::Memory { need }) = status.waiting_for else {
            panic!("{status:?}");
        };
        assert!(need >= 600 * MIB, "{status:?}");
    }

    #[test]
    fn after_running_out_of_memory_the_others_wait_for_a_job_alone() {
        let limits = Limits {
            budget: 4000 * MIB,
            slots: 2,
        };
        let (mut driver, ids) = started(limits, &[100 * MIB, 100 * MIB]);
        let oom = Ended {
            out_of_memory: true,
            ..Ended::default()
        };
        // The first retry has room for more beside the others; out of memory again, it
        // runs alone.
        let (after, _) = driver.attempt_ended(ids[0], oom, 1.0);
        assert!(matches!(after, AfterAttempt::Retry), "{after:?}");
        driver.decide(None, 1.0);
        assert!(
            driver.begin_attempt(ids[0]).is_some(),
            "retried beside the others"
        );
        let (after, _) = driver.attempt_ended(ids[0], oom, 2.0);
        assert!(matches!(after, AfterAttempt::Retry), "{after:?}");
        let status = build_status(&driver, ids.into_iter(), 0, 0, limits);
        assert_eq!(status.waiting_for, Some(Waiting::Alone), "{status:?}");
    }

    #[test]
    fn nothing_waits_while_every_job_runs() {
        let limits = Limits {
            budget: 4000 * MIB,
            slots: 4,
        };
        let (driver, ids) = started(limits, &[100 * MIB, 100 * MIB]);
        let status = build_status(&driver, ids.into_iter(), 0, 0, limits);
        assert_eq!((status.running, status.waiting), (2, 0), "{status:?}");
        assert_eq!(status.waiting_for, None);
    }
}
