//! What the governor reads from the history when a session begins (the warm start of its
//! driver), what it writes for every finished job, and what a session's end writes: the
//! build's row, and the report its CLI gets.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headroom_sched::ladder::Rung;
use headroom_sched::{Driver, Farm, Finished, JobId, Limits, SessionId, WarmStart};
use headroom_store::known::KnownPeaks;
use headroom_store::recorder::{Ending, Recorder};
use headroom_store::{BuildRecord, BuildReport, History, JobRecord};

use crate::last_build;
use crate::protocol::{Attempt, GovernorConfig};

use super::state::{JobIo, SessionState, State};
use super::Governor;

/// How long a session's end waits for the history to take the rest of its build: past it,
/// the session's CLI hears what the history did not get.
const HISTORY_GRACE: Duration = Duration::from_secs(3);

/// What the governor starts a session's build with from its history.
#[derive(Default)]
pub struct Past {
    /// Writes this build into the history.
    pub(super) recorder: Option<Recorder>,
    /// This build's id in the history.
    pub(super) build_id: Option<i64>,
    /// What the history knows of every job.
    pub(super) known: KnownPeaks,
    /// Seconds of work that waited on each job in the most recent build that ran it, by key.
    pub(super) waiting_seconds: HashMap<String, f64>,
    /// The same from shared history, by portable key: for jobs this machine has not run.
    pub(super) shared_waiting_seconds: HashMap<String, f64>,
    /// Each job's two newest clean runs, for the timing slack and the margin on peaks
    /// (`last_build::reruns`).
    pub(super) reruns: Vec<(last_build::CleanRun, last_build::CleanRun)>,
    /// Which jobs the newest build offered together.
    pub(super) bursts: headroom_sched::bursts::Bursts,
    /// The temporary directory of a history that stands in for one that cannot be opened,
    /// removed when the session ends.
    pub(super) temporary_history: Option<tempfile::TempDir>,
}

/// Opens the history and begins this session's build in it, with what recent builds say
/// about the jobs. What the user must hear goes to `warnings`.
pub fn open_history(config: &GovernorConfig, warnings: &mut Vec<String>) -> Past {
    let Some(path) = &config.history else {
        return Past::default();
    };
    let (history, temporary_history) = match open_or_replace(path, warnings) {
        Some(opened) => opened,
        None => return Past::default(),
    };
    let (waiting_seconds, reruns, bursts) =
        match history.recent_builds_jobs(last_build::BUILDS_TO_READ) {
            Ok(builds) => {
                let waiting_seconds = last_build::waiting_seconds_by_key(&builds);
                let newest = builds.first().map_or(&[][..], Vec::as_slice);
                let bursts = last_build::bursts(newest, &waiting_seconds);
                (waiting_seconds, last_build::reruns(&builds), bursts)
            }
            Err(err) => {
                warnings.push(format!(
                    "{err}; jobs queue by their own length only and plan with the configured \
                     timing slack and peak margin"
                ));
                Default::default()
            }
        };
    let known = history.known_peaks().unwrap_or_else(|err| {
        warnings.push(format!(
            "{err}; jobs are predicted as if they had never run"
        ));
        KnownPeaks::default()
    });
    let shared_waiting_seconds = history.shared_waiting_seconds().unwrap_or_else(|err| {
        warnings.push(format!(
            "{err}; jobs predicted from shared history queue by their own length only"
        ));
        HashMap::new()
    });
    match history.begin_governed_build(&build_record(config), Some(std::process::id())) {
        Ok(id) => Past {
            recorder: Some(Recorder::start(history, id)),
            build_id: Some(id),
            known,
            waiting_seconds,
            shared_waiting_seconds,
            reruns,
            bursts,
            temporary_history,
        },
        Err(err) => {
            warnings.push(format!("{err}; this build runs without history"));
            Past::default()
        }
    }
}

