//! `headroom build CMD…`: runs an unchanged build command as parallel as memory allows.
//!
//! The CLI works out the budget, starts a governed session (`headroom_govern::session`), runs
//! CMD with the shims first on PATH, and at the end prints the summary. It exits with CMD's
//! own exit code.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use headroom_govern::session::{make_takes_jobs, Ending, Session, TORCH_WRAPPER_ENV};
use headroom_process::{shell_code, Interrupts};
use headroom_report::{chrome_trace, summary, BuildReport};

use headroom_config::{session_settings, BuildOverrides};
use headroom_govern::start::{start_session, StartError};
use headroom_output as output;

mod bazel;
mod live;
use bazel::BazelBuild;
use live::LiveStatus;

/// How long an interrupted build may take to stop before it is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Arguments of `headroom build`.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// Memory the build's jobs may use together: a size (`6G`, `1.5GiB`), a percentage of
    /// available memory (`70%`) or `auto` (available memory or cgroup room, minus a reserve).
    /// [env: HEADROOM_BUDGET]
    // No `env =`: `BuildSettings::load` reads HEADROOM_BUDGET, so that a bad value is blamed
    // on the variable and not on this flag.
    #[arg(long, value_name = "SIZE|PERCENT", allow_hyphen_values = true)]
    budget: Option<String>,
    /// Most jobs that run at once [default: the number of CPUs].
    #[arg(long, short = 'j', env = "HEADROOM_JOBS", value_name = "N")]
    jobs: Option<usize>,
    /// Write the build report as JSON to FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "no_history")]
    report: Option<PathBuf>,
    /// Write the build as a Chrome trace to FILE, for ui.perfetto.dev or chrome://tracing:
    /// each job a slice on its slot's track, memory and budget counters, kills and OOMs.
    #[arg(long, value_name = "FILE", conflicts_with = "no_history")]
    trace: Option<PathBuf>,
    /// Let jobs that run out of memory even alone be rebuilt with lower-memory flags
    /// (`-g0`, then `-O1`, then `-O0` and small GC parameters; nvcc one target at a time,
    /// `--threads 1`); the report lists them.
    #[arg(long, env = "HEADROOM_LOWER_FLAGS", value_parser = clap::builder::BoolishValueParser::new())]
    lower_flags: bool,
    /// Run every job at the normal CPU priority, instead of starting jobs off the build's
    /// longest path nicer (`nice`) so that the jobs the build waits on get the cores first.
    #[arg(long, env = "HEADROOM_NO_PRIORITIES", value_parser = clap::builder::BoolishValueParser::new())]
    no_priorities: bool,
    /// Memory sampling interval of running jobs, in milliseconds.
    #[arg(
        long,
        env = "HEADROOM_SAMPLE_INTERVAL_MS",
        value_name = "MS",
        hide = true
    )]
    sample_interval_ms: Option<u64>,
    /// Send compiles to a build farm node (distcc's `distccd`, or with `--farm-engine
    /// sccache-dist` a node's own `sccache-dist scheduler`): `HOST:PORT=MEMORY/SLOTS`, such as
    /// `10.0.0.5:3632=64G/16`, given once per node. headroom places each job on a node whose
    /// memory fits its predicted peak; replaces `[build.farm] nodes` of headroom.toml.
    #[arg(
        long = "farm",
        env = "HEADROOM_FARM",
        value_name = "NODE",
        value_delimiter = ',',
        conflicts_with = "no_farm"
    )]
    farm: Vec<String>,
    /// The engine farm jobs go through: `distcc` (the default) or `sccache-dist` (which also
    /// distributes nvcc); replaces `[build.farm] engine`.
    #[arg(long, env = "HEADROOM_FARM_ENGINE", value_name = "ENGINE")]
    farm_engine: Option<String>,
    /// The token the sccache-dist schedulers take from clients (their `client_auth`);
    /// replaces `[build.farm] token`.
    #[arg(
        long,
        env = "HEADROOM_FARM_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    farm_token: Option<String>,
    /// Build on this machine only, even where headroom.toml names a farm.
    #[arg(long)]
    no_farm: bool,
    /// Do not read or write the build history.
    #[arg(long)]
    no_history: bool,
    /// Leave the build's parallelism as it is: offer it no jobs through `MAX_JOBS`,
    /// `MAKEFLAGS`, `CMAKE_BUILD_PARALLEL_LEVEL` or `CARGO_BUILD_JOBS`.
    #[arg(long, env = "HEADROOM_NO_OFFER_JOBS", value_parser = clap::builder::BoolishValueParser::new())]
    no_offer_jobs: bool,
    /// The build command, unchanged: `make -j8`, `ninja`, `cmake --build build`, `pip install .`…
    /// (a `--` before it is allowed, and needed only when CMD starts with `-`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

