//! `headroom run`'s contract at its edges: byte-exact pass-through, exit codes, bad input,
//! and Ctrl-C.

use crate::support::{self, run};

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use run::*;
use support::{assert_said, stderr, HEADROOM};

#[test]
fn binary_output_passes_through_untouched() {
    let scratch = Scratch::new();
    let mut data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    data.extend_from_slice(b"\xff\xfe not utf-8 \n##headroom stage \xff\n");
    std::fs::write(scratch.path("blob"), &data).unwrap();
    let output = scratch.headroom(&["run", "--", "sh", "-c", "cat blob; cat blob >&2"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(output.stdout, data, "stdout is byte-identical");
    assert!(
        output.stderr.starts_with(&data),
        "stderr starts with CMD's bytes, then the table"
    );
}

#[test]
fn exit_codes_pass_through() {
    let scratch = Scratch::new();
    assert_eq!(
        scratch
            .headroom(&["run", "--", "sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );
    assert_eq!(
        scratch
            .headroom(&["run", "--", "sh", "-c", "kill -9 $$"])
            .status
            .code(),
        Some(137)
    );
}

#[test]
fn a_missing_command_exits_127() {
    let scratch = Scratch::new();
    let output = scratch.headroom(&["run", "--", "no-such-command-headroom"]);
    assert_eq!(output.status.code(), Some(127));
    assert_said(&output, "no-such-command-headroom");
}

#[test]
fn a_command_that_cannot_be_run_exits_126() {
    let scratch = Scratch::new();
    let output = scratch.headroom(&["run", "--", "."]);
    assert_eq!(output.status.code(), Some(126));
    assert_said(&output, "`.` is a directory");
}

#[test]
fn bad_input_is_a_clear_error_naming_the_flag() {
    let scratch = Scratch::new();
    let regex = scratch.headroom(&["run", "--stage-regex", "(unclosed", "--", "true"]);
    assert_eq!(regex.status.code(), Some(2));
    assert_said(&regex, "--stage-regex");
    let size = scratch.headroom(&["run", "--memory-limit", "lots", "--", "true"]);
    assert_eq!(size.status.code(), Some(2));
    assert_said(&size, "--memory-limit");
    assert_said(&size, "512M");
    let missing = scratch.headroom(&["run"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_said(&missing, "CMD");
    let fallback = scratch.headroom(&["run", "--fallback", "echo 'open", "--", "true"]);
    assert_eq!(fallback.status.code(), Some(2));
    assert_said(&fallback, "--fallback");
    // A misspelt flag is not taken for the command.
    let flag = scratch.headroom(&["run", "--jsn", "out.json", "--", "true"]);
    assert_eq!(flag.status.code(), Some(2));
    assert_said(&flag, "'--jsn'");
}

#[test]
fn an_output_that_cannot_be_written_fails_before_the_command_runs() {
    let scratch = Scratch::new();
    for flag in ["--json", "--html", "--mprof"] {
        let output = scratch.headroom(&["run", flag, "missing/out", "--", "touch", "ran"]);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert_said(
            &output,
            &format!("{flag} missing/out: there is no directory"),
        );
        assert!(
            !scratch.path("ran").exists(),
            "the command must not have run"
        );
    }
}

#[test]
fn ctrl_c_is_forwarded_and_a_partial_report_is_written() {
    // Python, not `sh -c 'echo …; sleep 30'`: a shell that gets SIGINT between its echo and
    // forking sleep may carry on, so the test would race; Python handles SIGINT from its start.
    let Some(scratch) = Scratch::with_python() else {
        return;
    };
    let mut child = scratch.spawn_piped(&[
        "run",
        "--json",
        "r.json",
        "--",
        "python3",
        "-c",
        "import time; print('##headroom stage waiting', flush=True); time.sleep(30)",
    ]);
    // Once the marker is through, CMD runs and headroom's handler is installed (it is set up
    // before CMD starts), however loaded the machine is.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("##headroom stage waiting") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "headroom closed stdout early"
        );
    }
    let started = Instant::now();
    // SAFETY: kill(2) on the child we started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the 30 s sleep was interrupted"
    );
    assert_eq!(
        output.status.code(),
        Some(130),
        "CMD died of SIGINT: {}",
        stderr(&output)
    );
    let report = scratch.json("r.json");
    assert_eq!(report["interrupted"], true);
    assert_eq!(
        report["rungs"][0]["stages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["name"],
        "waiting"
    );
    let _ = std::io::stderr().flush();
}

#[test]
fn a_reader_that_goes_away_ends_the_run_as_it_would_end_cmd() {
    // `headroom run -- yes | head -1`, on stdout and on stderr: CMD dies of SIGPIPE as it would
    // writing to the closed pipe itself, and headroom exits as CMD did.
    let scratch = Scratch::new();
    for script in ["yes", "yes >&2"] {
        let to_stderr = script.ends_with(">&2");
        let mut child = Command::new(HEADROOM)
            .args(["run", "--json", "r.json", "--", "sh", "-c", script])
            .current_dir(scratch.dir.path())
            .stdout(if to_stderr {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stderr(if to_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap();
        let reader: Box<dyn std::io::Read> = match (child.stdout.take(), child.stderr.take()) {
            (Some(stdout), _) => Box::new(stdout),
            (_, Some(stderr)) => Box::new(stderr),
            _ => unreachable!("one stream is piped"),
        };
        let mut line = String::new();
        std::io::BufReader::new(reader)
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "y\n");
        // The reader is dropped here: the pipe's read end is closed.
        let status = wait_at_most(&mut child, Duration::from_secs(60));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(141),
            "`{script}` ends with 128 + SIGPIPE once its reader is gone"
        );
        assert_eq!(scratch.json("r.json")["rungs"][0]["exit_code"], 141);
    }
}

#[test]
fn an_output_that_fails_otherwise_does_not_end_cmd() {
    // Only a reader gone away ends CMD. Writing to a full disk fails too, but CMD would have
    // had an error and gone on: 8 MB is more than the pipe holds, so CMD writes on after
    // headroom's writes have failed, and must end by itself.
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        headroom_testkit::skip("dev-full", "no /dev/full to make writes fail");
        return;
    };
    let scratch = Scratch::new();
    let output = Command::new(HEADROOM)
        .args(["run", "--", "head", "-c", "8000000", "/dev/zero"])
        .current_dir(scratch.dir.path())
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// headroom's own CPU time to pass 100 MB of `yes LINE` through to /dev/null.
fn pass_through_cpu_s(scratch: &Scratch, line: &str) -> f64 {
    let script = format!("yes '{line}' | head -c 100000000");
    let output = Command::new(HEADROOM)
        .args(["run", "--json", "r.json", "--", "sh", "-c", &script])
        .current_dir(scratch.dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    scratch.json("r.json")["headroom_cpu_s"].as_f64().unwrap()
}

#[test]
fn passing_output_through_costs_by_the_byte_not_by_the_line() {
    // The same 100 MB as two-byte lines (the most lines a command can write) and as 1000-byte
    // lines. Looking at every line made the first cost 6 times the second (36 in a debug
    // build: 13 s of CPU); a look per chunk costs the same for both.
    let scratch = Scratch::new();
    let long_lines = pass_through_cpu_s(&scratch, &"x".repeat(999));
    let short_lines = pass_through_cpu_s(&scratch, "y");
    assert!(
        short_lines < 3.0 * long_lines + 0.1,
        "headroom spent {short_lines:.2}s of CPU on two-byte lines, {long_lines:.2}s on 1000-byte lines"
    );
}

#[test]
fn a_kill_headroom_sends_is_not_called_out_of_memory() {
    // CMD ignores INT and TERM, so only the second Ctrl-C, turned into SIGKILL, ends it.
    let scratch = Scratch::new();
    let mut child = scratch.spawn_piped(&[
        "run",
        "--json",
        "r.json",
        "--",
        "sh",
        "-c",
        "trap '' INT TERM; echo '##headroom stage stubborn'; sleep 60",
    ]);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("stubborn"), "{line:?}");
    // Ctrl-C until headroom ends: signals that arrive together count once, so keep pressing.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        // SAFETY: kill(2) on the child we started.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        if let Some(status) = wait_at_most(&mut child, Duration::from_millis(200)) {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("headroom never killed CMD");
        }
    };
    let mut shown = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut shown).unwrap();
    assert_eq!(status.code(), Some(137), "{shown}");
    let report = scratch.json("r.json");
    assert_eq!(report["interrupted"], true);
    let diagnosis = &report["rungs"][0]["diagnosis"];
    assert!(
        diagnosis.is_null() || diagnosis["is_memory"] == false,
        "headroom's own SIGKILL is no OOM kill: {diagnosis}"
    );
    assert!(!shown.contains("probably the OOM killer"), "{shown}");
    assert!(shown.contains("headroom killed CMD"), "{shown}");
}

/// Runs the shell `line` in `scratch` on a terminal of its own (`script` gives it a
/// pseudo-terminal for stdin, stdout and stderr), checks that it succeeds, and returns what
/// the terminal showed.
fn on_a_terminal(scratch: &Scratch, line: &str) -> String {
    let output = Command::new("script")
        .args(["-qec", line, "/dev/null"])
        .current_dir(scratch.dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{shown}");
    shown
}

/// On a terminal, CMD writes to terminals of its own as it would to ours (colours, line
/// buffering, progress bars), and its output reaches ours unchanged; into a pipe, it writes to
/// pipes. It used to write to pipes always: Python's `sys.stdout.isatty()` was false on a
/// terminal, and compilers printed plain diagnostics.
#[test]
fn cmd_on_a_terminal_writes_to_terminals() {
    if !support::have(&["script"]) {
        return;
    }
    let scratch = Scratch::new();
    let probe = "for fd in 1 2; do if [ -t $fd ]; then echo fd$fd=tty >&$fd; else echo fd$fd=pipe >&$fd; fi; done";
    let shown = on_a_terminal(&scratch, &format!("{HEADROOM} run -- sh -c '{probe}'"));
    assert!(
        shown.contains("fd1=tty\r\n") && shown.contains("fd2=tty\r\n"),
        "{shown:?}"
    );
    let piped = Command::new(HEADROOM)
        .args(["run", "--", "sh", "-c", probe])
        .current_dir(scratch.dir.path())
        .output()
        .unwrap();
    assert!(piped.status.success());
    assert_eq!(String::from_utf8_lossy(&piped.stdout), "fd1=pipe\n");
    assert!(
        stderr(&piped).starts_with("fd2=pipe\n"),
        "{}",
        stderr(&piped)
    );
}

/// A resized terminal resizes CMD's terminals, and CMD hears of it as it would on ours (a
/// progress bar redraws to the new width). CMD's terminals kept the size they started with,
/// and CMD, in a session of its own, was never told.
#[test]
fn cmd_follows_the_terminals_resizes() {
    if !support::have(&["script", "python3", "stty"]) {
        return;
    }
    let scratch = Scratch::new();
    let cmd = "import os, signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH}); \
               print('before', os.get_terminal_size(1), flush=True); \
               heard = signal.sigtimedwait({signal.SIGWINCH}, 10); \
               print('after', heard is not None, os.get_terminal_size(1), os.get_terminal_size(2))";
    // The terminal is resized 1 s in, as a window is; `stty` on the terminal makes the kernel
    // signal its foreground process group, which headroom leads here.
    let script = format!(
        "stty cols 100 rows 30; (sleep 1; stty cols 132 rows 50 </dev/tty) & \
         exec {HEADROOM} run -- python3 -c \"{cmd}\""
    );
    let shown = on_a_terminal(&scratch, &script);
    assert!(
        shown.contains("before os.terminal_size(columns=100, lines=30)"),
        "{shown:?}"
    );
    assert!(
        shown.contains(
            "after True os.terminal_size(columns=132, lines=50) os.terminal_size(columns=132, lines=50)"
        ),
        "{shown:?}"
    );
}

#[test]
fn a_terminal_gets_a_live_status_line() {
    if !support::have(&["script"]) {
        return;
    }
    let scratch = Scratch::new();
    let shown = on_a_terminal(
        &scratch,
        &format!("{HEADROOM} run -- sh -c 'echo \"##headroom stage settle\"; sleep 1'"),
    );
    assert!(
        shown.contains("\r\x1b[2Kheadroom: "),
        "status line drawn: {shown:?}"
    );
    assert!(
        shown.contains("peak") && shown.contains("stage settle"),
        "{shown:?}"
    );
}
