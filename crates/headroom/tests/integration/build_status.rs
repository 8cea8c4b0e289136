//! The live status of `headroom build`: on a terminal it shows the jobs and memory from the
//! governor on the terminal's last line and gives the line back at the end; anywhere else
//! (a pipe, a log file) it writes nothing, not even a carriage return.

use crate::support::{self, reliability};

use std::path::Path;
use std::process::{Command, Stdio};
use support::HEADROOM;

/// `headroom build --budget 700M -j 2 -- make -j2` in the scratch project `dir`.
const BUILD: &str = "build --budget 700M -j 2 -- make -j2";

fn project(dir: &Path) {
    reliability::project(dir, 3, "--mem 50 --ms 1500");
}

#[test]
fn a_build_on_a_terminal_shows_its_jobs_and_memory_and_gives_the_last_line_back() {
    if !support::have(&["script", "stty"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    project(dir.path());
    // `script` runs the build on a pseudo-terminal of its own and copies what it shows.
    let mut command = Command::new("script");
    command.args([
        "-qec",
        &format!("stty rows 20 cols 100; exec {HEADROOM} {BUILD}"),
        "/dev/null",
    ]);
    reliability::isolate(&mut command, dir.path());
    let output = command.stdin(Stdio::null()).output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    // The rows above the last scroll on their own while the build runs.
    let taken = shown.find("\x1b[1;19r").expect(&shown);
    let status = shown
        .find(" running · ")
        .filter(|&at| at > taken)
        .expect(&shown);
    assert!(shown.contains(" of 700.0 MiB · "), "{shown}");
    // Given back before the summary: the whole terminal scrolls again.
    let given_back = shown.rfind("\x1b[r").expect(&shown);
    let summary = shown.find("3 jobs in").expect(&shown);
    assert!(status < given_back && given_back < summary, "{shown}");
    for object in ["o0.o", "o1.o", "o2.o"] {
        assert!(dir.path().join(object).exists(), "{object}: {shown}");
    }
}

#[test]
fn a_build_whose_stderr_is_not_a_terminal_shows_no_status() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path());
    let mut command = Command::new(HEADROOM);
    command.args(BUILD.split(' '));
    reliability::isolate(&mut command, dir.path());
    let output = command.stdin(Stdio::null()).output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("3 jobs in"), "the summary: {said}");
    assert!(
        !said.contains('\r') && !said.contains('\x1b'),
        "no status drawn: {said:?}"
    );
}

/// A compiler colours its diagnostics when its stderr is a terminal. Its shim reads what it
/// writes, through a pipe, which made a governed g++ on a terminal print plain text; on a
/// terminal the shim now gives it a terminal of its own, and its diagnostics reach the
/// user's terminal byte for byte as without headroom.
#[test]
fn a_compilers_diagnostics_on_a_terminal_are_as_without_headroom() {
    if !support::have(&["script", "stty", "g++"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    reliability::project(dir.path(), 0, "");
    // The real g++, not the project's stand-in.
    std::fs::remove_file(dir.path().join("bin/g++")).unwrap();
    std::fs::write(dir.path().join("err.cpp"), "int main() { return x; }\n").unwrap();
    let on_a_terminal = |command: &str| {
        let mut script = Command::new("script");
        script.args(["-qec", &format!("stty cols 100; {command}"), "/dev/null"]);
        reliability::isolate(&mut script, dir.path());
        let output = script.stdin(Stdio::null()).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let compile = "g++ -c err.cpp -o err.o";
    let alone = on_a_terminal(compile);
    assert!(alone.contains("\x1b[01;31m\x1b[Kerror"), "{alone:?}");
    let governed = on_a_terminal(&format!("{HEADROOM} build -- {compile}"));
    assert!(governed.contains(&alone), "{alone:?}\n{governed:?}");
    assert!(governed.contains("1 jobs in"), "{governed}");
}
