//! Supervising a child process, in one place for every command that runs one: the shim's
//! compiler attempts, `headroom run`'s CMD and `headroom build`'s build command.
//!
//! - [`spawn`]: a child in a process group ([`Group::Own`]) or a session ([`Group::Session`])
//!   of its own, so it can be stopped, resumed and killed whole, and a terminal's signals reach
//!   it only through its supervisor;
//! - [`Interrupts`]: the signals a supervisor catches instead of dying of them, read by its own
//!   loop; [`foreground`]: the shim's handlers, which pass every signal on to the one child in
//!   its foreground at once;
//! - [`signal_group`], [`signal_process`], [`signal_each`], [`signal_tree`]: passing a signal
//!   on; [`ask_group_to_end`] and [`TERM_GRACE`]: ending a compiler so it cleans up after
//!   itself;
//! - [`wait_within`]: the child's end, waited for a bounded time; [`output_of`]: its status and
//!   output, as `Command::output` gives them, without waiting for a process it left holding
//!   its pipes;
//! - [`wait_with_usage`]: the child's end and the kernel's account of it alone (`wait4`), so a
//!   retried attempt does not inherit an earlier attempt's peak; [`reap_all`] and
//!   [`reap_orphans`]: reaping what a subreaper inherits, [`end_what_is_left_of_group`]: ending
//!   it;
//! - [`shell_code`]: the exit code a shell reports for how a child ended (`128 + signal`), and
//!   [`not_started_code`] with [`how_to_run`]: the code and the advice for one that could not
//!   start;
//! - [`slice`]: a short scheduler slice for processes that a compile waits on;
//! - [`terminal`]: a pseudo-terminal for a child whose output is read, where the supervisor's
//!   own stream is a terminal; [`OUTPUT_AFTER_EXIT`]: how long that output is read once the
//!   child has exited.

pub mod foreground;
mod output;
pub mod slice;
pub mod terminal;

pub use output::output_of;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a supervisor that reads a child's output waits for more once the child has
/// exited: what it wrote before its exit is read by then, and a background process it left
/// holding the stream (a daemon, a compile server) is not waited for.
pub const OUTPUT_AFTER_EXIT: Duration = Duration::from_millis(500);

/// A child could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot run `{program}`: {source}")]
pub struct SpawnError {
    pub program: String,
    #[source]
    pub source: std::io::Error,
}

impl SpawnError {
    /// The exit code a shell reports for this program (see [`not_started_code`]).
    pub fn shell_code(&self) -> Option<u8> {
        not_started_code(&self.source)
    }
}

/// How to run `program`, which exists but could not be run (exit code 126).
pub fn how_to_run(program: &std::ffi::OsStr) -> String {
    let shown = program.to_string_lossy();
    if std::path::Path::new(program).is_dir() {
        format!("`{shown}` is a directory")
    } else {
        format!(
            "make it executable (chmod +x {shown}), or run it through its interpreter (sh {shown})"
        )
    }
}

/// The exit code a shell reports for a command that could not start with `err`: 127 when the
/// program does not exist ("command not found"), 126 when it exists but cannot be run (not
/// executable, a directory). `None` for any other error, which is the supervisor's own.
pub fn not_started_code(err: &std::io::Error) -> Option<u8> {
    match err.kind() {
        std::io::ErrorKind::NotFound => Some(127),
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::IsADirectory => Some(126),
        _ => None,
    }
}

/// A signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the handler that passes signal {signal} on to the child: {source}")]
pub struct InstallError {
    pub signal: i32,
    #[source]
    pub source: std::io::Error,
}

/// What a child is the leader of, apart from its supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// A process group of its own (`setpgid`): the governor stops, resumes and kills an
    /// attempt whole by it.
    Own,
    /// A session of its own (`setsid`): an identity for the whole tree that survives double
    /// forks, and no controlling terminal, so the terminal's Ctrl-C reaches the supervisor
    /// only.
    Session,
}

/// Starts `command` as the leader of a group or session of its own.
pub fn spawn(command: &mut Command, group: Group) -> Result<Child, SpawnError> {
    match group {
        Group::Own => {
            command.process_group(0);
        }
        // SAFETY: setsid is async-signal-safe, and the closure touches no memory.
        Group::Session => unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        },
    }
    command.spawn().map_err(|source| SpawnError {
        program: command.get_program().to_string_lossy().into_owned(),
        source,
    })
}

