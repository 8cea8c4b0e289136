//! headroom is never why a build fails, stalls or builds the wrong thing: a hung or orphaned
//! governor, a terminal's signals, a kill to make room, a runtime or state directory that is
//! damaged or taken by another user, and goals that make must build in order. Each test is a
//! fault found by hostile testing, reproduced with the real binary, real make and real
//! processes (the stand-in compiler, or real g++ where its temporary files matter).

use crate::support::{self, fakecc, reliability};

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use headroom_govern::protocol::GovernorStatus;
use headroom_store::BuildReport;
use reliability::{below, compilers, output_within_patience, process_state, wait_until};
use support::{stderr, HEADROOM};

/// `headroom build ARGS…` in the scratch project `dir`, with everything of its own there.
fn build(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(HEADROOM);
    command.arg("build").args(args);
    reliability::isolate(&mut command, dir);
    command
}

fn alive(pid: i32) -> bool {
    process_state(pid).is_some_and(|state| state != 'Z')
}

fn objects(dir: &Path, count: usize) -> usize {
    (0..count)
        .filter(|i| dir.join(format!("o{i}.o")).exists())
        .count()
}

#[test]
fn a_hung_governor_costs_the_build_one_bounded_wait_and_is_counted() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 8, "--mem 4 --ms 400");
    let mut command = build(dir.path(), &["--jobs", "1", "--", "make", "-j4"]);
    // A group of its own, so that a build that never ends is killed whole, stopped governor
    // included.
    command
        .env("HEADROOM_GOVERNOR_SILENCE_MS", "2000")
        .process_group(0)
        .stderr(Stdio::piped());
    let cli = command.spawn().unwrap();
    wait_until("a compile", || !compilers(cli.id()).is_empty());
    let governor = below(cli.id(), "__governor")[0];
    // SAFETY: kill(2) on the governor this test's build started.
    unsafe { libc::kill(governor, libc::SIGSTOP) };
    let start = Instant::now();
    let output = output_within_patience(cli);
    let waited = start.elapsed();
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert_eq!(objects(dir.path(), 8), 8, "{said}");
    // Without a bound the build waited until the governor was resumed: never, here.
    assert!(waited < Duration::from_secs(40), "took {waited:?}: {said}");
    assert_eq!(
        said.matches("the governor has not answered").count(),
        1,
        "said once: {said}"
    );
    assert!(
        said.contains("compiler call(s) ran ungoverned because the governor"),
        "{said}"
    );
    assert!(!alive(governor), "the CLI ended the hung governor");
}

