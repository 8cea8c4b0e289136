//! The sampling thread: it reads each running job's memory, hands the readings to the driver
//! and carries out what the safety net decides (stop, resume, kill, trade room with other
//! users' governors), and flushes what was sampled to the sessions' reports.

use std::path::Path;
use std::time::{Duration, Instant};

use headroom_probe::cgroup::Cgroup;
use headroom_probe::procs::{walk_build, Usage};
use headroom_probe::room::MemoryFacts;
use headroom_process::{ask_group_to_end, signal_group, Interrupts, TERM_GRACE};
use headroom_sched::{Action, Job, JobId, JobState, OutsideAction, Reading, SessionId};
use headroom_store::{JobEvent, JobEventKind, Room, Sample};

use super::record::flush_samples;
use super::state::{held_by, JobIo, State};
use super::Governor;

/// Samples are handed to the history's writer at least this often.
const SAMPLE_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Stops the largest process outside every job, in whichever session runs it.
fn stop_largest_outside(
    state: &mut State,
    trees: &[(SessionId, headroom_probe::procs::BuildTree)],
) {
    let largest = trees
        .iter()
        .filter_map(|(id, tree)| {
            let biggest = tree.outside.iter().map(|p| p.rss_bytes).max()?;
            Some((biggest, *id, tree))
        })
        .max_by_key(|&(biggest, _, _)| biggest);
    if let Some((_, id, tree)) = largest {
        if let Some(own) = state.sessions.get_mut(&id) {
            own.outside.stop_largest(&tree.outside);
        }
    }
}

/// The started jobs (admitted or running) that `belongs` picks.
pub(super) fn started_jobs<'a>(
    state: &'a State,
    belongs: impl Fn(&JobIo) -> bool + 'a,
) -> impl Iterator<Item = &'a Job> + 'a {
    state
        .jobs
        .iter()
        .filter(move |(_, io)| belongs(io))
        .filter_map(|(&id, _)| state.driver.job(id))
        .filter(|job| {
            matches!(
                job.state,
                JobState::Admitted { .. } | JobState::Running { .. }
            )
        })
}

/// Ends an attempt the scheduler killed to make room: asked first, so its compiler driver
/// removes its temporary files; SIGKILL follows after [`TERM_GRACE`]
/// ([`Governor::enforce_stops`]).
pub(super) fn kill_attempt(dying: &mut Vec<(JobId, i32, Instant)>, id: JobId, pgid: i32) {
    ask_group_to_end(pgid);
    dying.push((id, pgid, Instant::now() + TERM_GRACE));
}

impl Governor {
    /// Asks the driver what to do and does it.
    pub(super) fn decide(&self, state: &mut State, machine_left: Option<u64>) {
        if state.shutting_down {
            return;
        }
        for action in state.driver.decide(machine_left, self.now()) {
            let (Action::Start { id, .. }
            | Action::Suspend(id)
            | Action::Resume(id)
            | Action::Kill(id)) = action;
            let kind = match action {
                Action::Start { .. } => None,
                Action::Suspend(_) => Some(JobEventKind::Suspend),
                Action::Resume(_) => Some(JobEventKind::Resume),
                Action::Kill(_) => Some(JobEventKind::Kill),
            };
            let session = state.jobs.get(&id).map(|io| io.session);
            if let Some((kind, own)) =
                kind.zip(session.and_then(|session| state.sessions.get_mut(&session)))
            {
                own.events.push(JobEvent {
                    t_ms: own.now_ms(),
                    job_id: id,
                    kind,
                });
            }
            let pgid = state.jobs.get_mut(&id).and_then(|job| match action {
                Action::Kill(_) => job.pgid.take(),
                _ => job.pgid,
            });
            match action {
                Action::Start { .. } => self.admitted.notify_all(),
                Action::Suspend(_) => pgid
                    .into_iter()
                    .for_each(|pgid| signal_group(pgid, libc::SIGSTOP)),
                Action::Resume(_) => pgid
                    .into_iter()
                    .for_each(|pgid| signal_group(pgid, libc::SIGCONT)),
                Action::Kill(_) => {
                    if let Some(pgid) = pgid {
                        kill_attempt(&mut state.dying, id, pgid);
                    }
                }
            }
        }
    }

