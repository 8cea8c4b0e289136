//! The compiler shim: the tiny program every compiler invocation of a governed build goes
//! through. It asks the governor for admission, runs the real compiler in its own process
//! group, and reports how it ended; a retried attempt is invisible to the build system.
//!
//! Fail open: without a reachable governor the shim simply becomes the real compiler.
//! No async runtime, no configuration files: nothing that is not needed before `exec`.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::Instant;

use headroom_farm::RemoteLaunch;
use headroom_probe::cpu_share::CpuShare;
use headroom_process::slice::Slice;
use headroom_process::{foreground, shell_code, Group, Usage, OUTPUT_AFTER_EXIT};
use headroom_sched::ladder::Rung;
use headroom_sched::SessionId;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{
    getpriority_process, setpriority_pgrp, setpriority_process, Pid, PidfdFlags,
};

use crate::liveness;
use crate::protocol::{monotonic_ms, read_frame, write_frame, Attempt, Reply, Request};

/// The name under which the shim works as a compiler launcher: `headroom-launch COMPILER ARGS…`.
pub const LAUNCHER_NAME: &str = "headroom-launch";
/// The governor's socket.
pub const SOCKET_ENV: &str = "HEADROOM_SOCKET";
/// The shim directory, skipped when looking for the real compiler.
pub const SHIM_DIR_ENV: &str = "HEADROOM_SHIM_DIR";
/// The session of the governor whose build this is (its CLI's process id).
pub const SESSION_ENV: &str = "HEADROOM_SESSION";
/// `1` in a build whose session may send compiles to a build farm, `0` otherwise. Its shims wait
/// for the governor's answer before they start the compiler: a job sent to a farm node would
/// otherwise start here first, only to be ended, and hold this machine's memory meanwhile.
/// Not `HEADROOM_FARM`, the user's `--farm`: a `headroom build` run by a build step would take
/// this value for its own farm and refuse to start.
pub const FARM_ENV: &str = "HEADROOM_SESSION_FARM";
/// Set for a job's processes (to its shim's process id), so a compiler started by a compiler
/// is not governed twice.
pub const JOB_ENV: &str = "HEADROOM_JOB";
/// The session's directory for its compilers' temporary files: a governed attempt runs with
/// it as `TMPDIR`, so that what a compiler headroom ended leaves there goes with the session
/// (`crate::session`). Only in place of the temporary directory the session itself had: a
/// build step that chose another (Bazel's sandbox) keeps its own.
pub const JOB_TMPDIR_ENV: &str = "HEADROOM_JOB_TMPDIR";
/// How much of the end of a failed job's stderr is sent to the governor.
const STDERR_TAIL: usize = 8 << 10;

