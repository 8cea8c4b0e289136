//! sccache-dist as a farm's engine: the one engine that distributes nvcc (it splits each call
//! into cicc, ptxas and the host compile, and sends those to a server). A client cannot name
//! a server, so each node is its own scheduler with one server behind it, and a job goes to
//! the node headroom chose by talking to that node's scheduler.
//!
//! sccache's client talks to a local daemon that preprocesses, packages the toolchain and, when
//! the node fails it, compiles here instead; nothing turns that fallback off
//! (mozilla/sccache#437). So each attempt runs a daemon of its own in the foreground, in the
//! job's process group: its local work is measured as the job's, and when it says it falls
//! back the shim kills the attempt at once, and headroom places the job again, with admission.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{find_on_path, one_source_compiled, Farming, Node, RemoteLaunch, RemoteOutcome};

/// The sccache client headroom sends jobs through, and the token its schedulers take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SccacheDist {
    pub client: PathBuf,
    pub token: String,
}

/// What sccache's daemon logs (at `warn` or `error`) when it is about to compile here: a node
/// failed the compile, or the daemon could not reach its scheduler when it started (it then
/// compiles everything here, saying nothing more).
const FALLBACK_MARKERS: [&str; 3] = [
    "falling back to local",
    "could not communicate with scheduler",
    "failure during dist client creation",
];
/// What the client prints when a compile failed on the node, for whatever reason.
const FAILED_ON_SERVER: &str = "sccache: Job failed on server";
/// The exit status of the launch script (its `exit 116`) when it could not set the attempt's
/// daemon up, and the name it says so under.
const SETUP_FAILED: i32 = 116;
const SCRIPT_NAME: &str = "headroom-sccache-dist";

/// Runs one attempt: `$1` is sccache, `$2` the build's start lock, `$3` the client settings,
/// the rest the compiler and its arguments. It writes the client settings, starts a daemon of
/// the attempt's own in the foreground (so it stays in the attempt's process group), waits for
/// its socket, compiles through it, and stops it. Daemons start one at a time (`flock` on a
/// lock the build's attempts share): two daemons opening sccache's toolchain cache at once
/// fail to make their distributed client, and compile here.
const LAUNCH_SCRIPT: &str = r#"sccache=$1; start_lock=$2; settings=$3; shift 3
printf '%s' "$settings" >"$SCCACHE_CONF" || exit 116
rm -f "$SCCACHE_SERVER_UDS"
exec 9>>"$start_lock" && flock 9 || exit 116
SCCACHE_NO_DAEMON=1 SCCACHE_START_SERVER=1 SCCACHE_IDLE_TIMEOUT=0 "$sccache" >/dev/null 9>&- &
daemon=$!
while [ ! -S "$SCCACHE_SERVER_UDS" ]; do
  if ! kill -0 "$daemon" 2>/dev/null; then
    echo "$0: sccache's daemon for this compile did not start" >&2
    exit 116
  fi
  sleep 0.01
done
exec 9>&-
"$sccache" "$@"
status=$?
"$sccache" --stop-server >/dev/null 2>&1
wait "$daemon"
exit "$status"
"#;

/// The client settings an attempt's daemon reads (`SCCACHE_CONF`): the node's scheduler.
#[derive(Serialize)]
struct ClientConfig {
    dist: DistConfig,
}

#[derive(Serialize)]
struct DistConfig {
    scheduler_url: String,
    auth: DistAuth,
}

#[derive(Serialize)]
struct DistAuth {
    #[serde(rename = "type")]
    kind: &'static str,
    token: String,
}

impl SccacheDist {
    /// The scheduler's port (`sccache-dist scheduler`'s default).
    pub const DEFAULT_PORT: u16 = 10600;

    /// The `sccache` client on `PATH`.
    pub fn find(token: &str) -> Option<SccacheDist> {
        find_on_path("sccache").map(|client| SccacheDist {
            client,
            token: token.to_string(),
        })
    }