/// A compile's shim does not wait for the governor once its compiler exited 0, so make may
/// start the link that waits for it before the governor reads of its end (here the governor
/// is paused; on a busy machine it is only slow). The report keeps when the compiler ended:
/// the compile's time is its own, and it ended before the link was offered, so `sim import`
/// still sees the link wait for it.
#[test]
fn a_jobs_end_the_governor_hears_of_late_is_recorded_when_it_happened() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 0, "");
    std::fs::write(
        dir.path().join("Makefile"),
        "tool: a.o\n\tg++ --mem 4 --ms 100 -o tool a.o\n\
         a.o:\n\tg++ --mem 4 --ms 1000 -c a.cpp -o a.o\n",
    )
    .unwrap();
    let mut command = build(dir.path(), &["--report", "report.json", "--", "make"]);
    command
        .env("HEADROOM_GOVERNOR_SILENCE_MS", "600000")
        .stderr(Stdio::piped());
    let cli = command.spawn().unwrap();
    wait_until("the compile to be admitted", || {
        let output = reliability::headroom(dir.path(), &["status", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice::<Vec<GovernorStatus>>(&output.stdout).is_ok_and(|status| {
            let session = status
                .first()
                .and_then(|governor| governor.sessions.first());
            session.is_some_and(|session| session.status.running == 1)
        })
    });
    let governor = below(cli.id(), "__governor")[0];
    let paused = Duration::from_secs(3);
    // SAFETY: kill(2) on the governor this test's build started, resumed below.
    unsafe { libc::kill(governor, libc::SIGSTOP) };
    std::thread::sleep(paused);
    // SAFETY: as above.
    unsafe { libc::kill(governor, libc::SIGCONT) };
    let output = output_within_patience(cli);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: BuildReport =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    let job = |label: &str| {
        report
            .jobs
            .iter()
            .find(|job| job.label == label)
            .unwrap_or_else(|| panic!("{label} in {:?}", report.jobs))
    };
    let (compile, link) = (job("a.o"), job("tool"));
    assert!(
        compile.end_ms <= link.offered_ms,
        "{compile:?} ended before {link:?} was offered"
    );
    assert!(
        compile.end_ms - compile.start_ms < paused.as_millis() as u64,
        "the compile's time is not the governor's pause: {compile:?}"
    );
}

/// `headroom __governor` as the CLI starts it: `listener` as its fd 3, its configuration to
/// come on its stdin, its stderr piped.
fn governor_listening_on(listener: &std::os::unix::net::UnixListener) -> Command {
    let fd = std::os::fd::AsRawFd::as_raw_fd(listener);
    let mut command = Command::new(HEADROOM);
    command
        .arg(headroom_govern::session::GOVERNOR_SUBCOMMAND)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: in the child, before exec, on a descriptor this test owns: fd 3 is the
    // listener, kept open across exec (where it is fd 3 already, only its close-on-exec flag
    // is cleared, as dup2 onto itself would not).
    unsafe {
        command.pre_exec(move || {
            let moved = if fd == 3 {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if moved < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// The governor run by hand, with no socket as its fd 3, says so; it aborted on closing a
/// descriptor it never had.
#[test]
fn a_governor_run_by_hand_says_it_must_be_started_by_headroom() {
    let mut governor = Command::new(HEADROOM);
    governor.arg(headroom_govern::session::GOVERNOR_SUBCOMMAND);
    // SAFETY: close(2) in the child, before exec: whatever fd 3 was, it is not there.
    unsafe {
        governor.pre_exec(|| {
            libc::close(3);
            Ok(())
        });
    }
    let output = output_within_patience(
        governor
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    support::assert_said(&output, "must be started by `headroom build`");
}

/// A governor whose starting CLI died before it could join (SIGKILL between the start and
/// the join) leaves after three silence bounds, removing its socket, and serves nobody.
#[test]
fn a_governor_that_no_session_joins_leaves() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let config = support::governor_config();
    let mut command = governor_listening_on(&listener);
    command.env("HEADROOM_GOVERNOR_SILENCE_MS", "300");
    let mut governor = command.spawn().unwrap();
    // The CLI hands the governor its configuration on stdin.
    let mut stdin = governor.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, config.to_string().as_bytes()).unwrap();
    drop(stdin);
    drop(listener);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = governor.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            governor.kill().unwrap();
            panic!("a governor nobody joined kept serving");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "it waited for a session first"
    );
    assert!(!socket.exists(), "it removed its socket");
}

/// Starts a build of two compiles made with `recipe` in `dir`, in its own process group as a
/// shell's job is (a terminal signals the whole group), started as `shell` starts it;
/// returns it, its group and its two compilers once both run.
fn two_compiles_as_a_job(
    dir: &Path,
    recipe: &str,
    shell: impl FnOnce(&mut Command),
) -> (Child, i32, Vec<i32>) {
    reliability::project(dir, 2, recipe);
    let mut command = build(dir, &["--jobs", "2", "--", "make", "-j2"]);
    command.process_group(0).stderr(Stdio::piped());
    shell(&mut command);
    let cli = command.spawn().unwrap();
    let group = cli.id() as i32;
    wait_until("two compiles", || compilers(cli.id()).len() == 2);
    let running = compilers(cli.id());
    (cli, group, running)
}

#[test]
fn ctrl_z_stops_the_compilers_and_fg_resumes_them() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    let (cli, group, running) = two_compiles_as_a_job(dir.path(), "--mem 4 --ms 4000", |_| {});
    // SAFETY: kill(2) on the process group of this test's build.
    unsafe { libc::kill(-group, libc::SIGTSTP) };
    wait_until("every compiler stopped", || {
        running
            .iter()
            .all(|&pid| matches!(process_state(pid), Some('T' | 't')))
    });
    // SAFETY: as above: what `fg` sends.
    unsafe { libc::kill(-group, libc::SIGCONT) };
    wait_until("every compiler running again", || {
        running
            .iter()
            .all(|&pid| !matches!(process_state(pid), Some('T' | 't')))
    });
    let output = output_within_patience(cli);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(objects(dir.path(), 2), 2);
}

#[test]
fn ctrl_backslash_ends_the_compilers_with_the_build() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::become_subreaper();
    // Compiles far longer than the test waits for them to end.
    let (cli, group, running) = two_compiles_as_a_job(dir.path(), "--mem 4 --ms 600000", |_| {});
    // SAFETY: kill(2) on the process group of this test's build: what Ctrl-\ sends.
    unsafe { libc::kill(-group, libc::SIGQUIT) };
    let output = output_within_patience(cli);
    assert_eq!(
        output.status.code(),
        Some(131),
        "128 + SIGQUIT, as a shell reports it"
    );
    // Orphaned compilers come to this test, their subreaper: each must end, not compile on.
    wait_until("every compiler ended", || {
        reliability::reap(&running);
        running.iter().all(|&pid| !alive(pid))
    });
}

/// `nohup headroom build …` and a terminal that hangs up: the hang-up reaches the CLI and,
/// through the shell, every process of the build. A build started ignoring SIGHUP must go on
/// as `nohup make` does: neither the CLI, a shim nor the governor may catch the signal.
#[test]
fn a_build_started_ignoring_sighup_survives_a_hang_up() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    let nohup = |command: &mut Command| {
        // SAFETY: signal(2) between fork and exec, as nohup does before it runs its command.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                Ok(())
            });
        }
    };
    let (cli, group, _) = two_compiles_as_a_job(dir.path(), "--mem 4 --ms 3000", nohup);
    let everyone = below(cli.id(), "");
    // SAFETY: kill(2) on this test's build: its CLI's group, then each of its processes.
    unsafe { libc::kill(-group, libc::SIGHUP) };
    for pid in everyone {
        unsafe { libc::kill(pid, libc::SIGHUP) };
    }
    let output = output_within_patience(cli);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(objects(dir.path(), 2), 2);
    // The governor, one of the build's processes, stayed too.
    assert!(
        !stderr(&output).contains("the governor stopped"),
        "{}",
        stderr(&output)
    );
}