/// Whether the program was called as the shim: as the launcher, or by a compiler's name (a
/// link in the shim directory recorded by a tree configured with an earlier version).
pub fn is_shim(argv0: &OsStr) -> bool {
    let name = Path::new(argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or("");
    name == LAUNCHER_NAME || crate::compiler::is_governed(name)
}

/// Runs the shim; never returns.
pub fn main(argv: Vec<OsString>) -> ! {
    let shim_dir = std::env::var_os(SHIM_DIR_ENV).map(PathBuf::from);
    let name = Path::new(&argv[0])
        .file_name()
        .unwrap_or_default()
        .to_os_string();
    let (wanted, args) = if name == LAUNCHER_NAME {
        match argv.get(1) {
            Some(compiler) => (compiler.clone(), argv[2..].to_vec()),
            None => fail(2, "usage: headroom-launch COMPILER [ARGS…] (set as CMAKE_<LANG>_COMPILER_LAUNCHER, CCACHE_PREFIX or RUSTC_WRAPPER)"),
        }
    } else {
        (name, argv[1..].to_vec())
    };
    let compiler = find_real_compiler(&wanted, shim_dir.as_deref()).unwrap_or_else(|| {
        fail(
            127,
            &format!(
                "cannot find the real `{}` on PATH (headroom's shim directory is skipped)",
                wanted.to_string_lossy()
            ),
        )
    });
    let mut command = Command::new(&compiler);
    command.args(&args);
    // The job's own processes (nvcc's cicc, gcc's cc1plus) are part of this job: they need
    // no interceptor. Set in this process's own environment, as every variable the compiler
    // gets from the shim is (see [`set_attempt_environment`]).
    match crate::intercept::job_preload() {
        Some(Some(preload)) => std::env::set_var("LD_PRELOAD", preload),
        Some(None) => std::env::remove_var("LD_PRELOAD"),
        None => {}
    };
    let socket = std::env::var_os(SOCKET_ENV).filter(|_| std::env::var_os(JOB_ENV).is_none());
    let Some(socket) = socket.map(PathBuf::from) else {
        become_compiler(command)
    };
    if crate::compiler::is_probe(&compiler, &args) {
        run_probe(command)
    }
    let session = std::env::var(SESSION_ENV)
        .ok()
        .and_then(|id| id.parse().ok())
        .unwrap_or(0);
    let ledger = liveness::Ledger::of(&socket, session);
    match liveness::connect(&socket, ledger.patience()) {
        Ok(stream) => governed(stream, command, &compiler, &args, session, &ledger),
        Err(err) if liveness::is_silence(&err) => run_ungoverned(command, None, &compiler, &ledger),
        // No governor: run as if it never existed.
        Err(_) => become_compiler(command),
    }
}

/// Runs the compiler ungoverned because the governor stayed silent past the bound
/// (`crate::liveness`): records it in the session's ledger, which the build's summary counts,
/// and tells the user if this is the build's first such call.
fn run_ungoverned(
    command: Command,
    early: Option<Child>,
    compiler: &Path,
    ledger: &liveness::Ledger,
) -> ! {
    if ledger.record(compiler) {
        let _ = writeln!(
            std::io::stderr(),
            "headroom: warning: the governor has not answered for {} s; compilers run \
             ungoverned until it does (the build's summary counts them)",
            liveness::silence_bound().as_secs_f64()
        );
    }
    without_governor(command, early)
}

/// Runs a probe at once, as a child in its own process group: the governor, which follows
/// the build's processes, takes a shim's group-leader child for an attempt it is about to
/// hear of, so a probe is neither a job nor a compiler that ran outside admission.
fn run_probe(mut command: Command) -> ! {
    let status = headroom_process::spawn(&mut command, Group::Own)
        .and_then(|mut child| {
            child.wait().map_err(|source| headroom_process::SpawnError {
                program: command.get_program().to_string_lossy().into_owned(),
                source,
            })
        })
        .unwrap_or_else(|err| fail(127, &err.to_string()));
    std::process::exit(shell_code(status))
}

fn fail(code: i32, message: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "headroom: {message}");
    std::process::exit(code)
}

/// Replaces this process with the compiler: the ungoverned path, as cheap as a shim can be.
fn become_compiler(mut command: Command) -> ! {
    let err = command.exec();
    fail(
        127,
        &format!(
            "cannot run `{}`: {err}",
            command.get_program().to_string_lossy()
        ),
    )
}

