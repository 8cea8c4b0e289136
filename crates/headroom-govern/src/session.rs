//! A governed session: everything needed to put compiler processes under a governor, for
//! `headroom build` (a whole build command), `headroom run` (the compilers a program starts)
//! and `headroom kernels build` (its own compile jobs through the launcher) alike.
//!
//! One governor per user, memory domain and history: a session joins the governor that
//! listens on its place ([`GovernorPlace`]) and starts it when none does. Race-free start:
//! the place's lock file is held while a session looks for the governor and, finding none,
//! binds the socket and hands it to the new governor as fd 3; no second governor can bind
//! beside it, and no shim can ever find the socket missing. The governor takes the same lock
//! to leave when its last session has ended ([`Exit`]).

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use headroom_probe::cgroup;
use headroom_process::Group;
use headroom_report::BuildReport;
pub use headroom_sched::SessionId;

use crate::governor_log::{self, Follower};
use crate::intercept;
use crate::liveness;
use crate::protocol::{
    write_frame, BuildStatus, GovernorConfig, GovernorStatus, Reply, Request, MAX_REPORT_FRAME,
    PROTOCOL,
};
use crate::shim::{FARM_ENV, JOB_TMPDIR_ENV, LAUNCHER_NAME, SESSION_ENV, SHIM_DIR_ENV, SOCKET_ENV};
use crate::shimdir;

