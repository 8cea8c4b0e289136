//! One machine, one budget: every headroom session of a user, memory domain and history joins
//! one governor. Two builds at once under one memory cgroup share its budget and slots
//! instead of each taking the whole room; sessions that start at the same moment never start
//! two governors; a governor that dies fails open, and the next session starts a new one; a
//! governor of another version is not joined.
//! Real processes, the stand-in compiler, a real memory cgroup where one can be made.

use crate::support::{self, reliability};

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use headroom_govern::protocol::{read_frame, write_frame, GovernorStatus, PROTOCOL};
use headroom_store::BuildReport;
use reliability::{output_within_patience, wait_until};
use support::limited_cgroup;

/// Two projects of `jobs` stand-in compiles with `recipe` each, and the home they share:
/// one state directory (so one history), one runtime directory, one temporary directory.
struct Shared {
    home: tempfile::TempDir,
}

impl Shared {
    fn new(jobs: usize, recipe: &str) -> Shared {
        let home = tempfile::tempdir().unwrap();
        for project in ["a", "b"] {
            reliability::project(&home.path().join(project), jobs, recipe);
        }
        for sub in ["state", "run", "tmp"] {
            std::fs::create_dir_all(home.path().join(sub)).unwrap();
        }
        Shared { home }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.home.path().join(name)
    }

