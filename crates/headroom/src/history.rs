//! `headroom history push` and `pull`: share measured peaks between machines through a store
//! (`--store`, `HEADROOM_HISTORY_STORE`, then `[build] store` in `headroom.toml`:
//! [`HISTORY_STORE`]), so that a first build on a new machine is predicted from what CI or a
//! colleague measured. The work is `headroom_remote::history`; this is what users see of it.

use anyhow::Context;
use clap::{Args, Subcommand};
use headroom_govern::last_build;
use headroom_remote::history::{self as remote, project_name};
use headroom_remote::{Store, StoreError};
use headroom_store::History;

use headroom_config::{project_root, HISTORY_STORE};

#[derive(Args)]
pub struct HistoryArgs {
    /// The shared store: s3://bucket/prefix, redis://host[:port][/db],
    /// webdav+http(s)://host/path or file:///absolute/path [default: `store` under [build] in
    /// headroom.toml or the user's settings].
    #[arg(
        long,
        global = true,
        env = "HEADROOM_HISTORY_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: Option<String>,
    /// The project's name in the store [default: the name of the project's root, the nearest
    /// directory upwards with a headroom.toml or a .git].
    #[arg(long, global = true, value_name = "NAME")]
    project: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: HistoryCommand,
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Publish this machine's measured peaks (clean runs only, no paths of this machine) to
    /// the store, merged with what is there: the newer measurement of each job wins.
    Push,
    /// Take in the peaks the store has for the project: jobs this machine has not run, or ran
    /// before the store's measurement, are then predicted from them (`shared` in reports).
    Pull,
}

pub fn main(args: HistoryArgs) -> anyhow::Result<u8> {
    let project = match &args.project {
        Some(name) => name.clone(),
        None => {
            let root = project_root(&std::env::current_dir()?);
            project_name(&root.file_name().unwrap_or_default().to_string_lossy())
        }
    };
    let url = HISTORY_STORE.url(args.store.as_deref())?;
    let path = History::default_path();
    let mut history = History::open(&path)
        .with_context(|| "set HEADROOM_STATE_DIR to use a history elsewhere".to_string())?;
    match args.command {
        HistoryCommand::Push => {
            let store = Store::open(&url, false)?;
            let waiting_seconds = last_build::waiting_seconds_by_key(
                &history.recent_builds_jobs(last_build::BUILDS_TO_READ)?,
            );
            let local = history.shareable_peaks(&waiting_seconds)?;
            let summary = remote::push(&store, &local, &project).with_context(|| {
                format!("pushing the history of `{project}` to {}", store.shown())
            })?;
            if let Some(why) = &summary.replaced {
                headroom_output::say!("headroom: warning: replaced what could not be read: {why}");
            }
            headroom_output::print_json_or(
                args.json,
                &serde_json::json!({ "store": store.shown(), "project": project, "summary": summary }),
                || {
                    format!(
                        "pushed {} of `{project}` to {} ({} new or newer); the store has {}\n",
                        peaks(summary.local),
                        store.shown(),
                        summary.published,
                        peaks(summary.entries)
                    )
                },
            )?;
            if summary.local == 0 {
                headroom_output::say!(
                    "headroom: the history {} has no measured peaks to share yet: run `headroom build -- …` first",
                    path.display()
                );
            }
        }
        HistoryCommand::Pull => {
            let pulled = match Store::open(&url, true) {
                Ok(store) => remote::pull(&store, &mut history, &project)
                    .map(|summary| (summary, store.shown().to_string())),
                Err(err) => Err(err.into()),
            };
            let (summary, shown) = match pulled {
                Ok(pulled) => pulled,
                // A store that cannot be reached leaves the local history as it was.
                Err(remote::HistoryError::Store(err @ StoreError::Service { .. })) => {
                    headroom_output::say!(
                        "headroom: warning: {err}; going on with the local history"
                    );
                    return Ok(0);
                }
                Err(err) => return Err(err.into()),
            };
            if let Some(why) = &summary.unusable {
                headroom_output::say!("headroom: warning: {why}; nothing was pulled");
            }
            for key in &summary.taken.refused {
                headroom_output::say!("headroom: warning: ignoring the entry `{key}` in {shown}: not a believable measurement");
            }
            let taken = &summary.taken;
            headroom_output::print_json_or(
                args.json,
                &serde_json::json!({ "store": shown, "project": project, "summary": summary }),
                || {
                    format!(
                        "pulled {} of `{project}` from {shown}: {} new, {} newer, {} already known\n",
                        peaks(summary.entries),
                        taken.new,
                        taken.newer,
                        taken.kept
                    )
                },
            )?;
        }
    }
    Ok(0)
}

fn peaks(count: usize) -> String {
    match count {
        1 => "1 measured peak".to_string(),
        _ => format!("{count} measured peaks"),
    }
}
