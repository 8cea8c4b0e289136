//! A governed session: everything needed to put a governor in front of a set of compiler
//! processes, for `headroom build` (a whole build command) and `headroom kernels build` (its
//! own compile jobs through the launcher) alike.
//!
//! Race-free start: the socket is bound here, before the governor process exists, and handed
//! to it as fd 3; no shim can ever find the socket missing.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use headroom_store::BuildReport;

use crate::governor::{serve, GovernorConfig};
use crate::intercept;
use crate::protocol::{read_frame_up_to, write_frame, Reply, Request, MAX_REPORT_FRAME};
use crate::shim::{LAUNCHER_NAME, SHIM_DIR_ENV, SOCKET_ENV};
use crate::shimdir;

/// The governor reads its configuration from this variable and its socket from fd 3.
const GOVERNOR_CONFIG_ENV: &str = "HEADROOM_GOVERNOR_CONFIG";
const GOVERNOR_FD: i32 = 3;
/// Socket names start so, followed by the id of the CLI that made them.
const SOCKET_KIND: &str = "session-";
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
    #[error("cannot create the private runtime directory {path} (set XDG_RUNTIME_DIR to use another place): {source}")]
    RuntimeDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the runtime directory {0} is not private to you (owner or mode); remove it or set XDG_RUNTIME_DIR")]
    NotPrivate(PathBuf),
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
    shim_dir: PathBuf,
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
        let shim_dir = state_dir.join("shims");
        // The small shim binary installed beside headroom starts faster than headroom itself.
        let small_shim = exe.with_file_name("headroom-shim");
        let shim_exe = if small_shim.is_file() {
            small_shim
        } else {
            exe.to_path_buf()
        };
        shimdir::install(&shim_dir, &shim_exe).map_err(|source| SessionError::ShimDir {
            path: shim_dir.clone(),
            source,
        })?;
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
        let socket = socket_path()?;
        let listener = UnixListener::bind(&socket).map_err(|source| SessionError::RuntimeDir {
            path: socket.clone(),
            source,
        })?;
        let fd = listener.as_raw_fd();
        let mut command = Command::new(exe);
        command
            .arg(GOVERNOR_SUBCOMMAND)
            .env(GOVERNOR_CONFIG_ENV, serde_json::to_string(&config)?)
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
            shim_dir,
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
    /// was already gone, else the build's report.
    pub fn finish(mut self, exit_code: Option<i32>, kill_jobs: bool) -> Option<Box<BuildReport>> {
        let ended = (|| {
            let stream = UnixStream::connect(&self.socket).ok()?;
            write_frame(
                &stream,
                &Request::Shutdown {
                    exit_code,
                    kill_jobs,
                },
            )
            .ok()?;
            match read_frame_up_to::<Reply>(&stream, MAX_REPORT_FRAME).ok()? {
                Reply::ShutDown { report } => Some(report),
                _ => None,
            }
        })();
        let _ = self.governor.wait();
        let _ = std::fs::remove_file(&self.socket);
        ended
    }
}

/// What torch's `cpp_extension` reads to leave its compiler wrapper out.
pub const TORCH_WRAPPER_ENV: &str = "TORCH_NO_COMPILER_WRAPPER";

/// The variables (`NAME=VALUE`) a governed build command gets: the parallelism variables
/// that offer it `offered` jobs, and `TORCH_NO_COMPILER_WRAPPER=1` where torch would hand
/// its compiles to sccache (see [`torch_wrapper_off`]). headroom sets them only where it
/// governs what they start (see [`Session::start`]).
pub fn build_variables(offered: usize) -> Vec<String> {
    let mut set = parallelism_set(offered);
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

/// The parallelism variables (`NAME=VALUE`) that offer a build `offered` jobs, among
/// `MAX_JOBS`, `CMAKE_BUILD_PARALLEL_LEVEL`, `CARGO_BUILD_JOBS` and `-jN` in `MAKEFLAGS`,
/// leaving alone what the user has set.
fn parallelism_set(offered: usize) -> Vec<String> {
    let mut set = Vec::new();
    for name in ["MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "CARGO_BUILD_JOBS"] {
        if std::env::var_os(name).is_none() {
            set.push(format!("{name}={offered}"));
        }
    }
    let makeflags = std::env::var("MAKEFLAGS").unwrap_or_default();
    let has_jobs = makeflags
        .split_whitespace()
        .any(|f| f.starts_with("-j") || f.starts_with("--jobs"));
    if !has_jobs {
        set.push(format!(
            "MAKEFLAGS={}",
            format!("{makeflags} -j{offered}").trim_start()
        ));
    }
    set
}

/// A fresh socket path in the per-user runtime directory (mode 0700).
fn socket_path() -> Result<PathBuf, SessionError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let uid = rustix::process::getuid().as_raw();
    let dir = headroom_paths::runtime_dir(uid);
    let runtime_error = |source| SessionError::RuntimeDir {
        path: dir.clone(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(runtime_error)?;
    let meta = std::fs::metadata(&dir).map_err(runtime_error)?;
    if meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(SessionError::NotPrivate(dir));
    }
    // A CLI killed before it could remove its socket leaves it here: the next one does.
    headroom_paths::temp::remove_orphaned(&dir, SOCKET_KIND);
    let socket = dir.join(format!(
        "{}governor.sock",
        headroom_paths::temp::prefix(SOCKET_KIND)
    ));
    let _ = std::fs::remove_file(&socket);
    Ok(socket)
}

/// Entry point of the governor process (`headroom __governor`).
pub fn governor_main() -> Result<(), SessionError> {
    let config =
        std::env::var(GOVERNOR_CONFIG_ENV).map_err(|_| SessionError::NotStartedByHeadroom)?;
    let config: GovernorConfig = serde_json::from_str(&config)?;
    // If the CLI dies, end too, releasing every stopped job on the way out.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| SessionError::Governor(e.into()))?;
    // SAFETY: `Session::start` passes the listening socket as this descriptor.
    let listener = unsafe { UnixListener::from_raw_fd(GOVERNOR_FD) };
    serve(listener, config).map_err(SessionError::Governor)
}