/// The exit code a shell reports for a process that ended with `status`: its own code, or
/// 128 + the signal that killed it.
pub fn shell_code(status: ExitStatus) -> i32 {
    shell_code_of(status.code(), status.signal()).unwrap_or(128)
}

/// [`shell_code`] from an exit code and a killing signal, as reports keep them; `None` for
/// neither.
pub fn shell_code_of(code: Option<i32>, signal: Option<i32>) -> Option<i32> {
    match (code, signal) {
        (_, Some(signal)) => Some(128 + signal),
        (code, None) => code,
    }
}

/// Signals a supervisor catches instead of dying of them, to pass them on from its own loop.
pub struct Interrupts {
    /// The last signal caught and not yet taken, 0 for none.
    pending: Arc<AtomicUsize>,
}

impl Interrupts {
    /// Catches `signals` from now on, but for those the process was started ignoring: a
    /// build run under `nohup` ignores SIGHUP, and so do its commands.
    pub fn install(signals: &[i32]) -> Result<Interrupts, InstallError> {
        let pending = Arc::new(AtomicUsize::new(0));
        for &signal in signals.iter().filter(|&&signal| !is_ignored(signal)) {
            signal_hook::flag::register_usize(signal, Arc::clone(&pending), signal as usize)
                .map_err(|source| InstallError { signal, source })?;
        }
        Ok(Interrupts { pending })
    }

    /// The last signal caught since the last `take`, if any.
    pub fn take(&self) -> Option<i32> {
        match self.pending.swap(0, Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as i32),
        }
    }

    /// The last signal caught, if any, for supervisors that never `take`.
    pub fn last(&self) -> Option<i32> {
        match self.pending.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as i32),
        }
    }
}

/// Whether this process ignores `signal` (`SIG_IGN`, which a program inherits across exec:
/// `nohup` starts its command so with SIGHUP). A supervisor leaves such a signal ignored, as
/// what it runs would have it without headroom, instead of catching and passing it on.
pub fn is_ignored(signal: i32) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one into `current`.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

/// How long a child asked to end ([`ask_group_to_end`]) has before SIGKILL: time for a
/// compiler driver (gcc, nvcc) to remove its temporary files, while the memory hog itself
/// (cc1plus, cicc), which does not catch SIGTERM, ends at once.
pub const TERM_GRACE: Duration = Duration::from_millis(500);

/// Asks process group `group` to end: SIGTERM, then SIGCONT in case it is stopped, so that the
/// pending SIGTERM is the first thing it handles once it runs. SIGKILL is the caller's, after
/// [`TERM_GRACE`].
pub fn ask_group_to_end(group: i32) {
    signal_group(group, libc::SIGTERM);
    signal_group(group, libc::SIGCONT);
}

/// Waits at most `patience` for `child` to exit, looking less often as time goes on (from
/// 200 µs up to 20 ms apart): its status, reaped, or `None` while it still runs.
pub fn wait_within(child: &mut Child, patience: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + patience;
    let mut pause = Duration::from_micros(200);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Sends `signal` to process group `group` (a child started with [`spawn`] leads its own).
pub fn signal_group(group: i32, signal: i32) {
    if group > 0 {
        // SAFETY: kill(2) on the group of a child this process started.
        unsafe { libc::kill(-group, signal) };
    }
}

/// Sends `signal` to the one process `pid`. A process that has just exited, or a pid that
/// names no one process (0 or below, which kill(2) would take for a whole group), is left
/// alone.
pub fn signal_process(pid: i32, signal: i32) {
    if pid > 0 {
        // SAFETY: kill(2) on one process the caller supervises.
        unsafe { libc::kill(pid, signal) };
    }
}

/// Sends `signal` to each process of `pids`.
pub fn signal_each(pids: impl IntoIterator<Item = i32>, signal: i32) {
    for pid in pids {
        signal_process(pid, signal);
    }
}

/// Sends `signal` to `root` and every process below it, as a terminal's Ctrl-C reaches every
/// process of a job: `make` alone would wait for its running children.
pub fn signal_tree(root: i32, signal: i32) {
    let pids: Vec<i32> = match headroom_probe::procs::snapshot() {
        Ok(all) => headroom_probe::procs::tree(&all, root)
            .iter()
            .map(|p| p.pid)
            .collect(),
        Err(_) => vec![root],
    };
    signal_each(pids, signal);
}

/// What the kernel counted for one child and the descendants it waited for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The largest resident set of any one of its processes, in bytes.
    pub max_rss: u64,
    /// User and system CPU time, in milliseconds.
    pub cpu_ms: u64,
}

