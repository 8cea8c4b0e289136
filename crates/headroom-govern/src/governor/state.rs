//! What the governor holds under its one lock: the driver, each job's I/O beside the
//! driver's record, and each session's build as its report and history will show it.

use std::collections::HashMap;
use std::time::Instant;

use headroom_sched::ladder::Rung;
use headroom_sched::{Driver, JobId, Limits, SessionId};
use headroom_store::known::KnownPeaks;
use headroom_store::recorder::{Recorder, Unwritten};
use headroom_store::{BuildRecord, BuildReport, JobEvent, Room, Sample};

use crate::job::JobIdentity;
use crate::ledger::Elsewhere;
use crate::outside::OutsideTracker;
use crate::portable::Places;
use crate::protocol::GovernorConfig;

use super::record::{build_record, instant_of, Past};
use super::sampler::started_jobs;

/// What the governor keeps of a job beside the driver's record: what its I/O needs.
pub(super) struct JobIo {
    pub(super) session: SessionId,
    pub(super) identity: JobIdentity,
    /// The key other machines know the job by, for shared history.
    pub(super) portable_key: String,
    pub(super) compiler: String,
    pub(super) cwd: String,
    /// When it was offered, in milliseconds of its session.
    pub(super) offered_ms: u64,
    /// Process group of the running attempt, once the shim has reported it.
    pub(super) pgid: Option<i32>,
    /// The rungs of the flag ladder it climbs, for its compiler and flags
    /// ([`crate::compiler::Ladder`]); the driver counts them.
    pub(super) ladder: Vec<Rung>,
}

pub(super) struct State {
    /// The policy over every session's jobs: every decision, and each job's attempts
    /// (`headroom_sched::driver`).
    pub(super) driver: Driver,
    pub(super) jobs: HashMap<JobId, JobIo>,
    pub(super) sessions: HashMap<SessionId, SessionState>,
    /// Whether the driver has learned from a session's history yet (the first one's).
    pub(super) warmed: bool,
    /// Attempts sent SIGTERM to make room: job, process group, and when SIGKILL follows if
    /// the attempt has not ended by then.
    pub(super) dying: Vec<(JobId, i32, Instant)>,
    /// The governor is ending: nothing more is admitted.
    pub(super) shutting_down: bool,
    /// Sessions whose end is under way (their report not yet sent), and sessions joining
    /// (their history being opened): the governor leaves only when there are none.
    pub(super) sessions_ending: usize,
    pub(super) sessions_joining: usize,
    /// What other users' governors in the memory domain hold and use, at the last sample.
    pub(super) elsewhere: Elsewhere,
}

/// One session's part of the state: its build as its report and its history see it, and
/// its processes outside every job.
pub(super) struct SessionState {
    pub(super) config: GovernorConfig,
    /// The CLI's process: the session's build is everything below it.
    pub(super) root: i32,
    /// The session's start (its CLI's), from which its report counts time.
    pub(super) start: Instant,
    /// This machine's places, which portable keys name instead of spelling out.
    pub(super) places: Places,
    /// Writes the build into the history, when there is one.
    pub(super) recorder: Option<Recorder>,
    /// The directory of a temporary history standing in for one that cannot be opened: it
    /// lasts as long as the session.
    pub(super) _temporary_history: Option<tempfile::TempDir>,
    /// What the history knew of every job when the session began.
    pub(super) known: KnownPeaks,
    /// The build as the summary, `--report` and `--trace` show it: every finished job and
    /// everything sampled up to the last flush, whatever reached the history.
    pub(super) report: BuildReport,
    /// Seconds of work that waited on each job in the most recent build that ran it, by key.
    pub(super) waiting_seconds: HashMap<String, f64>,
    /// The same as another machine saw it, by portable key (shared history).
    pub(super) shared_waiting_seconds: HashMap<String, f64>,
    /// Samples, what was done to jobs, and the machine's room, since the last flush.
    pub(super) samples: Vec<Sample>,
    pub(super) events: Vec<JobEvent>,
    pub(super) room: Vec<Room>,
    /// Finished jobs not yet in the report: each is moved there right after its shim has its
    /// answer; the session's end moves any left.
    pub(super) unwritten_jobs: Vec<Unwritten>,
    pub(super) last_flush: Instant,
    pub(super) peak_total: u64,
    /// What the session's processes used at the last sample.
    pub(super) used: u64,
    /// The session's processes outside every job.
    pub(super) outside: OutsideTracker,
    /// What the session's user must hear, sent with its report.
    pub(super) warnings: Vec<String>,
    /// The session is ending: its jobs are no longer admitted.
    pub(super) ending: bool,
    /// Taken on from a governor that died: no connection of its CLI's tells its end, which
    /// comes when the CLI's process is gone.
    pub(super) adopted: bool,
    /// What other users' governors used when the session began: its budget, taken from the
    /// room then, left that out already, so only what they hold beyond it is left to them.
    pub(super) used_elsewhere_at_start: u64,
}

impl SessionState {
    /// Milliseconds since the session began.
    pub(super) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// A session of `config` whose CLI is `root`, beginning with what `past` builds showed.
pub(super) fn new_session(config: GovernorConfig, root: i32, past: Past) -> SessionState {
    SessionState {
        root,
        start: instant_of(config.started_unix_ms),
        places: Places::new(&config.project_root, std::env::var("HOME").ok().as_deref()),
        report: BuildReport::begun(BuildRecord {
            id: past.build_id.unwrap_or(0),
            ..build_record(&config)
        }),
        recorder: past.recorder,
        _temporary_history: past.temporary_history,
        known: past.known,
        waiting_seconds: past.waiting_seconds,
        shared_waiting_seconds: past.shared_waiting_seconds,
        samples: Vec::new(),
        events: Vec::new(),
        room: Vec::new(),
        unwritten_jobs: Vec::new(),
        last_flush: Instant::now(),
        peak_total: 0,
        used: 0,
        outside: OutsideTracker::default(),
        warnings: Vec::new(),
        ending: false,
        adopted: false,
        used_elsewhere_at_start: 0,
        config,
    }
}

/// The limits `sessions` share: the smallest budget and the fewest slots; `None` without
/// sessions.
pub(super) fn shared_limits<'a>(
    sessions: impl Iterator<Item = &'a SessionState>,
) -> Option<Limits> {
    sessions
        .map(|session| Limits {
            budget: session.config.budget,
            slots: session.config.slots,
        })
        .reduce(|a, b| Limits {
            budget: a.budget.min(b.budget),
            slots: a.slots.min(b.slots),
        })
}

/// What the started jobs that `belongs` picks hold of the budget: their predicted peak or
/// what they were seen to use, the larger.
pub(super) fn held_by(state: &State, belongs: impl Fn(&JobIo) -> bool) -> u64 {
    started_jobs(state, belongs)
        .map(|job| job.estimate.peak.max(job.peak))
        .sum()
}