/// A project whose first job (`grow.o`, the stand-in compiler) outgrows what its history says
/// and whose second (`real.o`, real g++ for 4 s) is the youngest job when it does: the
/// governor kills `real.o` to make room and requeues it.
fn project_with_a_job_to_kill(dir: &Path) {
    reliability::project(dir, 0, "");
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/template-heavy");
    let makefile = format!(
        ".PHONY: all\nall: grow.o real.o\n\
         grow.o:\n\tg++ --mem-file grow --cpu-ms 1000 -c grow.cpp -o $@\n\
         real.o:\n\t/usr/bin/g++ -std=c++17 --param ggc-min-expand=100 \
         --param ggc-min-heapsize=131072 -O2 -DUNIT_NAME=real -DTARGET_MIB=300 \
         -I{unit} -c {unit}/unit.cpp -o $@\n",
        unit = unit.display()
    );
    std::fs::write(dir.join("Makefile"), makefile).unwrap();
    std::fs::write(dir.join("grow"), "20 100").unwrap();
}

#[test]
fn a_job_killed_to_make_room_is_requeued_not_retried_alone_and_leaves_no_temp_files() {
    let _alone = support::WHOLE_MACHINE.hold();
    if !support::have(&["g++"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    project_with_a_job_to_kill(dir.path());
    // All at one CPU priority: on a loaded machine a job started nicer grows so slowly that
    // the other ends before it peaks, and nothing has to make room.
    let args = [
        "-v",
        "--budget",
        "500M",
        "--jobs",
        "2",
        "--no-priorities",
        "--",
        "make",
        "-j2",
    ];
    let first = build(dir.path(), &args).output().unwrap();
    assert!(first.status.success(), "{}", stderr(&first));
    // Now the stand-in grows to 400 MiB in half a second: faster than the real compile, so
    // when the two reach the budget's suspend line the stand-in holds most of it, and the
    // real compile's own growth then passes the budget and a job must be killed. (Over 2 s it
    // reached the line only once the real compile had peaked: it was suspended, resumed when
    // that compile ended, and nothing had to be killed.) It holds its peak for a second of CPU
    // time (`--cpu-ms` in the Makefile): ending at its peak, it was gone before a real compile
    // slowed by a busy machine had grown to the line, and nothing had to make room.
    std::fs::write(dir.path().join("grow"), "400 500").unwrap();
    for object in ["grow.o", "real.o"] {
        std::fs::remove_file(dir.path().join(object)).unwrap();
    }
    let output = build(dir.path(), &args).output().unwrap();
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains("kill and requeue job"),
        "no kill happened: {said}"
    );
    assert!(
        !said.contains("ran out of memory") && said.contains("OOM retries 0"),
        "headroom's own kill is not an out-of-memory failure: {said}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path().join("tmp"))
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert!(left.is_empty(), "gcc's temporary files were left: {left:?}");
    assert!(dir.path().join("real.o").exists());
}

/// A stand-in compiler whose compiles leave a file in their temporary directory, as clang's
/// driver and nvcc do when they are ended, and append which directory that was to `tmpdirs`.
/// It answers `--version` (the governor asks it).
const LEAVES_TEMP_FILES: &str = r#"#!/bin/sh
case " $* " in *" -c "*) ;; *) echo "stand-in 1.0"; exit 0 ;; esac
echo "$TMPDIR" >> "$(dirname "$0")/../tmpdirs"
: > "$TMPDIR/left-by-$$"
for output; do :; done
: > "$output"
"#;