/// The lock file a shared governor takes to leave its socket; unset for a private one.
const GOVERNOR_LOCK_ENV: &str = "HEADROOM_GOVERNOR_LOCK";
/// The governor reads its socket from this descriptor and its first session's configuration
/// from stdin.
const GOVERNOR_FD: i32 = 3;
/// A private socket directory of a session's own under the temporary directory (where no
/// shared place can be used) is named so, followed by the CLI's id.
const RUNTIME_KIND: &str = "headroom-run";
/// A session's directory for its compilers' temporary files ([`jobs_temp_dir`]) is named so,
/// followed by the CLI's id.
const JOBS_TEMP_KIND: &str = "headroom-tmp";
/// The hidden subcommand that runs the governor.
pub const GOVERNOR_SUBCOMMAND: &str = "__governor";
/// How often a session tries to join before it gives up: a governor that is leaving (its
/// last session just ended) closes connections it has not served, and the next try starts a
/// new one.
const JOIN_TRIES: usize = 5;
/// How long a session's end waits for the governor to close its connection (see
/// [`wait_for_close`]).
const CLOSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot create the shim directory {path} (set HEADROOM_STATE_DIR to use another place): {source}")]
    ShimDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create a private directory for the governor's socket under {path} (set TMPDIR or XDG_RUNTIME_DIR to a writable directory): {source}")]
    RuntimeDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the governor: {0}")]
    Governor(#[source] std::io::Error),
    #[error("cannot join the governor at {socket}: {source}")]
    Join {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the governor must be started by `headroom build`, not by hand")]
    NotStartedByHeadroom,
    #[error("invalid governor configuration: {0}")]
    Config(#[from] serde_json::Error),
}

/// Where the governor of a user, memory domain and history listens: its socket, the lock
/// that orders starting it and leaving, and its log. A private place is a new directory of
/// one session's own.
pub struct GovernorPlace {
    socket: PathBuf,
    lock: PathBuf,
    log: PathBuf,
    /// The directory of a private place, removed with the session; `None` for a shared one.
    private_dir: Option<tempfile::TempDir>,
}

impl GovernorPlace {
    /// Whether other sessions may join the governor here.
    fn is_shared(&self) -> bool {
        self.private_dir.is_none()
    }

    /// Where this session's governor listens: the place it shares with this user's other
    /// sessions in its memory domain when `shareable`, else a private one.
    pub fn for_session(state_dir: &Path, shareable: bool) -> Result<GovernorPlace, SessionError> {
        let shared = shareable
            .then(|| GovernorPlace::shared(state_dir, &memory_domain()))
            .flatten();
        shared.map_or_else(GovernorPlace::private, Ok)
    }

    /// The place of the governor that this user's sessions in memory domain `domain` share:
    /// in the user's runtime directory when it is private to them, else in `state_dir/run`
    /// when that is (shared by the sessions with that state directory only); `None` where
    /// neither is (or the socket's path would be too long), and the session then keeps a
    /// governor of its own. Each session keeps its own history whichever governor it joins.
    fn shared(state_dir: &Path, domain: &str) -> Option<GovernorPlace> {
        let key = xxhash_rust::xxh3::xxh3_64(domain.as_bytes());
        let name = format!("governor-{key:016x}");
        let candidates = [headroom_paths::runtime_dir(), Some(state_dir.join("run"))];
        let dir = candidates
            .into_iter()
            .flatten()
            .find(|dir| is_private_to_me(dir) && dir.join(&name).as_os_str().len() < 100)?;
        Some(GovernorPlace {
            socket: dir.join(format!("{name}.sock")),
            lock: dir.join(format!("{name}.lock")),
            log: dir.join(format!("{name}.log")),
            private_dir: None,
        })
    }

    /// A place of this session's own: a new directory, mode 0700, under a name nobody could
    /// have taken before (mkdtemp), never a predictable name in a shared directory.
    fn private() -> Result<GovernorPlace, SessionError> {
        let temp = std::env::temp_dir();
        headroom_paths::temp::remove_orphaned(&temp, RUNTIME_KIND);
        let dir = tempfile::Builder::new()
            .prefix(&headroom_paths::temp::prefix(RUNTIME_KIND))
            .tempdir_in(&temp)
            .map_err(|source| SessionError::RuntimeDir {
                path: temp.clone(),
                source,
            })?;
        Ok(GovernorPlace {
            socket: dir.path().join("governor.sock"),
            lock: dir.path().join("governor.lock"),
            log: dir.path().join("governor.log"),
            private_dir: Some(dir),
        })
    }
}

/// The memory domain this process is in: the memory cgroup it runs in, whose limit (or the
/// machine's) every process in it shares; `machine` where no cgroup can be read.
pub(crate) fn memory_domain() -> String {
    match cgroup::Cgroup::of_self() {
        Ok(Some(cgroup)) => cgroup.dir().display().to_string(),
        _ => "machine".to_string(),
    }
}

/// How a governor leaves its place when its last session has ended: under the place's lock,
/// so no session starting a governor at that moment loses its socket, it removes its socket,
/// its log and the lock file, and exits. Sessions that connected in between find the
/// connection closed, and try again.
pub struct Exit {
    socket: PathBuf,
    lock: Option<PathBuf>,
}

impl Exit {
    /// Removes the place's files, under the lock when the place is shared; the process exits
    /// next, which lets the lock go.
    pub fn leave(&self) {
        let _held = self.lock.as_deref().and_then(|lock| lock_place(lock).ok());
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(self.socket.with_extension("log"));
        if let Some(lock) = &self.lock {
            let _ = std::fs::remove_file(lock);
        }
    }
}

/// The shim this binary carries, written into `dir`; `None` where it cannot be written (after
/// a warning) or where this binary carries none.
#[cfg(feature = "governor")]
fn carried_shim(dir: &Path) -> Option<PathBuf> {
    crate::shim_binary::install(dir)
        .map_err(|err| {
            headroom_output::say!(
                "headroom: warning: cannot write the compiler shim into {} ({err}); headroom \
                 itself stands in for it, which costs each compiler call a few milliseconds",
                dir.display()
            )
        })
        .ok()
}

#[cfg(not(feature = "governor"))]
fn carried_shim(_: &Path) -> Option<PathBuf> {
    None
}

/// Takes the place's lock file, waiting for whoever holds it. A lock taken on a file that its
/// holder removed meanwhile (a governor leaving) locks nothing: the file at the path is
/// opened and locked again until the two are the same.
fn lock_place(lock: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    loop {
        let file = File::options().create(true).append(true).open(lock)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        let held = file.metadata()?;
        match std::fs::metadata(lock) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(file),
            _ => continue,
        }
    }
}

/// The directory the session's compilers keep their temporary files in (their `TMPDIR`, see
/// [`crate::shim::JOB_TMPDIR_ENV`]): a new one under the user's temporary directory, removed
/// with the session. headroom ends compilers on purpose (the early attempt of a queued job, a
/// job killed to make room or to stay clear of the OOM killer), and not every compiler
/// removes its temporary files when it is ended: clang's driver and nvcc leave theirs, and
/// nothing does on SIGKILL. What they leave goes with this directory rather than piling up in
/// the user's. One a killed session left behind goes at the next session's start. `None`
/// where it cannot be made: compilers then keep the user's.
fn jobs_temp_dir() -> Option<tempfile::TempDir> {
    let temp = std::env::temp_dir();
    headroom_paths::temp::remove_orphaned(&temp, JOBS_TEMP_KIND);
    tempfile::Builder::new()
        .prefix(&headroom_paths::temp::prefix(JOBS_TEMP_KIND))
        .tempdir_in(&temp)
        .ok()
}

/// A session of a running governor, and the ways that lead compilers to it.
pub struct Session {
    place: GovernorPlace,
    /// The session's own connection: it carries the shutdown, and its close ends the session.
    stream: UnixStream,
    id: SessionId,
    governor_pid: u32,
    /// The governor process when this session started it.
    governor: Option<Child>,
    shim_dir: PathBuf,
    /// The shim directory when the state directory's could not be used.
    _temporary_shims: Option<tempfile::TempDir>,
    /// The shim binary, which the interceptor runs as `headroom-launch COMPILER ARGS…`.
    shim_exe: PathBuf,
    /// Where the session's compilers keep their temporary files, removed with the session.
    jobs_temp: Option<tempfile::TempDir>,
    /// The interceptor to preload into the build, or why there is none.
    interceptor: Result<PathBuf, String>,
    /// The variables the build gets (`NAME=VALUE`, see [`build_variables`]).
    parallelism_set: Vec<String>,
    /// Whether the session may send compiles to a build farm.
    farm: bool,
    /// The `cpu` cgroup the build starts in, where the governor made one.
    cpu_group: Option<PathBuf>,
    /// Copies what the governor logs while the session lives to stderr.
    log: Follower,
}

impl Session {
    /// Refreshes the shim directory and the interceptor, and joins the governor at `place`,
    /// starting it (`exe __governor`, in its own process group so a Ctrl-C aimed at a build
    /// reaches it only through an orderly shutdown) when none listens there. Without an
    /// interceptor nothing is governed, so the config's variables are dropped. The shims and
    /// the interceptor go under `state_dir` (see [`crate::state`]).
    pub fn start(
        exe: &Path,
        config: &GovernorConfig,
        state_dir: &Path,
        place: GovernorPlace,
    ) -> Result<Session, SessionError> {
        let library_dir = state_dir.join("lib");
        // The shim this binary carries starts faster than headroom itself, which acts as the
        // shim where it cannot be written.
        let shim_exe = carried_shim(&library_dir).unwrap_or_else(|| exe.to_path_buf());
        let (shim_dir, temporary_shims) = shimdir::install_or_temporary(state_dir, &shim_exe)
            .map_err(|(path, source)| SessionError::ShimDir { path, source })?;
        let interceptor = intercept::install(&library_dir).map_err(|err| {
            format!(
                "cannot write the interceptor into {} ({err}; set HEADROOM_STATE_DIR to a \
                 writable path without spaces or colons)",
                library_dir.display()
            )
        });
        let mut config = config.clone();
        if interceptor.is_err() {
            config.parallelism_set.clear();
        }
        let mut log = Follower::start(&place.log);
        let (place, (stream, joined, governor)) = match join(exe, &config, &place) {
            Ok(joined) => (place, joined),
            Err(err) if place.is_shared() => {
                drop(log);
                headroom_output::say!(
                    "headroom: warning: {err}; this session runs a governor of its own, which \
                     does not share the budget with other sessions"
                );
                let private = GovernorPlace::private()?;
                log = Follower::start(&private.log);
                let joined = join(exe, &config, &private)?;
                (private, joined)
            }
            Err(err) => return Err(err),
        };
        let Reply::Joined {
            session,
            governor: governor_pid,
            warnings,
            cpu_group,
            ..
        } = joined
        else {
            unreachable!("join_or_start returns a join");
        };
        for warning in warnings {
            headroom_output::say!("headroom: warning: {warning}");
        }
        Ok(Session {
            place,
            stream,
            id: session,
            governor_pid,
            governor,
            shim_dir,
            _temporary_shims: temporary_shims,
            shim_exe,
            jobs_temp: jobs_temp_dir(),
            interceptor,
            parallelism_set: config.parallelism_set,
            farm: config.farm.is_some(),
            cpu_group,
            log,
        })
    }

    /// The governor process's id.
    pub fn governor_pid(&self) -> u32 {
        self.governor_pid
    }

    /// `headroom-launch`: put it before a compiler's path to run that compiler governed.
    pub fn launcher(&self) -> PathBuf {
        self.shim_dir.join(LAUNCHER_NAME)
    }

    /// Sets up `command` (a build command) so every compiler it starts is governed: the
    /// interceptor preloaded, leading each compiler exec to the launcher, and the
    /// variables of the config; and so it starts in the builds' `cpu` cgroup. Returns why
    /// the build runs ungoverned, if it does.
    pub fn govern(&self, command: &mut Command) -> Result<(), String> {
        self.start_in_cpu_group(command);
        command.envs(self.launcher_env());
        let library = self.interceptor.as_ref().map_err(Clone::clone)?;
        let preload = std::env::var_os("LD_PRELOAD");
        command.env(
            "LD_PRELOAD",
            intercept::preload_with(library, preload.as_deref()),
        );
        command.env(intercept::LAUNCHER_ENV, &self.shim_exe);
        for assignment in &self.parallelism_set {
            if let Some((name, value)) = assignment.split_once('=') {
                command.env(name, value);
            }
        }
        Ok(())
    }

    /// Makes `command` start in the builds' `cpu` cgroup, where the governor made one, so that
    /// the build and every compiler it starts are born there: moving a process into a cgroup
    /// costs milliseconds on a busy host, and every fork and exit of the machine waits while
    /// it happens (`headroom_probe::cpu_share`). Best effort: the shims move the compilers of
    /// a build that starts outside.
    fn start_in_cpu_group(&self, command: &mut Command) {
        if let Some(dir) = &self.cpu_group {
            cgroup::join_before_exec(dir, command, cgroup::Joining::BestEffort);
        }
    }

    /// The variables that lead a launcher to this session's governor, for running compile
    /// jobs as `LAUNCHER COMPILER ARGS…`.
    pub fn launcher_env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = vec![
            (
                SOCKET_ENV.into(),
                self.place.socket.clone().into_os_string(),
            ),
            (SESSION_ENV.into(), self.id.to_string().into()),
            (SHIM_DIR_ENV.into(), self.shim_dir.clone().into_os_string()),
            (FARM_ENV.into(), if self.farm { "1" } else { "0" }.into()),
        ];
        if let Some(dir) = &self.jobs_temp {
            env.push((JOB_TMPDIR_ENV.into(), dir.path().into()));
        }
        env
    }

    /// Ends the session: the governor resumes anything of it still stopped (and kills its
    /// jobs if `kill_jobs`), records how the build ended, and, with its last session, exits.
    /// Returns `None` when the governor was already gone or stayed silent past the bound
    /// (`crate::liveness`), else the build's report. A silent governor is killed: no session
    /// ever waits on it for good. Compiler calls that ran ungoverned because the governor was
    /// silent (the session's `liveness::Ledger`) are counted to the user.
    pub fn finish(mut self, exit_code: Option<i32>, kill_jobs: bool) -> Ending {
        let ledger = liveness::Ledger::of(&self.place.socket, self.id);
        let ungoverned = ledger.count();
        if ungoverned > 0 {
            headroom_output::say!(
                "headroom: warning: {ungoverned} compiler call(s) ran ungoverned because the \
                 governor did not answer in time"
            );
        }
        // A governor already found silent in this build is not waited for long again.
        let bound = ledger.patience();
        let shutdown = Request::Shutdown {
            exit_code,
            kill_jobs,
        };
        let ended = match write_frame(&self.stream, &shutdown) {
            Err(_) => Ending::Gone,
            Ok(()) => {
                let _ = self.stream.set_read_timeout(Some(bound));
                match liveness::read_reply_up_to(&self.stream, MAX_REPORT_FRAME) {
                    Ok(Reply::ShutDown { report, warnings }) => {
                        for warning in warnings {
                            headroom_output::say!("headroom: warning: {warning}");
                        }
                        wait_for_close(&self.stream, CLOSE_GRACE);
                        Ending::Reported(report)
                    }
                    Err(err) if liveness::is_silence(&err) => Ending::Silent(bound),
                    _ => Ending::Gone,
                }
            }
        };
        if matches!(ended, Ending::Silent(_)) {
            headroom_process::signal_process(self.governor_pid as i32, libc::SIGKILL);
            let _ = std::fs::remove_file(&self.place.socket);
        }
        if let Some(governor) = self.governor.as_mut() {
            // A private governor ends with its only session, and a killed one now, before the
            // next build can find it half gone; a shared one may serve others.
            if self.place.is_shared() && !matches!(ended, Ending::Silent(_)) {
                let _ = governor.try_wait();
            } else {
                let _ = governor.wait();
            }
        }
        ledger.remove();
        self.log.finish();
        ended
    }

    /// How the build stands now, asked on a connection of its own; `None` when the governor
    /// does not answer within `bound` (busy, hung or gone): a live status is never worth a
    /// wait.
    pub fn status(&self, bound: Duration) -> Option<BuildStatus> {
        let stream = liveness::connect(&self.place.socket, bound).ok()?;
        write_frame(&stream, &Request::Status { session: self.id }).ok()?;
        match liveness::read_reply(&stream) {
            Ok(Reply::Status(status)) => Some(status),
            _ => None,
        }
    }
}

