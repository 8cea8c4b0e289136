//! The governor process of one build: it admits jobs as `headroom-sched` decides, samples
//! their memory, stops, resumes and kills their process groups, retries jobs that ran out of
//! memory, and writes every finished job to the history.
//!
//! One thread per connected shim (reused from one shim to the next), one sampling thread, one
//! lock around the state: simple to follow, and cheap enough for the few hundred jobs a build
//! has in flight at most.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use headroom_probe::cgroup::Cgroup;
use headroom_probe::procs::{walk_build, Usage};
use headroom_sched::{
    Action, Estimate, JobId, Limits, OutsideAction, PastRun, PredictionSource, Predictor, Profile,
    ProfileRecorder, Ran, Scheduler,
};
use headroom_size::format_size;
use headroom_store::{BuildRecord, History, JobRecord, Sample};
use rustix::process::{kill_process_group, Pid, Signal};
use serde::{Deserialize, Serialize};

use crate::budget::{default_job_peak, MemoryFacts};
use crate::job::JobIdentity;
use crate::ladder::{speaks_gcc_flags, Rung};
use crate::last_build;
use crate::oom::ran_out_of_memory;
use crate::outside::OutsideTracker;
use crate::protocol::{read_frame, write_frame, Attempt, Reply, Request};

/// Samples are written to the history at least this often.
const SAMPLE_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Everything the governor needs to know, passed from the CLI.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GovernorConfig {
    pub budget: u64,
    pub budget_source: String,
    pub slots: usize,
    /// Where the history lives; `None` runs without one.
    pub history: Option<PathBuf>,
    pub command: String,
    pub cwd: String,
    pub started_unix_ms: i64,
    /// Lower-memory rungs for jobs that run out of memory alone; empty when not opted in.
    pub ladder: Vec<Rung>,
    pub sample_interval_ms: u64,
    /// Whether jobs start at the niceness the scheduler chose; otherwise all at 0.
    pub priorities: bool,
    /// The parallelism variables headroom set for the build (`MAX_JOBS=4`), for the report.
    pub parallelism_set: Vec<String>,
}

struct Job {
    identity: JobIdentity,
    compiler: String,
    cwd: String,
    offered_ms: u64,
    first_start_ms: Option<u64>,
    /// Started by the scheduler, not yet handed to the shim.
    admitted: bool,
    /// The shim is running an attempt.
    attempt_running: bool,
    /// Process group of the running attempt, once the shim has reported it.
    pgid: Option<i32>,
    suspended: bool,
    killed_by_governor: bool,
    alone: bool,
    /// The CPU niceness the scheduler started the current attempt at.
    nice: u8,
    rung: usize,
    attempts: u32,
    suspends: u32,
    requeues: u32,
    oom_retries: u32,
    peak: u64,
    cpu_ms: u64,
    estimate: Estimate,
    source: PredictionSource,
    /// The memory profile of the current attempt, for the next build.
    profile: ProfileRecorder,
    /// Seconds the current attempt has run, stopped time excluded, counted by the sampler.
    active_seconds: f64,
}

struct State {
    scheduler: Scheduler,
    predictor: Predictor,
    jobs: HashMap<JobId, Job>,
    next_id: JobId,
    history: Option<History>,
    build_id: Option<i64>,
    /// Seconds of work that waited on each job in the most recent build that ran it, by key.
    waiting_seconds: HashMap<String, f64>,
    /// Which jobs the newest build offered together, and the keys this build has offered.
    bursts: last_build::Bursts,
    arrived: HashSet<String>,
    samples: Vec<Sample>,
    /// Finished jobs not yet in the history: each is written right after its shim has its
    /// answer, so no compiler call waits for SQLite; the build's end writes any left.
    unwritten_jobs: Vec<(JobRecord, Option<Profile>)>,
    last_flush: Instant,
    peak_total: u64,
    /// The build's processes outside every job.
    outside: OutsideTracker,
    shutting_down: bool,
}