    /// Whether sccache would send this call of a family that farms so (`farming`: nvcc or a
    /// gcc-style compiler) to a node: one of the family's sources compiled to an object.
    /// Anything else its client runs here, which a farmed job's local reservation would not
    /// cover.
    pub fn would_distribute(farming: &Farming, args: &[String]) -> bool {
        one_source_compiled(args, farming.is_source)
    }

    /// How the shim runs an attempt on `node`: through the launch script, with a client
    /// configuration naming the node's scheduler, and the daemon's socket in `state_dir` (the
    /// job's own; its parent, the build's farm directory, holds the start lock).
    pub fn launch(&self, node: &Node, state_dir: &Path) -> RemoteLaunch {
        let config = ClientConfig {
            dist: DistConfig {
                scheduler_url: format!("http://{}", node.address),
                auth: DistAuth {
                    kind: "token",
                    token: self.token.clone(),
                },
            },
        };
        let path = |dir: &Path, name: &str| dir.join(name).to_string_lossy().into_owned();
        let env = [
            ("SCCACHE_CONF", path(state_dir, "sccache.toml")),
            ("SCCACHE_SERVER_UDS", path(state_dir, "sccache.sock")),
            // The daemon says when it falls back, at this level, on the attempt's stderr.
            ("SCCACHE_LOG", "warn".into()),
        ];
        let start_lock = path(
            state_dir.parent().unwrap_or(state_dir),
            "sccache-start.lock",
        );
        RemoteLaunch {
            program: "/bin/sh".into(),
            args_before: vec![
                "-c".into(),
                LAUNCH_SCRIPT.into(),
                SCRIPT_NAME.into(),
                self.client.to_string_lossy().into_owned(),
                start_lock,
                toml::to_string(&config).expect("plain strings serialise"),
            ],
            env: env
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
            fallback_markers: FALLBACK_MARKERS.map(String::from).to_vec(),
        }
    }

    /// How an attempt sent to a node ended. sccache prints `Job failed on server` for any
    /// compile that failed there, a compile error as much as a compiler the OOM killer
    /// stopped: cicc killed reaches the client as exit 137, and g++ says so itself (`Killed
    /// signal terminated program cc1plus`, which headroom's failure rules read). A fallback
    /// the shim stopped, or a daemon that did not start, mean the node could not compile it.
    pub fn outcome(exit_code: Option<i32>, stderr: &str) -> RemoteOutcome {
        if FALLBACK_MARKERS
            .iter()
            .any(|marker| stderr.contains(marker))
            || exit_code == Some(SETUP_FAILED) && stderr.contains(SCRIPT_NAME)
        {
            RemoteOutcome::Unreachable
        } else if stderr.contains(FAILED_ON_SERVER) && exit_code == Some(128 + 9) {
            RemoteOutcome::OutOfMemory
        } else {
            RemoteOutcome::Ran
        }
    }
}

