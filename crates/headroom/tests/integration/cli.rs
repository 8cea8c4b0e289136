//! The command line without surprises: every variable headroom reads is in `--help`, a
//! mistake is reported in headroom's one error style, completions and the man page come
//! from the same definitions as the parser, a reader that goes away panics nothing, `-`
//! means stdout, and stderr carries colour codes only where asked.

use crate::support;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use support::headroom;

/// Variables between headroom's own processes, or for its tests: not for users.
const INTERNAL: &[&str] = &[
    "HEADROOM_JOB",                // set by the shim in a job's environment
    "HEADROOM_SOCKET",             // the governor's socket, for the shims
    "HEADROOM_SHIM_DIR",           // the shim directory, for the shims
    "HEADROOM_LAUNCHER",           // the launcher, for the interceptor
    "HEADROOM_GOVERNOR_LOCK",      // the lock a shared governor takes to leave its socket
    "HEADROOM_SESSION",            // the session a build's compilers belong to, for the shims
    "HEADROOM_SESSION_FARM",       // whether that session may farm, for the shims
    "HEADROOM_JOB_TMPDIR",         // the session's directory for its compilers' temporary files
    "HEADROOM_SAMPLE_INTERVAL_MS", // a hidden flag for tests and benchmarks
    "HEADROOM_BUILDING_SHIM",      // set by headroom-govern's build script for the shim's build
    "HEADROOM_SHIM_BINARY",        // where that build put the shim, at compile time
    "HEADROOM_SHIM_TARGET",        // what it built the shim for, at compile time
];

/// Every `"HEADROOM_…"` string in the non-test sources of the workspace's crates.
fn variables_read() -> Vec<String> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut dirs = vec![crates];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !["tests", "benches", "target", "headroom-fakecc"].contains(&name.as_str()) {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") || name.ends_with(".c") {
                let source = std::fs::read_to_string(&path).unwrap();
                // Only what comes before a file's unit tests.
                let source = source.split("#[cfg(test)]").next().unwrap();
                for piece in source.split("\"HEADROOM_").skip(1) {
                    let variable: String = piece
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                        .collect();
                    if piece[variable.len()..].starts_with('"') {
                        found.push(format!("HEADROOM_{variable}"));
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn every_variable_headroom_reads_is_in_its_help() {
    let help = support::text(&headroom(&["--help"]).output().unwrap().stdout);
    let read = variables_read();
    assert!(read.len() > 10, "the scan finds the variables: {read:?}");
    let missing: Vec<&String> = read
        .iter()
        .filter(|variable| !INTERNAL.contains(&variable.as_str()))
        .filter(|variable| !variable.starts_with("HEADROOM_TEST_"))
        .filter(|variable| !help.contains(variable.as_str()))
        .collect();
    assert!(missing.is_empty(), "not in `headroom --help`: {missing:?}");
}

#[test]
fn mistakes_on_the_command_line_are_reported_in_one_style() {
    for args in [
        &["build", "--no-such-flag", "make"][..],
        &["build", "--budget", "-5", "make"],
        &["sim", "--machine", "16/32", "trace.json"],
        &["report", "no-such-report.json"],
    ] {
        let output = headroom(args).output().unwrap();
        let stderr = support::text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("headroom: error: "),
            "{args:?}: {stderr}"
        );
    }
    let budget = support::text(
        &headroom(&["build", "--budget", "-5", "make"])
            .output()
            .unwrap()
            .stderr,
    );
    assert!(
        budget.contains("--budget") && budget.contains("`6G`"),
        "{budget}"
    );
    let machine = support::text(
        &headroom(&["sim", "--machine", "16/32", "trace.json"])
            .output()
            .unwrap()
            .stderr,
    );
    assert!(machine.contains("`32G`"), "{machine}");
}

#[test]
fn completions_and_the_man_page_come_from_the_parser() {
    for shell in ["bash", "zsh", "fish"] {
        let output = headroom(&["completions", shell]).output().unwrap();
        assert!(output.status.success(), "{shell}");
        let script = support::text(&output.stdout);
        assert!(
            script.contains("lower-flags") && script.contains("diagnose"),
            "{shell}"
        );
    }
    let man = support::text(&headroom(&["man"]).output().unwrap().stdout);
    assert!(
        man.starts_with(".ie") || man.contains(".TH headroom 1"),
        "{man}"
    );
    assert!(
        man.contains("HEADROOM_STATE_DIR"),
        "the environment is in the man page"
    );
}

#[test]
fn switches_set_by_variables_take_1_and_0_like_true_and_false() {
    let state = tempfile::tempdir().unwrap();
    for (variable, value) in [
        ("HEADROOM_NO_PRIORITIES", "1"),
        ("HEADROOM_NO_PRIORITIES", "0"),
        ("HEADROOM_LOWER_FLAGS", "yes"),
    ] {
        let output = headroom(&["build", "--no-history", "true"])
            .env(variable, value)
            .env("HEADROOM_STATE_DIR", state.path())
            .output()
            .expect("run headroom");
        assert!(
            output.status.success(),
            "{variable}={value}: {}",
            support::text(&output.stderr)
        );
    }
}

/// A pipe whose reader has gone: writing to it fails with EPIPE, or kills by SIGPIPE.
fn pipe_without_reader() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills in two new descriptors, which are then owned here.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    Stdio::from(writer)
}

/// `headroom ARGS` in the project `dir`, its home there too, with no colour asked for.
fn headroom_at_home(dir: &Path, args: &[&str]) -> Command {
    let mut command = support::headroom_in(dir, args);
    command
        .env("HOME", dir)
        .env_remove("HEADROOM_COLOR")
        .env_remove("NO_COLOR");
    command
}

#[test]
fn output_to_a_reader_that_has_gone_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("build.log"),
        "Out of memory: Killed process 9253 (cc1plus)\n",
    )
    .unwrap();
    // As `cat` and `grep` do: killed by SIGPIPE, 141 in a shell, and no panic message.
    for args in [
        &["doctor", "--json"][..],
        &["doctor"],
        &["diagnose", "--json", "build.log"],
        &["diagnose", "build.log"],
    ] {
        let output = headroom_at_home(dir.path(), args)
            .stdout(pipe_without_reader())
            .output()
            .unwrap();
        let stderr = support::text(&output.stderr);
        assert_eq!(
            output.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?} {stderr}",
            output.status
        );
        assert_eq!(stderr, "", "{args:?}");
    }
}

