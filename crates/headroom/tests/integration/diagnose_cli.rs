//! `headroom diagnose` end to end: the built binary on logs, stdin, bad bytes, a real
//! `headroom run` report and this machine's kernel log, with the exit-status policy.

use crate::support;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::{assert_printed, assert_said, stderr, stdout};

/// A fresh directory for one test; the binary runs in it.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new() -> Scratch {
        Scratch(tempfile::tempdir().expect("a temporary directory"))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = support::headroom(args);
        command.current_dir(self.0.path());
        command
    }

    fn headroom(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run headroom")
    }

    /// `headroom ARGS` with `input` on stdin.
    fn headroom_with_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run headroom");
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", stdout(output)))
}

/// A ninja build whose cc1plus the kernel killed: g++ says so first, dmesg's lines follow.
const BUILD_LOG: &str = "\
[1/412] Building CXX object src/CMakeFiles/core.dir/tensor.cpp.o
[2/412] Building CXX object src/CMakeFiles/core.dir/autograd.cpp.o
FAILED: src/CMakeFiles/core.dir/autograd.cpp.o
g++: fatal error: Killed signal terminated program cc1plus
compilation terminated.
ninja: build stopped: subcommand failed.
[ 1638.901233] cc1plus invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0
[ 1638.977120] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=cc1plus,pid=9253,uid=1000
[ 1638.977956] Out of memory: Killed process 9253 (cc1plus) total-vm:3970108kB, anon-rss:3090636kB, file-rss:4kB, shmem-rss:0kB, UID:1000 pgtables:6548kB oom_score_adj:0
";

