//! The shim starts a job's first attempt before the governor answers, so the answer's round
//! trip is off the compile's critical path (BENCHMARKS.md, "Cost of interception"). Each test
//! plays the governor on a socket of its own, with the real shim binary and a stand-in
//! compiler that records its process id and waits for the test's word to end: a queued job's
//! early compiler is asked to end (so it can clean up), what it started is ended with it, and
//! it is started again on admission, the
//! admitted compiler's pid and status reach the governor, an attempt sent elsewhere is ended
//! and reaped before that one starts (in a farm session none starts before the answer), a
//! compiler here gets the session's temporary directory while a farm's client keeps the
//! user's, and a governor that goes away leaves the compiler running to its end.

use crate::support::reliability::{process_state, wait_until};

use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use headroom_farm::RemoteLaunch;
use headroom_govern::protocol::{read_frame, write_frame, Reply, Request};

/// The shim headroom carries, written out once for this test binary, as a build writes it.
fn shim() -> &'static Path {
    static SHIM: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    let (_, path) = SHIM.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = headroom_govern::shim_binary::install(dir.path()).unwrap();
        (dir, path)
    });
    path
}

/// A stand-in compiler: appends its pid to `pids` and its `TMPDIR` to `tmpdirs`, waits for the
/// file `go`, exits 3. Asked to end (SIGTERM), it appends its pid to `cleaned`, as gcc removes
/// its temporary files then.
/// Where the file `leave-a-child` exists, it first starts a child that ignores SIGTERM and
/// appends its pid to `children`. Both give up once the directory is gone, which a failed test
/// leaves that way.
const COMPILER: &str = r#"#!/bin/sh
dir=$(dirname "$0")
trap 'echo $$ >> "$dir/cleaned"; exit 143' TERM
if [ -e "$dir/leave-a-child" ]; then
  sh -c 'trap "" TERM; echo $$ >> "$1/children"; while [ -d "$1" ]; do sleep 0.01; done' sh "$dir" &
fi
echo $$ >> "$dir/pids"
echo "$TMPDIR" >> "$dir/tmpdirs"
while [ ! -e "$dir/go" ]; do [ -d "$dir" ] || exit 1; sleep 0.01; done
exit 3
"#;

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Whether the shim's session may send compiles to a build farm (`HEADROOM_SESSION_FARM`).
#[derive(Clone, Copy)]
enum Session {
    Local,
    Farm,
}

/// Starts the shim as `headroom-launch DIR/cc -c unit.c` against the governor socket in
/// `dir`, in a local session; returns it and the connection it opened, after reading its job
/// request.
fn shim_asking(dir: &Path) -> (Child, UnixStream) {
    shim_asking_in(dir, Session::Local)
}

/// The temporary directory of the session the shim in `dir` belongs to
/// (`HEADROOM_JOB_TMPDIR`), under the user's, `dir/tmp`.
fn session_temp(dir: &Path) -> std::path::PathBuf {
    dir.join("tmp/headroom-tmp1-session")
}

fn shim_asking_in(dir: &Path, session: Session) -> (Child, UnixStream) {
    executable(&dir.join("cc"), COMPILER);
    std::fs::create_dir_all(session_temp(dir)).unwrap();
    let listener = UnixListener::bind(dir.join("governor.sock")).unwrap();
    let shim = Command::new(shim())
        .arg0("headroom-launch")
        .arg(dir.join("cc"))
        .args(["-c", "unit.c"])
        .current_dir(dir)
        .env("HEADROOM_SOCKET", dir.join("governor.sock"))
        .env("HEADROOM_SESSION", "1")
        .env("TMPDIR", dir.join("tmp"))
        .env("HEADROOM_JOB_TMPDIR", session_temp(dir))
        .env(
            "HEADROOM_SESSION_FARM",
            match session {
                Session::Local => "0",
                Session::Farm => "1",
            },
        )
        // Never taken for hung here: only the test's answers move the shim on.
        .env("HEADROOM_GOVERNOR_SILENCE_MS", "600000")
        .env_remove("HEADROOM_JOB")
        .env_remove("LD_PRELOAD")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (stream, _) = listener.accept().unwrap();
    match read_frame::<Request>(&stream).unwrap() {
        Request::Job { args, .. } => assert_eq!(args, ["-c", "unit.c"]),
        other => panic!("expected the job, got {other:?}"),
    }
    (shim, stream)
}