/// A source nvcc compiles.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{GCC_STYLE, NVCC_STYLE};
    use std::process::Command;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn nvcc_and_gcc_style_single_compiles_are_distributed() {
        for (farming, call) in [
            (
                NVCC_STYLE,
                "-c flash_fwd.cu -o flash_fwd.o --threads 4 -gencode arch=compute_80,code=sm_80",
            ),
            (NVCC_STYLE, "--compile k.cu -o k.o"),
            (GCC_STYLE, "-O2 -c a.cpp -o a.o"),
        ] {
            assert!(
                SccacheDist::would_distribute(&farming, &args(call)),
                "{call}"
            );
        }
        for (farming, call) in [
            (NVCC_STYLE, "k.o -o app"),
            (NVCC_STYLE, "-E k.cu"),
            (NVCC_STYLE, "--dryrun -c k.cu"),
            (NVCC_STYLE, "-ptx k.cu"),
            (NVCC_STYLE, "-c a.cu b.cu"),
            (NVCC_STYLE, "-c a.cpp"),
            (GCC_STYLE, "-c k.cu"),
            (GCC_STYLE, "a.o -o app"),
        ] {
            assert!(
                !SccacheDist::would_distribute(&farming, &args(call)),
                "{call}"
            );
        }
    }

    #[test]
    fn outcomes_tell_a_node_oom_and_a_fallback_from_the_compiler() {
        assert_eq!(SccacheDist::outcome(Some(0), ""), RemoteOutcome::Ran);
        assert_eq!(
            SccacheDist::outcome(Some(1), "k.cu(3): error: identifier \"x\" is undefined"),
            RemoteOutcome::Ran
        );
        assert_eq!(
            SccacheDist::outcome(
                Some(137),
                "sccache: Job failed on server 127.0.0.1:10501:\n"
            ),
            RemoteOutcome::OutOfMemory
        );
        // sccache 0.16 reports a compile error on a node so, exit 254.
        let compile_error = "sccache: Job failed on server 127.0.0.1:10601:\nbad.cpp:1:21: error: 'x' was not declared in this scope\nsccache: Compiler killed by signal 1\n";
        assert_eq!(
            SccacheDist::outcome(Some(254), compile_error),
            RemoteOutcome::Ran
        );
        let fallback = "[2026-11-25T10:28:36Z WARN  sccache::compiler::compiler] [d.o]: Could not perform distributed compile, falling back to local: Error 500";
        assert_eq!(
            SccacheDist::outcome(None, fallback),
            RemoteOutcome::Unreachable
        );
        let no_scheduler = "[2026-11-25T10:28:36Z WARN  sccache::server] Scheduler address configured, but could not communicate with scheduler";
        assert_eq!(
            SccacheDist::outcome(None, no_scheduler),
            RemoteOutcome::Unreachable
        );
        assert_eq!(
            SccacheDist::outcome(
                Some(116),
                "headroom-sccache-dist: sccache's daemon for this compile did not start\n"
            ),
            RemoteOutcome::Unreachable
        );
        assert_eq!(SccacheDist::outcome(Some(116), ""), RemoteOutcome::Ran);
    }

    /// The launch script writes the node's scheduler and the token into the daemon's settings,
    /// and says it could not start a daemon where the sccache it was given is not one.
    #[test]
    fn launch_names_the_node_scheduler_and_a_daemon_of_the_attempt_own() {
        let state = tempfile::tempdir().unwrap();
        let sccache = SccacheDist {
            client: "/bin/false".into(),
            token: "secret \"one\"".into(),
        };
        let node = Node::parse("10.0.0.5=64G/16", SccacheDist::DEFAULT_PORT).unwrap();
        let launch = sccache.launch(&node, state.path());
        let script = Command::new(&launch.program)
            .args(&launch.args_before)
            .arg("/bin/true")
            .envs(launch.env.iter().map(|(name, value)| (name, value)))
            .output()
            .unwrap();
        assert_eq!(
            script.status.code(),
            Some(SETUP_FAILED),
            "no sccache to start"
        );
        let env: std::collections::HashMap<_, _> = launch.env.into_iter().collect();
        let config: toml::Value =
            toml::from_str(&std::fs::read_to_string(&env["SCCACHE_CONF"]).unwrap()).unwrap();
        assert_eq!(
            config["dist"]["scheduler_url"].as_str(),
            Some("http://10.0.0.5:10600")
        );
        assert_eq!(
            config["dist"]["auth"]["token"].as_str(),
            Some("secret \"one\"")
        );
        assert_eq!(
            Path::new(&env["SCCACHE_SERVER_UDS"]).parent(),
            Some(state.path())
        );
        assert_eq!(launch.args_before[3], "/bin/false");
        assert_eq!(launch.fallback_markers, FALLBACK_MARKERS);
    }
}