#[test]
fn what_compilers_leave_in_their_temporary_directory_goes_with_the_build() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 0, "");
    let compiler = dir.path().join("bin/g++");
    std::fs::remove_file(&compiler).unwrap();
    std::fs::write(&compiler, LEAVES_TEMP_FILES).unwrap();
    std::fs::set_permissions(
        &compiler,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // Three compiles, and a fourth whose step chose a temporary directory of its own.
    let makefile = ".PHONY: all\nall: o0.o o1.o o2.o o3.o\n\
                    o3.o:\n\tTMPDIR=$(CURDIR)/own g++ -c o3.cpp -o $@\n\
                    %.o:\n\tg++ -c $*.cpp -o $@\n";
    std::fs::write(dir.path().join("Makefile"), makefile).unwrap();
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    // What a session killed before its end left: the next build's start removes it.
    let mut ended = Command::new("true").spawn().unwrap();
    ended.wait().unwrap();
    let temp = dir.path().join("tmp");
    let left_by_a_killed_session = temp.join(format!("headroom-tmp{}-x1", ended.id()));
    std::fs::create_dir(&left_by_a_killed_session).unwrap();
    std::fs::write(left_by_a_killed_session.join("cc1.s"), "").unwrap();

    let output = build(dir.path(), &["--", "make", "-j4"]).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(objects(dir.path(), 4), 4);
    let tmpdirs = std::fs::read_to_string(dir.path().join("tmpdirs")).unwrap();
    let tmpdirs: Vec<&Path> = tmpdirs.lines().map(Path::new).collect();
    // One for each compile, and one more for each early attempt of a queued job.
    let in_session_dir = tmpdirs
        .iter()
        .filter(|dir| dir.parent() == Some(temp.as_path()))
        .count();
    let chosen = tmpdirs.iter().filter(|dir| **dir == own).count();
    assert!(
        in_session_dir >= 3 && chosen >= 1 && in_session_dir + chosen == tmpdirs.len(),
        "compiles run in the session's directory under the user's TMPDIR, and a step that \
         chose another TMPDIR keeps it: {tmpdirs:?}"
    );
    let names = |dir: &Path| -> Vec<_> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .collect()
    };
    assert!(
        names(&temp).is_empty(),
        "left in the user's TMPDIR: {:?}",
        names(&temp)
    );
    assert_eq!(
        names(&own).len(),
        chosen,
        "a directory a step chose is its own"
    );
}