/// Waits for `child` to end (through interruptions by signals) and returns how it ended with
/// the kernel's account of it alone (`wait4`): a supervisor's earlier children do not count.
pub fn wait_with_usage(child: Child) -> std::io::Result<(ExitStatus, Usage)> {
    let pid = child.id() as libc::pid_t;
    loop {
        let mut status = 0;
        // SAFETY: wait4 writes only into the status and the zeroed rusage we pass.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if waited == pid {
            let millis = |tv: libc::timeval| tv.tv_sec as u64 * 1000 + tv.tv_usec as u64 / 1000;
            let usage = Usage {
                // Linux reports ru_maxrss in KiB.
                max_rss: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
                cpu_ms: millis(usage.ru_utime) + millis(usage.ru_stime),
            };
            return Ok((ExitStatus::from_raw(status), usage));
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Makes this process the reaper of orphaned descendants, so double-forked daemons stay in the
/// tree it follows (their parent becomes it, not init).
pub fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// Kills and reaps what is left of process group `group` once its leader has been reaped: the
/// processes the leader started in it that outlived it, which this process, their subreaper
/// ([`become_subreaper`]), inherited. The group is signalled only while a live child of this
/// process is in it, so its number cannot have been given to another group.
pub fn end_what_is_left_of_group(group: i32) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        match unsafe { libc::waitpid(-group, &mut status, libc::WNOHANG) } {
            // No child of this process is in the group any more.
            -1 => return,
            0 => {
                signal_group(group, libc::SIGKILL);
                // SAFETY: as above; blocks until one of the killed children is gone.
                unsafe { libc::waitpid(-group, &mut status, 0) };
            }
            _ => {}
        }
    }
}

/// Reaps every finished child of this process, orphans reparented to it included, and returns
/// how `child` ended once it has: for a supervisor that owns no other child.
pub fn reap_all(child: i32) -> Option<ExitStatus> {
    let mut ended = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return ended;
        }
        if pid == child {
            ended = Some(ExitStatus::from_raw(status));
        }
    }
}

