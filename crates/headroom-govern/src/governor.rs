//! The governor: one process per user, memory domain and history, which every session on
//! them joins (`headroom build`, `headroom run`, `headroom kernels build`; see
//! [`crate::session`]). It admits the jobs of all its sessions through one
//! `headroom-sched` driver, so they share one budget, one set of slots and one safety net;
//! samples their memory; stops, resumes and kills their process groups; retries jobs that ran
//! out of memory; and keeps each session's report in memory for its CLI, handing every
//! finished job to the session's history writer (`headroom_store::recorder`), which no job
//! ever waits for. It exits when its last session has ended.
//!
//! One thread per connection (reused from one to the next), one sampling thread, one lock
//! around the state: simple to follow, and cheap enough for the few hundred jobs a machine
//! has in flight at most.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headroom_farm::{RemoteLaunch, RemoteOutcome};
use headroom_probe::cgroup::Cgroup;
use headroom_probe::cpu_weights::CpuWeights;
use headroom_probe::procs::{walk_build, Usage};
use headroom_sched::{
    Action, AfterAttempt, Driver, Ended, Farm, Finished, Job, JobId, JobState, Limits, Offer,
    OutsideAction, Reading, SessionId, WarmStart,
};
use headroom_store::known::KnownPeaks;
use headroom_store::recorder::{Ending, Recorder, Unwritten};
use headroom_store::{
    BuildRecord, BuildReport, History, JobEvent, JobEventKind, JobRecord, Room, Sample,
};
use rustix::process::{kill_process_group, Pid, Signal};

use crate::budget::MemoryFacts;
use crate::compiler;
use crate::job::JobIdentity;
use crate::last_build;
use crate::ledger::{Elsewhere, ReservationLedger};
use crate::liveness::{silence_bound, HEARTBEAT};
use crate::oom::ran_out_of_memory;
use crate::outside::OutsideTracker;
use crate::portable::{self, Places};
use crate::protocol::{
    read_frame, write_frame, Attempt, BuildStatus, GovernorConfig, GovernorStatus, LiveJob, Reply,
    Request, SessionStatus, Waiting,
};

/// How long a session's end waits for the reports of its jobs that ended just before its build.
const REPORT_GRACE: Duration = Duration::from_secs(2);
/// Samples are handed to the history's writer at least this often.
const SAMPLE_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a job killed to make room has to end after SIGTERM before it gets SIGKILL: time
/// for a compiler driver (gcc, nvcc) to remove its temporary files, while the memory hog
/// itself (cc1plus, cicc), which does not catch SIGTERM, ends at once.
const KILL_GRACE: Duration = Duration::from_millis(500);
/// How many silence bounds (`crate::liveness`) a new governor waits for its first session
/// before it takes its starter for dead or hung, and leaves.
const FIRST_JOIN_BOUNDS: u32 = 3;
/// How long a session's end waits for the history to take the rest of its build: past it,
/// the session's CLI hears what the history did not get.
const HISTORY_GRACE: Duration = Duration::from_secs(3);

/// What the governor keeps of a job beside the driver's record: what its I/O needs.
struct JobIo {
    session: SessionId,
    identity: JobIdentity,
    /// The key other machines know the job by, for shared history.
    portable_key: String,
    compiler: String,
    cwd: String,
    /// When it was offered, in milliseconds of its session.
    offered_ms: u64,
    /// Process group of the running attempt, once the shim has reported it.
    pgid: Option<i32>,
}

struct State {
    /// The policy over every session's jobs: every decision, and each job's attempts
    /// (`headroom_sched::driver`).
    driver: Driver,
    jobs: HashMap<JobId, JobIo>,
    sessions: HashMap<SessionId, SessionState>,
    /// Whether the driver has learned from a session's history yet (the first one's).
    warmed: bool,
    /// Attempts sent SIGTERM to make room: job, process group, and when SIGKILL follows if
    /// the attempt has not ended by then.
    dying: Vec<(JobId, i32, Instant)>,
    /// The governor is ending: nothing more is admitted.
    shutting_down: bool,
    /// Sessions whose end is under way (their report not yet sent), and sessions joining
    /// (their history being opened): the governor leaves only when there are none.
    sessions_ending: usize,
    sessions_joining: usize,
    /// What other users' governors in the memory domain hold and use, at the last sample.
    elsewhere: Elsewhere,
}

