//! The `headroom` binary: CLI parsing and dispatch only.
//!
//! One binary plays two roles. Called as `headroom` it is the CLI below. Called through a
//! shim link (`g++`, `nvcc`, `headroom-launch`, ...) it is the compiler shim of
//! `headroom build`, which must stay tiny and never start the CLI machinery.

mod build;
mod config;
mod diagnose;
mod kernels;
mod report;
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for headroom's own failures (bad flags, unreadable files, ...).
/// A wrapped command's own exit code is passed through unchanged.
const EXIT_HEADROOM_ERROR: u8 = 2;
/// The tracing filter for headroom's diagnostics (`-v` sets it when it is unset).
const LOG_ENV: &str = "HEADROOM_LOG";

#[derive(Parser)]
#[command(
    name = "headroom",
    version,
    about = "Keep memory-hungry builds and jobs inside the memory the machine really has"
)]
struct Cli {
    /// Say more on stderr: `-v` every decision of the governor (each start, suspension,
    /// kill and retry, with its reason and figures), `-vv` everything. HEADROOM_LOG, when
    /// set, takes precedence (a tracing filter such as `headroom_govern=debug`).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
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
    /// The per-build governor process, started by `headroom build`.
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
    let cli = Cli::parse();
    if cli.verbose > 0 && std::env::var_os(LOG_ENV).is_none() {
        // Through the environment, so the governor process and the rest of headroom's
        // processes say as much.
        std::env::set_var(LOG_ENV, if cli.verbose == 1 { "info" } else { "debug" });
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env(LOG_ENV))
        .with_writer(std::io::stderr)
        .init();
    let outcome = match cli.command {
        Command::Build(args) => build::main(args),
        Command::Report(args) => report::main(args),
        Command::Governor => headroom_govern::session::governor_main()
            .map(|()| 0)
            .map_err(Into::into),
        Command::Run(args) => headroom_run::main(args),
        Command::Doctor(args) => headroom_doctor::main(args),
        Command::Diagnose(args) => diagnose::main(args),
        Command::Kernels(args) => kernels::main(args),
        Command::Sim(args) => sim::main(args),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("headroom: error: {}", describe(&err));
            ExitCode::from(EXIT_HEADROOM_ERROR)
        }
    }
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