#[test]
fn a_runtime_directory_another_user_took_or_that_cannot_be_used_does_not_stop_the_build() {
    let _alone = support::WHOLE_MACHINE.hold();
    for (name, setup) in [
        ("another user's", "taken"),
        ("a file as XDG_RUNTIME_DIR", "file"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        reliability::project(dir.path(), 2, "--mem 4 --ms 10");
        let mut command = build(dir.path(), &["--", "make"]);
        match setup {
            "taken" => {
                // The name earlier versions used under the temporary directory, taken first
                // by another local user.
                let taken = dir.path().join("tmp").join(format!(
                    "headroom-{}",
                    // SAFETY: getuid(2) cannot fail.
                    unsafe { libc::getuid() }
                ));
                std::fs::create_dir(&taken).unwrap();
                std::os::unix::fs::chown(&taken, Some(65534), Some(65534)).unwrap();
                command.env_remove("XDG_RUNTIME_DIR");
            }
            _ => {
                let file = dir.path().join("not-a-dir");
                std::fs::write(&file, "").unwrap();
                command.env("XDG_RUNTIME_DIR", &file);
            }
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{name}: {}", stderr(&output));
        assert_eq!(objects(dir.path(), 2), 2, "{name}: {}", stderr(&output));
        assert!(
            stderr(&output).contains("jobs"),
            "{name}: governed, with its summary: {}",
            stderr(&output)
        );
    }
}

#[test]
fn a_damaged_shim_directory_does_not_stop_the_build() {
    let _alone = support::WHOLE_MACHINE.hold();
    for damage in ["a file", "a directory as the launcher"] {
        let dir = tempfile::tempdir().unwrap();
        reliability::project(dir.path(), 2, "--mem 4 --ms 10");
        let shims = dir.path().join("state/shims");
        match damage {
            "a file" => std::fs::write(&shims, "x").unwrap(),
            _ => std::fs::create_dir_all(shims.join("headroom-launch/inside")).unwrap(),
        }
        let output = build(dir.path(), &["--", "make"]).output().unwrap();
        assert!(output.status.success(), "{damage}: {}", stderr(&output));
        assert_eq!(objects(dir.path(), 2), 2, "{damage}");
        assert!(
            stderr(&output).contains("cannot set up the shim directory"),
            "{damage}: {}",
            stderr(&output)
        );
    }
}

/// A build step that runs `headroom build` itself (a script wrapped whole whose parts already
/// use headroom): the inner build runs and governs its compiles. It used to refuse to start,
/// failing the outer build, since it read a variable the outer one set for its shims as its
/// own `--farm`.
#[test]
fn a_build_run_by_a_governed_build_runs() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 2, "--mem 4 --ms 10");
    builds_governed(dir.path(), &["--", HEADROOM, "build", "--", "make"], 2);
}