    /// Samples every running job, and each session's processes outside them, until told to
    /// stop. A session's build is everything below its CLI, but the governor.
    pub(super) fn sample_until(&self, terminate: &Interrupts) {
        let interval = Duration::from_millis(self.defaults.sample_interval_ms.max(10));
        let cgroup = Cgroup::of_self().ok().flatten();
        let governor = std::process::id() as i32;
        loop {
            std::thread::sleep(interval);
            if terminate.last().is_some() || self.never_joined() {
                self.end_on_signal();
            }
            let (groups, roots) = {
                let state = self.lock();
                let groups: Vec<(JobId, i32)> = state
                    .jobs
                    .iter()
                    .filter_map(|(&id, job)| job.pgid.map(|pgid| (id, pgid)))
                    .collect();
                let roots: Vec<(SessionId, i32)> =
                    state.sessions.iter().map(|(&id, s)| (id, s.root)).collect();
                (groups, roots)
            };
            for (id, root) in &roots {
                let orphaned = self.lock().sessions.get(id).is_some_and(|s| s.adopted)
                    && !Path::new(&format!("/proc/{root}")).exists();
                if orphaned {
                    self.end_session(*id, None, false, None);
                }
            }
            let pgids: Vec<i32> = groups.iter().map(|&(_, pgid)| pgid).collect();
            let trees: Vec<(SessionId, _)> = roots
                .iter()
                .map(|&(id, root)| {
                    (
                        id,
                        walk_build(root, governor, &pgids, crate::outside::is_shim),
                    )
                })
                .collect();
            let readings: Vec<(JobId, Usage)> = groups
                .iter()
                .map(|&(id, pgid)| {
                    let usage = trees
                        .iter()
                        .flat_map(|(_, tree)| &tree.jobs)
                        .find(|&&(root, _)| root == pgid);
                    (id, usage.map(|&(_, usage)| usage).unwrap_or_default())
                })
                .collect();
            let machine_left = MemoryFacts::read_in(cgroup.as_ref())
                .ok()
                .map(|facts| facts.room().0);
            let mut guard = self.lock();
            let state = &mut *guard;
            // A job whose attempt ended since the walk is not sampled.
            let readings: Vec<(SessionId, Reading)> = readings
                .into_iter()
                .filter_map(|(id, usage)| {
                    let job = state.jobs.get(&id).filter(|job| job.pgid.is_some())?;
                    let reading = Reading {
                        id,
                        bytes: usage.counted_bytes,
                        cpu_seconds: usage.cpu_seconds,
                    };
                    Some((job.session, reading))
                })
                .collect();
            let mut outside = 0;
            for (id, tree) in &trees {
                let Some(own) = state.sessions.get_mut(id) else {
                    continue;
                };
                let t_ms = own.now_ms();
                let counted = own.outside.observe(&tree.outside, t_ms) + tree.remains_bytes;
                outside += counted;
                if let Some(bytes) = machine_left {
                    own.room.push(Room { t_ms, bytes });
                }
                let mut total = counted;
                for (_, reading) in readings.iter().filter(|(session, _)| session == id) {
                    total += reading.bytes;
                    own.samples.push(Sample {
                        t_ms,
                        job_id: reading.id,
                        bytes: reading.bytes,
                    });
                }
                own.peak_total = own.peak_total.max(total);
                own.used = total;
            }
            let readings: Vec<Reading> = readings.into_iter().map(|(_, r)| r).collect();
            state.driver.sample(&readings, outside, self.now());
            self.trade_with_other_users(state, outside);
            self.enforce_stops(state);
            self.decide(state, machine_left);
            let any_stopped = state.sessions.values().any(|s| s.outside.any_stopped());
            match state.driver.outside_action(machine_left, any_stopped) {
                OutsideAction::StopLargest => stop_largest_outside(state, &trees),
                OutsideAction::ResumeAll => state
                    .sessions
                    .values_mut()
                    .for_each(|s| s.outside.resume_all()),
                OutsideAction::Nothing => {}
            }
            for own in state.sessions.values_mut() {
                if own.last_flush.elapsed() >= SAMPLE_FLUSH_INTERVAL {
                    flush_samples(own);
                }
            }
        }
    }

    /// Tells the ledger what this governor holds and uses, and leaves to other users'
    /// governors what they hold beyond what they used when this governor's sessions began
    /// (that much the sessions' budgets left out already).
    fn trade_with_other_users(&self, state: &mut State, outside: u64) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        let used: u64 = state.sessions.values().map(|s| s.used).sum();
        ledger.publish(held_by(state, |_| true) + outside, used);
        state.elsewhere = ledger.elsewhere();
        let left_out = state
            .sessions
            .values()
            .map(|s| s.used_elsewhere_at_start)
            .min()
            .unwrap_or(0);
        state
            .driver
            .set_held_elsewhere(state.elsewhere.held.saturating_sub(left_out));
    }

    /// Keeps what the governor stopped or killed so: a suspended job that something else
    /// resumed (a terminal's `fg` passed on by its shim) is stopped again, and a killed
    /// attempt that has not ended within [`TERM_GRACE`] of its SIGTERM gets SIGKILL.
    fn enforce_stops(&self, state: &mut State) {
        for (&id, job) in &state.jobs {
            let suspended = state.driver.job(id).is_some_and(|job| job.suspended());
            if let Some(pgid) = job.pgid.filter(|_| suspended) {
                signal_group(pgid, libc::SIGSTOP);
            }
        }
        let now = Instant::now();
        let driver = &state.driver;
        state.dying.retain(|&(id, pgid, deadline)| {
            let ending = driver.job(id).is_some_and(|job| job.attempt_killed);
            if ending && now >= deadline {
                signal_group(pgid, libc::SIGKILL);
                return false;
            }
            ending
        });
    }
}
