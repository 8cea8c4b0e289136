//! `headroom build -- bazel build …`: leads the compiles of Bazel's actions to the governor.
//!
//! Bazel runs no compiler in the build's process tree. Its client drops `LD_PRELOAD`, its
//! server is a daemon that may predate the build, and it runs every action in a clean
//! environment. So headroom passes its variables to the actions themselves, as
//! `--action_env=NAME=VALUE` options right after the Bazel command (`build`, `test`, `run`,
//! `coverage`), where the options the user gives after it still win.
//!
//! - An action's environment is part of its key: a governed build misses the action cache
//!   of an ungoverned one, once each way. To keep governed builds cached among themselves,
//!   every value is stable: the socket is a link of this workspace's own in the state
//!   directory (see [`SocketLink`]), pointed at each session's socket in turn.
//! - Bazel's default sandbox, `linux-sandbox`, runs each action in a PID namespace of its
//!   own: the pid a shim sees for its compiler is not one the governor can sample or stop
//!   (measured: every job governed, but the build's peak read 0 B). headroom asks for
//!   Bazel's default strategies with `processwrapper-sandbox` in the place of
//!   `linux-sandbox`: actions still see only their declared inputs, as Bazel itself runs
//!   them where namespaces are not available. A `--spawn_strategy` (or `--config`) given
//!   on the command line replaces it; a shim in a PID namespace then stays governed for
//!   admission, and tells the governor no pid (see `headroom_govern::shim`).
//! - A Bazel build in which headroom governed no compile says so (see [`BazelBuild::explain`]).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use headroom_govern::intercept::LAUNCHER_ENV;
use headroom_govern::session::SessionId;
use headroom_govern::shim::{FARM_ENV, SESSION_ENV, SHIM_DIR_ENV, SOCKET_ENV};
use headroom_store::BuildReport;

/// The Bazel commands that run actions.
const RUNS_ACTIONS: [&str; 4] = ["build", "test", "run", "coverage"];
/// Bazel's default strategies (remote execution when configured, persistent workers, the
/// sandbox, then local), with the sandbox whose processes the governor can see.
const SPAWN_STRATEGY: &str = "--spawn_strategy=remote,worker,processwrapper-sandbox,local";
const PRELOAD_ENV: &str = "LD_PRELOAD";

/// A Bazel command that runs actions, as headroom runs it.
pub struct BazelBuild {
    /// The link the actions reach the governor by; removed when the build is over.
    _link: Option<SocketLink>,
}

impl BazelBuild {
    /// Gives `build` (a command whose environment `Session::govern` has set) the arguments of
    /// `command`, with the options that govern Bazel's actions inserted when `command` is a
    /// Bazel command that runs actions. `None` when it is not one.
    pub fn arguments(command: &[OsString], build: &mut Command) -> Option<BazelBuild> {
        let Some(at) = action_command_at(command) else {
            build.args(&command[1..]);
            return None;
        };
        let Some(mut variables) = governing_variables(build) else {
            // The session could not govern the build: Bazel runs as it is.
            build.args(&command[1..]);
            return Some(BazelBuild { _link: None });
        };
        let link = SocketLink::point_to(&variables.socket);
        if let Some(link) = &link {
            variables.socket = link.path.clone().into_os_string();
        } else {
            headroom_output::say!(
                "headroom: warning: cannot link the governor's socket under {}; Bazel's \
                 actions get this session's own socket, and rerun in the next governed build",
                SocketLink::dir().display()
            );
        }
        // The client ignores the interceptor, and says so: it gets the user's LD_PRELOAD.
        match std::env::var_os(PRELOAD_ENV) {
            Some(preload) => build.env(PRELOAD_ENV, preload),
            None => build.env_remove(PRELOAD_ENV),
        };
        build
            .args(&command[1..=at])
            .args(variables.options())
            .args(&command[at + 1..]);
        Some(BazelBuild { _link: link })
    }

    /// Tells the user, after the summary, when headroom governed none of the compiles of this
    /// Bazel build: it must never read like a governed one.
    pub fn explain(&self, report: &BuildReport) {
        if report.governed_nothing() {
            headroom_output::say!(
                "headroom: governed 0 compiles of this Bazel build: Bazel ran none of them \
                 through headroom (its cache had every output, or it ran them remotely, in \
                 persistent workers, or with options that dropped headroom's --action_env)"
            );
        }
    }
}

/// The session id a Bazel build asks the governor for: the same in every build of the
/// workspace (the current directory), so `HEADROOM_SESSION` in the actions' environment, and
/// with it their cache keys, stays the same; `None` for other commands. Its top bit is set,
/// so it is never a process id.
pub fn stable_session_id(command: &[OsString]) -> Option<SessionId> {
    action_command_at(command)?;
    let workspace = std::env::current_dir().ok()?;
    let hash = xxhash_rust::xxh3::xxh3_64(workspace.as_os_str().as_encoded_bytes());
    Some((hash as SessionId) | (1 << 31))
}