/// The sockets of this user's shared governors with `state_dir` (their history), in every
/// memory domain: what `headroom status` asks.
pub fn shared_sockets(state_dir: &Path) -> Vec<PathBuf> {
    let mut sockets: Vec<PathBuf> = [headroom_paths::runtime_dir(), Some(state_dir.join("run"))]
        .into_iter()
        .flatten()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("governor-") && name.ends_with(".sock")
        })
        .collect();
    sockets.sort();
    sockets.dedup();
    sockets
}

/// Every session of the governor listening on `socket` and what each holds, for `headroom
/// status`; `None` when no governor answers there within `bound`.
pub fn governor_status(socket: &Path, bound: Duration) -> Option<GovernorStatus> {
    let stream = liveness::connect(socket, bound).ok()?;
    write_frame(&stream, &Request::Sessions).ok()?;
    match liveness::read_reply(&stream) {
        Ok(Reply::Sessions(status)) => Some(status),
        _ => None,
    }
}

/// Waits, at most `bound`, until the governor closes the session's connection: at once when
/// other sessions go on, and when the governor has left its place (socket, log, lock) and
/// exited when this was its last session. A build that has ended leaves no governor behind
/// it, so a script can remove its cgroup or directories at once.
fn wait_for_close(mut stream: &UnixStream, bound: Duration) {
    use std::io::Read;
    let deadline = std::time::Instant::now() + bound;
    let mut buffer = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        if stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .is_err()
        {
            return;
        }
        // Heartbeats may still come; the end is the close.
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Joins the governor at `place`, starting it when none listens there, and tries again
/// while the governor it found was leaving.
fn join(
    exe: &Path,
    config: &GovernorConfig,
    place: &GovernorPlace,
) -> Result<(UnixStream, Reply, Option<Child>), SessionError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match join_or_start(exe, config, place) {
            Err(err) if tries < JOIN_TRIES && is_retryable(&err) => {
                tracing::debug!("joining the governor failed ({err}); trying again");
                std::thread::sleep(Duration::from_millis(20 * tries as u64));
            }
            joined => return joined,
        }
    }
}

