//! A governed session: everything needed to put a governor in front of a set of compiler
//! processes, for `headroom build` (a whole build command) and `headroom kernels build` (its
//! own compile jobs through the launcher) alike.
//!
//! Race-free start: the socket is bound here, before the governor process exists, and handed
//! to it as fd 3; no shim can ever find the socket missing.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use headroom_store::BuildReport;

use crate::governor::{serve, GovernorConfig};
use crate::intercept;
use crate::liveness;
use crate::protocol::{write_frame, BuildStatus, Reply, Request, MAX_REPORT_FRAME};
use crate::shim::{LAUNCHER_NAME, SHIM_DIR_ENV, SOCKET_ENV};
use crate::shimdir;

/// The governor reads its configuration from this variable and its socket from fd 3.
const GOVERNOR_CONFIG_ENV: &str = "HEADROOM_GOVERNOR_CONFIG";
/// The id of the process that started the governor, which it must not outlive.
const GOVERNOR_PARENT_ENV: &str = "HEADROOM_GOVERNOR_PARENT";
const GOVERNOR_FD: i32 = 3;
/// Socket names start so, followed by the id of the CLI that made them.
const SOCKET_KIND: &str = "session-";
/// A private socket directory of a session's own under the temporary directory (where the
/// user's runtime directory cannot be used) is named so, followed by the CLI's id.
const RUNTIME_KIND: &str = "headroom-run";
/// The hidden subcommand that runs the governor.
pub const GOVERNOR_SUBCOMMAND: &str = "__governor";

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
    #[error("the governor must be started by `headroom build`, not by hand")]
    NotStartedByHeadroom,
    #[error("invalid governor configuration: {0}")]
    Config(#[from] serde_json::Error),
}

/// A running governor and the ways that lead compilers to it.
pub struct Session {
    socket: PathBuf,
    /// The socket's directory when it is a temporary one of this session's own.
    _socket_dir: Option<tempfile::TempDir>,
    shim_dir: PathBuf,
    /// The shim directory when the state directory's could not be used.
    _temporary_shims: Option<tempfile::TempDir>,
    /// The shim binary, which the interceptor runs as `headroom-launch COMPILER ARGS…`.
    shim_exe: PathBuf,
    /// The interceptor to preload into the build, or why there is none.
    interceptor: Result<PathBuf, String>,
    /// The variables the build gets (`NAME=VALUE`, see [`build_variables`]).
    parallelism_set: Vec<String>,
    governor: Child,
}

