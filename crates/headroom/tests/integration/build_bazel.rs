//! `headroom build -- bazel build …` with a real Bazel (Debian's `bazel-bootstrap`, offline):
//! every compile of a small cc_library/cc_binary workspace is a governed job with a peak
//! the governor measured, whether the Bazel server starts with the build or was running
//! before it; a governed build that Bazel finds cached reruns nothing and says that headroom
//! governed no compile. Each test uses an output root of its own in its temp dir, and shuts
//! its server down. Skips, saying why, where `bazel` is not installed.

use crate::support::{self, fakecc};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fakecc::command_in;
use headroom_store::BuildReport;
use support::HEADROOM;

/// Translation units of the library; the binary adds `main.cc` and its link.
const UNITS: usize = 7;
/// Where Debian's Bazel keeps the `platforms` repository it needs offline.
const PLATFORMS: &str = "/usr/share/bazel/platforms";

/// A workspace in a temp dir: the library and binary, and stand-ins for `rules_cc` and
/// `rules_java` that re-export Bazel 4's native rules, which Bazel cannot fetch offline.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    /// `None`, after saying why, where Bazel is missing.
    fn new() -> Option<Workspace> {
        if Command::new("bazel").arg("--version").output().is_err()
            || !Path::new(PLATFORMS).is_dir()
        {
            headroom_testkit::skip(
                "bazel",
                "Debian's bazel (apt-get install bazel-bootstrap) is not installed",
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("ws/WORKSPACE", "workspace(name = \"governed\")\n");
        let mut sources = Vec::new();
        let mut main = String::new();
        for unit in 1..=UNITS {
            write(
                &format!("ws/unit{unit}.cc"),
                &format!("#include <map>\n#include <string>\nint unit{unit}() {{ std::map<std::string, int> m{{{{\"a\", {unit}}}}}; return m[\"a\"]; }}\n"),
            );
            sources.push(format!("\"unit{unit}.cc\""));
            main += &format!("int unit{unit}();\n");
        }
        main += "int main() { return unit1() - 1; }\n";
        write("ws/main.cc", &main);
        write(
            "ws/BUILD",
            &format!(
                "cc_library(name = \"units\", srcs = [{}])\n\
                 cc_binary(name = \"app\", srcs = [\"main.cc\"], deps = [\":units\"])\n",
                sources.join(", ")
            ),
        );
        let rules = |name: &str, package: &str, symbols: &[&str]| {
            write(
                &format!("{name}/WORKSPACE"),
                &format!("workspace(name = \"{name}\")\n"),
            );
            write(&format!("{name}/BUILD"), "");
            write(&format!("{name}/{package}/BUILD"), "");
            let defs: String = symbols
                .iter()
                .map(|symbol| format!("{symbol} = native.{symbol}\n"))
                .collect();
            write(&format!("{name}/{package}/defs.bzl"), &defs);
        };
        rules(
            "rules_cc",
            "cc",
            &[
                "cc_binary",
                "cc_import",
                "cc_library",
                "cc_proto_library",
                "cc_test",
                "cc_toolchain",
                "cc_toolchain_suite",
                "objc_library",
            ],
        );
        rules(
            "rules_java",
            "java",
            &[
                "java_binary",
                "java_import",
                "java_library",
                "java_proto_library",
                "java_runtime",
                "java_test",
                "java_toolchain",
            ],
        );
        Some(Workspace { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `bazel --output_user_root=… COMMAND`, with the stand-in repositories for `build`.
    fn bazel(&self, command: &str) -> Vec<String> {
        let mut line = vec![
            "bazel".to_string(),
            format!("--output_user_root={}", self.path("root").display()),
            // A server a failed test leaves behind ends by itself.
            "--max_idle_secs=600".to_string(),
            command.to_string(),
        ];
        if command == "build" {
            for (name, dir) in [
                ("rules_cc", self.path("rules_cc")),
                ("rules_java", self.path("rules_java")),
                ("platforms", PathBuf::from(PLATFORMS)),
            ] {
                line.push(format!("--override_repository={name}={}", dir.display()));
            }
            line.push("//:app".to_string());
        }
        line
    }

    fn run(&self, line: &[String]) -> Output {
        let output = command_in(&self.path("ws"), &line[0])
            .args(&line[1..])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{line:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// `headroom build --report … -- bazel … build`: its report and stderr.
    fn governed_build(&self, name: &str) -> (BuildReport, String) {
        let report = self.path(&format!("{name}.json"));
        let mut line = vec![
            HEADROOM.to_string(),
            "build".to_string(),
            format!("--report={}", report.display()),
            "--".to_string(),
        ];
        line.extend(self.bazel("build"));
        let output = self.run(&line);
        let report = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
        (report, String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = command_in(&self.path("ws"), "bazel")
            .args(&self.bazel("shutdown")[1..])
            .output();
    }
}

/// Every compile and the link of the workspace are jobs the governor admitted and measured
/// (a fresh output root adds the compiler probes of Bazel's toolchain configuration).
fn assert_all_governed(report: &BuildReport, stderr: &str) {
    let actions: Vec<&str> = report
        .jobs
        .iter()
        .map(|job| job.label.as_str())
        .filter(|label| label.starts_with("bazel-out/"))
        .collect();
    let objects = actions.iter().filter(|label| label.ends_with(".o")).count();
    assert_eq!(objects, UNITS + 1, "every compile is a job: {stderr}");
    assert_eq!(actions.len(), UNITS + 2, "and the link: {stderr}");
    for job in &report.jobs {
        assert!(job.peak > 0, "{} has a peak: {stderr}", job.label);
    }
    // Sampled while the jobs ran: the governor saw their processes, not a sandbox's pids.
    assert!(
        report.build.peak_total.unwrap_or(0) > 0,
        "the governor sampled the jobs: {stderr}"
    );
}

#[test]
fn compiles_are_governed_when_the_server_starts_with_the_build() {
    let Some(workspace) = Workspace::new() else {
        return;
    };
    let (report, stderr) = workspace.governed_build("fresh");
    assert_all_governed(&report, &stderr);
}

#[test]
fn compiles_are_governed_by_a_server_started_before_and_stay_cached() {
    let Some(workspace) = Workspace::new() else {
        return;
    };
    workspace.run(&workspace.bazel("info"));
    let (report, stderr) = workspace.governed_build("running");
    assert_all_governed(&report, &stderr);

    // The actions' environment is the same in every governed build: nothing reruns, and the
    // summary does not read like a governed build.
    let (cached, stderr) = workspace.governed_build("cached");
    assert!(cached.jobs.is_empty(), "nothing reran: {stderr}");
    assert!(
        stderr.contains("governed 0 compiles of this Bazel build"),
        "{stderr}"
    );
}
