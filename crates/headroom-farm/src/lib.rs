//! Build farms for `headroom build`: the nodes a user configured, and the distributed compile
//! engine each farmed job goes through. headroom chooses the node (by predicted memory, see
//! `headroom_sched::farm`); the engine only carries the job there. See ARCHITECTURE.md
//! ("Build farms") for the two engines, distcc and sccache-dist, and why.

mod distcc;
mod engine;
mod sccache_dist;

use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use headroom_sched::NodeSpec;
use headroom_size::{format_size, parse_size};
use serde::{Deserialize, Serialize};

pub use distcc::Distcc;
pub use engine::{Engine, EngineKind};
pub use sccache_dist::SccacheDist;

/// How long a node may take to accept a connection before the build counts it unreachable.
const REACH_TIMEOUT: Duration = Duration::from_secs(2);

/// A farm node as the user wrote it: `HOST:PORT=MEMORY/SLOTS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// `host:port` of the engine's daemon.
    pub address: String,
    pub memory: u64,
    pub slots: usize,
}

/// A node setting that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("farm node `{text}`: {problem}; write HOST:PORT=MEMORY/SLOTS, such as `10.0.0.5:3632=64G/16` (the memory its compiles may use, and how many it runs at once)")]
pub struct NodeError {
    text: String,
    problem: String,
}

impl Node {
    /// Parses `HOST:PORT=MEMORY/SLOTS`; the port may be left out (`default_port`, the engine's).
    pub fn parse(text: &str, default_port: u16) -> Result<Node, NodeError> {
        let error = |problem: String| NodeError {
            text: text.to_string(),
            problem,
        };
        let (address, capacity) = text
            .split_once('=')
            .ok_or_else(|| error("no `=MEMORY/SLOTS`".into()))?;
        let (memory, slots) = capacity
            .split_once('/')
            .ok_or_else(|| error("no `/SLOTS` after the memory".into()))?;
        let address = address.trim();
        if address.is_empty() || address.contains(char::is_whitespace) {
            return Err(error("no host".into()));
        }
        let address = if address
            .rsplit_once(':')
            .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        {
            address.to_string()
        } else {
            format!("{address}:{default_port}")
        };
        let memory = parse_size(memory.trim()).map_err(|e| error(e.to_string()))?;
        let slots: usize = slots
            .trim()
            .parse()
            .ok()
            .filter(|&slots| slots > 0)
            .ok_or_else(|| {
                error(format!(
                    "slots must be a whole number above 0, not `{slots}`"
                ))
            })?;
        if memory == 0 {
            return Err(error("memory must be above 0".into()));
        }
        Ok(Node {
            address,
            memory,
            slots,
        })
    }

    /// What the scheduler places jobs by.
    pub fn spec(&self) -> NodeSpec {
        NodeSpec {
            name: self.address.clone(),
            memory: self.memory,
            slots: self.slots,
        }
    }

    /// Whether the node's daemon accepts a connection now; the error says why not.
    pub fn reachable(&self) -> std::io::Result<()> {
        let mut last = std::io::Error::other("the name resolves to no address");
        for address in self.address.to_socket_addrs()? {
            match TcpStream::connect_timeout(&address, REACH_TIMEOUT) {
                Ok(_) => return Ok(()),
                Err(err) => last = err,
            }
        }
        Err(last)
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={}/{}",
            self.address,
            format_size(self.memory),
            self.slots
        )
    }
}

/// A build's farm: the engine's client and the nodes that answered when the build began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FarmSettings {
    pub engine: Engine,
    pub nodes: Vec<Node>,
}

/// How the shim runs one attempt on a node: `program`, then `args_before` the compiler and its
/// own arguments, with `env` set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLaunch {
    pub program: PathBuf,
    pub args_before: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Texts the engine writes to stderr when it gives up on the node and compiles here
    /// instead, for an engine that cannot be told not to: the shim kills the attempt on
    /// seeing one, before the compile grows here unadmitted.
    pub fallback_markers: Vec<String>,
}

/// How an attempt sent to a node ended, as the engine's client told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteOutcome {
    /// The node compiled it: its status is the compiler's own.
    Ran,
    /// The engine could not compile it there (the node is down, refused, or went away).
    Unreachable,
    /// The compiler was killed on the node: its memory ran out.
    OutOfMemory,
}