/// One session's part of the state: its build as its report and its history see it, and
/// its processes outside every job.
struct SessionState {
    config: GovernorConfig,
    /// The CLI's process: the session's build is everything below it.
    root: i32,
    /// The session's start (its CLI's), from which its report counts time.
    start: Instant,
    /// This machine's places, which portable keys name instead of spelling out.
    places: Places,
    /// Writes the build into the history, when there is one.
    recorder: Option<Recorder>,
    /// The directory of a temporary history standing in for one that cannot be opened: it
    /// lasts as long as the session.
    _temporary_history: Option<tempfile::TempDir>,
    /// What the history knew of every job when the session began.
    known: KnownPeaks,
    /// The build as the summary, `--report` and `--trace` show it: every finished job and
    /// everything sampled up to the last flush, whatever reached the history.
    report: BuildReport,
    /// Seconds of work that waited on each job in the most recent build that ran it, by key.
    waiting_seconds: HashMap<String, f64>,
    /// The same as another machine saw it, by portable key (shared history).
    shared_waiting_seconds: HashMap<String, f64>,
    /// Samples, what was done to jobs, and the machine's room, since the last flush.
    samples: Vec<Sample>,
    events: Vec<JobEvent>,
    room: Vec<Room>,
    /// Finished jobs not yet in the report: each is moved there right after its shim has its
    /// answer; the session's end moves any left.
    unwritten_jobs: Vec<Unwritten>,
    last_flush: Instant,
    peak_total: u64,
    /// What the session's processes used at the last sample.
    used: u64,
    /// The session's processes outside every job.
    outside: OutsideTracker,
    /// What the session's user must hear, sent with its report.
    warnings: Vec<String>,
    /// The session is ending: its jobs are no longer admitted.
    ending: bool,
    /// Taken on from a governor that died: no connection of its CLI's tells its end, which
    /// comes when the CLI's process is gone.
    adopted: bool,
    /// What other users' governors used when the session began: its budget, taken from the
    /// room then, left that out already, so only what they hold beyond it is left to them.
    used_elsewhere_at_start: u64,
}