/// The pids the stand-in compiler recorded, one per start.
fn compiler_pids(dir: &Path) -> Vec<i32> {
    pids_in(dir, "pids")
}

/// The pids recorded in `dir/name`, one per line.
fn pids_in(dir: &Path, name: &str) -> Vec<i32> {
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect()
}

/// Waits until the compiler has started, before any answer, and returns its pid.
fn started_before_the_answer(dir: &Path) -> i32 {
    wait_until("the compiler to start before the governor answered", || {
        !compiler_pids(dir).is_empty()
    });
    compiler_pids(dir)[0]
}

fn run(remote: Option<RemoteLaunch>) -> Reply {
    Reply::Run {
        job_id: 1,
        rung: None,
        nice: 0,
        cpu_group: None,
        remote,
    }
}

fn wait_for(mut shim: Child) -> std::process::ExitStatus {
    let mut status = None;
    wait_until("the shim to exit", || {
        status = shim.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

/// Starts the shim, tells it its job is queued and waits until its early compiler has ended;
/// returns the shim, its connection and the early compiler's pid.
fn queued(dir: &Path) -> (Child, UnixStream, i32) {
    let (shim, stream) = shim_asking(dir);
    let early = started_before_the_answer(dir);
    write_frame(&stream, &Reply::Queued).unwrap();
    wait_until("the queued compiler to end", || {
        process_state(early).is_none()
    });
    (shim, stream, early)
}

#[test]
fn a_queued_compiler_is_ended_and_started_again_when_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let (shim, stream, early) = queued(dir.path());
    assert_eq!(
        pids_in(dir.path(), "cleaned"),
        [early],
        "asked to end, so that it could clean up, not killed outright"
    );
    write_frame(&stream, &run(None)).unwrap();
    let admitted = match read_frame::<Request>(&stream).unwrap() {
        Request::Started { pid } => pid,
        other => panic!("expected Started, got {other:?}"),
    };
    wait_until("the compiler to start again", || {
        compiler_pids(dir.path()).len() == 2
    });
    assert_eq!(
        compiler_pids(dir.path()),
        [early, admitted],
        "by the pid the governor heard"
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    match read_frame::<Request>(&stream).unwrap() {
        Request::Finished(attempt) => {
            assert_eq!(attempt.exit_code, Some(3));
            assert!(attempt.max_rss > 0, "its peak is measured: {attempt:?}");
        }
        other => panic!("expected Finished, got {other:?}"),
    }
    write_frame(&stream, &Reply::Done).unwrap();
    assert_eq!(wait_for(shim).code(), Some(3));
}

#[test]
fn what_a_queued_compiler_started_is_ended_with_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("leave-a-child"), "").unwrap();
    let (shim, stream, _) = queued(dir.path());
    let child = pids_in(dir.path(), "children");
    assert_eq!(child.len(), 1, "the early compiler started its child");
    // It ignores SIGTERM and outlived the compiler: the shim, its subreaper, kills and reaps it.
    wait_until("the early compiler's child to be gone", || {
        process_state(child[0]).is_none()
    });
    std::fs::remove_file(dir.path().join("leave-a-child")).unwrap();
    write_frame(&stream, &run(None)).unwrap();
    assert!(matches!(
        read_frame::<Request>(&stream).unwrap(),
        Request::Started { .. }
    ));
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert!(matches!(
        read_frame::<Request>(&stream).unwrap(),
        Request::Finished(_)
    ));
    write_frame(&stream, &Reply::Done).unwrap();
    assert_eq!(wait_for(shim).code(), Some(3));
}

/// Answers the shim's job in `dir` by sending it to a farm node whose engine client records
/// whether a compiler had started here (and its own `TMPDIR`, in `client-tmpdir`), and waits
/// for the shim to end; returns what the client saw: `early-gone` or `early-still-there` for
/// a compiler that started before the answer, `none-here` where none did.
fn sent_to_a_farm_node(dir: &Path, shim: Child, stream: &UnixStream) -> String {
    let client = dir.join("client");
    executable(
        &client,
        r#"#!/bin/sh
dir=$(dirname "$0")
early=$(head -n 1 "$dir/pids" 2>/dev/null)
if [ -z "$early" ]; then echo none-here
elif [ -e "/proc/$early" ]; then echo early-still-there
else echo early-gone; fi > "$dir/client.log"
echo "$TMPDIR" > "$dir/client-tmpdir"
"#,
    );
    let remote = RemoteLaunch {
        program: client,
        args_before: Vec::new(),
        env: Vec::new(),
        fallback_markers: Vec::new(),
    };
    write_frame(stream, &run(Some(remote))).unwrap();
    assert!(matches!(
        read_frame::<Request>(stream).unwrap(),
        Request::Started { .. }
    ));
    match read_frame::<Request>(stream).unwrap() {
        Request::Finished(attempt) => assert_eq!(attempt.exit_code, Some(0)),
        other => panic!("expected Finished, got {other:?}"),
    }
    assert!(wait_for(shim).success());
    let log = std::fs::read_to_string(dir.join("client.log")).unwrap();
    log.trim().to_string()
}

/// A job in `dir` whose compiler starts here before the answer, which then sends it to a farm
/// node: what the node's client saw (see [`sent_to_a_farm_node`]).
fn farmed_after_an_early_start(dir: &Path) -> String {
    let (shim, stream) = shim_asking(dir);
    started_before_the_answer(dir);
    sent_to_a_farm_node(dir, shim, &stream)
}

#[test]
fn an_attempt_sent_to_a_farm_node_starts_only_once_the_early_one_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(farmed_after_an_early_start(dir.path()), "early-gone");
    assert_eq!(
        compiler_pids(dir.path()).len(),
        1,
        "no compiler ran here again"
    );
}

