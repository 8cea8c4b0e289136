//! distcc as a farm's engine: its client takes the node for each call from `DISTCC_HOSTS`, so
//! headroom can send every job to the node it chose, and can tell it never to fall back to a
//! local compile (`DISTCC_FALLBACK=0`, `DISTCC_SKIP_LOCAL_RETRY`): a fallback would run a
//! heavy compile here without admission. headroom retries such jobs itself.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    find_on_path, one_source_compiled, FarmStyle, Farming, Node, RemoteLaunch, RemoteOutcome,
};

/// The distcc client headroom sends jobs through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Distcc {
    pub client: PathBuf,
}

/// distcc's own exit codes (`exitcode.h`: `EXIT_DISTCC_FAILED` 100 to `EXIT_TIMEOUT` 118), kept
/// apart from compilers' codes: the job did not compile on the node, for a reason that is
/// the node's or the network's.
const OWN_EXIT_CODES: std::ops::RangeInclusive<i32> = 100..=118;
/// `EXIT_OUT_OF_MEMORY`: the client itself ran out.
const EXIT_OUT_OF_MEMORY: i32 = 105;

impl Distcc {
    pub const DEFAULT_PORT: u16 = 3632;

    /// The `distcc` client on `PATH`.
    pub fn find() -> Option<Distcc> {
        find_on_path("distcc").map(|client| Distcc { client })
    }

    /// Whether distcc would compile this call of a family that farms so (`farming`) on a node:
    /// one source of a gcc-style compiler compiled to an object. Anything else (nvcc, a link,
    /// `-E`, `-march=native`, a response file) its client runs here, which a farmed job's small
    /// local reservation would not cover: such jobs stay local jobs.
    pub fn would_distribute(farming: &Farming, args: &[String]) -> bool {
        farming.style == FarmStyle::Gcc && one_source_compiled(args, farming.is_source)
    }

    /// How the shim runs an attempt on `node`, with distcc's state (its host backoff) kept in
    /// `state_dir`, one per job: one job's failure on a node must not make another job's
    /// client refuse the node; headroom decides that.
    pub fn launch(&self, node: &Node, state_dir: &Path) -> RemoteLaunch {
        let env = [
            ("DISTCC_HOSTS", format!("{}/1", node.address)),
            ("DISTCC_FALLBACK", "0".into()),
            ("DISTCC_SKIP_LOCAL_RETRY", "1".into()),
            ("DISTCC_DIR", state_dir.to_string_lossy().into_owned()),
        ];
        RemoteLaunch {
            program: self.client.clone(),
            args_before: Vec::new(),
            env: env
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
            fallback_markers: Vec::new(),
        }
    }

    /// How an attempt sent to a node ended. distcc prints `distcc[PID] ERROR: compile FILE on
    /// HOST: Killed` when the node's compiler died of SIGKILL (the OOM killer); a compiler
    /// driver such as g++ says so itself (`Killed signal terminated program cc1plus`), which
    /// headroom's failure rules already read.
    pub fn outcome(exit_code: Option<i32>, stderr: &str) -> RemoteOutcome {
        match exit_code {
            Some(EXIT_OUT_OF_MEMORY) => RemoteOutcome::OutOfMemory,
            Some(code) if OWN_EXIT_CODES.contains(&code) => RemoteOutcome::Unreachable,
            _ if stderr.lines().any(|line| {
                line.starts_with("distcc[")
                    && line.contains("ERROR: compile ")
                    && line.trim_end().ends_with(": Killed")
            }) =>
            {
                RemoteOutcome::OutOfMemory
            }
            _ => RemoteOutcome::Ran,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{GCC_STYLE, NVCC_STYLE};

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn only_single_compiles_to_objects_are_distributed() {
        for remote in [
            "-O2 -c a.cpp -o a.o",
            "-c src/x.cc -MD -MF x.d -o x.o",
            "-std=c++17 -I/include -c /abs/unit.cxx",
        ] {
            assert!(
                Distcc::would_distribute(&GCC_STYLE, &args(remote)),
                "{remote}"
            );
        }
        for local in [
            "a.o b.o -o app",
            "-E a.cpp",
            "-c a.cpp b.cpp",
            "-march=native -c a.cpp",
            "@flags.rsp -c a.cpp",
            "-c - -o a.o",
            "-shared a.o -o lib.so",
            "-c kernel.cu -o kernel.o",
        ] {
            assert!(
                !Distcc::would_distribute(&GCC_STYLE, &args(local)),
                "{local}"
            );
        }
        assert!(
            !Distcc::would_distribute(&NVCC_STYLE, &args("-c k.cu -o k.o")),
            "distcc carries no nvcc"
        );
    }

    #[test]
    fn outcomes_tell_the_node_from_the_compiler() {
        assert_eq!(Distcc::outcome(Some(0), ""), RemoteOutcome::Ran);
        assert_eq!(
            Distcc::outcome(Some(1), "a.cpp:1:1: error: expected ';'"),
            RemoteOutcome::Ran
        );
        assert_eq!(
            Distcc::outcome(
                Some(116),
                "distcc[9] (dcc_build_somewhere) ERROR: failed to distribute and fallbacks are disabled"
            ),
            RemoteOutcome::Unreachable
        );
        assert_eq!(Distcc::outcome(Some(107), ""), RemoteOutcome::Unreachable);
        assert_eq!(
            Distcc::outcome(
                Some(137),
                "distcc[14334] ERROR: compile a.cpp on 127.0.0.1:36303/1: Killed\n"
            ),
            RemoteOutcome::OutOfMemory
        );
    }

    #[test]
    fn launch_names_one_node_and_forbids_local_fallback() {
        let distcc = Distcc {
            client: "/usr/bin/distcc".into(),
        };
        let node = Node::parse("10.0.0.5:3632=8G/4", Distcc::DEFAULT_PORT).unwrap();
        let launch = distcc.launch(&node, Path::new("/run/headroom/job-7"));
        let env: std::collections::HashMap<_, _> = launch.env.into_iter().collect();
        assert_eq!(env["DISTCC_HOSTS"], "10.0.0.5:3632/1");
        assert_eq!(env["DISTCC_FALLBACK"], "0");
        assert_eq!(env["DISTCC_SKIP_LOCAL_RETRY"], "1");
        assert_eq!(env["DISTCC_DIR"], "/run/headroom/job-7");
    }
}