impl SessionState {
    /// Milliseconds since the session began.
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

struct Governor {
    /// The first session's configuration: how often to sample, and the limits until sessions
    /// say otherwise.
    defaults: GovernorConfig,
    /// Each compiler's name and version, by the path a build called it by: asked once,
    /// outside the state's lock.
    compiler_ids: Mutex<HashMap<String, String>>,
    /// The driver's clock starts here.
    start: Instant,
    state: Mutex<State>,
    /// Signalled whenever a job is admitted or a session or the governor ends.
    admitted: Condvar,
    /// Where farmed jobs keep their engine's state, a directory per job.
    farm_state: PathBuf,
    /// Every open connection, for the heartbeat.
    connections: Connections,
    /// The cgroup whose levels carry the jobs' priorities, where one could be made and
    /// priorities are on; otherwise the shims take them on as niceness.
    cpu_weights: Option<CpuWeights>,
    /// How the governor leaves its socket when its last session has ended.
    exit: crate::session::Exit,
    /// Where it tells other users' governors in its memory domain what it holds, and hears
    /// what they hold; `None` where the ledger cannot be used.
    ledger: Option<ReservationLedger>,
}

/// The writing ends of the open connections, which the heartbeat reaches as well as each
/// connection's own thread: a connection's frames are written one at a time, never mixed.
#[derive(Default)]
struct Connections {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Writer>>,
}

type Writer = Arc<Mutex<UnixStream>>;

impl Connections {
    /// Registers `stream`; returns its key and its writing end.
    fn open(&self, stream: &UnixStream) -> io::Result<(u64, Writer)> {
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
fn send(writer: &Writer, reply: &Reply) -> io::Result<()> {
    write_frame(&*lock_ignoring_poison(writer), reply)
}

/// Runs the governor on `listener` until its last session has ended or a signal ends it.
/// `defaults` is the first session's configuration.
pub fn serve(
    listener: UnixListener,
    defaults: GovernorConfig,
    exit: crate::session::Exit,
) -> io::Result<()> {
    let terminate = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&terminate))?;
    }
    // What the history says of earlier builds comes with the first session.
    let driver = driver_for(&defaults, &Past::default());
    let governor = Arc::new(Governor {
        start: Instant::now(),
        state: Mutex::new(State {
            driver,
            jobs: HashMap::new(),
            sessions: HashMap::new(),
            warmed: false,
            dying: Vec::new(),
            shutting_down: false,
            sessions_ending: 0,
            sessions_joining: 0,
            elsewhere: Elsewhere::default(),
        }),
        admitted: Condvar::new(),
        compiler_ids: Mutex::new(HashMap::new()),
        farm_state: std::env::temp_dir().join(format!("headroom-farm-{}", std::process::id())),
        connections: Connections::default(),
        cpu_weights: defaults
            .priorities
            .then(|| cpu_weights(defaults.slots))
            .flatten(),
        defaults,
        exit,
        ledger: ReservationLedger::open(&crate::session::memory_domain()),
    });
    {
        let governor = Arc::clone(&governor);
        std::thread::spawn(move || governor.sample_until(&terminate));
    }
    {
        let governor = Arc::clone(&governor);
        std::thread::spawn(move || governor.beat());
    }
    let handlers = Handlers::new();
    for stream in listener.incoming() {
        handlers.hand(stream?, &governor);
    }
    Ok(())
}

/// Set to `0`, jobs' priorities stay niceness even where a CPU cgroup could be made.
pub const CPU_CGROUP_ENV: &str = "HEADROOM_CPU_CGROUP";