#[test]
fn an_attempt_here_gets_the_sessions_temporary_directory_and_a_farm_client_the_users() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(farmed_after_an_early_start(dir.path()), "early-gone");
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert_eq!(
        read("tmpdirs").trim(),
        session_temp(dir.path()).to_str().unwrap(),
        "the compiler here runs in the session's temporary directory"
    );
    // The engine's client may start its server, which outlives the session's directory.
    assert_eq!(
        read("client-tmpdir").trim(),
        dir.path().join("tmp").to_str().unwrap(),
        "the farm's client keeps the user's"
    );
}

#[test]
fn in_a_farm_session_no_compiler_starts_here_before_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (shim, stream) = shim_asking_in(dir.path(), Session::Farm);
    // Long enough for a compiler started at once to have written its pid.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        compiler_pids(dir.path()).is_empty(),
        "nothing started before the answer"
    );
    assert_eq!(sent_to_a_farm_node(dir.path(), shim, &stream), "none-here");
    assert!(compiler_pids(dir.path()).is_empty(), "nor after it");
}

#[test]
fn a_governor_gone_while_the_job_is_queued_leaves_the_job_to_run_ungoverned() {
    let dir = tempfile::tempdir().unwrap();
    let (shim, stream, early) = queued(dir.path());
    drop(stream);
    wait_until(
        "the compiler to start again once the governor is gone",
        || compiler_pids(dir.path()).len() == 2,
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(wait_for(shim).code(), Some(3), "the compiler's own status");
    assert_eq!(compiler_pids(dir.path())[0], early);
}

#[test]
fn a_governor_gone_before_it_answers_leaves_the_early_compiler_to_finish() {
    let dir = tempfile::tempdir().unwrap();
    let (shim, stream) = shim_asking(dir.path());
    let early = started_before_the_answer(dir.path());
    drop(stream);
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(wait_for(shim).code(), Some(3), "the compiler's own status");
    assert_eq!(compiler_pids(dir.path()), [early], "the compiler ran once");
}