#[test]
fn the_kernel_kill_is_the_root_cause_of_a_killed_compiler() {
    let scratch = Scratch::new();
    scratch.write("build.log", BUILD_LOG);
    let output = scratch.headroom(&["diagnose", "build.log"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    let kernel = text
        .find("1. killed by the kernel OOM killer — root cause")
        .unwrap_or_else(|| panic!("the kernel kill comes first:\n{text}"));
    let compiler = text
        .find("2. compiler process killed")
        .unwrap_or_else(|| panic!("then the compiler's report:\n{text}"));
    assert!(kernel < compiler);
    for expected in [
        "build.log:9: [ 1638.977956] Out of memory: Killed process 9253 (cc1plus)",
        "process   cc1plus, pid 9253, 2.95 GiB resident when killed",
        "limit     the whole machine ran out of memory",
        "build.log:4: g++: fatal error: Killed signal terminated program cc1plus",
        "advice",
    ] {
        assert!(text.contains(expected), "`{expected}` in:\n{text}");
    }
}

#[test]
fn stdin_is_read_without_a_file_and_for_a_dash() {
    let scratch = Scratch::new();
    for args in [&["diagnose"][..], &["diagnose", "-"][..]] {
        let output = scratch.headroom_with_stdin(args, BUILD_LOG.as_bytes());
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
        assert!(text.contains("<stdin>:9: [ 1638.977956]"), "{text}");
    }
}

#[test]
fn json_has_files_findings_and_a_summary() {
    let scratch = Scratch::new();
    scratch.write("build.log", BUILD_LOG);
    scratch.write("disk.log", "OSError: [Errno 28] No space left on device\n");
    let output = scratch.headroom(&["diagnose", "--json", "disk.log", "build.log"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = json(&output);
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[1]["file"], "build.log");
    assert_eq!(files[1]["format"], "log");
    assert_eq!(files[1]["lines"], 9);
    assert_eq!(files[1]["findings"], 2);
    assert_eq!(files[1]["oom_kills"].as_array().unwrap().len(), 1);
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 3);
    // Root cause first across files: the memory failures of the second file before the
    // first file's full disk.
    let root = &findings[0];
    assert_eq!(root["file"], "build.log");
    assert_eq!(root["line"], 9);
    assert_eq!(root["kind"], "kernel_oom_kill");
    assert_eq!(root["is_memory"], true);
    assert_eq!(root["process"]["name"], "cc1plus");
    assert_eq!(root["process"]["pid"], 9253);
    assert_eq!(root["process"]["rss_bytes"], (3_090_636u64 + 4) << 10);
    assert_eq!(root["constraint"], "machine");
    assert!(root["advice"].as_str().unwrap().contains("lower"));
    assert_eq!(findings[1]["kind"], "compiler_killed");
    assert_eq!(findings[2]["file"], "disk.log");
    assert_eq!(findings[2]["kind"], "disk_full");
    assert_eq!(findings[2]["is_memory"], false);
    let summary = &report["summary"];
    assert_eq!(summary["findings"], 3);
    assert_eq!(summary["memory"], 2);
    assert_eq!(summary["root_cause"], "killed by the kernel OOM killer");
    assert_eq!(summary["exit_code"], 0);
}

/// `headroom ARGS`: its exit status, its stdout, and the most memory it held (its peak
/// resident set), which `wait4` reports for that one child.
#[expect(clippy::zombie_processes, reason = "wait4 reaps the child")]
fn headroom_with_peak_memory(scratch: &Scratch, args: &[&str]) -> (i32, Vec<u8>, u64) {
    let mut child = scratch
        .command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run headroom");
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child, with pointers to live locals.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if waited == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        assert_eq!(err.kind(), std::io::ErrorKind::Interrupted, "wait4: {err}");
    }
    assert!(
        libc::WIFEXITED(status),
        "headroom {args:?} ended with status {status:#x}"
    );
    // Linux counts ru_maxrss in KiB.
    (
        libc::WEXITSTATUS(status),
        out,
        usage.ru_maxrss as u64 * 1024,
    )
}

#[test]
fn memory_does_not_grow_with_repeated_kernel_kills() {
    const KILLS: u64 = 60_000;
    let scratch = Scratch::new();
    let kill = |pid: u64| {
        format!(
            "[{pid}.000001] Out of memory: Killed process {pid} (cc1plus) total-vm:6084172kB, \
anon-rss:5342044kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:11000kB oom_score_adj:0\n"
        )
    };
    scratch.write("one.log", kill(1));
    let many: String = (1..=KILLS).map(kill).collect();
    scratch.write("many.log", many);
    let (code, _, one_peak) =
        headroom_with_peak_memory(&scratch, &["diagnose", "--json", "one.log"]);
    assert_eq!(code, 0);
    let (code, out, many_peak) =
        headroom_with_peak_memory(&scratch, &["diagnose", "--json", "many.log"]);
    assert_eq!(code, 0);
    // Kept whole, each kill cost about 400 bytes (24 MiB here, 2 GiB for 5 million).
    let growth = many_peak.saturating_sub(one_peak);
    assert!(
        growth < 8 << 20,
        "{KILLS} kills took {} MiB more than one ({} MiB)",
        growth >> 20,
        one_peak >> 20
    );
    let report: Value = serde_json::from_slice(&out).unwrap();
    let file = &report["files"][0];
    assert_eq!(file["oom_kill_count"], KILLS);
    let kept: Vec<_> = file["oom_kills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kill| kill["victim"]["pid"].clone())
        .collect();
    assert_eq!(kept, [1, KILLS], "the first and the last kill are kept");
    assert_eq!(report["findings"][0]["count"], KILLS);
}

#[test]
fn each_exit_status_of_the_policy() {
    let scratch = Scratch::new();
    scratch.write(
        "oom.log",
        "Traceback (most recent call last):\nMemoryError\n",
    );
    scratch.write("disk.log", "OSError: [Errno 28] No space left on device\n");
    scratch.write("clean.log", "[1/1] Linking CXX executable app\nall good\n");
    let code = |args: &[&str]| scratch.headroom(args).status.code();
    assert_eq!(code(&["diagnose", "oom.log"]), Some(0), "memory");
    assert_eq!(code(&["diagnose", "disk.log"]), Some(1), "not memory");
    assert_eq!(
        code(&["diagnose", "disk.log", "oom.log"]),
        Some(0),
        "any memory"
    );
    assert_eq!(code(&["diagnose", "clean.log"]), Some(3), "nothing");
    let nothing = scratch.headroom(&["diagnose", "clean.log"]);
    assert_printed(&nothing, "nothing recognised");
    let missing = scratch.headroom(&["diagnose", "oom.log", "no-such.log"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_said(&missing, "cannot read no-such.log: No such file");
    assert!(missing.stdout.is_empty(), "no half report before the error");
}

#[test]
fn an_unreadable_file_is_named_with_the_reason() {
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.path("logs")).unwrap();
    let output = scratch.headroom(&["diagnose", "logs"]);
    assert_eq!(output.status.code(), Some(2));
    assert_said(&output, "cannot read logs: Is a directory");
    let secret = scratch.write("secret.log", "MemoryError\n");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    if std::fs::File::open(&secret).is_ok() {
        headroom_testkit::skip("unprivileged", "this user (root?) reads a mode-000 file");
        return;
    }
    let output = scratch.headroom(&["diagnose", "secret.log"]);
    assert_eq!(output.status.code(), Some(2));
    assert_said(&output, "cannot read secret.log: Permission denied");
}

#[test]
fn bad_bytes_never_break_it() {
    let scratch = Scratch::new();
    let mut log: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    log.extend_from_slice(b"\n\xff\xfe\xfd not utf-8 \xc3\x28\r\n");
    // A 5 MB line with no newline inside, then a coloured, CRLF-ended CUDA OOM.
    log.extend(std::iter::repeat_n(b'x', 5 << 20));
    log.extend_from_slice(b"\r\n\x1b[1;31mtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.32 GiB is free.\x1b[0m\r\n");
    log.extend_from_slice(b"\x00\x07\x08 trailing garbage without a newline \xff");
    scratch.write("garbage.log", &log);
    let output = scratch.headroom(&["diagnose", "garbage.log"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    assert!(
        text.contains("1. CUDA out of memory — root cause"),
        "{text}"
    );
    assert!(
        text.contains("asked for 2.00 GiB · 1.32 GiB free of 23.7 GiB · on device 0"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "no escape codes reach the terminal");
    assert!(!text.contains('\r'));

    // Garbage alone: nothing recognised, no panic, whatever the bytes. A quarter MiB, because
    // the rule set goes through random non-ASCII bytes far slower than through text.
    let noise: Vec<u8> = (0..256_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    scratch.write("noise.bin", &noise);
    let output = scratch.headroom(&["diagnose", "--json", "noise.bin"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert_eq!(json(&output)["summary"]["findings"], 0);
    assert!(!stderr(&output).contains("panicked"));
}

#[test]
fn a_stage_marker_names_the_stage_of_a_failure() {
    let scratch = Scratch::new();
    scratch.write(
        "ci.log",
        "##headroom stage compile\r\n[1/2] g++ -c a.cc\r\n##headroom stage link\r\n\
collect2: fatal error: ld terminated with signal 9 [Killed]\r\n",
    );
    let output = scratch.headroom(&["diagnose", "--json", "ci.log"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = json(&output);
    let finding = &report["findings"][0];
    assert_eq!(finding["stage"], "link", "{report:#}");
    assert_eq!(finding["line"], 4);
    let text = stdout(&scratch.headroom(&["diagnose", "ci.log"]));
    assert!(text.contains("stage     link"), "{text}");
}

#[test]
fn a_run_report_lists_each_rungs_diagnosis_with_its_stage() {
    let scratch = Scratch::new();
    let run = scratch.headroom(&[
        "run",
        "--json",
        "run.json",
        "--fallback",
        "SMALLER=1",
        "--",
        "sh",
        "-c",
        "echo '##headroom stage load'; echo 'Traceback (most recent call last):'; echo MemoryError >&2; exit 1",
    ]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let output = scratch.headroom(&["diagnose", "run.json"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    assert!(text.contains("`headroom run` report, 2 rungs"), "{text}");
    assert!(
        text.contains("1. Python MemoryError — root cause"),
        "{text}"
    );
    assert!(text.contains("run.json: rung 0 (`sh -c"), "{text}");
    assert!(
        text.contains("run.json: rung 1 (`SMALLER=1 sh -c"),
        "{text}"
    );
    assert!(text.contains("stage     load"), "{text}");

    let report = json(&scratch.headroom(&["diagnose", "--json", "run.json"]));
    assert_eq!(report["files"][0]["format"], "run_report");
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 2);
    assert_eq!(findings[0]["rung"], 0);
    assert_eq!(findings[0]["stage"], "load");
    assert_eq!(findings[0]["kind"], "python_memory_error");
}

/// Writes a made-up OOM kill into the kernel log and finds it with `--kernel-log`, where this
/// user may write `/dev/kmsg` (root); elsewhere checks that the command says why it cannot read
/// the log, if it cannot.
#[test]
fn kernel_log_lists_a_kill_written_to_kmsg() {
    let scratch = Scratch::new();
    let pid = std::process::id();
    let line = format!(
        "Out of memory: Killed process {pid} (headroom-test) total-vm:1000kB, anon-rss:2048kB, file-rss:0kB, shmem-rss:0kB, UID:0\n"
    );
    // A fake OOM kill in a machine's kernel log can set off its monitoring: only machines
    // that say so (CI's, `.ci/run`) get one.
    let written = if std::env::var_os("HEADROOM_TEST_WRITE_KMSG").is_some() {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .and_then(|mut kmsg| kmsg.write_all(line.as_bytes()))
    } else {
        Err(std::io::Error::other(
            "HEADROOM_TEST_WRITE_KMSG is not set, so no fake kill is written to this machine's log",
        ))
    };
    let output = scratch.headroom(&["diagnose", "--kernel-log", "--json"]);
    if let Err(e) = written {
        headroom_testkit::skip(
            "root",
            format!("the kill check: cannot write /dev/kmsg ({e}); writing needs root"),
        );
        match output.status.code() {
            Some(0 | 3) => {
                json(&output);
            }
            Some(2) => assert!(
                stderr(&output).contains("cannot read the kernel log"),
                "{}",
                stderr(&output)
            ),
            other => panic!("exit {other:?}: {}", stderr(&output)),
        }
        return;
    }
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = json(&output);
    let kill = report["kills"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|kill| kill["process"]["name"] == "headroom-test" && kill["process"]["pid"] == pid)
        .unwrap_or_else(|| panic!("the kill written to /dev/kmsg is listed: {report:#}"));
    assert_eq!(kill["process"]["rss_bytes"], 2048 << 10);
    assert!(kill["time"].as_str().unwrap().ends_with('Z'), "{kill:#}");
    assert!(kill["constraint"].is_null(), "the line names no limit");
    let text = stdout(&scratch.headroom(&["diagnose", "--kernel-log"]));
    assert!(
        text.contains(&format!(
            "headroom-test, pid {pid}, 2.00 MiB resident when killed"
        )),
        "{text}"
    );
}

#[test]
fn kernel_log_and_files_do_not_mix() {
    let scratch = Scratch::new();
    let output = scratch.headroom(&["diagnose", "--kernel-log", "build.log"]);
    assert_eq!(output.status.code(), Some(2));
    assert_said(&output, "cannot be used with");
}