    /// `headroom ARGS` in project `project`, with the shared state, runtime and temporary
    /// directories.
    fn headroom(&self, project: &str, args: &[&str]) -> Command {
        let mut command = reliability::headroom(&self.path(project), args);
        command
            .env("HEADROOM_STATE_DIR", self.path("state"))
            .env("XDG_RUNTIME_DIR", self.path("run"))
            .env("TMPDIR", self.path("tmp"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    /// What `headroom status --json` says now.
    fn status(&self) -> Vec<GovernorStatus> {
        let output = self
            .headroom("a", &["status", "--json"])
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", support::text(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn report(&self, project: &str) -> BuildReport {
        let json = std::fs::read(self.path(project).join("report.json")).unwrap();
        serde_json::from_slice(&json).unwrap()
    }
}

fn finished(child: Child) -> Output {
    output_within_patience(child)
}

/// The most jobs of `reports` (builds that ran at the same time) that ran at once, on the
/// wall clock: each report counts time from its own start.
fn most_at_once(reports: &[&BuildReport]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for report in reports {
        let start = report.build.started_unix_ms;
        for job in &report.jobs {
            edges.push((start + job.start_ms as i64, 1));
            edges.push((start + job.end_ms as i64, -1));
        }
    }
    // Ends before starts at the same moment.
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// Waits until one governor lists `sessions` sessions, and returns what it said.
fn wait_for_sessions(shared: &Shared, sessions: usize) -> GovernorStatus {
    let mut seen = None;
    wait_until(&format!("one governor with {sessions} sessions"), || {
        let governors = shared.status();
        assert!(
            governors.len() <= 1,
            "more than one governor: {governors:?}"
        );
        seen = governors
            .into_iter()
            .find(|governor| governor.sessions.len() == sessions);
        seen.is_some()
    });
    seen.unwrap()
}

#[test]
fn two_builds_under_one_cap_share_its_budget_and_nothing_is_killed() {
    let _alone = support::WHOLE_MACHINE.hold();
    // Each build alone fits two of its 250 MiB jobs in 600 MiB; a governor each would run
    // four at once (1000 MiB) and the kernel or headroom would kill some.
    let Some(cap) = limited_cgroup("two-builds", 600 << 20) else {
        return;
    };
    let shared = Shared::new(4, "--mem 250 --ms 1500");
    let build = ["build", "--report", "report.json", "--", "make", "-k"];
    let children: Vec<Child> = ["a", "b"]
        .iter()
        .map(|project| {
            let mut command = shared.headroom(project, &build);
            cap.attach(&mut command);
            command.spawn().unwrap()
        })
        .collect();
    let governor = wait_for_sessions(&shared, 2);
    assert!(governor.budget < 600 << 20, "{governor:?}");
    // `-v` says, for a session whose jobs wait, that other sessions hold what they need.
    wait_until("a session waiting for the other", || {
        let output = shared
            .headroom("a", &["-v", "status"])
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        let said = support::text(&output.stdout);
        said.contains("waiting for other sessions") && said.contains("running ")
    });
    for output in children.into_iter().map(finished) {
        assert!(output.status.success(), "{}", support::text(&output.stderr));
    }
    assert_eq!(cap.oom_kills(), 0, "the kernel killed nothing");
    let (a, b) = (shared.report("a"), shared.report("b"));
    for report in [&a, &b] {
        assert_eq!(report.jobs.len(), 4, "every compile was a governed job");
        for job in &report.jobs {
            assert_eq!((job.requeues, job.oom_retries), (0, 0), "{job:?}");
            assert_eq!(job.exit_code, Some(0), "{job:?}");
        }
    }
    assert!(most_at_once(&[&a, &b]) <= 2, "{:?} {:?}", a.jobs, b.jobs);
    cap.remove().unwrap();
}

#[test]
fn sessions_that_start_together_share_one_governor() {
    let _alone = support::WHOLE_MACHINE.hold();
    for round in 0..3 {
        let shared = Shared::new(2, "--mem 4 --ms 1500");
        let build = ["build", "--report", "report.json", "--", "make"];
        let children: Vec<Child> = ["a", "b"]
            .iter()
            .map(|project| shared.headroom(project, &build).spawn().unwrap())
            .collect();
        wait_for_sessions(&shared, 2);
        for output in children.into_iter().map(finished) {
            assert!(
                output.status.success(),
                "round {round}: {}",
                support::text(&output.stderr)
            );
        }
        for project in ["a", "b"] {
            let report = shared.report(project);
            assert_eq!(
                report.jobs.len(),
                2,
                "round {round}: {project}'s jobs were governed"
            );
        }
        wait_until("the governor to leave with its last session", || {
            shared.status().is_empty()
        });
    }
}

#[test]
fn a_killed_governor_is_replaced_by_the_next_session_and_no_build_fails() {
    let _alone = support::WHOLE_MACHINE.hold();
    let shared = Shared::new(3, "--mem 4 --ms 2500");
    let first = shared
        .headroom("a", &["build", "--jobs", "1", "--", "make"])
        .spawn()
        .unwrap();
    let killed = wait_for_sessions(&shared, 1).pid;
    // SAFETY: kill(2) on the governor this test's build started.
    unsafe { libc::kill(killed as i32, libc::SIGKILL) };

    let second = shared
        .headroom("b", &["build", "--report", "report.json", "--", "make"])
        .spawn()
        .unwrap();
    let replacement = wait_for_sessions(&shared, 1).pid;
    assert_ne!(replacement, killed);
    let second = finished(second);
    assert!(second.status.success(), "{}", support::text(&second.stderr));
    assert_eq!(shared.report("b").jobs.len(), 3, "the new governor governs");
    let first = finished(first);
    assert!(first.status.success(), "{}", support::text(&first.stderr));
    for object in ["o0.o", "o1.o", "o2.o"] {
        for project in ["a", "b"] {
            assert!(
                shared.path(project).join(object).exists(),
                "{project}/{object}"
            );
        }
    }
}

#[test]
fn a_build_and_a_run_at_once_under_one_cap_share_its_budget() {
    let _alone = support::WHOLE_MACHINE.hold();
    let Some(cap) = limited_cgroup("build-and-run", 600 << 20) else {
        return;
    };
    let shared = Shared::new(4, "--mem 250 --ms 1500");
    let mut build = shared.headroom("a", &["build", "--report", "report.json", "--", "make"]);
    let mut run = shared.headroom(
        "b",
        &["run", "--json", "run.json", "--", "make", "-j4", "-k"],
    );
    cap.attach(&mut build);
    cap.attach(&mut run);
    let (build, run) = (build.spawn().unwrap(), run.spawn().unwrap());
    wait_for_sessions(&shared, 2);
    for output in [build, run].into_iter().map(finished) {
        assert!(output.status.success(), "{}", support::text(&output.stderr));
    }
    assert_eq!(cap.oom_kills(), 0, "the kernel killed nothing");
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared.path("b").join("run.json")).unwrap()).unwrap();
    let jobs = run["rungs"][0]["jobs"].as_array().unwrap();
    assert_eq!(
        jobs.len(),
        4,
        "the run's compiles were governed jobs: {run}"
    );
    assert_eq!(shared.report("a").jobs.len(), 4);
    cap.remove().unwrap();
}

/// `headroom status` without a running session says so, for people and for scripts.
#[test]
fn status_without_sessions_says_none_runs() {
    let _alone = support::WHOLE_MACHINE.hold();
    let shared = Shared::new(1, "--mem 4 --ms 10");
    assert!(shared.status().is_empty());
    let output = shared
        .headroom("a", &["status"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(
        support::text(&output.stdout),
        "no headroom session is running\n"
    );
}

#[test]
fn a_governor_of_another_version_is_not_joined_and_the_build_says_so() {
    let shared = Shared::new(2, "--mem 4 --ms 1500");
    // Where the shared governor listens, seen while a first build runs.
    let first = shared
        .headroom("a", &["build", "--", "make"])
        .spawn()
        .unwrap();
    let mut socket = None;
    wait_until("the shared governor's socket", || {
        socket = std::fs::read_dir(shared.path("run/headroom"))
            .into_iter()
            .chain(std::fs::read_dir(shared.path("state/run")))
            .flatten()
            .map(|entry| entry.unwrap().path())
            .find(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("governor-") && name.ends_with(".sock")
            });
        socket.is_some()
    });
    // The governor refuses a CLI of a version before the protocol had a number: it closes.
    let older_cli = std::os::unix::net::UnixStream::connect(socket.as_ref().unwrap()).unwrap();
    let config = support::governor_config();
    let join = serde_json::json!({"Join": {"config": config, "root": std::process::id()}});
    write_frame(&older_cli, &join).unwrap();
    let answer = read_frame::<serde_json::Value>(&older_cli);
    assert_eq!(
        answer.as_ref().map_err(std::io::Error::kind).err(),
        Some(std::io::ErrorKind::UnexpectedEof),
        "{answer:?}"
    );
    let first = finished(first);
    assert!(first.status.success(), "{}", support::text(&first.stderr));
    // An older headroom's governor there: it answers a join as versions before the protocol
    // had a number did.
    let socket = socket.unwrap();
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let old_governor = std::thread::spawn(move || {
        let mut join = None;
        wait_until("the new build to ask the old governor", || {
            let Ok((stream, _)) = listener.accept() else {
                return false;
            };
            stream.set_nonblocking(false).unwrap();
            join = Some(read_frame::<serde_json::Value>(&stream).unwrap());
            let joined = serde_json::json!({
                "Joined": {"session": 1, "governor": 1, "warnings": []}
            });
            write_frame(&stream, &joined).unwrap();
            true
        });
        join.unwrap()
    });
    let args = ["build", "--report", "report.json", "--", "make"];
    let output = finished(shared.headroom("b", &args).spawn().unwrap());
    let said = support::text(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains("another version of headroom") && said.contains("a governor of its own"),
        "{said}"
    );
    let join = old_governor.join().unwrap();
    assert_eq!(join["Join"]["protocol"], PROTOCOL, "{join}");
    assert_eq!(
        shared.report("b").jobs.len(),
        2,
        "its compiles were governed, by its own governor"
    );
}