/// The history at `path`, set aside and begun anew when corrupt; one that cannot be opened at
/// all (a read-only or blocked state directory) is replaced, for this build only, by a
/// temporary one, whose directory comes with it, so the summary and `--report` still come.
/// `None` only when not even that can be made: the build then runs without history.
fn open_or_replace(
    path: &Path,
    warnings: &mut Vec<String>,
) -> Option<(History, Option<tempfile::TempDir>)> {
    let opened = History::open_or_recover(path);
    if let Some(history) = opened.history {
        warnings.extend(opened.warnings);
        return Some((history, None));
    }
    let temporary = tempfile::Builder::new()
        .prefix("headroom-history-")
        .tempdir()
        .ok()
        .and_then(|dir| Some((History::open(&dir.path().join("history.sqlite")).ok()?, dir)));
    let Some((history, dir)) = temporary else {
        warnings.extend(opened.warnings);
        return None;
    };
    warnings.push(format!(
        "{}; this build records into a temporary history, so its summary and report still \
         come, but the next build will not learn from it",
        opened.warnings.join("; ")
    ));
    Some((history, Some(dir)))
}

/// The moment `unix_ms` (the CLI's start of the build, which the build's row records) on this
/// process's monotonic clock: every time in the report counts from there, not from when the
/// governor got going (after its start and the history's read), so `headroom run` can place
/// each job in the stage it ran in.
pub(super) fn instant_of(unix_ms: i64) -> Instant {
    let now_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    let ago = Duration::from_millis(now_unix_ms.saturating_sub(unix_ms).max(0) as u64);
    let now = Instant::now();
    now.checked_sub(ago).unwrap_or(now)
}

/// The build's row as it begins: no end, no exit code, no peak yet.
pub(super) fn build_record(config: &GovernorConfig) -> BuildRecord {
    BuildRecord {
        id: 0,
        started_unix_ms: config.started_unix_ms,
        duration_ms: None,
        command: config.command.clone(),
        cwd: config.cwd.clone(),
        budget: config.budget,
        budget_source: config.budget_source.clone(),
        slots: config.slots as u32,
        exit_code: None,
        peak_total: None,
        parallelism_set: config.parallelism_set.clone(),
    }
}

/// The policy driver for a build with `config`, knowing what `past` builds showed.
pub fn driver_for(config: &GovernorConfig, past: &Past) -> Driver {
    let limits = Limits {
        budget: config.budget,
        slots: config.slots,
    };
    let mut driver = Driver::new(limits, config.priorities);
    if let Some(farm) = &config.farm {
        driver.set_farm(Farm::new(
            farm.nodes.iter().map(|node| node.spec()).collect(),
        ));
    }
    learn_from(&mut driver, past);
    driver
}

/// Tells `driver` what `past` builds showed.
pub(super) fn learn_from(driver: &mut Driver, past: &Past) {
    driver.warm_start(warm_start(past));
}

/// What `past` builds showed: how far jobs strayed between runs, and which came together.
pub fn warm_start(past: &Past) -> WarmStart {
    WarmStart::from_reruns(
        past.reruns
            .iter()
            .map(|(earlier, later)| ((earlier.ran, earlier.peak), (later.ran, later.peak))),
        past.bursts.clone(),
    )
}

/// Moves every session's finished jobs into its report, and hands them to the history's
/// writer.
pub(super) fn write_jobs(state: &mut State) {
    state.sessions.values_mut().for_each(write_session_jobs);
}

/// Moves a session's finished jobs into its report, and hands them to the history's writer.
fn write_session_jobs(own: &mut SessionState) {
    for job in std::mem::take(&mut own.unwritten_jobs) {
        own.report.jobs.push(job.record.clone());
        if let Some(recorder) = &own.recorder {
            recorder.job(job);
        }
    }
}

/// Moves what was sampled of a session since the last flush into its report, and hands it to
/// the history's writer.
pub(super) fn flush_samples(own: &mut SessionState) {
    own.last_flush = Instant::now();
    let samples = std::mem::take(&mut own.samples);
    let events = std::mem::take(&mut own.events);
    let room = std::mem::take(&mut own.room);
    if let Some(recorder) = &own.recorder {
        recorder.samples(samples.clone(), events.clone(), room.clone());
    }
    own.report.samples.extend(samples);
    own.report.events.extend(events);
    own.report.room.extend(room);
}