struct Governor {
    config: GovernorConfig,
    start: Instant,
    state: Mutex<State>,
    /// Signalled whenever a job is admitted or the governor shuts down.
    admitted: Condvar,
}

/// Runs the governor on `listener` until the CLI asks it to shut down or a signal ends it.
pub fn serve(listener: UnixListener, config: GovernorConfig) -> io::Result<()> {
    let terminate = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&terminate))?;
    }
    let past = open_history(&config);
    let limits = Limits {
        budget: config.budget,
        slots: config.slots,
    };
    let mut scheduler = Scheduler::new(limits);
    scheduler.note_reruns(
        past.reruns
            .iter()
            .map(|(earlier, later)| (earlier.ran, later.ran)),
    );
    let mut predictor = Predictor::new(default_job_peak(config.budget, config.slots));
    predictor.note_peak_reruns(
        past.reruns
            .iter()
            .map(|(earlier, later)| (earlier.peak, later.peak)),
    );
    let governor = Arc::new(Governor {
        start: Instant::now(),
        state: Mutex::new(State {
            scheduler,
            predictor,
            jobs: HashMap::new(),
            next_id: 0,
            history: past.history,
            build_id: past.build_id,
            waiting_seconds: past.waiting_seconds,
            bursts: past.bursts,
            arrived: HashSet::new(),
            samples: Vec::new(),
            unwritten_jobs: Vec::new(),
            last_flush: Instant::now(),
            peak_total: 0,
            outside: OutsideTracker::default(),
            shutting_down: false,
        }),
        admitted: Condvar::new(),
        config,
    });
    {
        let governor = Arc::clone(&governor);
        std::thread::spawn(move || governor.sample_until(&terminate));
    }
    let handlers = Handlers::new();
    for stream in listener.incoming() {
        handlers.hand(stream?, &governor);
    }
    Ok(())
}

/// The threads that talk with shims, one per connected shim. A thread whose shim is done
/// waits for the next connection: every compiler call waits for the governor's first reply,
/// and starting a thread costs about 60 µs on our VMs where waking one costs a few
/// (BENCHMARKS.md, "Cost of interception").
struct Handlers {
    /// Connections for idle threads. Only the accepting thread sends, and only after it has
    /// counted an idle thread off `idle`, so a connection never waits for a busy thread.
    send: Sender<UnixStream>,
    queue: Arc<Mutex<Receiver<UnixStream>>>,
    idle: Arc<AtomicUsize>,
}

impl Handlers {
    fn new() -> Handlers {
        let (send, receive) = std::sync::mpsc::channel();
        Handlers {
            send,
            queue: Arc::new(Mutex::new(receive)),
            idle: Arc::default(),
        }
    }