impl Session {
    /// Refreshes the shim directory and the interceptor, binds the socket and starts the
    /// governor process (`exe __governor`, in its own process group so a Ctrl-C aimed at the
    /// build reaches it only through an orderly shutdown). Without an interceptor nothing is
    /// governed, so the config's variables are dropped.
    /// The shims and the interceptor go under `state_dir` (see [`crate::state`]).
    pub fn start(
        exe: &Path,
        config: &GovernorConfig,
        state_dir: &Path,
    ) -> Result<Session, SessionError> {
        // The small shim binary installed beside headroom starts faster than headroom itself.
        let small_shim = exe.with_file_name("headroom-shim");
        let shim_exe = if small_shim.is_file() {
            small_shim
        } else {
            exe.to_path_buf()
        };
        let (shim_dir, temporary_shims) = shimdir::install_or_temporary(state_dir, &shim_exe)
            .map_err(|(path, source)| SessionError::ShimDir { path, source })?;
        let library_dir = state_dir.join("lib");
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
        let (socket, listener, socket_dir) = bind_socket()?;
        let fd = listener.as_raw_fd();
        let mut command = Command::new(exe);
        command
            .arg(GOVERNOR_SUBCOMMAND)
            .env(GOVERNOR_CONFIG_ENV, serde_json::to_string(&config)?)
            .env(GOVERNOR_PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .process_group(0);
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
        let governor = command.spawn().map_err(SessionError::Governor)?;
        Ok(Session {
            socket,
            _socket_dir: socket_dir,
            shim_dir,
            _temporary_shims: temporary_shims,
            shim_exe,
            interceptor,
            parallelism_set: config.parallelism_set,
            governor,
        })
    }

    /// The governor process's id.
    pub fn governor_pid(&self) -> u32 {
        self.governor.id()
    }

    /// `headroom-launch`: put it before a compiler's path to run that compiler governed.
    pub fn launcher(&self) -> PathBuf {
        self.shim_dir.join(LAUNCHER_NAME)
    }

    /// Sets up `command` (a build command) so every compiler it starts is governed: the
    /// interceptor preloaded, leading each compiler exec to the launcher, and the
    /// variables of the config. Returns why the build runs ungoverned, if it does.
    pub fn govern(&self, command: &mut Command) -> Result<(), String> {
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

    /// The variables that lead a launcher to this session's governor, for running compile
    /// jobs as `LAUNCHER COMPILER ARGS…`.
    pub fn launcher_env(&self) -> Vec<(OsString, OsString)> {
        vec![
            (SOCKET_ENV.into(), self.socket.clone().into_os_string()),
            (SHIM_DIR_ENV.into(), self.shim_dir.clone().into_os_string()),
        ]
    }

    /// Ends the session: the governor resumes anything stopped (and kills every job if
    /// `kill_jobs`), records how the build ended, and exits. Returns `None` when the governor
    /// was already gone or stayed silent past the bound (`crate::liveness`), else the build's
    /// report. A silent governor is killed: it never outlives its session, and the session
    /// never waits on it for good. Compiler calls that ran ungoverned because the governor was
    /// silent (the session's `liveness::Ledger`) are counted to the user.
    pub fn finish(mut self, exit_code: Option<i32>, kill_jobs: bool) -> Ending {
        let ledger = liveness::Ledger::of(&self.socket);
        let ungoverned = ledger.count();
        if ungoverned > 0 {
            headroom_output::say!(
                "headroom: warning: {ungoverned} compiler call(s) ran ungoverned because the \
                 governor did not answer in time"
            );
        }
        // A governor already found silent in this build is not waited for long again.
        let bound = ledger.patience();
        let ended = (|| {
            let stream = liveness::connect(&self.socket, bound).map_err(|_| Ending::Gone)?;
            let shutdown = Request::Shutdown {
                exit_code,
                kill_jobs,
            };
            write_frame(&stream, &shutdown).map_err(|_| Ending::Gone)?;
            Ok(
                match liveness::read_reply_up_to(&stream, MAX_REPORT_FRAME) {
                    Ok(Reply::ShutDown { report }) => Ending::Reported(report),
                    Err(err) if liveness::is_silence(&err) => Ending::Silent(bound),
                    _ => Ending::Gone,
                },
            )
        })()
        .unwrap_or_else(|gone| gone);
        if !matches!(ended, Ending::Reported(_)) {
            let _ = self.governor.kill();
        }
        let _ = self.governor.wait();
        let _ = std::fs::remove_file(&self.socket);
        ledger.remove();
        ended
    }

    /// How the build stands now, asked on a connection of its own; `None` when the governor
    /// does not answer within `bound` (busy, hung or gone): a live status is never worth a
    /// wait.
    pub fn status(&self, bound: Duration) -> Option<BuildStatus> {
        let stream = liveness::connect(&self.socket, bound).ok()?;
        write_frame(&stream, &Request::Status).ok()?;
        match liveness::read_reply(&stream) {
            Ok(Reply::Status(status)) => Some(status),
            _ => None,
        }
    }
}

/// How a session ended.
pub enum Ending {
    /// The governor shut down and sent the build as it saw it.
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

/// Binds the governor's socket in a directory only this user can enter: the user's runtime
/// directory (`headroom_paths::runtime_dir`) when it is private to them and can be used, else
/// a new directory of this session's own under the temporary directory, made with a random
/// name. Never a predictable name in a shared directory: another local user could take that
/// first and keep every build from starting. Returns the socket, its listener, and the
/// temporary directory if one was made.
fn bind_socket() -> Result<(PathBuf, UnixListener, Option<tempfile::TempDir>), SessionError> {
    let name = format!("{}governor.sock", headroom_paths::temp::prefix(SOCKET_KIND));
    if let Some(dir) = headroom_paths::runtime_dir().filter(|dir| is_private_to_me(dir)) {
        // A CLI killed before it could remove its socket leaves it here: the next one does.
        headroom_paths::temp::remove_orphaned(&dir, SOCKET_KIND);
        let socket = dir.join(&name);
        let _ = std::fs::remove_file(&socket);
        match UnixListener::bind(&socket) {
            Ok(listener) => return Ok((socket, listener, None)),
            Err(err) => tracing::debug!("cannot bind {}: {err}", socket.display()),
        }
    }
    let temp = std::env::temp_dir();
    headroom_paths::temp::remove_orphaned(&temp, RUNTIME_KIND);
    let runtime_error = |source| SessionError::RuntimeDir {
        path: temp.clone(),
        source,
    };
    // mkdtemp: a new directory, mode 0700, under a name nobody could have taken before.
    let dir = tempfile::Builder::new()
        .prefix(&headroom_paths::temp::prefix(RUNTIME_KIND))
        .tempdir_in(&temp)
        .map_err(runtime_error)?;
    let socket = dir.path().join(&name);
    let listener = UnixListener::bind(&socket).map_err(runtime_error)?;
    Ok((socket, listener, Some(dir)))
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

/// Entry point of the governor process (`headroom __governor`).
pub fn governor_main() -> Result<(), SessionError> {
    let config =
        std::env::var(GOVERNOR_CONFIG_ENV).map_err(|_| SessionError::NotStartedByHeadroom)?;
    let config: GovernorConfig = serde_json::from_str(&config)?;
    // If the CLI dies, end too, releasing every stopped job on the way out. A CLI that died
    // before this was armed left the governor to another parent: end now.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| SessionError::Governor(e.into()))?;
    let parent = rustix::process::getppid().map_or(0, |pid| pid.as_raw_nonzero().get());
    if std::env::var(GOVERNOR_PARENT_ENV).ok() != Some(parent.to_string()) {
        return Ok(());
    }
    // SAFETY: `Session::start` passes the listening socket as this descriptor.
    let listener = unsafe { UnixListener::from_raw_fd(GOVERNOR_FD) };
    serve(listener, config).map_err(SessionError::Governor)
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
