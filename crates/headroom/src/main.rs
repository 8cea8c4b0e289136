//! The `headroom` binary: CLI parsing and dispatch only.
//!
//! One binary plays two roles. Called as `headroom` it is the CLI below. Called through a
//! shim link (`g++`, `nvcc`, `headroom-launch`, ...) it is the compiler shim of
//! `headroom build`, which must stay tiny and never start the CLI machinery.

mod build;
mod diagnose;
mod history;
mod kernels;
mod report;
mod sim;
mod status;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{ColorChoice, CommandFactory, Parser, Subcommand};
use headroom_output::say;

/// Exit code for headroom's own failures (bad flags, unreadable files, ...).
/// A wrapped command's own exit code is passed through unchanged.
const EXIT_HEADROOM_ERROR: u8 = 2;
/// The tracing filter for headroom's diagnostics (`-v` sets it when it is unset).
const LOG_ENV: &str = "HEADROOM_LOG";
/// The default of `--color`, and how the CLI hands its choice to the processes it starts.
const COLOR_ENV: &str = "HEADROOM_COLOR";

/// Every environment variable headroom reads, in `--help` and the man page: one name per
/// concept, whatever the command. `tests/cli.rs` checks that each `HEADROOM_*` the code
/// reads is here.
const ENVIRONMENT: &str = "\
Environment:
  HEADROOM_BUDGET, HEADROOM_JOBS, HEADROOM_LOWER_FLAGS, HEADROOM_NO_PRIORITIES,
  HEADROOM_NO_OFFER_JOBS
      Defaults for `build`'s --budget, --jobs, --lower-flags, --no-priorities and
      --no-offer-jobs (the budget also for `kernels build`; `doctor` reports it).
  HEADROOM_CPU_CGROUP
      0 runs `build` without a CPU cgroup of its own: its jobs' niceness then yields to
      every process on the machine, not only to the build's own.
  HEADROOM_GOVERNOR_SILENCE_MS
      How long a compiler call waits for a governor that says nothing before it runs
      ungoverned [default: 10000].
  HEADROOM_FARM, HEADROOM_FARM_ENGINE, HEADROOM_FARM_TOKEN
      `build`'s --farm nodes, comma-separated (HOST:PORT=MEMORY/SLOTS), --farm-engine
      and --farm-token.
  HEADROOM_STATE_DIR
      The build history, the shim directory and the interceptor
      [default: $XDG_STATE_HOME/headroom, else ~/.local/state/headroom]. Your sessions
      with one state directory in one memory cgroup share a governor.
  HEADROOM_LEDGER_DIR
      Where the governors of different users tell each other what they hold
      [default: /dev/shm/headroom-ledger, made with mode 1777].
  HEADROOM_CONFIG
      The user's settings file [default: $XDG_CONFIG_HOME/headroom/config.toml, else
      ~/.config/headroom/config.toml]; a file it names must exist. A project's
      headroom.toml is found upwards from the current directory.
  HEADROOM_LOG
      A tracing filter for headroom's own diagnostics (`-v` sets `info`, `-vv` `debug`).
  HEADROOM_COLOR, NO_COLOR
      The default of --color; NO_COLOR, set and not empty, turns colour off under `auto`.
  HEADROOM_RUN_INTERVAL, HEADROOM_RUN_MEMORY_LIMIT
      Defaults for `run`'s --interval and --memory-limit.
  HEADROOM_KERNEL_MANIFEST, HEADROOM_KERNEL_CACHE, HEADROOM_KERNEL_CACHE_MAX
      `kernels`: the manifest, the cache directory [default: $XDG_CACHE_HOME/headroom/kernels,
      else ~/.cache/headroom/kernels] and the cache's size limit.
  HEADROOM_CLANG
      `kernels`: the clang used for GPU targets [default: the first of clang-19, clang-20,
      clang-21, clang-18 and clang on PATH].
  CUDA_HOME, CUDA_PATH
      `kernels`: where nvcc is looked for before PATH.
  HEADROOM_KERNEL_STORE, HEADROOM_KERNEL_STORE_READ_ONLY
      `kernels`: the shared kernel store's URL, and read-only use of it (`push`, `pull`,
      `resolve --fetch`).
  HEADROOM_HISTORY_STORE
      `history`: the store that shares measured peaks between machines (`push`, `pull`).
  HEADROOM_WEBDAV_USER, HEADROOM_WEBDAV_PASSWORD
      `kernels`, `history`: WebDAV credentials when the store's URL has none.
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL
      `kernels`, `history`: an s3:// store's credentials, region and endpoint.
  HEADROOM_SIM_MACHINES
      The default of `sim`'s --machine.
";