/// Reaps the finished children of this process other than `own` (which their owners wait
/// for): orphans of a tree reparented to a subreaper (a compiler killed with its job after its
/// driver) would otherwise stay zombies to the end.
pub fn reap_orphans(own: &[u32]) {
    let Some(children) = headroom_probe::procs::children_of(std::process::id() as i32) else {
        return;
    };
    for child in children
        .into_iter()
        .filter(|&pid| !own.contains(&(pid as u32)))
    {
        // SAFETY: waitpid on one of our own children, without blocking.
        unsafe { libc::waitpid(child, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    const MIB: u64 = 1 << 20;

    #[test]
    fn waiting_within_a_bound_gives_the_end_or_none_while_the_child_runs() {
        let mut quick = Command::new("true").spawn().unwrap();
        let ended = wait_within(&mut quick, Duration::from_secs(10)).unwrap();
        assert!(ended.is_some_and(|status| status.success()));
        let mut slow = Command::new("sleep").arg("10").spawn().unwrap();
        let start = Instant::now();
        assert!(wait_within(&mut slow, Duration::from_millis(50))
            .unwrap()
            .is_none());
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "it gave up in time"
        );
        slow.kill().unwrap();
        slow.wait().unwrap();
    }

    /// Fields 3 and on of `/proc/PID/stat`, from the process's state.
    fn stat_after_name(pid: u32) -> String {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // The command name, field 2, is in parentheses and may hold spaces.
        stat[stat.rfind(')').unwrap() + 2..].to_string()
    }

    /// Field `index` (1-based, as proc(5) counts) of `/proc/PID/stat`.
    fn stat_field(pid: u32, index: usize) -> i32 {
        stat_after_name(pid)
            .split(' ')
            .nth(index - 3)
            .unwrap()
            .parse()
            .unwrap()
    }

    /// `cat`, waiting on a stdin pipe: alive until the pipe closes.
    fn waiting_cat(group: Group) -> Child {
        let mut command = Command::new("cat");
        command.stdin(Stdio::piped()).stdout(Stdio::null());
        spawn(&mut command, group).unwrap()
    }

    #[test]
    fn a_child_leads_its_own_group_or_session() {
        for (group, field) in [(Group::Own, 5), (Group::Session, 6)] {
            let mut child = waiting_cat(group);
            let pid = child.id();
            assert_eq!(stat_field(pid, field), pid as i32, "{group:?}");
            assert_ne!(
                stat_field(pid, field),
                stat_field(std::process::id(), field)
            );
            drop(child.stdin.take());
            assert!(child.wait().unwrap().success());
        }
    }

    #[test]
    fn a_program_that_does_not_exist_is_named_and_not_found() {
        let err = spawn(&mut Command::new("headroom-no-such-program"), Group::Own).unwrap_err();
        assert_eq!(err.shell_code(), Some(127));
        assert!(
            err.to_string().contains("`headroom-no-such-program`"),
            "{err}"
        );
    }

    #[test]
    fn a_program_that_cannot_be_run_reads_as_126() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("not-executable.sh");
        std::fs::write(&script, "echo hi\n").unwrap();
        for program in [script.as_path(), dir.path()] {
            let err = spawn(&mut Command::new(program), Group::Own).unwrap_err();
            assert_eq!(err.shell_code(), Some(126), "{err}");
        }
    }

    #[test]
    fn a_signal_to_the_group_ends_the_child_and_reads_as_128_plus_signal() {
        let child = waiting_cat(Group::Own);
        signal_group(child.id() as i32, libc::SIGTERM);
        let (status, _) = wait_with_usage(child).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert_eq!(shell_code(status), 128 + libc::SIGTERM);
    }

    /// Waits, for at most a minute, until process `pid`'s state (`/proc/PID/stat` field 3) is
    /// `state`.
    fn wait_for_state(pid: u32, state: char) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let now = stat_after_name(pid).chars().next().unwrap();
            if now == state {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "process {pid} is `{now}`, not `{state}`"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_signal_to_one_process_stops_resumes_and_ends_it() {
        let child = waiting_cat(Group::Own);
        let pid = child.id();
        signal_process(pid as i32, libc::SIGSTOP);
        wait_for_state(pid, 'T');
        signal_process(pid as i32, libc::SIGCONT);
        wait_for_state(pid, 'S');
        signal_process(pid as i32, libc::SIGKILL);
        let (status, _) = wait_with_usage(child).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn shell_codes_are_the_code_or_128_plus_the_signal() {
        let exited = Command::new("sh").args(["-c", "exit 3"]).status().unwrap();
        assert_eq!(shell_code(exited), 3);
        assert_eq!(shell_code_of(Some(0), None), Some(0));
        assert_eq!(shell_code_of(None, Some(libc::SIGKILL)), Some(137));
        assert_eq!(shell_code_of(None, None), None);
    }

    /// Each attempt's peak is its own: the shim once sent `getrusage(RUSAGE_CHILDREN)`, which
    /// keeps the largest peak of every child so far, so a retry after a large attempt
    /// reported the large attempt's peak as its own.
    #[test]
    fn each_attempt_counts_its_own_peak() {
        // dd reads 256 MiB into one buffer of that size: a peak of at least that much.
        let large = Command::new("dd")
            .args(["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (status, large) = wait_with_usage(large).unwrap();
        assert!(status.success());
        assert!(large.max_rss >= 200 * MIB, "{large:?}");
        let small = Command::new("true").spawn().unwrap();
        let (status, small) = wait_with_usage(small).unwrap();
        assert!(status.success());
        assert!(small.max_rss < 64 * MIB, "{small:?} after {large:?}");
        assert!(
            headroom_probe::rusage::children_max_rss() >= large.max_rss,
            "the process-wide account still holds the first attempt's peak"
        );
    }

    #[test]
    fn caught_signals_are_taken_once_and_the_last_is_kept() {
        let interrupts = Interrupts::install(&[libc::SIGUSR1]).unwrap();
        assert_eq!(interrupts.take(), None);
        // SAFETY: raise(3) delivers the signal to this thread, which the handler catches.
        unsafe { libc::raise(libc::SIGUSR1) };
        assert_eq!(interrupts.last(), Some(libc::SIGUSR1));
        assert_eq!(interrupts.take(), Some(libc::SIGUSR1));
        assert_eq!(interrupts.take(), None);
    }

    #[test]
    fn a_signal_ignored_before_install_stays_ignored() {
        // SAFETY: signal(2) on a signal only this test uses, as nohup does with SIGHUP.
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        assert!(is_ignored(libc::SIGUSR2));
        assert!(!is_ignored(libc::SIGUSR1));
        let interrupts = Interrupts::install(&[libc::SIGUSR2]).unwrap();
        // SAFETY: raise(3): ignored, the signal neither ends the test nor is caught.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert_eq!(interrupts.take(), None);
        assert!(is_ignored(libc::SIGUSR2));
    }
}
