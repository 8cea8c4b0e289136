//! `headroom build -- CMD…`: runs an unchanged build command as parallel as memory allows.
//!
//! The CLI works out the budget, starts the governor on a private socket, puts the shim
//! directory first on PATH, runs CMD, and at the end prints the summary. It exits with CMD's
//! own exit code.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use headroom_govern::budget::{self, MemoryFacts};
use headroom_govern::governor::GovernorConfig;
use headroom_govern::protocol::{read_frame, write_frame, Reply, Request};
use headroom_govern::shim::{LAUNCHER_NAME, SHIM_DIR_ENV, SOCKET_ENV};
use headroom_govern::shimdir;
use headroom_probe::size::Size;
use headroom_store::history::state_dir;
use headroom_store::{summary, BuildReport, History};

use crate::config::{BuildOverrides, BuildSettings, FileConfig};

/// The governor reads its configuration from this variable and its socket from fd 3.
pub const GOVERNOR_CONFIG_ENV: &str = "HEADROOM_GOVERNOR_CONFIG";
const GOVERNOR_FD: i32 = 3;
/// How long an interrupted build may take to stop before it is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Arguments of `headroom build`.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// Memory the build's jobs may use together: a size (`6G`, `1.5GiB`), a percentage of
    /// available memory (`70%`) or `auto` (available memory or cgroup room, minus a reserve).
    #[arg(long, env = "HEADROOM_BUDGET", value_name = "SIZE|PERCENT")]
    budget: Option<String>,
    /// Most jobs that run at once [default: the number of CPUs].
    #[arg(long, short = 'j', env = "HEADROOM_JOBS", value_name = "N")]
    jobs: Option<usize>,
    /// Write the build report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Let jobs that run out of memory even alone be rebuilt with lower-memory flags
    /// (`-g0`, then `-O1`, then `-O0` and small GC parameters); the report lists them.
    #[arg(long, env = "HEADROOM_LOWER_FLAGS")]
    lower_flags: bool,
    /// Memory sampling interval of running jobs, in milliseconds.
    #[arg(
        long,
        env = "HEADROOM_SAMPLE_INTERVAL_MS",
        value_name = "MS",
        hide = true
    )]
    sample_interval_ms: Option<u64>,
    /// Do not read or write the build history.
    #[arg(long)]
    no_history: bool,
    /// The build command, unchanged: `make -j8`, `ninja`, `cmake --build build`, `pip install .`…
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

pub fn main(args: BuildArgs) -> Result<u8> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let settings = settings(&args, &cwd)?;
    let facts = MemoryFacts::read()?;
    let budget = budget::resolve(settings.budget, &facts);
    let (room, _) = facts.room();
    if budget.bytes > room {
        eprintln!(
            "headroom: warning: the budget {} is more than this machine can hand out now ({}); jobs may be OOM-killed",
            Size(budget.bytes),
            Size(room)
        );
    }
    let history = (!args.no_history).then(History::default_path);
    let exe = std::env::current_exe().context("cannot locate the headroom binary")?;
    let shim_dir = state_dir().join("shims");
    let path = std::env::var_os("PATH").unwrap_or_default();
    shimdir::install(&shim_dir, &exe, &shimdir::compiler_names(&path)).with_context(|| {
        format!(
            "cannot create the shim directory {} (set HEADROOM_STATE_DIR to use another place)",
            shim_dir.display()
        )
    })?;

    let socket = socket_path()?;
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    let config = GovernorConfig {
        budget: budget.bytes,
        budget_source: budget.source,
        slots: settings.jobs,
        history: history.clone(),
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        cwd: cwd.to_string_lossy().into_owned(),
        started_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        ladder: settings.ladder,
        sample_interval_ms: settings.sample_interval_ms,
    };
    let mut governor = start_governor(&exe, &listener, &config)?;
    drop(listener);

    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    let start = Instant::now();
    let build = build_command(&args.command, &shim_dir, &socket, &path, settings.jobs).spawn();
    let mut build = match build {
        Ok(child) => child,
        Err(err) => {
            shut_down_governor(&socket, None, false);
            let _ = std::fs::remove_file(&socket);
            let program = args.command[0].to_string_lossy();
            if err.kind() == std::io::ErrorKind::NotFound {
                eprintln!("headroom: command not found: {program}");
                return Ok(127);
            }
            bail!("cannot run `{program}`: {err}");
        }
    };
    let status = wait_for_build(&mut build, &interrupted)?;
    let was_interrupted = interrupted.load(Ordering::Relaxed);
    let exit_code = exit_code_of(status);

    let build_id = shut_down_governor(&socket, Some(exit_code), was_interrupted);
    let _ = governor.wait();
    let _ = std::fs::remove_file(&socket);
    match (build_id, history) {
        (Some(Some(id)), Some(path)) => report(&path, id, args.report.as_deref())?,
        (None, _) => eprintln!(
            "headroom: warning: the governor stopped before the build ended; the build ran ungoverned from then on and has no report ({:.1} s)",
            start.elapsed().as_secs_f64()
        ),
        _ => eprintln!("headroom: build finished in {:.1} s (no history, so no report)", start.elapsed().as_secs_f64()),
    }
    Ok(if was_interrupted {
        130
    } else {
        exit_code as u8
    })
}

