//! `headroom status`: the sessions that share this user's governors, their jobs, and what
//! each holds of the budget, asked of each governor as it runs.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use headroom_govern::protocol::{BuildStatus, GovernorStatus};
use headroom_govern::session::{governor_status, shared_sockets};
use headroom_govern::status_line;
use headroom_size::Size;

/// How long a governor has to answer: a busy one answers in milliseconds, a hung one is
/// reported as not answering.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON (a list of governors, each with its sessions and their jobs).
    #[arg(long)]
    json: bool,
}

/// Prints every running governor of this user and its sessions; with `verbose`, each
/// session's jobs and why its waiting jobs wait. Exits 0 even when none runs.
pub fn main(args: StatusArgs, verbose: bool) -> Result<u8> {
    let state_dir = headroom_paths::state_dir();
    let governors: Vec<GovernorStatus> = shared_sockets(&state_dir)
        .iter()
        .filter_map(|socket| governor_status(socket, ANSWER_WITHIN))
        .collect();
    headroom_output::print_json_or(args.json, &governors, || describe(&governors, verbose))?;
    Ok(0)
}

/// The governors as a table per governor, a row per session.
fn describe(governors: &[GovernorStatus], verbose: bool) -> String {
    if governors.is_empty() {
        return "no headroom session is running\n".to_string();
    }
    let mut text = String::new();
    for governor in governors {
        let _ = writeln!(
            text,
            "governor {} · budget {} · {} slots · {} in use",
            governor.pid,
            Size(governor.budget),
            governor.slots,
            Size(governor.used)
        );
        let _ = writeln!(
            text,
            "  {:>8}  {:>10}  {:>7}  {:>7}  {:>7}  {:>5}  command",
            "session", "held", "running", "stopped", "waiting", "done"
        );
        for session in &governor.sessions {
            let BuildStatus {
                running,
                stopped,
                waiting,
                done,
                ..
            } = session.status;
            let _ = writeln!(
                text,
                "  {:>8}  {:>10}  {running:>7}  {stopped:>7}  {waiting:>7}  {done:>5}  {} (in {})",
                session.id,
                Size(session.held).to_string(),
                session.command,
                session.cwd
            );
            if verbose {
                let _ = writeln!(
                    text,
                    "            {}",
                    status_line::describe(&session.status)
                );
                for job in &session.jobs {
                    let _ = writeln!(
                        text,
                        "            {:<9} {} (predicted {}, peak {})",
                        job.state,
                        job.label,
                        Size(job.predicted),
                        Size(job.peak)
                    );
                }
            }
        }
    }
    text
}