/// The index of the Bazel command in `command` (`bazel [STARTUP OPTIONS] build …`) when
/// `command` runs Bazel (`bazel`, `bazelisk`, `bazel-real`, by name or path) with a command
/// that runs actions.
fn action_command_at(command: &[OsString]) -> Option<usize> {
    let program = Path::new(command.first()?).file_name()?.to_str()?;
    if !(program == "bazel" || program == "bazelisk" || program.starts_with("bazel-")) {
        return None;
    }
    for (at, arg) in command.iter().enumerate().skip(1) {
        let arg = arg.to_str()?;
        if RUNS_ACTIONS.contains(&arg) {
            return Some(at);
        }
        // A startup option, or the value of one given apart (`--output_base /path`).
        if !(arg.starts_with('-') || arg.contains('/')) {
            return None;
        }
    }
    None
}

/// What Bazel's actions need to reach the governor.
struct GoverningVariables {
    socket: OsString,
    session: OsString,
    shim_dir: OsString,
    farm: OsString,
    launcher: OsString,
    preload: OsString,
}

impl GoverningVariables {
    fn options(&self) -> Vec<OsString> {
        let mut options: Vec<OsString> = [
            (SOCKET_ENV, &self.socket),
            (SESSION_ENV, &self.session),
            (SHIM_DIR_ENV, &self.shim_dir),
            (FARM_ENV, &self.farm),
            (LAUNCHER_ENV, &self.launcher),
            (PRELOAD_ENV, &self.preload),
        ]
        .into_iter()
        .map(|(name, value)| action_env(name, value))
        .collect();
        options.push(SPAWN_STRATEGY.into());
        options
    }
}

/// `--action_env=NAME=VALUE`.
fn action_env(name: &str, value: &OsStr) -> OsString {
    let mut option = OsString::from(format!("--action_env={name}="));
    option.push(value);
    option
}

/// The variables `Session::govern` gave `build`; `None` when it could not govern it.
fn governing_variables(build: &Command) -> Option<GoverningVariables> {
    let set = |wanted: &str| {
        build
            .get_envs()
            .find(|(name, _)| *name == wanted)
            .and_then(|(_, value)| value.map(OsStr::to_os_string))
    };
    Some(GoverningVariables {
        socket: set(SOCKET_ENV)?,
        session: set(SESSION_ENV)?,
        shim_dir: set(SHIM_DIR_ENV)?,
        farm: set(FARM_ENV)?,
        launcher: set(LAUNCHER_ENV)?,
        preload: set(PRELOAD_ENV)?,
    })
}

/// A symbolic link, named after the workspace (the current directory), to the session's
/// socket: the same path in every governed build of the workspace, so the actions' keys stay
/// the same. Bazel runs one command at a time in a workspace; two headroom builds at once in
/// the same workspace (with two output bases) share the later session's governor, and a
/// link left behind leads shims to no governor, where they run the compiler as it is.
struct SocketLink {
    path: PathBuf,
    socket: PathBuf,
}

impl SocketLink {
    fn dir() -> PathBuf {
        headroom_paths::state_dir().join("bazel")
    }

    /// Points this workspace's link at `socket` (an atomic rename over the old link).
    fn point_to(socket: &OsStr) -> Option<SocketLink> {
        let workspace = std::env::current_dir().ok()?;
        let hash = xxhash_rust::xxh3::xxh3_64(workspace.as_os_str().as_encoded_bytes());
        let dir = Self::dir();
        std::fs::create_dir_all(&dir).ok()?;
        let path = dir.join(format!("{hash:016x}.sock"));
        headroom_paths::atomic::replace_symlink(Path::new(socket), &path, ".tmp").ok()?;
        Some(SocketLink {
            path,
            socket: socket.into(),
        })
    }
}

impl Drop for SocketLink {
    /// Removes the link, unless a later session has taken it over.
    fn drop(&mut self) {
        if std::fs::read_link(&self.path).is_ok_and(|target| target == self.socket) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn the_bazel_command_is_found_past_startup_options() {
        for (line, at) in [
            ("bazel build //...", Some(1)),
            (
                "/usr/bin/bazel --output_user_root=/tmp/x test //a:b",
                Some(2),
            ),
            ("bazelisk --output_base /tmp/o run //app -- build", Some(3)),
            ("bazel-4.2.3 coverage //...", Some(1)),
            ("bazel query deps(//...)", None),
            ("bazel info", None),
            ("bazel shutdown", None),
            ("make build", None),
            ("bazel", None),
        ] {
            assert_eq!(action_command_at(&command(line)), at, "{line}");
        }
    }

    #[test]
    fn options_go_after_the_bazel_command_before_the_users_own() {
        let mut build = Command::new("bazel");
        for (name, value) in [
            (SOCKET_ENV, "/run/s.sock"),
            (SESSION_ENV, "2147483649"),
            (SHIM_DIR_ENV, "/state/shims"),
            (FARM_ENV, "0"),
            (LAUNCHER_ENV, "/bin/headroom-shim"),
            (PRELOAD_ENV, "/state/lib/i.so"),
        ] {
            build.env(name, value);
        }
        let variables = governing_variables(&build).expect("all six are set");
        let options = variables.options();
        assert_eq!(options[0], "--action_env=HEADROOM_SOCKET=/run/s.sock");
        assert_eq!(options[1], "--action_env=HEADROOM_SESSION=2147483649");
        assert_eq!(options[3], "--action_env=HEADROOM_SESSION_FARM=0");
        assert_eq!(options[5], "--action_env=LD_PRELOAD=/state/lib/i.so");
        assert_eq!(options[6], SPAWN_STRATEGY);
        build.env_remove(LAUNCHER_ENV);
        assert!(governing_variables(&build).is_none());
    }
}