/// Joins the governor at `place`, or starts it there when none listens. Returns the
/// session's connection, the governor's `Joined`, and the governor process if this call
/// started it.
fn join_or_start(
    exe: &Path,
    config: &GovernorConfig,
    place: &GovernorPlace,
) -> Result<(UnixStream, Reply, Option<Child>), SessionError> {
    let join_error = |source| SessionError::Join {
        socket: place.socket.clone(),
        source,
    };
    let bound = liveness::silence_bound();
    let mut governor = None;
    let stream = if place.is_shared() {
        let _held = lock_place(&place.lock).map_err(join_error)?;
        match liveness::connect(&place.socket, bound) {
            Ok(stream) => stream,
            Err(err) if no_listener(&err) => {
                // A governor that died left its socket: the lock says nobody else starts one.
                let _ = std::fs::remove_file(&place.socket);
                let (stream, child) = start_governor(exe, config, place)?;
                governor = Some(child);
                stream
            }
            Err(err) => return Err(join_error(err)),
        }
    } else {
        let (stream, child) = start_governor(exe, config, place)?;
        governor = Some(child);
        stream
    };
    let join = Request::Join {
        config: Box::new(config.clone()),
        root: std::process::id() as i32,
        protocol: PROTOCOL,
    };
    write_frame(&stream, &join).map_err(join_error)?;
    match liveness::read_reply(&stream) {
        Ok(Reply::Joined { protocol, .. }) if protocol != PROTOCOL => {
            Err(join_error(std::io::Error::other(format!(
                "the governor there is another version of headroom (protocol {protocol}; this \
                 one speaks {PROTOCOL})"
            ))))
        }
        Ok(joined @ Reply::Joined { .. }) => {
            // The session's connection waits for its shutdown, however long the build.
            stream.set_read_timeout(None).map_err(join_error)?;
            Ok((stream, joined, governor))
        }
        Ok(other) => Err(join_error(std::io::Error::other(format!(
            "unexpected answer {other:?}"
        )))),
        Err(err) => Err(join_error(err)),
    }
}