/// The cgroup that orders the build's jobs by priority without handing their CPU to
/// unrelated processes (`headroom_probe::cpu_weights`); `None`, said at `-v`, where none can
/// be made and priorities fall back to niceness.
fn cpu_weights(slots: usize) -> Option<CpuWeights> {
    if std::env::var(CPU_CGROUP_ENV).is_ok_and(|value| value == "0") {
        tracing::info!("{CPU_CGROUP_ENV}=0: job priorities are niceness, which also yields to unrelated processes");
        return None;
    }
    match CpuWeights::create(slots) {
        Ok(weights) => {
            tracing::info!(
                "job priorities are CPU weights in {}",
                weights.dir().display()
            );
            Some(weights)
        }
        Err(err) => {
            tracing::info!(
                "job priorities are niceness, which also yields to unrelated processes: {err}"
            );
            None
        }
    }
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

/// What the governor starts a session's build with from its history.
#[derive(Default)]
pub struct Past {
    /// Writes this build into the history.
    recorder: Option<Recorder>,
    /// This build's id in the history.
    build_id: Option<i64>,
    /// What the history knows of every job.
    known: KnownPeaks,
    /// Seconds of work that waited on each job in the most recent build that ran it, by key.
    waiting_seconds: HashMap<String, f64>,
    /// The same from shared history, by portable key: for jobs this machine has not run.
    shared_waiting_seconds: HashMap<String, f64>,
    /// Each job's two newest clean runs, for the timing slack and the margin on peaks
    /// (`last_build::reruns`).
    reruns: Vec<(last_build::CleanRun, last_build::CleanRun)>,
    /// Which jobs the newest build offered together.
    bursts: headroom_sched::bursts::Bursts,
    /// The temporary directory of a history that stands in for one that cannot be opened,
    /// removed when the session ends.
    temporary_history: Option<tempfile::TempDir>,
}

/// Opens the history and begins this session's build in it, with what recent builds say
/// about the jobs. What the user must hear goes to `warnings`.
fn open_history(config: &GovernorConfig, warnings: &mut Vec<String>) -> Past {
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
fn instant_of(unix_ms: i64) -> Instant {
    let now_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    let ago = Duration::from_millis(now_unix_ms.saturating_sub(unix_ms).max(0) as u64);
    let now = Instant::now();
    now.checked_sub(ago).unwrap_or(now)
}

/// The build's row as it begins: no end, no exit code, no peak yet.
fn build_record(config: &GovernorConfig) -> BuildRecord {
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

/// Tells `driver` what `past` builds showed: how far jobs strayed between runs, and which
/// came together.
fn learn_from(driver: &mut Driver, past: &Past) {
    driver.warm_start(WarmStart::from_reruns(
        past.reruns
            .iter()
            .map(|(earlier, later)| ((earlier.ran, earlier.peak), (later.ran, later.peak))),
        past.bursts.clone(),
    ));
}

impl Governor {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock_ignoring_poison(&self.state)
    }

    /// Seconds since the governor started: the driver's clock.
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// `seconds` on the driver's clock, in milliseconds of `session`.
    fn session_ms(&self, session: &SessionState, seconds: f64) -> u64 {
        let at = self.start + Duration::from_secs_f64(seconds.max(0.0));
        at.saturating_duration_since(session.start).as_millis() as u64
    }

    fn handle(&self, stream: UnixStream) {
        match read_frame::<Request>(&stream) {
            Ok(Request::Join { config, root }) => self.serve_session(*config, root, &stream),
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
    fn join(&self, config: GovernorConfig, root: i32) -> (SessionId, Vec<String>) {
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
    fn adopt(&self, state: &mut State, id: SessionId) -> Option<()> {
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
    fn end_session(
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
            self.remove_cpu_weights();
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
    fn beat(&self) {
        loop {
            std::thread::sleep(HEARTBEAT);
            drop(self.lock());
            for writer in self.connections.writers() {
                // A connection whose peer has gone ends on its own thread.
                let _ = send(&writer, &Reply::Alive);
            }
        }
    }

    /// Registers a job that session `session`'s build system just started, and queues it;
    /// `None` when the governor does not know the session.
    fn offer(
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
            lower_rungs: if family.is_some_and(|f| f.gcc_flags) {
                own.config.ladder.len()
            } else {
                0
            },
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
    fn supervise(&self, id: JobId, stream: &UnixStream, writer: &Writer) -> io::Result<()> {
        loop {
            send(writer, &self.wait_for_admission(id)?)?;
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

    fn wait_for_admission(&self, id: JobId) -> io::Result<Reply> {
        let mut state = self.lock();
        loop {
            let session = state
                .jobs
                .get(&id)
                .and_then(|io| state.sessions.get(&io.session))
                .filter(|session| !session.ending && !state.shutting_down);
            let Some(session) = session else {
                return Err(io::Error::other("the job's session has ended"));
            };
            let ladder = session.config.ladder.clone();
            if let Some(job) = state.driver.begin_attempt(id) {
                return Ok(Reply::Run {
                    job_id: id,
                    rung: job.rung.checked_sub(1).map(|rung| ladder[rung].clone()),
                    nice: job.nice,
                    cpu_group: self.cpu_weights.as_ref().map(|w| w.level(job.nice)),
                    remote: job.node.map(|node| self.remote_launch(id, node)),
                });
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

    fn started(&self, id: JobId, pid: i32) {
        let mut state = self.lock();
        let Some(job) = state.jobs.get_mut(&id) else {
            return;
        };
        job.pgid = Some(pid);
        // The scheduler may have acted before the process existed.
        match state.driver.job(id) {
            Some(job) if job.attempt_killed => kill_attempt(&mut state.dying, id, pid),
            Some(job) if job.state == (JobState::Running { suspended: true }) => {
                signal_group(pid, Signal::STOP)
            }
            _ => {}
        }
    }

    /// Decides what becomes of a job whose attempt ended. A job whose session has ended is
    /// done: nobody waits for a retry of it.
    fn finished(&self, id: JobId, attempt: Attempt) -> Reply {
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
        let ended = Ended {
            succeeded: attempt.exit_code == Some(0),
            // A farmed attempt the shim killed because its engine fell back to this machine
            // died of SIGKILL, but not for memory.
            out_of_memory: !ending
                && !killed_by_us
                && match remote {
                    Some(RemoteOutcome::OutOfMemory) => true,
                    Some(RemoteOutcome::Unreachable) => false,
                    _ => ran_out_of_memory(&attempt),
                },
            cpu_seconds: attempt.cpu_ms as f64 / 1000.0,
            max_rss: attempt.max_rss,
            node_unreachable: !ending && remote == Some(RemoteOutcome::Unreachable),
        };
        let (after, decide_now) = state.driver.attempt_ended(id, ended, self.now());
        let reply = match after {
            AfterAttempt::Retry => Reply::Retry,
            AfterAttempt::Done(finished) => {
                let io = state
                    .jobs
                    .remove(&id)
                    .expect("a supervised job stays registered");
                if let Some(own) = state.sessions.get_mut(&session) {
                    let portable_key = io.portable_key.clone();
                    let record = self.record(own, id, io, &finished, &attempt);
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

    /// The history's row for a job of `session` that is over.
    fn record(
        &self,
        session: &SessionState,
        id: JobId,
        io: JobIo,
        finished: &Finished,
        attempt: &Attempt,
    ) -> JobRecord {
        let job = &finished.job;
        let offered_ms = io.offered_ms;
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
            start_ms: job
                .first_start
                .map_or(offered_ms, |seconds| self.session_ms(session, seconds)),
            end_ms: session.now_ms(),
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
                .map(|rung| config.ladder[rung].describe()),
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

    /// The shim went away (killed, or the build was interrupted): forget the job.
    fn abandon(&self, id: JobId) {
        let mut state = self.lock();
        let io = state.jobs.remove(&id);
        let suspended = state.driver.forget(id).is_some_and(|job| job.suspended());
        if let Some(pgid) = io.and_then(|io| io.pgid).filter(|_| suspended) {
            signal_group(pgid, Signal::CONT);
        }
        self.decide(&mut state, None);
    }

    /// Asks the driver what to do and does it.
    fn decide(&self, state: &mut State, machine_left: Option<u64>) {
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
                    .for_each(|pgid| signal_group(pgid, Signal::STOP)),
                Action::Resume(_) => pgid
                    .into_iter()
                    .for_each(|pgid| signal_group(pgid, Signal::CONT)),
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
    fn sample_until(&self, terminate: &AtomicBool) {
        let interval = Duration::from_millis(self.defaults.sample_interval_ms.max(10));
        let cgroup = Cgroup::of_self().ok().flatten();
        let governor = std::process::id() as i32;
        loop {
            std::thread::sleep(interval);
            if terminate.load(Ordering::Relaxed) || self.never_joined() {
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
                let counted = own.outside.observe(&tree.outside, t_ms);
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
    /// attempt that has not ended within [`KILL_GRACE`] of its SIGTERM gets SIGKILL.
    fn enforce_stops(&self, state: &mut State) {
        for (&id, job) in &state.jobs {
            let suspended = state.driver.job(id).is_some_and(|job| job.suspended());
            if let Some(pgid) = job.pgid.filter(|_| suspended) {
                signal_group(pgid, Signal::STOP);
            }
        }
        let now = Instant::now();
        let driver = &state.driver;
        state.dying.retain(|&(id, pgid, deadline)| {
            let ending = driver.job(id).is_some_and(|job| job.attempt_killed);
            if ending && now >= deadline {
                signal_group(pgid, Signal::KILL);
                return false;
            }
            ending
        });
    }

    /// Ends session `id`'s jobs: resumes every suspended one, and kills every running one if
    /// asked; no process is ever left stopped behind the governor. The jobs leave the driver,
    /// so they hold nothing of the other sessions' budget.
    fn release_jobs(&self, id: SessionId, kill: bool) {
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
                    signal_group(pgid, Signal::KILL);
                }
                signal_group(pgid, Signal::CONT);
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

    /// Completes session `id`'s report, hands its end to the history's writer (waiting at
    /// most `HISTORY_GRACE` for the history to take it all) and removes the session. Returns
    /// the report and what its user must hear; `None` for a session already ended.
    fn finish_history(
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

    /// Whether no session has joined within [`FIRST_JOIN_BOUNDS`] silence bounds: the CLI
    /// that started the governor died before it could.
    fn never_joined(&self) -> bool {
        let state = self.lock();
        !state.warmed && self.start.elapsed() > FIRST_JOIN_BOUNDS * silence_bound()
    }

    /// A signal ends the governor: every session's jobs are released and its history
    /// completed, as far as the grace allows.
    fn end_on_signal(&self) -> ! {
        let ids: Vec<SessionId> = self.lock().sessions.keys().copied().collect();
        for id in ids {
            self.release_jobs(id, false);
            self.finish_history(id, None);
        }
        self.remove_cpu_weights();
        self.leave();
    }

    /// Withdraws from the ledger, leaves the socket's place, and exits.
    fn leave(&self) -> ! {
        if let Some(ledger) = &self.ledger {
            ledger.withdraw();
        }
        self.exit.leave();
        std::process::exit(0);
    }

    /// Takes down the jobs' CPU cgroup: the process exits without dropping anything.
    fn remove_cpu_weights(&self) {
        if let Some(weights) = &self.cpu_weights {
            weights.remove();
        }
    }
}

/// A session of `config` whose CLI is `root`, beginning with what `past` builds showed.
fn new_session(config: GovernorConfig, root: i32, past: Past) -> SessionState {
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
fn shared_limits<'a>(sessions: impl Iterator<Item = &'a SessionState>) -> Option<Limits> {
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
fn started_jobs<'a>(
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

/// What the started jobs that `belongs` picks hold of the budget: their predicted peak or
/// what they were seen to use, the larger.
fn held_by(state: &State, belongs: impl Fn(&JobIo) -> bool) -> u64 {
    started_jobs(state, belongs)
        .map(|job| job.estimate.peak.max(job.peak))
        .sum()
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

/// Moves every session's finished jobs into its report, and hands them to the history's
/// writer.
fn write_jobs(state: &mut State) {
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
fn flush_samples(own: &mut SessionState) {
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

/// Locks `mutex`, poisoned or not: a panicking connection thread must not take the whole build
/// down.
fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Ends an attempt the scheduler killed to make room: SIGTERM, so its compiler driver removes
/// its temporary files, woken in case it is stopped; SIGKILL follows after [`KILL_GRACE`]
/// ([`Governor::enforce_stops`]).
fn kill_attempt(dying: &mut Vec<(JobId, i32, Instant)>, id: JobId, pgid: i32) {
    signal_group(pgid, Signal::TERM);
    signal_group(pgid, Signal::CONT);
    dying.push((id, pgid, Instant::now() + KILL_GRACE));
}

fn signal_group(pgid: i32, signal: Signal) {
    if let Some(pgid) = Pid::from_raw(pgid) {
        // The group may have exited a moment ago: nothing to do then.
        let _ = kill_process_group(pgid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
        let (mut driver, ids) = started(limits, &[100 * MIB, 100 * MIB, 100 * MIB]);
        let oom = Ended {
            out_of_memory: true,
            ..Ended::default()
        };
        let (after, _) = driver.attempt_ended(ids[0], oom, 1.0);
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