/// How a compiler family's compiles can go to a node, as its family module says
/// (`headroom_govern::compiler`): the engines that carry them, and which of its arguments are
/// sources. A family without one stays on this machine.
#[derive(Debug, Clone, Copy)]
pub struct Farming {
    pub style: FarmStyle,
    /// Whether an argument is a source the family compiles (`a.cpp`, `k.cu`).
    pub is_source: fn(&str) -> bool,
}

/// Which engines can carry a family's compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FarmStyle {
    /// gcc-style calls, which every engine carries: the node runs the same compiler by name.
    Gcc,
    /// nvcc's calls, which only sccache-dist carries (it splits them into cicc, ptxas and the
    /// host compile).
    Nvcc,
}

/// Whether `args` compile exactly one source (`is_source`) to an object, with none of the
/// flags that make an engine's client run the call here (`-E`, `-M`, `-march=native`, a
/// response file, nvcc's `--dryrun` or `-ptx`), so that the job's work goes to the node.
fn one_source_compiled(args: &[String], is_source: fn(&str) -> bool) -> bool {
    let compiles = args.iter().any(|arg| arg == "-c" || arg == "--compile");
    let local_only = args.iter().any(|arg| {
        matches!(
            arg.as_str(),
            "-E" | "-M"
                | "-MM"
                | "-"
                | "-save-temps"
                | "--preprocess"
                | "--dryrun"
                | "-dryrun"
                | "-ptx"
                | "--ptx"
                | "-cubin"
                | "--cubin"
                | "-fatbin"
                | "--fatbin"
                | "-lib"
                | "--lib"
                | "--options-file"
                | "-optf"
        ) || arg.starts_with('@')
            || arg.starts_with("-Wp,")
            || arg.ends_with("=native")
    });
    let sources = args
        .iter()
        .filter(|arg| !arg.starts_with('-') && is_source(arg))
        .count();
    compiles && !local_only && sources == 1
}

/// The file `program` in the first directory of `PATH` that has one: an engine's client.
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gcc-style family whose sources are `.cpp` files, and nvcc's, whose are `.cu` files,
    /// for the engines' tests (the real ones are the families' own).
    pub const GCC_STYLE: Farming = Farming {
        style: FarmStyle::Gcc,
        is_source: |arg| arg.ends_with(".cpp") || arg.ends_with(".cc") || arg.ends_with(".cxx"),
    };
    pub const NVCC_STYLE: Farming = Farming {
        style: FarmStyle::Nvcc,
        is_source: |arg| arg.ends_with(".cu"),
    };

    #[test]
    fn nodes_parse_and_bad_ones_say_what_to_write() {
        let node = Node::parse("10.0.0.5:3633=64G/16", 3632).unwrap();
        assert_eq!(
            node,
            Node {
                address: "10.0.0.5:3633".into(),
                memory: 64 << 30,
                slots: 16
            }
        );
        assert_eq!(
            Node::parse("builder=3GiB/2", 3632).unwrap().address,
            "builder:3632"
        );
        assert_eq!(
            Node::parse("[::1]:4000=1G/1", 3632).unwrap().address,
            "[::1]:4000"
        );
        for (bad, says) in [
            ("10.0.0.5:3632", "no `=MEMORY/SLOTS`"),
            ("10.0.0.5=64G", "no `/SLOTS`"),
            ("=64G/2", "no host"),
            ("h=lots/2", "lots"),
            ("h=4G/0", "above 0"),
            ("h=0/2", "memory must be above 0"),
        ] {
            let err = Node::parse(bad, 3632).unwrap_err().to_string();
            assert!(
                err.contains(says) && err.contains("HOST:PORT=MEMORY/SLOTS"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_listening_port_is_reachable_and_a_closed_one_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let node = Node::parse(&format!("{address}=1G/1"), 3632).unwrap();
        assert!(node.reachable().is_ok());
        // Port 1 lies below the ephemeral range: no bind(0) elsewhere can
        // take it, and a loopback connect cannot self-connect to it, as it
        // can (rarely) to a just-freed ephemeral port.
        let closed = Node::parse("127.0.0.1:1=1G/1", 3632).unwrap();
        assert!(closed.reachable().is_err());
    }
}
