//! A job's trip through the governor, from its shim's offer to the end of its last attempt:
//! admission, the attempt's start (here or on a farm node), and how it ended ([`ended`]), which
//! the driver turns into a retry or the job's record.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use headroom_farm::{RemoteLaunch, RemoteOutcome};
use headroom_process::signal_group;
use headroom_sched::{AfterAttempt, Ended, JobId, JobState, Offer, SessionId};
use headroom_store::recorder::Unwritten;
use headroom_store::{JobEvent, JobEventKind};

use crate::compiler;
use crate::job::JobIdentity;
use crate::oom::ran_out_of_memory;
use crate::portable;
use crate::protocol::{read_frame, Attempt, Reply, Request};

use super::connection::{send, Writer};
use super::record::write_jobs;
use super::sampler::kill_attempt;
use super::state::{JobIo, State};
use super::{lock_ignoring_poison, Governor};

impl Governor {
    /// Registers a job that session `session`'s build system just started, and queues it;
    /// `None` when the governor does not know the session.
    pub(super) fn offer(
        &self,
        session: SessionId,
        compiler: String,
        args: &[String],
        cwd: String,
    ) -> Option<JobId> {
        let family = compiler::family_of(&compiler);
        // The flags inside `@file`s make the job what it is; the file's name does not.
        let args = compiler::expand_response_files(&compiler, args, Path::new(&cwd));
        let identity = JobIdentity::new(&compiler, &args, &cwd);
        let compiler_id = self.compiler_id(&compiler);
        let mut state = self.lock();
        if !state.sessions.contains_key(&session) {
            self.adopt(&mut state, session)?;
        }
        let own = state.sessions.get(&session).filter(|s| !s.ending)?;
        let portable_key = identity.portable_key(&compiler_id, &cwd, &own.places);
        let past = own.known.past_run(&identity.key, &portable_key);
        let farmable = own.config.farm.as_ref().is_some_and(|farm| {
            farm.engine
                .would_distribute(family.and_then(|f| f.farming.as_ref()), &args)
        });
        let local_share = farmable
            .then(|| own.known.local_share(&identity.key))
            .flatten();
        let ladder = family.map_or_else(Vec::new, |f| f.ladder.rungs(&args, &own.config.ladder));
        let offer = Offer {
            session,
            key: identity.key.clone(),
            label: identity.label.clone(),
            group: identity.group,
            past,
            waiting_seconds: own
                .waiting_seconds
                .get(&identity.key)
                .or_else(|| own.shared_waiting_seconds.get(&portable_key))
                .copied()
                .unwrap_or(0.0),
            lower_rungs: ladder.len(),
            farmable,
            local_share,
        };
        let offered_ms = own.now_ms();
        let (id, decide_now) = state.driver.offer(offer);
        state.jobs.insert(
            id,
            JobIo {
                session,
                identity,
                portable_key,
                compiler,
                cwd,
                offered_ms,
                pgid: None,
                ladder,
            },
        );
        if decide_now {
            self.decide(&mut state, None);
        }
        Some(id)
    }

    /// The name and version of the compiler at `path`, asked the first time a build calls it.
    fn compiler_id(&self, path: &str) -> String {
        if let Some(id) = lock_ignoring_poison(&self.compiler_ids).get(path) {
            return id.clone();
        }
        let id = portable::compiler_id(path);
        lock_ignoring_poison(&self.compiler_ids).insert(path.to_string(), id.clone());
        id
    }

