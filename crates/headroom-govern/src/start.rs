//! Starting a governed session for a command: reads the memory there is, resolves the budget
//! against it, finds the farm nodes that answer, and starts (or joins) the governor
//! ([`Session`]). One implementation for every command that governs compilers: `headroom
//! build`, `headroom kernels build` and `headroom run`.
//!
//! The settings come in as `headroom_config::SessionSettings`: the one set of build settings
//! that `headroom_config` merges from flags, variables and files, with the directory the work
//! runs in.

use std::ffi::OsString;
use std::time::{SystemTime, UNIX_EPOCH};

use headroom_config::SessionSettings;
use headroom_farm::{Engine, FarmSettings, Node};
use headroom_probe::room::{MemoryFacts, Unreadable};
use headroom_size::Size;

use crate::protocol::GovernorConfig;
use crate::session::{build_variables, GovernorPlace, Session, SessionError, SessionId};
use crate::state::BuildState;

/// A governor started for some work, with what it was started with.
pub struct Governed {
    pub session: Session,
    /// The memory the governed work may use, in bytes.
    pub budget: u64,
    pub settings: SessionSettings,
    /// Kept until the work is reported: a temporary state directory lives as long as this.
    _state: BuildState,
}

/// Why no session started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Memory(#[from] Unreadable),
    #[error("cannot locate the headroom binary")]
    CurrentExe(#[source] std::io::Error),
    /// No governor could start or be joined: the work may run ungoverned.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// Resolves the budget and starts a governor for `command` (a description for the history);
/// the build command `offer_jobs_to` (when given) is offered twice as many jobs as run, so the
/// governor can pick small ones past a big one that waits. `memory_limit` is a limit the
/// governed work runs under that this process's own cgroup does not show (the cgroup
/// `headroom run --memory-limit` makes for its command): the budget fits inside it.
/// `session_id` is the id the session's compilers must know it by from build to build, when
/// it must not change (see `GovernorConfig::session_id`).
pub fn start_session(
    settings: SessionSettings,
    use_history: bool,
    command: String,
    offer_jobs_to: Option<&[OsString]>,
    memory_limit: Option<u64>,
    session_id: Option<SessionId>,
) -> Result<Governed, StartError> {
    let mut facts = MemoryFacts::read()?;
    if let Some(limit) = memory_limit {
        if facts
            .cgroup
            .is_none_or(|(outer, used)| limit < outer.saturating_sub(used))
        {
            facts.cgroup = Some((limit, 0));
        }
    }
    let budget = settings.build.resolve_budget(&facts);
    let (room, _) = facts.room();
    if budget.bytes > room {
        headroom_output::say!(
            "headroom: warning: the budget {} is more than this machine can hand out now ({}); jobs may be OOM-killed",
            Size(budget.bytes),
            Size(room)
        );
    }
    let state = BuildState::for_build();
    let config = GovernorConfig {
        budget: budget.bytes,
        budget_source: budget.source,
        slots: settings.build.jobs,
        history: use_history.then(|| state.history().to_path_buf()),
        command,
        cwd: settings.cwd.to_string_lossy().into_owned(),
        started_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        ladder: settings.build.ladder.clone(),
        sample_interval_ms: settings.build.sample_interval_ms,
        priorities: settings.build.priorities,
        parallelism_set: offer_jobs_to.map_or_else(Vec::new, |command| {
            build_variables(2 * settings.build.jobs, command)
        }),
        project_root: settings.project_root.to_string_lossy().into_owned(),
        farm: reachable_farm(&settings),
        session_id,
    };
    let exe = std::env::current_exe().map_err(StartError::CurrentExe)?;
    // Work under a limit of its own, or sent to a farm, keeps a governor of its own; all
    // other sessions of this user, memory domain and history share one.
    let shareable = memory_limit.is_none() && config.farm.is_none();
    let place = GovernorPlace::for_session(state.dir(), shareable)?;
    let session = Session::start(&exe, &config, state.dir(), place)?;
    Ok(Governed {
        session,
        budget: budget.bytes,
        settings,
        _state: state,
    })
}

/// The farm that can be used now: the engine's client must be on PATH and a node must answer.
/// Anything missing is a warning, not an error: the build then runs here, as it would without
/// a farm.
fn reachable_farm(settings: &SessionSettings) -> Option<FarmSettings> {
    let nodes = &settings.build.farm;
    if nodes.is_empty() {
        return None;
    }
    let engine = match Engine::find(settings.build.farm_engine, &settings.build.farm_token) {
        Ok(engine) => engine,
        Err(missing) => {
            headroom_output::say!("headroom: warning: a build farm is configured, but {missing}; this build runs on this machine only");
            return None;
        }
    };
    let mut reachable = Vec::new();
    for node in nodes {
        match node.reachable() {
            Ok(()) => reachable.push(node.clone()),
            Err(err) => headroom_output::say!(
                "headroom: warning: farm node {} is unreachable ({err}); no job goes there",
                node.address
            ),
        }
    }
    if reachable.is_empty() {
        return None;
    }
    let names: Vec<String> = reachable.iter().map(Node::to_string).collect();
    headroom_output::say!(
        "headroom: farm ({}): {}",
        engine.kind().name(),
        names.join(", ")
    );
    Some(FarmSettings {
        engine,
        nodes: reachable,
    })
}