/// A build command that is itself a compiler (`headroom build -- g++ -c big.cpp`) is governed
/// as one job. It used to run ungoverned, with a summary saying that no compiler ran: the
/// interceptor sees what the build command starts, not the command headroom starts.
#[test]
fn a_compiler_given_as_the_build_command_is_governed() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 0, "");
    let compile = [
        "--", "g++", "--mem", "4", "--ms", "10", "-c", "o0.cpp", "-o", "o0.o",
    ];
    builds_governed(dir.path(), &compile, 1);
}

/// A compiler wrapper that leaves a background process holding its stdout and stderr (a
/// compile server it started) no longer holds the build up for as long as that process
/// lives: make alone goes on at once. It did twice: the governor read the wrapper's
/// `--version` to its end before it admitted the job, and the shim read the compile's stderr
/// to its end.
#[test]
fn a_compiler_that_leaves_a_process_holding_its_output_does_not_hold_the_build() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 2, "--mem 4 --ms 10");
    let wrapper = dir.path().join("bin/g++");
    std::fs::remove_file(&wrapper).unwrap();
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nsleep 60 &\necho $! >> {}\nexec {} \"$@\"\n",
            dir.path().join("holders").display(),
            fakecc::path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let started = Instant::now();
    // The build's own output goes to files, which a process left behind does not hold open
    // for the test as a pipe would.
    let log = std::fs::File::create(dir.path().join("build.log")).unwrap();
    let status = build(dir.path(), &["--", "make"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    let took = started.elapsed();
    let said = std::fs::read_to_string(dir.path().join("build.log")).unwrap();
    let holders = std::fs::read_to_string(dir.path().join("holders")).unwrap_or_default();
    for pid in holders.lines().filter_map(|pid| pid.parse::<i32>().ok()) {
        // SAFETY: kill(2) with a pid this test's wrapper started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(status.success(), "{said}");
    assert_eq!(objects(dir.path(), 2), 2, "{said}");
    assert!(said.contains("headroom: 2 jobs"), "{said}");
    assert!(took < Duration::from_secs(20), "{took:?}: {said}");
}

/// A build command longer than the kernel lets one variable be (128 KiB: a link of thousands
/// of objects given as the command) is governed. It ran ungoverned: the CLI handed the
/// governor its configuration, which holds the command, in a variable, and the governor could
/// not start.
#[test]
fn a_build_command_longer_than_a_variable_can_be_is_governed() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 0, "");
    let objects: Vec<String> = (0..3000)
        .map(|i| format!("objects/a_long_descriptive_object_file_name_{i:05}.o"))
        .collect();
    let mut link = vec!["--", "g++", "--mem", "4", "--ms", "10", "-o", "o0.o"];
    link.extend(objects.iter().map(String::as_str));
    assert!(link.iter().map(|arg| arg.len() + 1).sum::<usize>() > 128 << 10);
    builds_governed(dir.path(), &link, 1);
}

/// A CLI killed while it writes a new governor its configuration leaves it half of one: the
/// governor removes its socket and exits, rather than leave a socket nobody answers. It left
/// the socket, and a build killed at that moment waited on it.
#[test]
fn a_governor_given_half_its_configuration_leaves_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("governor.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut governor = governor_listening_on(&listener).spawn().unwrap();
    drop(listener);
    let mut stdin = governor.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, br#"{"budget": 10"#).unwrap();
    drop(stdin);
    let output = output_within_patience(governor);
    assert!(!output.status.success(), "{}", stderr(&output));
    assert!(!socket.exists(), "{}", stderr(&output));
}

/// Runs `headroom build ARGS…` in the scratch project `dir` and checks that it succeeds,
/// leaves the `count` objects `o0.o`… and governed them as that many jobs.
fn builds_governed(dir: &Path, args: &[&str], count: usize) {
    let output = build(dir, args).output().unwrap();
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert_eq!(objects(dir, count), count, "{said}");
    assert!(said.contains(&format!("headroom: {count} jobs")), "{said}");
}

