//! `headroom run`'s contract at its edges: byte-exact pass-through, exit codes, bad input,
//! and Ctrl-C.

mod run_support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use run_support::*;

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
    assert!(
        stderr(&output).contains("no-such-command-headroom"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn bad_input_is_a_clear_error_naming_the_flag() {
    let scratch = Scratch::new();
    let regex = scratch.headroom(&["run", "--stage-regex", "(unclosed", "--", "true"]);
    assert_eq!(regex.status.code(), Some(2));
    assert!(
        stderr(&regex).contains("--stage-regex"),
        "{}",
        stderr(&regex)
    );
    let size = scratch.headroom(&["run", "--memory-limit", "lots", "--", "true"]);
    assert_eq!(size.status.code(), Some(2));
    assert!(
        stderr(&size).contains("--memory-limit") && stderr(&size).contains("512M"),
        "{}",
        stderr(&size)
    );
    let missing = scratch.headroom(&["run"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("CMD"), "{}", stderr(&missing));
    let fallback = scratch.headroom(&["run", "--fallback", "echo 'open", "--", "true"]);
    assert_eq!(fallback.status.code(), Some(2));
    assert!(
        stderr(&fallback).contains("--fallback"),
        "{}",
        stderr(&fallback)
    );
}

#[test]
fn ctrl_c_is_forwarded_and_a_partial_report_is_written() {
    let scratch = Scratch::new();
    let child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "run",
            "--json",
            "r.json",
            "--",
            "sh",
            "-c",
            "echo '##headroom stage waiting'; sleep 30",
        ])
        .current_dir(scratch.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    // SAFETY: kill(2) on the child we started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "sleep 30 was interrupted"
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
