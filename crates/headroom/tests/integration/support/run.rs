//! Shared helpers for the `headroom run` integration tests: the built binary, a scratch
//! directory, and a small Python program that allocates known amounts in named stages.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;

/// Allocates and touches `MB` MiB per stage (`0` frees everything held), then sleeps.
/// Usage: `alloc.py NAME:MB:SECONDS ...`; prints `##headroom stage NAME` at each stage, then
/// waits 50 ms so the stage's entry memory is measured before the allocation starts (headroom
/// samples a few milliseconds after the marker arrives).
const ALLOC_PY: &str = r###"
import sys, time
held = []
for spec in sys.argv[1:]:
    name, mb, seconds = spec.split(":")
    print("##headroom stage " + name, flush=True)
    time.sleep(0.05)
    if int(mb) == 0:
        held.clear()
    else:
        block = bytearray(int(mb) << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        held.append(block)
        del block
    time.sleep(float(seconds))
"###;

pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    /// A scratch directory for a test that runs python3; `None`, saying why the test skips,
    /// where python3 is missing.
    pub fn with_python() -> Option<Scratch> {
        have_python().then(Scratch::new)
    }

    pub fn new() -> Scratch {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("alloc.py"), ALLOC_PY).expect("write alloc.py");
        Scratch { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn alloc_py(&self) -> String {
        self.path("alloc.py").display().to_string()
    }

    /// `headroom ARGS…` in the scratch directory, ready to run.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_of(Path::new(crate::support::HEADROOM), args)
    }

    /// `BINARY ARGS…`, a copy of headroom, in the scratch directory, ready to run.
    pub fn command_of(&self, binary: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(binary);
        // The run's governor keeps its history and socket in the scratch directory.
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("HEADROOM_STATE_DIR", self.path("state"))
            .env("XDG_RUNTIME_DIR", self.path("run"))
            .env_remove("HEADROOM_BUDGET");
        command
    }

    /// `headroom run --json r.json ARGS…` in the scratch directory, run to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.headroom(&[&["run", "--json", "r.json"], args].concat())
    }

    /// [`Scratch::run`], which must succeed; how it ended and its report.
    pub fn run_ok(&self, args: &[&str]) -> (Output, serde_json::Value) {
        let output = self.run(args);
        assert!(output.status.success(), "{}", super::stderr(&output));
        (output, self.json("r.json"))
    }

    /// `headroom ARGS…` in the scratch directory, run to its end.
    pub fn headroom(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run headroom")
    }

    /// `headroom ARGS…` started in the scratch directory, its stdout and stderr piped.
    pub fn spawn_piped(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start headroom")
    }

    pub fn json(&self, name: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(self.path(name)).expect("report written");
        serde_json::from_str(&text).expect("report is JSON")
    }
}

/// Whether python3 is here; prints why a test skips when not.
pub fn have_python() -> bool {
    let ok = Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        headroom_testkit::skip("python3", "python3 is not installed");
    }
    ok
}

/// Whether this machine lets us make a memory-limited cgroup; prints why a test skips when not.
pub fn can_make_cgroups() -> bool {
    super::limited_cgroup("probe", 64 * MIB).is_some_and(|cgroup| cgroup.remove().is_ok())
}

pub fn stage<'a>(report: &'a serde_json::Value, rung: usize, name: &str) -> &'a serde_json::Value {
    report["rungs"][rung]["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {}", report["rungs"][rung]["stages"]))
}

pub fn bytes(value: &serde_json::Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a byte count: {value}"))
}

/// Waits for `child` to exit, at most `limit`; `None` while it still runs after that.
pub fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for headroom") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