pub fn main(args: BuildArgs) -> Result<u8> {
    output::check_all([
        ("--report", args.report.as_deref()),
        ("--trace", args.trace.as_deref()),
    ])?;
    let overrides = BuildOverrides {
        budget: args.budget.clone(),
        // Read from the environment by `BuildSettings::load`.
        budget_variable: None,
        jobs: args.jobs,
        lower_flags: args.lower_flags,
        sample_interval_ms: args.sample_interval_ms,
        no_priorities: args.no_priorities,
        farm: args.farm.clone(),
        farm_engine: args.farm_engine.clone(),
        farm_token: args.farm_token.clone(),
        no_farm: args.no_farm,
    };
    let command = args
        .command
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let offer_to = (!args.no_offer_jobs).then_some(args.command.as_slice());
    if let Err(Some(why)) = offer_to.map_or(Ok(()), make_takes_jobs) {
        headroom_output::say!("headroom: {why}");
    }
    let governed = match start_session(
        session_settings(&overrides)?,
        !args.no_history,
        command,
        offer_to,
        None,
        bazel::stable_session_id(&args.command),
    ) {
        Ok(governed) => governed,
        // headroom is never why a build does not run: without a governor it runs as it is.
        // The error says its cause itself: the chain would say it twice.
        Err(StartError::Session(err)) => {
            headroom_output::say!("headroom: warning: {err}; this build runs ungoverned");
            return run_ungoverned(&args.command);
        }
        Err(err) => return Err(err.into()),
    };
    // The rest of `governed` (its state directory) lives to the end of the build.
    let session = governed.session;

    // The signal that interrupts the build (Ctrl-C, Ctrl-\, SIGTERM, SIGHUP).
    let interrupted =
        Interrupts::install(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT])?;
    // Orphans of the build (a double-forked compiler) stay below headroom, where the governor
    // follows the build's processes.
    headroom_process::become_subreaper();
    let start = Instant::now();
    let mut build = build_command(&args.command[0], &session);
    let governed = session.govern(&mut build);
    let bazel = BazelBuild::arguments(&args.command, &mut build);
    match governed {
        Err(why) => headroom_output::say!("headroom: warning: {why}; this build runs ungoverned"),
        Ok(()) if sets(&build, TORCH_WRAPPER_ENV) => headroom_output::say!(
            "headroom: sccache is on PATH, and torch would compile extensions through its \
             server, outside headroom's jobs; this build runs with {TORCH_WRAPPER_ENV}=1 \
             (set {TORCH_WRAPPER_ENV}= to keep sccache)"
        ),
        Ok(()) => {}
    }
    // Before the build starts: the status takes the terminal's last line while nothing else
    // writes there.
    let mut live = LiveStatus::on_terminal();
    let mut build = match build.spawn() {
        Ok(child) => child,
        Err(err) => {
            drop(live);
            session.finish(None, false);
            return cannot_start(&args.command[0], err);
        }
    };
    let status = wait_for_build(&mut build, &session, &interrupted, live.as_mut())?;
    drop(live);
    let interrupted_by = interrupted.last();
    let exit_code = shell_code(status);

    match session.finish(Some(exit_code), interrupted_by.is_some()) {
        Ending::Reported(built) => {
            report(&built, args.report.as_deref(), args.trace.as_deref())?;
            if let Some(bazel) = &bazel {
                bazel.explain(&built);
            }
        }
        Ending::Silent(waited) => headroom_output::say!(
            "headroom: warning: the governor did not answer for {:.0} s after the build ended; \
             it was stopped, and this build has no report ({:.1} s)",
            waited.as_secs_f64(),
            start.elapsed().as_secs_f64()
        ),
        Ending::Gone => headroom_output::say!(
            "headroom: warning: the governor stopped before the build ended; the build ran ungoverned from then on and has no report ({:.1} s)",
            start.elapsed().as_secs_f64()
        ),
    }
    Ok(match interrupted_by {
        Some(signal) => 128 + signal as u8,
        None => exit_code as u8,
    })
}