    /// Gives `stream` to an idle thread, or to a new one when none is idle.
    fn hand(&self, stream: UnixStream, governor: &Arc<Governor>) {
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
        let (governor, queue, idle) = (
            Arc::clone(governor),
            Arc::clone(&self.queue),
            Arc::clone(&self.idle),
        );
        std::thread::spawn(move || {
            let mut stream = stream;
            loop {
                governor.handle(stream);
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

/// What the governor starts a build with from its history.
#[derive(Default)]
struct Past {
    history: Option<History>,
    /// This build's id in the history.
    build_id: Option<i64>,
    /// Seconds of work that waited on each job in the most recent build that ran it, by key.
    waiting_seconds: HashMap<String, f64>,
    /// Each job's two newest clean runs, for the timing slack and the margin on peaks
    /// (`last_build::reruns`).
    reruns: Vec<(last_build::CleanRun, last_build::CleanRun)>,
    /// Which jobs the newest build offered together.
    bursts: last_build::Bursts,
}

/// Opens the history and begins this build in it, with what recent builds say about the jobs.
fn open_history(config: &GovernorConfig) -> Past {
    let Some(path) = &config.history else {
        return Past::default();
    };
    let opened = History::open_or_recover(path);
    for warning in &opened.warnings {
        eprintln!("headroom: warning: {warning}");
    }
    let Some(history) = opened.history else {
        return Past::default();
    };
    let (waiting_seconds, reruns, bursts) =
        match history.recent_builds_jobs(last_build::BUILDS_TO_READ) {
            Ok(builds) => {
                let waiting_seconds = last_build::waiting_seconds_by_key(&builds);
                let newest = builds.first().map_or(&[][..], Vec::as_slice);
                let bursts = last_build::Bursts::new(newest, &waiting_seconds);
                (waiting_seconds, last_build::reruns(&builds), bursts)
            }
            Err(err) => {
                eprintln!(
                "headroom: warning: {err}; jobs queue by their own length only and plan with the \
                 configured timing slack and peak margin"
            );
                Default::default()
            }
        };
    let build = BuildRecord {
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
    };
    match history.begin_build(&build) {
        Ok(id) => Past {
            history: Some(history),
            build_id: Some(id),
            waiting_seconds,
            reruns,
            bursts,
        },
        Err(err) => {
            eprintln!("headroom: warning: {err}; this build runs without history");
            Past::default()
        }
    }
}

impl Governor {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread must not take the whole build down: keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn handle(&self, stream: UnixStream) {
        match read_frame::<Request>(&stream) {
            Ok(Request::Job {
                compiler,
                args,
                cwd,
            }) => {
                let id = self.offer(compiler, &args, cwd);
                if self.supervise(id, &stream).is_err() {
                    self.abandon(id);
                }
            }
            Ok(Request::Shutdown {
                exit_code,
                kill_jobs,
            }) => self.shut_down(&stream, exit_code, kill_jobs),
            Ok(other) => tracing::warn!("unexpected first message {other:?}"),
            Err(err) => tracing::debug!("connection closed before a request: {err}"),
        }
    }

    /// Registers a job the build system just started, and queues it.
    fn offer(&self, compiler: String, args: &[String], cwd: String) -> JobId {
        let identity = JobIdentity::new(&compiler, args, &cwd);
        let mut state = self.lock();
        let past = state
            .history
            .as_ref()
            .and_then(|h| h.past_run(&identity.key).ok().flatten());
        let id = state.next_id;
        state.next_id += 1;
        state.arrived.insert(identity.key.clone());
        // A job that came first in its burst waits, at most until the sampler's next tick, for
        // the longer jobs its burst brought last time: the queue's order, not the race to
        // connect, decides which starts first, as in the simulator.
        let wait_for_burst = state
            .bursts
            .longer_one_coming(&identity.key, &state.arrived);
        let mut prediction = state.predictor.predict(id, past.as_ref(), identity.group);
        prediction.estimate.waiting_seconds = state
            .waiting_seconds
            .get(&identity.key)
            .copied()
            .unwrap_or(0.0);
        state.jobs.insert(
            id,
            Job {
                identity,
                compiler,
                cwd,
                offered_ms: self.now_ms(),
                first_start_ms: None,
                admitted: false,
                attempt_running: false,
                pgid: None,
                suspended: false,
                killed_by_governor: false,
                alone: false,
                nice: 0,
                rung: 0,
                attempts: 0,
                suspends: 0,
                requeues: 0,
                oom_retries: 0,
                peak: 0,
                cpu_ms: 0,
                estimate: prediction.estimate.clone(),
                source: prediction.source,
                profile: ProfileRecorder::default(),
                active_seconds: 0.0,
            },
        );
        tracing::debug!(
            "job {id} offered: {}, predicted {} from {}{}",
            state.jobs[&id].identity.label,
            format_size(state.jobs[&id].estimate.peak),
            source_name(state.jobs[&id].source),
            if wait_for_burst {
                "; waits for the longer jobs its burst brought last time"
            } else {
                ""
            }
        );
        state.scheduler.submit(id, prediction.estimate, false);
        if !wait_for_burst {
            self.decide(&mut state, None);
        }
        id
    }

    /// Talks with one job's shim until the job is done.
    fn supervise(&self, id: JobId, stream: &UnixStream) -> io::Result<()> {
        loop {
            write_frame(stream, &self.wait_for_admission(id)?)?;
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
            let sent = write_frame(stream, &reply);
            // The compiler's result is on its way to the build system: now the history.
            write_jobs(&mut self.lock());
            if reply == Reply::Done {
                // A shim whose attempt exited 0 has not waited to read this.
                return Ok(());
            }
            sent?;
        }
    }

    fn wait_for_admission(&self, id: JobId) -> io::Result<Reply> {
        let mut state = self.lock();
        loop {
            if state.shutting_down {
                return Err(io::Error::other("the governor is shutting down"));
            }
            let ladder = &self.config.ladder;
            let job = state
                .jobs
                .get_mut(&id)
                .expect("a supervised job stays registered");
            if job.admitted {
                job.admitted = false;
                job.attempt_running = true;
                return Ok(Reply::Run {
                    job_id: id,
                    rung: job.rung.checked_sub(1).map(|rung| ladder[rung].clone()),
                    nice: job.nice,
                });
            }
            state = self
                .admitted
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    fn started(&self, id: JobId, pid: i32) {
        let mut state = self.lock();
        let Some(job) = state.jobs.get_mut(&id) else {
            return;
        };
        job.pgid = Some(pid);
        // The scheduler may have acted before the process existed.
        if job.killed_by_governor {
            signal_group(pid, Signal::KILL);
        } else if job.suspended {
            signal_group(pid, Signal::STOP);
        }
    }

    /// Decides what becomes of a job whose attempt ended.
    fn finished(&self, id: JobId, attempt: Attempt) -> Reply {
        let mut state = self.lock();
        let shutting_down = state.shutting_down;
        let job = state
            .jobs
            .get_mut(&id)
            .expect("a supervised job stays registered");
        job.attempt_running = false;
        job.pgid = None;
        job.suspended = false;
        job.cpu_ms += attempt.cpu_ms;
        job.peak = job.peak.max(attempt.max_rss);
        if job.killed_by_governor {
            // The scheduler requeued it when it chose the kill.
            job.killed_by_governor = false;
            return Reply::Retry;
        }
        let retry = !shutting_down && ran_out_of_memory(&attempt) && self.escalate(job);
        if retry {
            tracing::info!(
                "retry job {id} {} alone{}: it ran out of memory at {} (predicted {})",
                job.identity.label,
                job.rung
                    .checked_sub(1)
                    .map(|rung| format!(" with {}", self.config.ladder[rung].describe()))
                    .unwrap_or_default(),
                format_size(job.peak),
                format_size(job.estimate.peak),
            );
            let estimate = job.estimate.clone().at_least(job.peak);
            state.scheduler.remove(id);
            state.scheduler.submit(id, estimate, true);
            self.decide(&mut state, None);
            return Reply::Retry;
        }
        let job = state.jobs.remove(&id).expect("checked above");
        // The jobs that waited on this one come in a moment; a slot it leaves waits for them
        // (at most until the sampler's next tick) if one is longer than any queued job.
        let longest_queued = state
            .jobs
            .values()
            .filter(|job| !job.admitted && !job.attempt_running)
            .map(|job| state.bursts.path(&job.identity.key))
            .fold(0.0, f64::max);
        let wait_for_followers =
            state
                .bursts
                .longer_one_follows(&job.identity.key, longest_queued, &state.arrived);
        let ran = Ran {
            cpu_seconds: attempt.cpu_ms as f64 / 1000.0,
            wall_seconds: job.active_seconds,
        };
        if attempt.exit_code == Some(0) {
            state.scheduler.finished(id, ran);
        } else {
            // A job that failed ended early for reasons of its own: its timing says nothing.
            state.scheduler.remove(id);
        }
        self.record(&mut state, id, job, &attempt, ran);
        if !wait_for_followers {
            self.decide(&mut state, None);
        }
        Reply::Done
    }

    /// Moves a job that ran out of memory one step up: first alone, then, where the user opted
    /// in, down the flag ladder. Returns false when nothing is left to try.
    fn escalate(&self, job: &mut Job) -> bool {
        if !job.alone {
            job.alone = true;
        } else if job.rung < self.config.ladder.len() && speaks_gcc_flags(job.compiler.as_ref()) {
            job.rung += 1;
        } else {
            return false;
        }
        job.oom_retries += 1;
        true
    }

    fn record(&self, state: &mut State, id: JobId, job: Job, attempt: &Attempt, ran: Ran) {
        let succeeded = attempt.exit_code == Some(0);
        let profile = job.profile.finish(ran);
        if succeeded && job.rung == 0 {
            let run = PastRun {
                peak: job.peak,
                profile: profile.clone(),
            };
            learn(state, id, job.identity.group, run);
        } else {
            state.predictor.forget(id);
        }
        let record = JobRecord {
            job_id: id,
            key: job.identity.key,
            group: format!("{:016x}", job.identity.group),
            label: job.identity.label,
            compiler: job.compiler,
            command: job.identity.command,
            cwd: job.cwd,
            offered_ms: job.offered_ms,
            start_ms: job.first_start_ms.unwrap_or(job.offered_ms),
            end_ms: self.now_ms(),
            peak: job.peak,
            cpu_ms: job.cpu_ms,
            exit_code: attempt.exit_code,
            signal: attempt.signal,
            predicted: job.estimate.peak,
            prediction_source: source_name(job.source),
            attempts: job.attempts,
            suspends: job.suspends,
            requeues: job.requeues,
            oom_retries: job.oom_retries,
            lowered_flags: job
                .rung
                .checked_sub(1)
                .map(|rung| self.config.ladder[rung].describe()),
            over_budget: job.estimate.peak > self.config.budget,
            nice: job.nice,
        };
        state.unwritten_jobs.push((record, profile));
    }

    /// The shim went away (killed, or the build was interrupted): forget the job.
    fn abandon(&self, id: JobId) {
        let mut state = self.lock();
        state.scheduler.remove(id);
        if let Some(job) = state.jobs.remove(&id) {
            if let Some(pgid) = job.pgid.filter(|_| job.suspended) {
                signal_group(pgid, Signal::CONT);
            }
        }
        self.decide(&mut state, None);
    }

    /// Asks the scheduler what to do and does it.
    fn decide(&self, state: &mut State, machine_left: Option<u64>) {
        if state.shutting_down {
            return;
        }
        let now = self.now_ms();
        let used = state.scheduler.used();
        for action in state.scheduler.decide(machine_left) {
            let (Action::Start { id, .. }
            | Action::Suspend(id)
            | Action::Resume(id)
            | Action::Kill(id)) = action;
            let Some(job) = state.jobs.get_mut(&id) else {
                continue;
            };
            log_decision(&action, id, job, self.config.budget, used, machine_left);
            match action {
                Action::Start { nice, .. } => {
                    job.admitted = true;
                    job.nice = if self.config.priorities { nice } else { 0 };
                    job.attempts += 1;
                    job.profile = ProfileRecorder::default();
                    job.active_seconds = 0.0;
                    job.first_start_ms.get_or_insert(now);
                    self.admitted.notify_all();
                }
                Action::Suspend(_) => {
                    job.suspended = true;
                    job.suspends += 1;
                    job.pgid.inspect(|&pgid| signal_group(pgid, Signal::STOP));
                }
                Action::Resume(_) => {
                    job.suspended = false;
                    job.pgid.inspect(|&pgid| signal_group(pgid, Signal::CONT));
                }
                Action::Kill(_) => {
                    job.requeues += 1;
                    job.suspended = false;
                    if job.admitted {
                        // Not handed to the shim yet: nothing runs, the requeue is all.
                        job.admitted = false;
                    } else if job.attempt_running {
                        job.killed_by_governor = true;
                        if let Some(pgid) = job.pgid.take() {
                            signal_group(pgid, Signal::KILL);
                            signal_group(pgid, Signal::CONT);
                        }
                    }
                }
            }
        }
    }

    /// Samples every running job, and the build's processes outside them, until told to
    /// stop. The build is everything below the process that started the governor (the CLI),
    /// but the governor itself.
    fn sample_until(&self, terminate: &AtomicBool) {
        let interval = Duration::from_millis(self.config.sample_interval_ms.max(10));
        let cgroup = Cgroup::of_self().ok().flatten();
        let build_root = rustix::process::getppid().map_or(0, |pid| pid.as_raw_nonzero().get());
        let governor = std::process::id() as i32;
        let mut last_sample = Instant::now();
        loop {
            std::thread::sleep(interval);
            if terminate.load(Ordering::Relaxed) {
                self.release_jobs(false);
                self.finish_history(None);
                std::process::exit(0);
            }
            let groups: Vec<(JobId, i32)> = self
                .lock()
                .jobs
                .iter()
                .filter_map(|(&id, job)| job.pgid.map(|pgid| (id, pgid)))
                .collect();
            let pgids: Vec<i32> = groups.iter().map(|&(_, pgid)| pgid).collect();
            let build = walk_build(build_root, governor, &pgids, crate::outside::is_shim);
            let readings: Vec<(JobId, Usage)> = groups
                .iter()
                .map(|&(id, pgid)| {
                    let usage = build.jobs.iter().find(|&&(root, _)| root == pgid);
                    (id, usage.map(|&(_, usage)| usage).unwrap_or_default())
                })
                .collect();
            let machine_left = MemoryFacts::read_in(cgroup.as_ref())
                .ok()
                .map(|facts| facts.room().0);
            let t_ms = self.now_ms();
            let since_last = last_sample.elapsed().as_secs_f64();
            last_sample = Instant::now();
            let mut guard = self.lock();
            let state = &mut *guard;
            let mut total = state.outside.observe(&build.outside, t_ms);
            state.scheduler.observe_outside(total);
            for &(id, usage) in &readings {
                let bytes = usage.rss_bytes;
                let Some(job) = state.jobs.get_mut(&id) else {
                    continue;
                };
                if job.pgid.is_none() {
                    continue;
                }
                job.peak = job.peak.max(bytes);
                total += bytes;
                if !job.suspended {
                    job.active_seconds += since_last;
                }
                job.profile.record(usage.cpu_seconds, bytes);
                state.scheduler.observe(id, bytes, usage.cpu_seconds);
                state.samples.push(Sample {
                    t_ms,
                    job_id: id,
                    bytes,
                });
            }
            state.peak_total = state.peak_total.max(total);
            self.decide(state, machine_left);
            let any_stopped = state.outside.any_stopped();
            match state.scheduler.outside_action(machine_left, any_stopped) {
                OutsideAction::StopLargest => state.outside.stop_largest(&build.outside),
                OutsideAction::ResumeAll => state.outside.resume_all(),
                OutsideAction::Nothing => {}
            }
            if state.last_flush.elapsed() >= SAMPLE_FLUSH_INTERVAL {
                flush_samples(state);
            }
        }
    }

    /// Resumes every suspended job, and kills every running one if asked: no process is ever
    /// left stopped behind the governor.
    fn release_jobs(&self, kill: bool) {
        let mut state = self.lock();
        state.shutting_down = true;
        state.outside.resume_all();
        for job in state.jobs.values() {
            if let Some(pgid) = job.pgid {
                if kill {
                    signal_group(pgid, Signal::KILL);
                }
                signal_group(pgid, Signal::CONT);
            }
        }
        self.admitted.notify_all();
    }

    fn finish_history(&self, exit_code: Option<i32>) -> Option<i64> {
        let mut state = self.lock();
        write_jobs(&mut state);
        flush_samples(&mut state);
        let outside = std::mem::take(&mut state.outside).finish();
        let (build_id, peak_total) = (state.build_id?, state.peak_total);
        let history = state.history.as_mut()?;
        if let Err(err) = history.record_outside(build_id, &outside) {
            eprintln!("headroom: warning: {err}");
        }
        if let Err(err) = history.finish_build(build_id, self.now_ms(), exit_code, peak_total) {
            eprintln!("headroom: warning: {err}");
        }
        Some(build_id)
    }

    fn shut_down(&self, stream: &UnixStream, exit_code: Option<i32>, kill_jobs: bool) {
        self.release_jobs(kill_jobs);
        let build_id = self.finish_history(exit_code);
        let _ = write_frame(stream, &Reply::ShutDown { build_id });
        std::process::exit(0);
    }
}

/// Teaches the predictor how job `id` of `group` ran, and passes the better guesses on to the
/// jobs offered before it was known (see [`Predictor::learn`]).
fn learn(state: &mut State, id: JobId, group: u64, run: PastRun) {
    for (id, prediction) in state.predictor.learn(id, group, run) {
        if let Some(job) = state.jobs.get_mut(&id) {
            job.estimate = Estimate {
                waiting_seconds: job.estimate.waiting_seconds,
                ..prediction.estimate.clone()
            };
            job.source = prediction.source;
            state.scheduler.repredict(id, prediction.estimate);
        }
    }
}

fn write_jobs(state: &mut State) {
    let jobs = std::mem::take(&mut state.unwritten_jobs);
    if let (Some(history), Some(build_id)) = (state.history.as_mut(), state.build_id) {
        for (record, profile) in &jobs {
            if let Err(err) = history.record_job(build_id, record, profile.as_ref()) {
                eprintln!("headroom: warning: {err}");
            }
        }
    }
}

fn flush_samples(state: &mut State) {
    state.last_flush = Instant::now();
    let samples = std::mem::take(&mut state.samples);
    if let (Some(history), Some(build_id)) = (state.history.as_mut(), state.build_id) {
        if let Err(err) = history.record_samples(build_id, &samples) {
            eprintln!("headroom: warning: {err}");
        }
    }
}

/// Where a prediction came from, as reports and logs name it: `history`, `group`, `default`.
fn source_name(source: PredictionSource) -> String {
    format!("{source:?}").to_lowercase()
}

/// One line per decision, with the figures it rests on (`-v`, `HEADROOM_LOG=info`): what a
/// user needs to answer "why did it wait?" or "why was it stopped?". `used` is what the
/// running jobs and the processes outside them used when the scheduler decided.
fn log_decision(
    action: &Action,
    id: JobId,
    job: &Job,
    budget: u64,
    used: u64,
    machine_left: Option<u64>,
) {
    // Called for every action, on the governor's path: nothing is formatted unless logged.
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let label = &job.identity.label;
    let predicted = format_size(job.estimate.peak);
    let seen = format_size(job.peak);
    let budget = format_size(budget);
    let using = format!(
        "the build used {} of the {budget} budget",
        format_size(used)
    );
    let left = machine_left.map_or(String::new(), |left| {
        format!(", {} left on the machine", format_size(left))
    });
    match action {
        Action::Start { nice, .. } => {
            let before = if job.peak > 0 {
                format!(", seen at {seen} before it was stopped")
            } else {
                String::new()
            };
            tracing::info!(
                "start job {id} {label}: predicted {predicted} (from {}){before}; it fits \
beside the running jobs ({using}{left}); attempt {}, nice {nice}",
                source_name(job.source),
                job.attempts + 1
            )
        }
        Action::Suspend(_) => tracing::info!(
            "suspend job {id} {label}: seen at {seen} against {predicted} predicted, and \
{using}{left}; it keeps its memory and resumes when there is room"
        ),
        Action::Resume(_) => {
            tracing::info!("resume job {id} {label}: there is room again ({using}{left})")
        }
        Action::Kill(_) => tracing::info!(
            "kill and requeue job {id} {label}: seen at {seen} against {predicted} predicted, \
and {using}{left}; stopping it would not free enough, so it runs again later"
        ),
    }
}

fn signal_group(pgid: i32, signal: Signal) {
    if let Some(pgid) = Pid::from_raw(pgid) {
        // The group may have exited a moment ago: nothing to do then.
        let _ = kill_process_group(pgid, signal);
    }
}