impl Governor {
    /// The history's row for a job of `session` that is over, whose last attempt ended at
    /// `ended_at` on the driver's clock.
    pub(super) fn record(
        &self,
        session: &SessionState,
        id: JobId,
        io: JobIo,
        finished: &Finished,
        attempt: &Attempt,
        ended_at: f64,
    ) -> JobRecord {
        let job = &finished.job;
        let offered_ms = io.offered_ms;
        let start_ms = job
            .first_start
            .map_or(offered_ms, |seconds| self.session_ms(session, seconds));
        let config = &session.config;
        JobRecord {
            job_id: id,
            key: io.identity.key,
            group: format!("{:016x}", io.identity.group),
            label: io.identity.label,
            compiler: io.compiler,
            command: io.identity.command,
            cwd: io.cwd,
            offered_ms,
            start_ms,
            end_ms: self.session_ms(session, ended_at).max(start_ms),
            peak: job.peak,
            cpu_ms: (job.cpu_seconds * 1000.0).round() as u64,
            exit_code: attempt.exit_code,
            signal: attempt.signal,
            predicted: if job.node.is_some() {
                job.planned_on_node
            } else {
                job.estimate.peak
            },
            prediction_source: job.source.name().to_string(),
            attempts: job.attempts,
            suspends: job.suspends,
            requeues: job.requeues,
            oom_retries: job.oom_retries,
            lowered_flags: job
                .rung
                .checked_sub(1)
                .and_then(|rung| io.ladder.get(rung))
                .map(Rung::describe),
            over_budget: job.estimate.peak > config.budget,
            nice: job.nice,
            node: config
                .farm
                .as_ref()
                .zip(job.node)
                .map(|(farm, node)| farm.nodes[node].address.clone()),
            node_start_ms: job
                .node
                .map(|_| self.session_ms(session, job.attempt_started())),
        }
    }

    /// Completes session `id`'s report, hands its end to the history's writer (waiting at
    /// most `HISTORY_GRACE` for the history to take it all) and removes the session. Returns
    /// the report and what its user must hear; `None` for a session already ended.
    pub(super) fn finish_history(
        &self,
        id: SessionId,
        exit_code: Option<i32>,
    ) -> Option<(BuildReport, Vec<String>)> {
        let mut state = self.lock();
        let mut own = state.sessions.remove(&id)?;
        tracing::info!("session {id} ended ({} left)", state.sessions.len());
        drop(state);
        write_session_jobs(&mut own);
        flush_samples(&mut own);
        let outside = std::mem::take(&mut own.outside).finish();
        let duration_ms = own.now_ms();
        let mut report = own.report;
        report.build.duration_ms = Some(duration_ms);
        report.build.exit_code = exit_code;
        report.build.peak_total = Some(own.peak_total);
        report.outside = outside.clone();
        // In the order the history loads them.
        report.jobs.sort_by_key(|job| job.job_id);
        report
            .samples
            .sort_by_key(|sample| (sample.t_ms, sample.job_id));
        report.events.sort_by_key(|event| event.t_ms);
        let mut warnings = own.warnings;
        if let Some(recorder) = own.recorder {
            let ending = Ending {
                outside,
                duration_ms,
                exit_code,
                peak_total: own.peak_total,
            };
            if let Err(unrecorded) = recorder.finish(ending, HISTORY_GRACE) {
                warnings.push(unrecorded.to_string());
            }
        }
        Some((report, warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_that_cannot_be_opened_is_replaced_for_this_build() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the history file should be: SQLite cannot open it, and it is not
        // corruption that moving the file aside would cure.
        let blocked = dir.path().join("history.sqlite");
        std::fs::create_dir(&blocked).unwrap();
        let mut warnings = Vec::new();
        let (history, temporary) = open_or_replace(&blocked, &mut warnings).unwrap();
        let temporary = temporary.expect("a temporary history stands in");
        assert_eq!(history.path(), temporary.path().join("history.sqlite"));
        assert!(
            matches!(&warnings[..], [warning] if warning.contains("temporary history")),
            "{warnings:?}"
        );
        let kept = temporary.path().to_path_buf();
        drop((history, temporary));
        assert!(!kept.exists(), "removed with the session");
    }

    #[test]
    fn a_history_that_opens_is_used_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.sqlite");
        let mut warnings = Vec::new();
        let (history, temporary) = open_or_replace(&path, &mut warnings).unwrap();
        assert_eq!(history.path(), path);
        assert!(temporary.is_none());
        assert_eq!(warnings, Vec::<String>::new());
    }
}