    /// Talks with one job's shim until the job is done.
    pub(super) fn supervise(
        &self,
        id: JobId,
        stream: &UnixStream,
        writer: &Writer,
    ) -> io::Result<()> {
        loop {
            send(writer, &self.wait_for_admission(id, writer)?)?;
            match read_frame::<Request>(stream)? {
                Request::Started { pid } => self.started(id, pid),
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{other:?}"),
                    ))
                }
            }
            let attempt = match read_frame::<Request>(stream)? {
                Request::Finished(attempt) => attempt,
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{other:?}"),
                    ))
                }
            };
            let reply = self.finished(id, attempt);
            let sent = send(writer, &reply);
            // The compiler's result is on its way to the build system: now the history.
            write_jobs(&mut self.lock());
            if reply == Reply::Done {
                // A shim whose attempt exited 0 has not waited to read this.
                return Ok(());
            }
            sent?;
        }
    }

    /// Waits until job `id` may run and returns how. A job that cannot run at once hears
    /// [`Reply::Queued`] first: its shim may have started the compiler already, and ends it.
    fn wait_for_admission(&self, id: JobId, writer: &Writer) -> io::Result<Reply> {
        let mut state = self.lock();
        let mut told_queued = false;
        loop {
            let live = state
                .jobs
                .get(&id)
                .and_then(|io| state.sessions.get(&io.session))
                .is_some_and(|session| !session.ending && !state.shutting_down);
            if !live {
                return Err(io::Error::other("the job's session has ended"));
            }
            // The driver and the jobs' rungs, borrowed apart through the guard.
            let now = &mut *state;
            if let Some(job) = now.driver.begin_attempt(id) {
                let rung = job
                    .rung
                    .checked_sub(1)
                    .and_then(|rung| now.jobs.get(&id)?.ladder.get(rung))
                    .cloned();
                return Ok(Reply::Run {
                    job_id: id,
                    rung,
                    nice: job.nice,
                    cpu_group: self.cpu_group(),
                    remote: job.node.map(|node| self.remote_launch(id, node)),
                });
            }
            if !told_queued {
                // Not under the lock: the state is checked again before waiting.
                drop(state);
                send(writer, &Reply::Queued)?;
                told_queued = true;
                state = self.lock();
                continue;
            }
            state = self
                .admitted
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// How the shim sends job `id`'s attempt to farm node `node`.
    fn remote_launch(&self, id: JobId, node: usize) -> RemoteLaunch {
        let farm = self
            .defaults
            .farm
            .as_ref()
            .expect("a job goes to a farm node");
        let state_dir = self.farm_state_of(id);
        if let Err(err) = std::fs::create_dir_all(&state_dir) {
            tracing::warn!("cannot create {}: {err}", state_dir.display());
        }
        farm.engine.launch(&farm.nodes[node], &state_dir)
    }

    /// Where job `id` keeps its engine's state (distcc's host backoff), a directory of its own.
    fn farm_state_of(&self, id: JobId) -> PathBuf {
        self.farm_state.join(format!("job-{id}"))
    }

    /// Tells the user, once per node, that the engine could not reach a node any more.
    fn warn_node_down(&self, state: &State, node: usize, stderr: &str) {
        if state.shutting_down || !state.driver.farm().is_some_and(|farm| farm.is_up(node)) {
            return;
        }
        let address = &self.defaults.farm.as_ref().expect("a farmed job").nodes[node].address;
        let why = stderr
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or("");
        headroom_output::say!(
            "headroom: warning: farm node {address} is unreachable ({why}); its jobs run elsewhere"
        );
    }

    pub(super) fn started(&self, id: JobId, pid: i32) {
        let mut state = self.lock();
        let Some(job) = state.jobs.get_mut(&id) else {
            return;
        };
        job.pgid = Some(pid);
        // The scheduler may have acted before the process existed.
        match state.driver.job(id) {
            Some(job) if job.attempt_killed => kill_attempt(&mut state.dying, id, pid),
            Some(job) if job.state == (JobState::Running { suspended: true }) => {
                signal_group(pid, libc::SIGSTOP)
            }
            _ => {}
        }
    }

    /// Decides what becomes of a job whose attempt ended. A job whose session has ended is
    /// done: nobody waits for a retry of it.
    pub(super) fn finished(&self, id: JobId, attempt: Attempt) -> Reply {
        let mut state = self.lock();
        let Some(session) = state.jobs.get_mut(&id).map(|job| {
            job.pgid = None;
            job.session
        }) else {
            return Reply::Done;
        };
        let node = state.driver.job(id).and_then(|job| job.node);
        let remote = node
            .zip(self.defaults.farm.as_ref())
            .map(|(_, farm)| farm.engine.outcome(attempt.exit_code, &attempt.stderr_tail));
        if let (Some(node), Some(RemoteOutcome::Unreachable)) = (node, remote) {
            self.warn_node_down(&state, node, &attempt.stderr_tail);
        }
        if remote.is_some() {
            let _ = std::fs::remove_dir_all(self.farm_state_of(id));
        }
        // headroom's own kill reaches the shim as a SIGKILL, as the OOM killer's would.
        let killed_by_us = state.driver.job(id).is_some_and(|job| job.attempt_killed);
        let ending = state.shutting_down || state.sessions.get(&session).is_none_or(|s| s.ending);
        let ended = ended(&attempt, remote, ending, killed_by_us);
        let ended_at = self.now() - attempt.age().as_secs_f64();
        let (after, decide_now) = state.driver.attempt_ended(id, ended, ended_at);
        let reply = match after {
            AfterAttempt::Retry => Reply::Retry,
            AfterAttempt::Done(finished) => {
                let io = state
                    .jobs
                    .remove(&id)
                    .expect("a supervised job stays registered");
                if let Some(own) = state.sessions.get_mut(&session) {
                    let portable_key = io.portable_key.clone();
                    let record = self.record(own, id, io, &finished, &attempt, ended_at);
                    own.unwritten_jobs.push(Unwritten {
                        record,
                        portable_key,
                        profile: finished.profile,
                    });
                }
                Reply::Done
            }
        };
        if ended.out_of_memory {
            if let Some(own) = state.sessions.get_mut(&session) {
                let t_ms = own.now_ms();
                own.events.push(JobEvent {
                    t_ms,
                    job_id: id,
                    kind: JobEventKind::OutOfMemory,
                });
            }
        }
        if decide_now {
            self.decide(&mut state, None);
        }
        reply
    }

    /// The shim went away (killed, or the build was interrupted): forget the job.
    pub(super) fn abandon(&self, id: JobId) {
        let mut state = self.lock();
        let io = state.jobs.remove(&id);
        let suspended = state.driver.forget(id).is_some_and(|job| job.suspended());
        if let Some(pgid) = io.and_then(|io| io.pgid).filter(|_| suspended) {
            signal_group(pgid, libc::SIGCONT);
        }
        self.decide(&mut state, None);
    }
}

/// How an attempt ended, as the driver takes it. `remote` is the farm engine's reading of a
/// farmed attempt (`None` for one that ran here); `ending` says its session or the governor is
/// ending, whose kill is no lack of memory; `killed_by_us` says headroom killed the attempt to
/// make room, which reaches the shim as a SIGKILL, as the OOM killer's would.
fn ended(
    attempt: &Attempt,
    remote: Option<RemoteOutcome>,
    ending: bool,
    killed_by_us: bool,
) -> Ended {
    Ended {
        succeeded: attempt.exit_code == Some(0),
        // A farmed attempt the shim killed because its engine fell back to this machine
        // died of SIGKILL, but not for memory.
        out_of_memory: !ending
            && !killed_by_us
            && match remote {
                Some(RemoteOutcome::OutOfMemory) => true,
                Some(RemoteOutcome::Unreachable) => false,
                _ => ran_out_of_memory(attempt),
            },
        cpu_seconds: attempt.cpu_ms as f64 / 1000.0,
        max_rss: attempt.max_rss,
        node_unreachable: !ending && remote == Some(RemoteOutcome::Unreachable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(exit_code: Option<i32>, signal: Option<i32>) -> Attempt {
        Attempt {
            exit_code,
            signal,
            max_rss: 7 << 20,
            cpu_ms: 1500,
            stderr_tail: String::new(),
            ended_at: 0,
        }
    }

    #[test]
    fn every_way_an_attempt_ends_is_told_to_the_driver() {
        let succeeded = attempt(Some(0), None);
        let failed = attempt(Some(1), None);
        let sigkilled = attempt(None, Some(libc::SIGKILL));
        // How the attempt ran, where, and what it says when neither its session nor the
        // governor is ending and headroom did not kill it: (succeeded, out of memory, node
        // unreachable).
        let table = [
            (&succeeded, None, (true, false, false)),
            (&succeeded, Some(RemoteOutcome::Ran), (true, false, false)),
            (
                &succeeded,
                Some(RemoteOutcome::Unreachable),
                (true, false, true),
            ),
            (
                &succeeded,
                Some(RemoteOutcome::OutOfMemory),
                (true, true, false),
            ),
            (&failed, None, (false, false, false)),
            (&failed, Some(RemoteOutcome::Ran), (false, false, false)),
            (
                &failed,
                Some(RemoteOutcome::Unreachable),
                (false, false, true),
            ),
            (
                &failed,
                Some(RemoteOutcome::OutOfMemory),
                (false, true, false),
            ),
            (&sigkilled, None, (false, true, false)),
            (&sigkilled, Some(RemoteOutcome::Ran), (false, true, false)),
            // The shim killed it when its engine fell back to this machine.
            (
                &sigkilled,
                Some(RemoteOutcome::Unreachable),
                (false, false, true),
            ),
            (
                &sigkilled,
                Some(RemoteOutcome::OutOfMemory),
                (false, true, false),
            ),
        ];
        for (attempt, remote, (succeeded, out_of_memory, unreachable)) in table {
            for ending in [false, true] {
                for killed_by_us in [false, true] {
                    let case = format!(
                        "{attempt:?} {remote:?} ending={ending} killed_by_us={killed_by_us}"
                    );
                    let told = ended(attempt, remote, ending, killed_by_us);
                    assert_eq!(told.succeeded, succeeded, "{case}");
                    // A kill of the session's or the governor's end, or headroom's own, is
                    // no lack of memory; an ending session's unreachable node is not news.
                    assert_eq!(
                        told.out_of_memory,
                        out_of_memory && !ending && !killed_by_us,
                        "{case}"
                    );
                    assert_eq!(told.node_unreachable, unreachable && !ending, "{case}");
                    assert_eq!((told.cpu_seconds, told.max_rss), (1.5, 7 << 20), "{case}");
                }
            }
        }
    }
}