/// The real compiler for `wanted`: a path is taken as it is, unless it is a shim itself; a
/// name is looked up on PATH, skipping the shim directory and anything that is this program.
pub fn find_real_compiler(wanted: &OsStr, shim_dir: Option<&Path>) -> Option<PathBuf> {
    // The same file as this program, by device and inode: two stat calls, where comparing
    // canonical paths costs a readlink per path component.
    let identity = |path: &Path| path.metadata().ok().map(|m| (m.dev(), m.ino()));
    let me = identity(Path::new("/proc/self/exe"));
    let is_me = |candidate: &Path| me.is_some() && identity(candidate) == me;
    let wanted_path = Path::new(wanted);
    if wanted.as_bytes().contains(&b'/') && !is_me(wanted_path) {
        return Some(wanted_path.to_path_buf());
    }
    let name = wanted_path.file_name()?;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| shim_dir.is_none_or(|shims| dir != shims))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate) && !is_me(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs the job under the governor, retrying attempts the governor asks to retry.
///
/// The first attempt starts as soon as the job is asked for, while the governor decides: its
/// answer is then off the compile's critical path (not in a farm session, see [`FARM_ENV`]).
/// A job the governor cannot run yet hears [`Reply::Queued`] within the same round trip, and
/// its early attempt is ended there: a stopped compiler would hold memory the governor does
/// not see, for the few milliseconds of work it saves. One admitted with lower-memory flags or
/// sent to a farm node has its early attempt ended too. Either way it is reaped before the
/// attempt the governor asked for starts, so only that one writes the job's outputs. Retries
/// start after their answer, as they always have.
fn governed(
    stream: UnixStream,
    command: Command,
    compiler: &Path,
    args: &[OsString],
    session: SessionId,
    ledger: &liveness::Ledger,
) -> ! {
    // Without the handlers a signal ends the shim and leaves the compiler running: still a
    // build that goes on, so not a reason to refuse it.
    let _ = foreground::install();
    // What an attempt's compiler starts and leaves behind when it is ended comes to this shim,
    // not to the build's subreaper: it is still the attempt's (`end_early`, and the governor's
    // walk of the build, `headroom_probe::procs::walk_build`).
    headroom_process::become_subreaper();
    let temp_dir = session_temp_dir();
    let request = Request::Job {
        session,
        compiler: compiler.to_string_lossy().into_owned(),
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    if write_frame(&stream, &request).is_err() {
        become_compiler(command)
    }
    // The niceness the user gave the build is a floor that headroom's priorities add to.
    let floor = getpriority_process(None).unwrap_or(0);
    let slice = Slice::shorten_own();
    let build_temp_dir = set_attempt_environment(temp_dir.as_deref());
    let attempt = |rung: Option<&Rung>, remote: Option<&RemoteLaunch>| {
        attempt_command(compiler, args, rung, remote, build_temp_dir.as_deref())
    };
    let mut early = if std::env::var_os(FARM_ENV).is_some_and(|farm| farm == "1") {
        None
    } else {
        start_attempt(&mut attempt(None, None), slice).ok()
    };
    loop {
        let (rung, nice, cpu_group, remote) = match liveness::read_reply(&stream) {
            Ok(Reply::Queued) => {
                end_early(&mut early);
                continue;
            }
            Ok(Reply::Run {
                rung,
                nice,
                cpu_group,
                remote,
                ..
            }) => (rung, nice, cpu_group, remote),
            // The governor is silent, or gone before admitting us: run as if it never existed,
            // in this process where the compiler has not started yet, with the slice the
            // build gave it.
            other => {
                if let Some(slice) = slice {
                    slice.give_back(std::process::id());
                }
                match other {
                    Err(err) if liveness::is_silence(&err) => {
                        run_ungoverned(command, early, compiler, ledger)
                    }
                    _ => without_governor(command, early),
                }
            }
        };
        let priority = Priority {
            floor,
            nice,
            cpu_group,
        };
        let started = match early.take() {
            Some(child) if rung.is_none() && remote.is_none() => {
                priority.take_on(Some(child.id()));
                Ok(child)
            }
            mut early => {
                end_early(&mut early);
                priority.take_on(None);
                start_attempt(&mut attempt(rung.as_ref(), remote.as_ref()), slice)
            }
        };
        let fallback_markers = remote.as_ref().map_or(&[][..], |r| &r.fallback_markers);
        let outcome = started.and_then(|child| finish_attempt(child, &stream, fallback_markers));
        let ended_at = monotonic_ms();
        let Ok((status, usage, stderr)) = outcome else {
            let err = outcome.err().map(|e| e.to_string()).unwrap_or_default();
            fail(127, &format!("cannot run `{}`: {err}", compiler.display()))
        };
        let attempt = Attempt {
            exit_code: status.code(),
            signal: status.signal(),
            max_rss: usage.max_rss,
            cpu_ms: usage.cpu_ms,
            stderr_tail: tail(&stderr),
            ended_at,
        };
        // An attempt the user's signal ended ends the job, whatever the governor says.
        let interrupted = foreground::interrupted();
        let sent = write_frame(&stream, &Request::Finished(attempt));
        // An attempt that exited 0 is done whatever the governor says: the build need not
        // wait for its answer. A silent governor's answer is not waited for either.
        let reply = sent
            .ok()
            .filter(|()| !status.success())
            .and_then(|()| liveness::read_reply(&stream).ok());
        if reply == Some(Reply::Retry) && !interrupted {
            continue;
        }
        let _ = std::io::stderr().write_all(&stderr);
        std::process::exit(shell_code(status))
    }
}

/// The session's directory for temporary files ([`JOB_TMPDIR_ENV`]), where it stands in for
/// this process's own and still exists.
fn session_temp_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(JOB_TMPDIR_ENV)?);
    let in_place_of_mine = dir.parent() == Some(std::env::temp_dir().as_path());
    (in_place_of_mine && dir.is_dir()).then_some(dir)
}