/// Runs the build command as it is, for when no governor can be started; returns its exit
/// code.
fn run_ungoverned(command: &[OsString]) -> Result<u8> {
    match Command::new(&command[0]).args(&command[1..]).status() {
        Ok(status) => Ok(shell_code(status) as u8),
        Err(err) => cannot_start(&command[0], err),
    }
}

/// The program the build starts: the build command's own, or the launcher in front of it when
/// it is itself a compiler (`headroom build -- g++ -c big.cpp`), since the interceptor governs
/// what the build command starts, not the command headroom starts.
fn build_command(program: &OsStr, session: &Session) -> Command {
    let name = Path::new(program).file_name().and_then(OsStr::to_str);
    if name.is_some_and(headroom_govern::compiler::is_governed) {
        let mut launch = Command::new(session.launcher());
        launch.arg(program);
        launch
    } else {
        Command::new(program)
    }
}

/// The build command `program` could not start: 127 when it does not exist and 126 when it
/// cannot be run, as a shell says, else headroom's own error.
fn cannot_start(program: &OsStr, err: std::io::Error) -> Result<u8> {
    let shown = program.to_string_lossy();
    let Some(code) = headroom_process::not_started_code(&err) else {
        bail!("cannot run `{shown}`: {err}")
    };
    if code == 127 {
        headroom_output::say!("headroom: command not found: {shown}");
    } else {
        let how = headroom_process::how_to_run(program);
        headroom_output::say!("headroom: cannot run `{shown}`: {err}; {how}");
    }
    Ok(code)
}

/// Whether `command` sets the variable `name` (to any value).
fn sets(command: &Command, name: &str) -> bool {
    command
        .get_envs()
        .any(|(key, value)| key == name && value.is_some())
}

/// Waits for the build, reaping the orphans it leaves to headroom as their subreaper, and
/// keeps the live status (on a terminal) up to date; on Ctrl-C (or SIGTERM, SIGHUP) passes
/// the interrupt on and, after a grace period, kills it.
fn wait_for_build(
    build: &mut Child,
    session: &Session,
    interrupted: &Interrupts,
    mut live: Option<&mut LiveStatus>,
) -> Result<ExitStatus> {
    let mut interrupted_at: Option<Instant> = None;
    loop {
        if let Some(status) = build.try_wait()? {
            return Ok(status);
        }
        headroom_process::reap_orphans(&[build.id(), session.governor_pid()]);
        if let Some(live) = live.as_mut() {
            live.refresh(session);
        }
        if let Some(signal) = interrupted.last() {
            match interrupted_at {
                None => {
                    interrupted_at = Some(Instant::now());
                    // As a terminal's Ctrl-C reaches every process of a build: `make` alone
                    // would wait for its running children, and shims still waiting for the
                    // governor would be admitted one after another.
                    headroom_process::signal_tree(build.id() as i32, signal);
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

/// Prints the summary of the build the governor kept in memory, and writes the JSON report
/// and the trace if asked: none of them waits on the history, or depends on what reached it.
fn report(report: &BuildReport, json: Option<&Path>, trace: Option<&Path>) -> Result<()> {
    let summary = summary::render(report);
    headroom_output::say!("{}", summary.strip_suffix('\n').unwrap_or(&summary));
    if let Some(path) = json {
        output::write("--report", path, &report.to_json()?)?;
    }
    if let Some(path) = trace {
        output::write("--trace", path, &chrome_trace::to_json(report)?)?;
    }
    Ok(())
}