fn settings(args: &BuildArgs, cwd: &Path) -> Result<BuildSettings> {
    let project = match FileConfig::find_project(cwd) {
        Some(path) => FileConfig::load(&path)?,
        None => FileConfig::default(),
    };
    let user = match FileConfig::user_path() {
        Some(path) => FileConfig::load(&path)?,
        None => FileConfig::default(),
    };
    let overrides = BuildOverrides {
        budget: args.budget.clone(),
        jobs: args.jobs,
        lower_flags: args.lower_flags,
        sample_interval_ms: args.sample_interval_ms,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    BuildSettings::merge(&overrides, &project, &user, cpus)
}

/// A fresh socket path in the per-user runtime directory (mode 0700).
fn socket_path() -> Result<PathBuf> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(runtime) => PathBuf::from(runtime).join("headroom"),
        None => {
            std::env::temp_dir().join(format!("headroom-{}", rustix::process::getuid().as_raw()))
        }
    };
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create the runtime directory {}", dir.display()))?;
    let meta = std::fs::metadata(&dir)?;
    if meta.uid() != rustix::process::getuid().as_raw() || meta.permissions().mode() & 0o077 != 0 {
        bail!("the runtime directory {} is not private to you (owner or mode); remove it or set XDG_RUNTIME_DIR", dir.display());
    }
    let socket = dir.join(format!("build-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    Ok(socket)
}

/// Starts `headroom __governor` on the already-bound socket, in its own process group so a
/// Ctrl-C aimed at the build does not kill it before it has released every job.
fn start_governor(exe: &Path, listener: &UnixListener, config: &GovernorConfig) -> Result<Child> {
    let fd = listener.as_raw_fd();
    let mut command = Command::new(exe);
    command
        .arg("__governor")
        .env(GOVERNOR_CONFIG_ENV, serde_json::to_string(config)?)
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
    command.spawn().context("cannot start the governor process")
}

/// Entry point of the hidden `headroom __governor`.
pub fn governor_main() -> Result<u8> {
    let config: GovernorConfig = serde_json::from_str(
        &std::env::var(GOVERNOR_CONFIG_ENV)
            .context("the governor is started by `headroom build`, not by hand")?,
    )?;
    // If the CLI dies, end too (releasing every stopped job on the way out).
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
    // SAFETY: `headroom build` passes the listening socket as this descriptor.
    let listener = unsafe { UnixListener::from_raw_fd(GOVERNOR_FD) };
    headroom_govern::governor::serve(listener, config)?;
    Ok(0)
}

/// The build command with the shims first on PATH and the launcher and parallelism variables
/// set, each only where the user has not set it already.
fn build_command(
    command: &[OsString],
    shim_dir: &Path,
    socket: &Path,
    path: &OsString,
    jobs: usize,
) -> Command {
    let mut build = Command::new(&command[0]);
    build.args(&command[1..]);
    let mut dirs = vec![shim_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(path));
    build.env(
        "PATH",
        std::env::join_paths(dirs).unwrap_or_else(|_| path.clone()),
    );
    build.env(SOCKET_ENV, socket).env(SHIM_DIR_ENV, shim_dir);
    let launcher = shim_dir.join(LAUNCHER_NAME);
    let unset = |name: &str| std::env::var_os(name).is_none();
    for name in [
        "CMAKE_C_COMPILER_LAUNCHER",
        "CMAKE_CXX_COMPILER_LAUNCHER",
        "CMAKE_CUDA_COMPILER_LAUNCHER",
        "CMAKE_HIP_COMPILER_LAUNCHER",
        "CCACHE_PREFIX",
        "RUSTC_WRAPPER",
    ] {
        if unset(name) {
            build.env(name, &launcher);
        }
    }
    // Offer more jobs than run, so the governor can pick small ones past a big one that waits.
    let offered = (2 * jobs).to_string();
    for name in ["MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "CARGO_BUILD_JOBS"] {
        if unset(name) {
            build.env(name, &offered);
        }
    }
    let makeflags = std::env::var("MAKEFLAGS").unwrap_or_default();
    if !makeflags
        .split_whitespace()
        .any(|flag| flag.starts_with("-j") || flag.starts_with("--jobs"))
    {
        build.env("MAKEFLAGS", format!("{makeflags} -j{offered}").trim_start());
    }
    build
}

/// Waits for the build; on Ctrl-C passes the interrupt on and, after a grace period, kills it.
fn wait_for_build(build: &mut Child, interrupted: &AtomicBool) -> Result<ExitStatus> {
    let mut interrupted_at: Option<Instant> = None;
    loop {
        if let Some(status) = build.try_wait()? {
            return Ok(status);
        }
        if interrupted.load(Ordering::Relaxed) {
            match interrupted_at {
                None => {
                    interrupted_at = Some(Instant::now());
                    // SAFETY: kill(2) on our own child.
                    unsafe { libc::kill(build.id() as i32, libc::SIGINT) };
                }
                Some(at) if at.elapsed() > INTERRUPT_GRACE => {
                    let _ = build.kill();
                }
                Some(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The build's exit code, or 128 + signal as shells report it.
fn exit_code_of(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Tells the governor the build is over. `None` when the governor is gone; otherwise the
/// build's id in the history, if it has one.
fn shut_down_governor(
    socket: &Path,
    exit_code: Option<i32>,
    kill_jobs: bool,
) -> Option<Option<i64>> {
    let stream = UnixStream::connect(socket).ok()?;
    write_frame(
        &stream,
        &Request::Shutdown {
            exit_code,
            kill_jobs,
        },
    )
    .ok()?;
    match read_frame::<Reply>(&stream).ok()? {
        Reply::ShutDown { build_id } => Some(build_id),
        _ => None,
    }
}

/// Prints the summary of build `id` and writes the JSON report if asked.
fn report(history: &Path, id: i64, json: Option<&Path>) -> Result<()> {
    let report = History::open(history)?.load_build(id)?;
    eprint!("{}", summary::render(&report));
    if let Some(path) = json {
        write_json_report(&report, path)?;
    }
    Ok(())
}

/// Writes a report atomically: a crash never leaves half a file.
pub fn write_json_report(report: &BuildReport, path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write a report in {}", dir.display()))?;
    serde_json::to_writer_pretty(&mut file, report)?;
    file.write_all(b"\n")?;
    file.persist(path)
        .with_context(|| format!("cannot write the report {}", path.display()))?;
    Ok(())
}