#[test]
fn a_build_whose_stderr_reader_has_gone_keeps_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let output = headroom_at_home(
        dir.path(),
        &["build", "--", "sh", "-c", "sleep 0.5; exit 3"],
    )
    .stderr(pipe_without_reader())
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(3), "{:?}", output.status);
}

#[test]
fn a_dash_writes_the_output_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let output = headroom_at_home(dir.path(), &["run", "--json", "-", "--", "true"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", support::text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", support::text(&output.stdout)));
    assert!(report["rungs"].is_array(), "{report}");
    assert!(!dir.path().join("-").exists(), "no file named `-`");
    let both = headroom_at_home(
        dir.path(),
        &["run", "--json", "-", "--html", "-", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(both.status.code(), Some(2));
    assert!(
        support::text(&both.stderr).contains("only one output can go to stdout"),
        "{}",
        support::text(&both.stderr)
    );
}

#[test]
fn colour_codes_only_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    // Looks like a `headroom run` report and is not one: `-vv` logs that.
    std::fs::write(dir.path().join("not-a-report.json"), "{\"rungs\": 5").unwrap();
    let log = |extra: &[&str], no_color: Option<&str>| {
        let mut args = vec!["-vv"];
        args.extend_from_slice(extra);
        args.extend(["diagnose", "not-a-report.json"]);
        let mut command = headroom_at_home(dir.path(), &args);
        if let Some(value) = no_color {
            command.env("NO_COLOR", value);
        }
        let stderr = command.output().unwrap().stderr;
        assert!(
            support::text(&stderr).contains("is not one"),
            "{args:?}: {}",
            support::text(&stderr)
        );
        stderr.contains(&0x1b)
    };
    assert!(!log(&[], None), "stderr is a pipe, not a terminal");
    assert!(log(&["--color", "always"], None));
    assert!(log(&["--color", "always"], Some("1")), "the flag wins");
    assert!(!log(&["--color", "never"], None));
}
