//! What every integration test of the `headroom` binary shares: the built binary run in a
//! project directory of the test's own, what a run wrote to stderr, servers on loopback
//! ports that no other process can take from under the test, and the locks that keep the
//! tests that must not overlap apart. The topic modules below build on this one.

/// The stand-in compiler, `headroom-fakecc`, built once per run.
pub mod fakecc;
/// Memory-limited cgroups for the farm's nodes and `headroom build` run inside one.
pub mod farm;
/// Crash, full-disk and load tests: isolated projects and what a run leaves behind.
pub mod reliability;
/// `headroom run`: a scratch directory and a Python program that allocates in stages.
pub mod run;
/// Real store servers (S3, redis, WebDAV) on loopback.
pub mod stores;

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use headroom_probe::cgroup::Cgroup;

/// The `headroom` binary cargo built for these tests.
pub const HEADROOM: &str = env!("CARGO_BIN_EXE_headroom");

/// How long a server may take to listen on a loaded 2-core machine.
const SERVER_PATIENCE: Duration = Duration::from_secs(60);

/// How many ports a server that cannot pick its own is offered before the test gives up.
const PORT_TRIES: usize = 5;

/// Variables of the machine that runs the tests that would change what headroom does.
const CALLERS_VARIABLES: &[&str] = &[
    "MAKEFLAGS",
    "HEADROOM_BUDGET",
    "HEADROOM_JOBS",
    "HEADROOM_LOG",
    "HEADROOM_CONFIG",
    "HEADROOM_KERNEL_CACHE",
    "HEADROOM_KERNEL_CACHE_MAX",
    "HEADROOM_FARM",
    "HEADROOM_FARM_ENGINE",
    "HEADROOM_FARM_TOKEN",
    "HEADROOM_HISTORY_STORE",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
];

/// `headroom ARGS…`, its stdin empty, with none of the caller's variables that would change
/// what headroom does: the start of every test's headroom command, to which the test adds
/// where it runs ([`headroom_in`], `reliability::headroom`) and what it sets.
pub fn headroom(args: &[&str]) -> Command {
    let mut command = Command::new(HEADROOM);
    command.args(args).stdin(Stdio::null());
    for variable in CALLERS_VARIABLES {
        command.env_remove(variable);
    }
    command
}

/// `headroom ARGS…` run in the project `dir`; see [`in_project`].
pub fn headroom_in(dir: &Path, args: &[&str]) -> Command {
    let mut command = headroom(args);
    in_project(&mut command, dir);
    command
}

/// Runs `command` in the project `dir`: headroom's state in `dir/state`, its runtime
/// directory in `dir/run`, `dir/bin` first on PATH (where a test puts its stand-in compiler),
/// and none of the caller's variables that would change what headroom does.
pub fn in_project(command: &mut Command, dir: &Path) {
    command
        .current_dir(dir)
        .env("HEADROOM_STATE_DIR", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                dir.join("bin").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    for variable in CALLERS_VARIABLES {
        command.env_remove(variable);
    }
}

/// What a finished process wrote to stderr, as text.
pub fn stderr(output: &Output) -> String {
    text(&output.stderr)
}

/// What a process printed on stdout, as text.
pub fn stdout(output: &Output) -> String {
    text(&output.stdout)
}

/// Asserts that a command printed `text` on stdout, and shows what it printed when it did not.
#[track_caller]
pub fn assert_printed(output: &Output, text: &str) {
    let printed = stdout(output);
    assert!(
        printed.contains(text),
        "expected {text:?} on stdout:\n{printed}"
    );
}

/// Asserts that a command said `text` on stderr, and shows what it said when it did not.
#[track_caller]
pub fn assert_said(output: &Output, text: &str) {
    let said = stderr(output);
    assert!(said.contains(text), "expected {text:?} on stderr:\n{said}");
}

/// Asserts that a command did not say `text` on stderr, and shows what it said when it did.
#[track_caller]
pub fn assert_not_said(output: &Output, text: &str) {
    let said = stderr(output);
    assert!(
        !said.contains(text),
        "did not expect {text:?} on stderr:\n{said}"
    );
}

/// The settings a CLI gives its governor, as JSON (a 1 GiB budget, one slot, no history),
/// for tests that start or join a governor without a CLI.
pub fn governor_config() -> serde_json::Value {
    serde_json::json!({
        "budget": 1u64 << 30, "budget_source": "test", "slots": 1, "history": null,
        "command": "make", "cwd": "/", "started_unix_ms": 0, "ladder": [],
        "sample_interval_ms": 100, "priorities": false, "parallelism_set": [],
        "project_root": "/", "farm": null
    })
}

/// What a process wrote, as text (invalid UTF-8 shown as U+FFFD).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether every one of `tools` is on PATH; where one is not, says so under its own name
/// (see `headroom_testkit::skip`) and returns false.
pub fn have(tools: &[&str]) -> bool {
    for tool in tools {
        if !on_path(tool) {
            headroom_testkit::skip(tool, format!("`{tool}` is not on PATH"));
            return false;
        }
    }
    true
}

/// Whether `tool` is a file in a directory of PATH.
pub fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
}