/// Runs the compiler as if there were no governor: becomes it, or, where the first attempt
/// started already, lets that attempt (resumed, in case it was stopped) finish and ends as it
/// did.
fn without_governor(command: Command, early: Option<Child>) -> ! {
    let Some(mut child) = early else {
        become_compiler(command)
    };
    foreground::signal(libc::SIGCONT);
    if let Some(pipe) = child.stderr.take() {
        let _ = std::io::stderr().write_all(&collect_stderr(pipe, child.id(), None, &[]));
    }
    std::process::exit(shell_code(reap(child)))
}

/// Ends the early attempt, if one runs, and waits for it, so that nothing of it writes an
/// output or holds memory once another attempt starts. SIGTERM first, as the governor's own
/// kills, so that gcc removes its temporary files; SIGKILL after
/// [`headroom_process::TERM_GRACE`], and to whatever of it outlived the compiler's driver (a
/// `cc1plus` still dying, or a child that ignores SIGTERM). Where the user's signal ended it,
/// nothing starts the job again: the shim exits as the compiler did.
fn end_early(early: &mut Option<Child>) {
    let Some(mut child) = early.take() else {
        return;
    };
    let group = child.id() as i32;
    headroom_process::ask_group_to_end(group);
    let ended = headroom_process::wait_within(&mut child, headroom_process::TERM_GRACE);
    if !matches!(ended, Ok(Some(_))) {
        headroom_process::signal_group(group, libc::SIGKILL);
    }
    let status = reap(child);
    headroom_process::end_what_is_left_of_group(group);
    if foreground::interrupted() {
        std::process::exit(shell_code(status))
    }
}

/// Waits for an early attempt to end; it is then no longer the foreground child.
fn reap(mut child: Child) -> ExitStatus {
    let ended = child.wait();
    foreground::ended();
    ended.unwrap_or_else(|err| fail(127, &format!("cannot wait for the compiler: {err}")))
}