/// A Makefile whose `clean` takes a while and whose `all` builds `out` from nothing: under
/// `make -j`, `make clean all` runs both at once, and `clean` removes what `all` built.
fn project_with_ordered_goals(dir: &Path) {
    reliability::project(dir, 0, "");
    std::fs::write(
        dir.join("Makefile"),
        ".PHONY: all clean\nall: out\nout:\n\tg++ --mem 4 --ms 10 -c out.cpp -o out\n\
         clean:\n\tsleep 1\n\trm -f out\n",
    )
    .unwrap();
}

#[test]
fn goals_named_in_order_are_built_in_order() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    project_with_ordered_goals(dir.path());
    let output = build(dir.path(), &["--", "make", "clean", "all"])
        .output()
        .unwrap();
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        dir.path().join("out").exists(),
        "clean ran after all: {said}"
    );
    assert!(said.contains("does not offer it jobs"), "{said}");
}

#[test]
fn a_parallelism_the_user_set_or_refused_is_kept() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 1, "--mem 4 --ms 10");
    let makeflags = |output: &Output| {
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap())
                .unwrap();
        let set = report["build"]["parallelism_set"].clone();
        assert!(output.status.success(), "{}", stderr(output));
        set.as_array()
            .unwrap()
            .iter()
            .filter(|v| v.as_str().unwrap().starts_with("MAKEFLAGS"))
            .count()
    };
    let offered = build(dir.path(), &["--report", "report.json", "--", "make", "-B"])
        .output()
        .unwrap();
    assert_eq!(makeflags(&offered), 1, "one goal: make is offered jobs");
    let mut empty = build(dir.path(), &["--report", "report.json", "--", "make", "-B"]);
    empty.env("MAKEFLAGS", "");
    assert_eq!(
        makeflags(&empty.output().unwrap()),
        0,
        "MAKEFLAGS= is a choice"
    );
    let refused = build(
        dir.path(),
        &[
            "--no-offer-jobs",
            "--report",
            "report.json",
            "--",
            "make",
            "-B",
        ],
    )
    .output()
    .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert!(refused.status.success(), "{}", stderr(&refused));
    assert_eq!(report["build"]["parallelism_set"], serde_json::json!([]));
}

#[test]
fn the_users_niceness_is_a_floor_for_every_compiler() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 2, "--mem 4 --ms 10");
    let mut command = Command::new("nice");
    command.args(["-n", "15", HEADROOM, "build", "--", "make"]);
    reliability::isolate(&mut command, dir.path());
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    for object in ["o0.o", "o1.o"] {
        let nice: i32 = fakecc::object_says(&dir.path().join(object), "nice")
            .parse()
            .unwrap();
        assert!(nice >= 15, "{object} ran at niceness {nice}");
    }
}

/// The shim and the governor run with the shortest scheduler slice, so that on a busy host a
/// compiler call does not wait for cores at each of its wake-ups; the compiler gets back the
/// slice the build was given, and runs as it would have without headroom.
#[test]
fn compilers_run_with_the_scheduler_slice_the_build_was_given() {
    let _alone = support::WHOLE_MACHINE.hold();
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 2, "--mem 4 --ms 10");
    let mut ungoverned = Command::new(dir.path().join("bin/g++"));
    ungoverned.args(["-c", "x.cpp", "-o", "alone.o"]);
    reliability::isolate(&mut ungoverned, dir.path());
    assert!(ungoverned.status().unwrap().success());
    let given = fakecc::object_says(&dir.path().join("alone.o"), "slice");
    if given == "?" {
        eprintln!("skipped: this kernel names no scheduler slice (/proc/self/sched)");
        return;
    }
    let mut command = Command::new(HEADROOM);
    command.args(["build", "--", "make"]);
    reliability::isolate(&mut command, dir.path());
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    for object in ["o0.o", "o1.o"] {
        let slice = fakecc::object_says(&dir.path().join(object), "slice");
        assert_eq!(slice, given, "{object}");
    }
}