/// A loopback port that nothing listens on, and that nothing else can take while this value
/// lives: it is bound, and never listened on, so a connection to it is refused.
pub struct ClosedPort {
    _socket: OwnedFd,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned at once.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `address` is a sockaddr_in of `length` bytes, live for both calls.
        let bound = unsafe {
            libc::bind(fd, std::ptr::addr_of!(address).cast(), length) == 0
                && libc::getsockname(fd, std::ptr::addr_of_mut!(address).cast(), &mut length) == 0
        };
        assert!(
            bound,
            "bind 127.0.0.1:0: {}",
            std::io::Error::last_os_error()
        );
        ClosedPort {
            _socket: socket,
            port: u16::from_be(address.sin_port),
        }
    }
}

/// The TCP ports process `pid` listens on: its sockets (`/proc/PID/fd`) found among the
/// listening ones of its network namespace (`/proc/PID/net/tcp`, `tcp6`).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            const LISTEN: &str = "0A";
            let (Some(local), Some(&LISTEN), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if !inodes.iter().any(|mine| mine == inode) {
                continue;
            }
            let port = local.rsplit(':').next().unwrap_or_default();
            if let Ok(port) = u16::from_str_radix(port, 16) {
                ports.push(port);
            }
        }
    }
    ports
}

/// A server this test started and the loopback port it listens on. Dropping it kills it.
pub struct Listening {
    pub child: Child,
    pub port: u16,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `command`, a server told to listen on port 0 so that the kernel picks its port, its
/// stdout and stderr in `log`; returns once it listens, with the port read back from `/proc`.
pub fn start_on_its_own_port(what: &str, mut command: Command, log: &Path) -> Listening {
    let mut child = spawn_logging(what, &mut command, log);
    let deadline = Instant::now() + SERVER_PATIENCE;
    loop {
        if let Some(&port) = listening_ports(child.id()).first() {
            return Listening { child, port };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} ended ({status}) before it listened: {}", read(log));
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen within {SERVER_PATIENCE:?}: {}",
            read(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `server(port)`, a server that cannot pick its own port (port 0 means something
/// else to it, or it must know its port before it binds), on a port that was free a moment
/// ago, its stdout and stderr in `log`. Another process may take that port in between: the
/// server then ends saying "Address already in use", and is started again on another port.
/// Returns once it listens on the port it was given (checked in `/proc`, not by connecting,
/// which another process's listener would answer too).
pub fn start_on_a_free_port(
    what: &str,
    mut server: impl FnMut(u16) -> Command,
    log: &Path,
) -> Listening {
    for _ in 0..PORT_TRIES {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let mut child = spawn_logging(what, &mut server(port), log);
        let deadline = Instant::now() + SERVER_PATIENCE;
        loop {
            if listening_ports(child.id()).contains(&port) {
                return Listening { child, port };
            }
            if let Ok(Some(status)) = child.try_wait() {
                let said = read(log);
                assert!(
                    said.contains("Address already in use"),
                    "{what} ended ({status}) before it listened on {port}: {said}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not listen on {port} within {SERVER_PATIENCE:?}: {}",
                read(log)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("{what}: each of {PORT_TRIES} free ports was taken before it could bind it");
}

fn spawn_logging(what: &str, command: &mut Command, log: &Path) -> Child {
    let out = File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let err = out.try_clone().unwrap();
    command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"))
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// A fresh memory cgroup named after `name`, this test process and a count of the cgroups it
/// made (the tests share one process, and two may ask for the same name), capped at `limit`,
/// or `None` (saying why the test skips) where none can be made.
pub fn limited_cgroup(name: &str, limit: u64) -> Option<Cgroup> {
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let count = MADE.fetch_add(1, Ordering::Relaxed);
    let name = format!("headroom-test-{name}-{}-{count}", std::process::id());
    match Cgroup::create_under_self(&name, Some(limit)) {
        Ok(cgroup) => Some(cgroup),
        Err(err) => {
            headroom_testkit::skip(
                "cgroup",
                format!("cannot make a memory-limited cgroup here: {err}"),
            );
            None
        }
    }
}

/// The tests that must not overlap one another, as the threads of this one test process run
/// two tests at once: each such test holds [`WHOLE_MACHINE`] while it runs, so it shares the
/// machine only with light tests. They are the tests that load every core or much of the
/// memory for long (the crash points, many builds at once, build farms of real daemons in
/// cgroups), and those that bound a wall time or the moment a governor reacts (`fail_open`,
/// `sessions`, `load`): next to one another, each would slow the other past its bounds on a
/// loaded 2-core machine. The sccache farm's tests need it besides: sccache's client keeps one
/// toolchain cache per user, which two builds starting daemons at once would open together.
pub struct Exclusive(Mutex<()>);

/// See [`Exclusive`].
pub static WHOLE_MACHINE: Exclusive = Exclusive(Mutex::new(()));

impl Exclusive {
    /// Waits until no other test holds this lock, and holds it until the guard is dropped. A
    /// test that failed while holding it does not fail the next one.
    pub fn hold(&'static self) -> MutexGuard<'static, ()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