/// Whether connecting found nobody listening: no socket, or one whose governor is gone.
fn no_listener(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

/// Whether joining may succeed if tried again: the governor was leaving (its last session
/// had just ended) and closed the connection, or went away between connecting and joining.
fn is_retryable(err: &SessionError) -> bool {
    use std::io::ErrorKind::{
        BrokenPipe, ConnectionRefused, ConnectionReset, NotFound, UnexpectedEof,
    };
    matches!(err, SessionError::Join { source, .. }
        if matches!(source.kind(), UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionRefused | NotFound))
}

/// Binds the place's socket and starts a governor on it; returns a connection to it.
fn start_governor(
    exe: &Path,
    config: &GovernorConfig,
    place: &GovernorPlace,
) -> Result<(UnixStream, Child), SessionError> {
    let listener = UnixListener::bind(&place.socket).map_err(|source| SessionError::Join {
        socket: place.socket.clone(),
        source,
    })?;
    let fd = listener.as_raw_fd();
    let config = serde_json::to_string(config)?;
    let mut command = Command::new(exe);
    // The configuration goes through stdin: it holds the build command, which may be longer
    // than the kernel lets one variable be (128 KiB; a link of thousands of objects).
    command
        .arg(GOVERNOR_SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    if place.is_shared() {
        command.env(GOVERNOR_LOCK_ENV, &place.lock);
    }
    // A governor that outlives this session must not hold its terminal or pipes: what it
    // says goes to its log, which each session follows (`governor_log`).
    command
        .env(governor_log::LOG_ENV, governor_log::GOVERNOR_LEVEL)
        .env("HEADROOM_COLOR", "never");
    match File::create(&place.log) {
        Ok(log) => command.stderr(log),
        Err(_) => command.stderr(Stdio::null()),
    };
    // SAFETY: dup2 and fcntl are async-signal-safe and touch only the listener's descriptor.
    unsafe {
        command.pre_exec(move || {
            let moved = if fd == GOVERNOR_FD {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, GOVERNOR_FD)
            };
            if moved < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = headroom_process::spawn(&mut command, Group::Own)
        .map_err(|err| SessionError::Governor(err.source))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(config.as_bytes())
            .map_err(SessionError::Governor)?;
    }
    // The socket listens already: the connection waits in its backlog for the governor.
    let stream = UnixStream::connect(&place.socket).map_err(|source| SessionError::Join {
        socket: place.socket.clone(),
        source,
    })?;
    stream
        .set_read_timeout(Some(liveness::silence_bound()))
        .map_err(SessionError::Governor)?;
    Ok((stream, child))
}

/// How a session ended.
pub enum Ending {
    /// The governor ended the session and sent its build as it saw it.
    Reported(Box<BuildReport>),
    /// The governor was gone before the build ended: it ran ungoverned from then on.
    Gone,
    /// The governor said nothing for this long after the build ended, and was killed.
    Silent(Duration),
}

/// What torch's `cpp_extension` reads to leave its compiler wrapper out.
pub const TORCH_WRAPPER_ENV: &str = "TORCH_NO_COMPILER_WRAPPER";

/// The variables (`NAME=VALUE`) that the build command `command` gets: the parallelism
/// variables that offer it `offered` jobs (see [`parallelism_set`]), and
/// `TORCH_NO_COMPILER_WRAPPER=1` where torch would hand its compiles to sccache (see
/// [`torch_wrapper_off`]). headroom sets them only where it governs what they start (see
/// [`Session::start`]).
pub fn build_variables(offered: usize, command: &[OsString]) -> Vec<String> {
    let mut set = parallelism_set(offered, command);
    set.extend(torch_wrapper_off());
    set
}

/// torch's `cpp_extension` puts the first of `ccache` and `sccache` on PATH before every
/// compiler, unless `TORCH_NO_COMPILER_WRAPPER` is set. ccache runs the compiler itself,
/// inside the build, where the interceptor governs it. sccache hands it to its server, a
/// daemon that may predate the build and that runs nvcc's cicc and cudafe++ by itself: those
/// compiles run outside every job, ungoverned. So where torch would pick sccache, the build
/// gets `TORCH_NO_COMPILER_WRAPPER=1`; a user who sets the variable (even empty) keeps it.
fn torch_wrapper_off() -> Option<String> {
    let picks_sccache = std::env::var_os(TORCH_WRAPPER_ENV).is_none()
        && headroom_farm::find_on_path("ccache").is_none()
        && headroom_farm::find_on_path("sccache").is_some();
    picks_sccache.then(|| format!("{TORCH_WRAPPER_ENV}=1"))
}

/// The parallelism variables (`NAME=VALUE`) that offer the build command `command`
/// `offered` jobs: `MAX_JOBS`, `CMAKE_BUILD_PARALLEL_LEVEL` and `CARGO_BUILD_JOBS`, which
/// only tools that run their jobs in any order read, and `MAKEFLAGS=-jN` where
/// [`make_takes_jobs`] says make may run in parallel. A variable the user has set, even
/// empty, is left alone: it is their choice.
fn parallelism_set(offered: usize, command: &[OsString]) -> Vec<String> {
    let mut set = Vec::new();
    for name in ["MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "CARGO_BUILD_JOBS"] {
        if std::env::var_os(name).is_none() {
            set.push(format!("{name}={offered}"));
        }
    }
    if std::env::var_os("MAKEFLAGS").is_none() && make_takes_jobs(command).is_ok() {
        set.push(format!("MAKEFLAGS=-j{offered}"));
    }
    set
}

/// Whether headroom may offer `make -jN` to the build command `command`, and if not, why, when
/// the user should hear it. `-jN` makes make build the goals it was given at the same time:
/// `make clean all` would remove what `all` builds while it builds it. So make is offered jobs
/// only when headroom runs it itself (a script's makes may name goals in any order) with at
/// most one goal and no `-j` of the user's. A Makefile that is not safe in parallel says so
/// with `.NOTPARALLEL:`, which make honours under `-j`; `--no-offer-jobs` or `MAKEFLAGS=`
/// keep make as it is anyway.
pub fn make_takes_jobs(command: &[OsString]) -> Result<(), Option<String>> {
    let Some((program, args)) = command.split_first() else {
        return Err(None);
    };
    let name = Path::new(program).file_name().unwrap_or_default();
    if name != "make" && name != "gmake" {
        return Err(None);
    }
    let mut goals = Vec::new();
    let mut args = args.iter().map(|arg| arg.to_string_lossy());
    while let Some(arg) = args.next() {
        match arg.as_ref() {
            // The user chose make's parallelism.
            jobs if jobs.starts_with("-j") || jobs.starts_with("--jobs") => return Err(None),
            // Options whose value is the next argument.
            "-C" | "-f" | "-I" | "-o" | "-W" | "--file" | "--makefile" | "--directory"
            | "--include-dir" | "--old-file" | "--assume-old" | "--what-if" | "--new-file"
            | "--assume-new" | "--eval" => {
                args.next();
            }
            option if option.starts_with('-') => {}
            assignment if assignment.contains('=') => {}
            goal => goals.push(goal.to_string()),
        }
    }
    if goals.len() > 1 {
        return Err(Some(format!(
            "make was given {} goals ({}), which `make -j` would build at the same time; \
             headroom does not offer it jobs (run each goal as its own `headroom build`, or \
             give `-jN` yourself if the goals may run together)",
            goals.len(),
            goals.join(" ")
        )));
    }
    Ok(())
}

/// Whether `dir` is, or can be made, a directory that only this user can enter: owned by
/// them, with no access for group or others (as sccache checks its socket directory).
fn is_private_to_me(dir: &Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir);
    let private = std::fs::symlink_metadata(dir).is_ok_and(|meta| {
        meta.is_dir()
            && meta.uid() == rustix::process::getuid().as_raw()
            && meta.permissions().mode() & 0o077 == 0
    });
    if made.is_err() || !private {
        tracing::debug!(
            "{} is not a private directory of this user's",
            dir.display()
        );
    }
    made.is_ok() && private
}

/// Entry point of the governor process (`headroom __governor`); only a crate that enables the
/// `governor` feature (the binary) runs it, so the session's clients build without SQLite.
#[cfg(feature = "governor")]
pub fn governor_main() -> Result<(), SessionError> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl(2) only asks whether the descriptor is open; run by hand, it is not.
    if unsafe { libc::fcntl(GOVERNOR_FD, libc::F_GETFD) } == -1 {
        return Err(SessionError::NotStartedByHeadroom);
    }
    // SAFETY: `start_governor` passes the listening socket as this descriptor, which is open;
    // where it is no listening socket the governor stops here.
    let listener = unsafe { UnixListener::from_raw_fd(GOVERNOR_FD) };
    let socket = listener
        .local_addr()
        .ok()
        .and_then(|address| address.as_pathname().map(Path::to_path_buf))
        .ok_or(SessionError::NotStartedByHeadroom)?;
    let exit = Exit {
        socket,
        lock: std::env::var_os(GOVERNOR_LOCK_ENV).map(PathBuf::from),
    };
    // A CLI killed while it wrote the configuration leaves half of it: the governor leaves its
    // place then, as after its last session, rather than a socket nobody answers.
    let config = std::io::read_to_string(std::io::stdin())
        .map_err(SessionError::Governor)
        .and_then(|config| Ok(serde_json::from_str::<GovernorConfig>(&config)?))
        .inspect_err(|_| exit.leave())?;
    crate::governor::serve(listener, config, exit).map_err(SessionError::Governor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn make_is_offered_jobs_only_for_one_goal_it_runs_itself() {
        for offered in [
            "make",
            "make check",
            "/usr/bin/make -C examples/template-heavy all",
            "gmake -f other.mk CXX=clang++ --keep-going install",
        ] {
            assert_eq!(make_takes_jobs(&command(offered)), Ok(()), "{offered}");
        }
        for (kept, told) in [
            ("make clean all", true),
            ("make -C examples/template-heavy clean check", true),
            ("make -j1 clean all", false),
            ("make --jobs=3", false),
            ("ninja", false),
            ("sh -c make", false),
        ] {
            let why = make_takes_jobs(&command(kept)).unwrap_err();
            assert_eq!(why.is_some(), told, "{kept}: {why:?}");
        }
    }
}