#[derive(Parser)]
#[command(
    name = "headroom",
    version,
    about = "Keep memory-hungry builds and jobs inside the memory the machine really has",
    after_long_help = ENVIRONMENT
)]
struct Cli {
    /// Say more on stderr: `-v` every decision of the governor (each start, suspension,
    /// kill and retry, with its reason and figures), `-vv` everything. HEADROOM_LOG, when
    /// set, takes precedence (a tracing filter such as `headroom_govern=debug`).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Colour headroom's diagnostics on stderr: `auto` colours them on a terminal unless
    /// NO_COLOR is set.
    #[arg(
        long,
        value_name = "WHEN",
        global = true,
        env = COLOR_ENV,
        default_value = "auto"
    )]
    color: ColorChoice,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a build command (make, ninja, cmake --build, pip install, cargo…) unchanged, as
    /// parallel as memory allows, and report what each job cost.
    Build(build::BuildArgs),
    /// Render the last build, or a given report, as a summary, JSON or an HTML timeline.
    Report(report::ReportArgs),
    /// Share measured peaks between machines through a store, so that a first build is
    /// predicted from what others measured.
    History(history::HistoryArgs),
    /// Record memory per stage of a command, classify its failure, walk a fallback ladder.
    Run(headroom_run::RunArgs),
    /// Check this machine before a big build.
    Doctor(headroom_doctor::DoctorArgs),
    /// Say why a build or job failed, from its log, a `headroom run` report, or the kernel log.
    Diagnose(diagnose::DiagnoseArgs),
    /// Build, cache, ship and resolve multi-target GPU kernels.
    Kernels(kernels::KernelsArgs),
    /// Simulate scheduling policies on recorded build traces.
    Sim(sim::SimArgs),
    /// Show the sessions (builds, runs) that share this user's governors, their jobs, and
    /// what each holds of the budget; `-v` says why jobs wait.
    Status(status::StatusArgs),
    /// Print a completion script for a shell: `headroom completions bash >
    /// /usr/share/bash-completion/completions/headroom`.
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print headroom's man page (roff): `headroom man > /usr/local/share/man/man1/headroom.1`.
    Man,
    /// The governor process that sessions share, started by the first of them.
    #[command(name = headroom_govern::session::GOVERNOR_SUBCOMMAND, hide = true)]
    Governor,
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv
        .first()
        .is_some_and(|argv0| headroom_govern::shim::is_shim(argv0))
    {
        headroom_govern::shim::main(argv);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return clap_error(&err),
    };
    if matches!(
        cli.command,
        Command::Report(_)
            | Command::Completions { .. }
            | Command::Man
            | Command::Sim(_)
            | Command::Doctor(_)
            | Command::Diagnose(_)
            | Command::Status(_)
    ) {
        // Commands whose only work is what they print, often through a pipe (`| less`, `|
        // head`), end when their reader does, killed by SIGPIPE (exit status 141 in a shell)
        // as `cat` and `grep` are: quietly, and telling a `pipefail` script that the output
        // was cut short. The other commands run a build or a command, or talk to a store:
        // headroom must not die in the middle of those, and what they print goes through
        // `headroom_output`, which drops what nobody reads.
        // SAFETY: restoring a signal's default disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // Through the environment, so the governor process and the rest of headroom's processes
    // say as much, in the same colours.
    if cli.verbose > 0 && std::env::var_os(LOG_ENV).is_none() {
        std::env::set_var(LOG_ENV, if cli.verbose == 1 { "info" } else { "debug" });
    }
    match cli.color {
        ColorChoice::Auto => std::env::remove_var(COLOR_ENV),
        ColorChoice::Always => std::env::set_var(COLOR_ENV, "always"),
        ColorChoice::Never => std::env::set_var(COLOR_ENV, "never"),
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env(LOG_ENV))
        .with_ansi(colour_stderr(cli.color))
        .with_writer(std::io::stderr)
        .init();
    let outcome = match cli.command {
        Command::Build(args) => build::main(args),
        Command::Report(args) => report::main(args),
        Command::History(args) => history::main(args),
        Command::Governor => headroom_govern::session::governor_main()
            .map(|()| 0)
            .map_err(Into::into),
        Command::Run(args) => headroom_run::main(args),
        Command::Doctor(args) => headroom_doctor::main(args),
        Command::Diagnose(args) => diagnose::main(args),
        Command::Kernels(args) => kernels::main(args),
        Command::Sim(args) => sim::main(args),
        Command::Status(args) => status::main(args, cli.verbose > 0),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "headroom",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Man => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map(|()| 0)
            .map_err(Into::into),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            say!("headroom: error: {}", describe(&err));
            ExitCode::from(EXIT_HEADROOM_ERROR)
        }
    }
}

/// Whether what headroom writes on stderr may carry colour codes: as `--color` says, and
/// under `auto` only on a terminal and when NO_COLOR is unset or empty (no-color.org).
fn colour_stderr(choice: ColorChoice) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
                && std::io::stderr().is_terminal()
        }
    }
}

/// Help and version go to stdout as clap prints them; a mistake on the command line is
/// reported in headroom's one error style (`headroom: error: …`), with clap's usage and tip.
fn clap_error(err: &clap::Error) -> ExitCode {
    if !err.use_stderr() {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    let text = err.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    say!("headroom: error: {}", text.trim_end());
    ExitCode::from(EXIT_HEADROOM_ERROR)
}

/// The error and each of its causes once. Most of our errors name their cause in their own
/// message, before the advice on what to do, and also keep it as their source, so printing
/// the whole chain would repeat it.
fn describe(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain().map(ToString::to_string) {
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_each_cause_once() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(headroom_sim::SimError::Read {
            path: "a.json".into(),
            source: missing,
        })
        .context("loading a trace");
        assert_eq!(
            describe(&err),
            "loading a trace: cannot read a.json: no such file"
        );
        let bare = anyhow::Error::new(std::io::Error::other("disk on fire")).context("saving");
        assert_eq!(describe(&bare), "saving: disk on fire");
    }
}