/// Reads an attempt's stderr to its end, or until [`OUTPUT_AFTER_EXIT`] after the attempt's
/// own process (the compiler's driver) exited: a background process it left holding stderr
/// (a compile server a wrapper started) would otherwise hold the build up for as long as it
/// lives, where make alone goes on at once. While the attempt runs the governor, where there
/// is one, sends only its heartbeats, so its socket closing, or staying silent past the
/// bound, means it has gone or hung: then the attempt, which it may have stopped, is resumed,
/// since nobody else would. An attempt that writes one of `fallback_markers` (its farm engine
/// is about to compile here, unadmitted) is killed at once.
fn collect_stderr(
    mut pipe: ChildStderr,
    attempt: u32,
    mut governor: Option<&UnixStream>,
    fallback_markers: &[String],
) -> Vec<u8> {
    let mut stderr = Vec::new();
    let mut chunk = [0u8; 8192];
    let silence = liveness::silence_bound();
    let mut heard = Instant::now();
    // Readable once the attempt's process has exited (Linux 5.3 and later; before, the end of
    // stderr is waited for, as it always was).
    let mut running = Pid::from_raw(attempt as i32)
        .and_then(|pid| rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok());
    let mut exited_at: Option<Instant> = None;
    loop {
        // The pipe first; the governor and the attempt where they are still watched.
        let mut ready = vec![PollFd::new(&pipe, PollFlags::IN)];
        let governor_slot = governor.map(|governor| {
            ready.push(PollFd::new(governor, PollFlags::IN));
            ready.len() - 1
        });
        let attempt_slot = running.as_ref().map(|pidfd| {
            ready.push(PollFd::new(pidfd, PollFlags::IN));
            ready.len() - 1
        });
        let wait = match exited_at {
            Some(exited) => Some(OUTPUT_AFTER_EXIT.saturating_sub(exited.elapsed())),
            None => governor.map(|_| liveness::HEARTBEAT),
        };
        let timeout = wait.and_then(|wait| rustix::event::Timespec::try_from(wait).ok());
        match poll(&mut ready, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        let readable = |slot: usize| !ready[slot].revents().is_empty();
        let pipe_ready = readable(0);
        let governor_ready = governor_slot.is_some_and(readable);
        let attempt_exited = attempt_slot.is_some_and(readable);
        drop(ready);
        if let Some(mut watched) = governor {
            let alive = governor_ready && read_frame::<Reply>(&mut watched).is_ok();
            if alive {
                heard = Instant::now();
            }
            if (governor_ready && !alive) || heard.elapsed() > silence {
                governor = None;
                foreground::signal(libc::SIGCONT);
            }
        }
        if attempt_exited {
            running = None;
            exited_at = Some(Instant::now());
        }
        if exited_at.is_some_and(|exited| exited.elapsed() >= OUTPUT_AFTER_EXIT) {
            break;
        }
        if !pipe_ready {
            continue;
        }
        match pipe.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => {
                let searched_to = stderr.len();
                stderr.extend_from_slice(&chunk[..read]);
                let falls_back = fallback_markers.iter().any(|marker| {
                    let from = searched_to.saturating_sub(marker.len());
                    contains(&stderr[from..], marker.as_bytes())
                });
                if falls_back {
                    foreground::signal(libc::SIGKILL);
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            // A terminal's reader reads EIO once every writer has closed it.
            Err(_) => break,
        }
    }
    stderr
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Sets what every attempt inherits from this process's environment: [`JOB_ENV`], and the
/// session's `temp_dir`, where there is one, as `TMPDIR`; returns the `TMPDIR` the build gave
/// the shim. In the shim's own environment, not each attempt's `Command`: a `Command` with
/// variables of its own makes the standard library copy the whole environment on every
/// spawn, which was 80 µs of a compiler call (BENCHMARKS.md, "Cost of interception"). The
/// shim runs one thread, so nothing reads the environment while it changes.
fn set_attempt_environment(temp_dir: Option<&Path>) -> Option<OsString> {
    let build_temp_dir = std::env::var_os("TMPDIR");
    std::env::set_var(JOB_ENV, std::process::id().to_string());
    if let Some(dir) = temp_dir {
        std::env::set_var("TMPDIR", dir);
    }
    build_temp_dir
}

/// The command of one attempt: `compiler` with `args` lowered by `rung` when given, or sent
/// to a farm node through the engine's client when `remote` is given. The client gets back
/// the build's own `build_temp_dir`, since it may start the engine's server, which outlives
/// the session and its directory.
fn attempt_command(
    compiler: &Path,
    args: &[OsString],
    rung: Option<&Rung>,
    remote: Option<&RemoteLaunch>,
    build_temp_dir: Option<&OsStr>,
) -> Command {
    let args = match rung {
        Some(rung) => rung.apply(args),
        None => args.to_vec(),
    };
    let mut command = match remote {
        Some(remote) => {
            let mut client = Command::new(&remote.program);
            client
                .args(&remote.args_before)
                .arg(compiler)
                .envs(remote.env.iter().map(|(name, value)| (name, value)));
            match build_temp_dir {
                Some(dir) => client.env("TMPDIR", dir),
                None => client.env_remove("TMPDIR"),
            };
            client
        }
        None => Command::new(compiler),
    };
    command.args(args);
    command
}

/// The CPU priority an attempt runs at.
struct Priority {
    /// The user's niceness, which headroom's priorities never go below.
    floor: i32,
    /// The governor's priority level for the attempt, 0 the highest: steps of niceness.
    nice: u8,
    /// The builds' cgroup, where the governor has one.
    cpu_group: Option<PathBuf>,
}

impl Priority {
    /// Takes on the priority in this process (`attempt` None), which the attempt then
    /// inherits, so that every process and thread of it has it from its start and the
    /// compiler can start through posix_spawn (no pre_exec hook, which would force a fork);
    /// or gives it to `attempt`, a first attempt started before the answer, whose whole
    /// process group gets the niceness. The priority is `nice` steps of niceness above the
    /// user's `floor` (`nice -n 15 headroom build` means the build is background work, even
    /// for root). Inside the builds' cgroup, niceness orders the builds' own processes only;
    /// the build starts there, so a shim moves its attempt (or itself) there only when it
    /// runs outside (under a build server started before the build), since a move costs
    /// milliseconds on a busy host. Niceness only rises without privilege: a retry the
    /// governor starts nicer gets it; one it starts less nice keeps the shim's. Failing to
    /// change either only costs speed.
    fn take_on(&self, attempt: Option<u32>) {
        if let Some(group) = &self.cpu_group {
            if !CpuShare::holds_this_process(group) {
                // 0 is the writing process itself.
                let member = attempt.unwrap_or(0).to_string();
                let _ = std::fs::write(group.join("cgroup.procs"), member);
            }
        }
        let level = (self.floor + i32::from(self.nice)).min(19);
        let _ = match attempt.and_then(|pid| Pid::from_raw(pid as i32)) {
            Some(group) => setpriority_pgrp(Some(group), level),
            None => setpriority_process(None, level),
        };
    }
}

/// Starts an attempt in its own process group, so the governor can stop, resume or kill it
/// whole, as the foreground child, with its stderr read by this process: through a pipe, or
/// through a terminal of its own where the shim's stderr is a terminal, so the compiler
/// colours its diagnostics as it would without headroom. The attempt starts with the shim's
/// short slice, so that it gets a core at once on a busy host, and then runs with the slice
/// the shim was given (`slice`, see [`headroom_process::slice`]).
fn start_attempt(command: &mut Command, slice: Option<Slice>) -> std::io::Result<Child> {
    let (stderr, reader) = headroom_process::terminal::for_child(std::io::stderr().as_fd());
    command.stderr(stderr);
    let spawned = foreground::spawn(command).map_err(|err| err.source);
    // The command no longer holds the terminal's writing end: once the attempt's processes
    // close theirs, the reader sees the end.
    command.stderr(Stdio::null());
    let mut child = spawned?;
    if let Some(reader) = reader {
        child.stderr = Some(ChildStderr::from(reader));
    }
    if let Some(slice) = slice {
        slice.give_back(child.id());
    }
    Ok(child)
}

/// Follows an admitted attempt to its end: tells the governor its process, reads its stderr;
/// returns its status, the kernel's account of it alone, and everything it wrote to stderr.
fn finish_attempt(
    mut child: Child,
    stream: &UnixStream,
    fallback_markers: &[String],
) -> std::io::Result<(ExitStatus, Usage, Vec<u8>)> {
    let pid = if governor_sees_my_pids(stream) {
        child.id() as i32
    } else {
        0
    };
    let _ = write_frame(stream, &Request::Started { pid });
    let attempt = child.id();
    let stderr = child
        .stderr
        .take()
        .map(|pipe| collect_stderr(pipe, attempt, Some(stream), fallback_markers))
        .unwrap_or_default();
    let ended = headroom_process::wait_with_usage(child);
    foreground::ended();
    let (status, usage) = ended?;
    Ok((status, usage, stderr))
}

/// Whether the governor sees this process's pids as this process does. Not where the shim
/// runs in a PID namespace of its own (Bazel's `linux-sandbox` runs every action in one):
/// the kernel then gives the governor's pid as 0 here, and a pid from here would name
/// another process to the governor, which it would sample and stop. The shim then sends
/// pid 0, which the governor neither samples nor signals: the job stays governed for
/// admission, and its peak comes from the shim's own count when it ends.
/// (libc's getsockopt: rustix's `UCred` holds a pid that cannot be 0.)
fn governor_sees_my_pids(stream: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut peer = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes of a `ucred` into `peer`.
    let read = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut peer as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // Unknown (not a Unix socket, or an old kernel): as before, the pid as it is.
    read != 0 || peer.pid != 0
}

fn tail(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(STDERR_TAIL)..]).into_owned()
}
