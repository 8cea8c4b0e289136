//! Shared history end to end: a project built on one "machine" (a checkout, a state directory
//! and a home of its own), its peaks pushed to a real store, and a checkout of the same project
//! elsewhere, on a "new machine" with an empty state directory, pulling them. Its first build
//! must predict every job from shared history: none starts on the default estimate. The
//! projects are real CMake + Ninja trees, configured outside headroom and compiled by the real
//! g++, called by another path on each machine.

use crate::support::{self, stores};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use headroom_store::BuildReport;
use stores::{Kind, Server, AWS_SECRET};

const UNITS: usize = 4;

/// One machine: a checkout of the project under `root`, with its own state and home.
struct Machine {
    root: PathBuf,
}

impl Machine {
    /// Writes the project under `root/…/proj` and configures it with CMake, compiler `cxx`.
    fn new(root: PathBuf, cxx: &str) -> Machine {
        let project = root.join("checkout/of/proj");
        std::fs::create_dir_all(project.join("src")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        // A headroom.toml marks the project's root, as a .git would.
        std::fs::write(project.join("headroom.toml"), "").unwrap();
        let mut sources = Vec::new();
        for unit in 0..UNITS {
            // Units of different weights: each a few templates deep.
            let depth = 20 + 40 * unit;
            std::fs::write(
                project.join(format!("src/unit{unit}.cpp")),
                format!(
                    "#include <vector>\ntemplate <int N> struct D {{ static int v() {{ return D<N - 1>::v() + N; }} }};\ntemplate <> struct D<0> {{ static int v() {{ return 0; }} }};\nint unit{unit}() {{ std::vector<int> v(3); return D<{depth}>::v() + int(v.size()); }}\n"
                ),
            )
            .unwrap();
            sources.push(format!("src/unit{unit}.cpp"));
        }
        let calls: String = (0..UNITS).map(|u| format!("unit{u}() + ")).collect();
        let declarations: String = (0..UNITS).map(|u| format!("int unit{u}();\n")).collect();
        std::fs::write(
            project.join("src/main.cpp"),
            format!("{declarations}int main() {{ return ({calls}0) == 0; }}\n"),
        )
        .unwrap();
        std::fs::write(
            project.join("CMakeLists.txt"),
            format!(
                "cmake_minimum_required(VERSION 3.16)\nproject(proj CXX)\nadd_executable(app src/main.cpp {})\n",
                sources.join(" ")
            ),
        )
        .unwrap();
        let machine = Machine { root };
        let configured = Command::new("cmake")
            .args(["-G", "Ninja", "-S", ".", "-B", "build"])
            .arg(format!("-DCMAKE_CXX_COMPILER={cxx}"))
            .current_dir(machine.project())
            .env("HOME", machine.root.join("home"))
            .output()
            .unwrap();
        assert!(
            configured.status.success(),
            "{}",
            support::text(&configured.stderr)
        );
        machine
    }

    fn project(&self) -> PathBuf {
        self.root.join("checkout/of/proj")
    }

    /// `headroom ARGS…` in the project, with this machine's state and home, and nothing from
    /// the machine that runs the test.
    fn headroom(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = support::headroom(args);
        command
            .current_dir(self.project())
            .env("HEADROOM_STATE_DIR", self.root.join("state"))
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("HOME", self.root.join("home"))
            .env("HEADROOM_CONFIG", "/dev/null")
            .env("AWS_ACCESS_KEY_ID", "headroom-test")
            .env("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
            .env("AWS_CONFIG_FILE", self.root.join("no-aws-config"))
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                self.root.join("no-aws-credentials"),
            );
        command
    }

    /// A clean build under headroom, and its report.
    fn build(&self) -> BuildReport {
        let _ = std::fs::remove_file(self.project().join("build/app"));
        let clean = Command::new("ninja")
            .args(["-C", "build", "-t", "clean"])
            .current_dir(self.project())
            .output()
            .unwrap();
        assert!(clean.status.success());
        let report = self.root.join("report.json");
        let built = self.headroom(&[
            "build",
            "--report",
            report.to_str().unwrap(),
            "--",
            "ninja",
            "-C",
            "build",
        ]);
        assert!(built.status.success(), "{}", support::text(&built.stderr));
        let report: BuildReport = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert_eq!(
            report.jobs.len(),
            UNITS + 2,
            "every compile and the link is a job: {:?}; outside admission: {:?}; stderr: {}",
            report.jobs.iter().map(|job| &job.label).collect::<Vec<_>>(),
            report.outside,
            support::text(&built.stderr)
        );
        report
    }
}

fn sources(report: &BuildReport) -> Vec<&str> {
    report
        .jobs
        .iter()
        .map(|job| job.prediction_source.as_str())
        .collect()
}

fn tools_missing() -> bool {
    let missing: Vec<&str> = ["cmake", "ninja", "/usr/bin/g++", "/usr/bin/c++"]
        .into_iter()
        .filter(|tool| {
            Command::new(tool)
                .arg("--version")
                .output()
                .map_or(true, |o| !o.status.success())
        })
        .collect();
    for tool in &missing {
        let requirement = tool.trim_start_matches("/usr/bin/");
        headroom_testkit::skip(
            requirement,
            format!("{tool} is not installed (apt-get install cmake ninja-build g++)"),
        );
    }
    !missing.is_empty()
}

/// CI's machine builds and pushes; a new machine pulls, and its first build is predicted from
/// shared history alone.
fn a_new_machine_starts_warm(kind: Kind) {
    if tools_missing() {
        return;
    }
    let Some(server) = Server::start(kind) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ci = Machine::new(dir.path().join("ci"), "/usr/bin/g++");
    let cold = ci.build();
    assert!(sources(&cold).contains(&"default"), "{:?}", sources(&cold));
    let pushed = ci.headroom(&["history", "push", "--store", &server.url, "--json"]);
    assert!(pushed.status.success(), "{}", support::text(&pushed.stderr));
    let pushed: serde_json::Value = serde_json::from_slice(&pushed.stdout).unwrap();
    assert_eq!(pushed["project"], "proj");
    assert_eq!(pushed["summary"]["entries"], UNITS + 2);

    // Another checkout path, another home, another path to the same compiler, no history.
    let laptop = Machine::new(dir.path().join("laptop/elsewhere"), "/usr/bin/c++");
    let pulled = laptop.headroom(&["history", "pull", "--store", &server.url]);
    assert!(pulled.status.success(), "{}", support::text(&pulled.stderr));
    assert!(
        support::text(&pulled.stdout).contains(&format!("pulled {} measured peaks", UNITS + 2)),
        "{}",
        support::text(&pulled.stdout)
    );
    let first = laptop.build();
    assert_eq!(sources(&first), vec!["shared"; UNITS + 2]);
    for job in &first.jobs {
        let measured = cold.jobs.iter().find(|j| j.label == job.label).unwrap();
        assert!(
            job.predicted >= measured.peak,
            "{} predicted at {} though it peaked at {} on CI",
            job.label,
            job.predicted,
            measured.peak
        );
    }
    // Its own measurements are newer from now on, and win.
    assert_eq!(sources(&laptop.build()), vec!["history"; UNITS + 2]);
    // And pulling again changes nothing.
    let again = laptop.headroom(&["history", "pull", "--store", &server.url, "--json"]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["summary"]["taken"]["kept"], UNITS + 2);
}

#[test]
fn a_new_machine_starts_warm_from_a_directory_store() {
    a_new_machine_starts_warm(Kind::Directory);
}

#[test]
fn a_new_machine_starts_warm_from_an_s3_store() {
    a_new_machine_starts_warm(Kind::S3);
}

#[test]
fn a_store_that_is_down_or_corrupt_leaves_the_history_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let machine = Machine {
        root: dir.path().to_path_buf(),
    };
    std::fs::create_dir_all(machine.project()).unwrap();
    let (down, _closed) = stores::down_url(Kind::S3, dir.path());
    let pulled = machine.headroom(&["history", "pull", "--store", &down]);
    assert!(pulled.status.success(), "{}", support::text(&pulled.stderr));
    let warning = support::text(&pulled.stderr);
    assert!(
        warning.contains("warning") && warning.contains("going on with the local history"),
        "{warning}"
    );
    assert_eq!(warning.lines().count(), 1, "one warning: {warning}");

    let store = dir.path().join("store");
    let index = store.join("history/v1/proj.json");
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    std::fs::write(&index, "{\"format\": \"headroom-history\", \"vers").unwrap();
    let url = format!("file://{}", store.display());
    let pulled = machine.headroom(&["history", "pull", "--store", &url]);
    assert!(pulled.status.success(), "{}", support::text(&pulled.stderr));
    assert!(
        support::text(&pulled.stderr).contains("not a shared-history index"),
        "{}",
        support::text(&pulled.stderr)
    );
    let bad = machine.headroom(&["history", "push", "--store", &url, "--project", "../x"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        support::text(&bad.stderr).contains("--project"),
        "{}",
        support::text(&bad.stderr)
    );
    let none = machine.headroom(&["history", "pull"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        support::text(&none.stderr).contains("HEADROOM_HISTORY_STORE")
            && support::text(&none.stderr).contains("[build]"),
        "{}",
        support::text(&none.stderr)
    );
    assert!(Path::new(&dir.path().join("state/history.sqlite")).exists());
}

/// Eight machines push their own peaks of one project at once: every peak is in the store
/// afterwards, however their merges interleaved.
#[test]
fn eight_concurrent_pushers_lose_no_peak() {
    let Some(server) = Server::start(Kind::S3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    const PUSHERS: usize = 8;
    const PEAKS_EACH: usize = 5;
    let machines: Vec<Machine> = (0..PUSHERS)
        .map(|index| {
            let machine = Machine {
                root: dir.path().join(format!("machine{index}")),
            };
            std::fs::create_dir_all(machine.project()).unwrap();
            std::fs::create_dir_all(machine.root.join("state")).unwrap();
            let mut history =
                headroom_store::History::open(&machine.root.join("state/history.sqlite")).unwrap();
            let build = history.begin_build(&build_record()).unwrap();
            for job in 0..PEAKS_EACH {
                let portable_key = format!("{index:08x}{job:08x}");
                let record = job_record(job as u64, (1 + job as u64) << 20);
                history
                    .record_job(build, &record, &portable_key, None)
                    .unwrap();
            }
            machine
        })
        .collect();
    let pushers: Vec<std::thread::JoinHandle<Output>> = machines
        .iter()
        .map(|machine| {
            let mut command = machine.command(&["history", "push", "--store", &server.url]);
            std::thread::spawn(move || command.output().unwrap())
        })
        .collect();
    for pusher in pushers {
        let pushed = pusher.join().unwrap();
        assert!(pushed.status.success(), "{}", support::text(&pushed.stderr));
    }
    let reader = Machine {
        root: dir.path().join("reader"),
    };
    std::fs::create_dir_all(reader.project()).unwrap();
    let pulled = reader.headroom(&["history", "pull", "--store", &server.url, "--json"]);
    assert!(pulled.status.success(), "{}", support::text(&pulled.stderr));
    let pulled: serde_json::Value = serde_json::from_slice(&pulled.stdout).unwrap();
    assert_eq!(pulled["summary"]["entries"], PUSHERS * PEAKS_EACH);
    assert_eq!(pulled["summary"]["taken"]["new"], PUSHERS * PEAKS_EACH);
}

fn build_record() -> headroom_store::BuildRecord {
    headroom_store::BuildRecord {
        id: 0,
        started_unix_ms: 0,
        duration_ms: None,
        command: "make".into(),
        cwd: "/src".into(),
        budget: 1 << 30,
        budget_source: "test".into(),
        slots: 2,
        exit_code: None,
        peak_total: None,
        parallelism_set: Vec::new(),
    }
}

fn job_record(job_id: u64, peak: u64) -> headroom_store::JobRecord {
    headroom_store::JobRecord {
        job_id,
        key: format!("local{job_id}"),
        group: "g".into(),
        label: format!("unit{job_id}.o"),
        compiler: "/usr/bin/g++".into(),
        command: format!("g++ -c unit{job_id}.cpp -o unit{job_id}.o"),
        cwd: "/src".into(),
        end_ms: 1000,
        peak,
        cpu_ms: 900,
        exit_code: Some(0),
        predicted: peak,
        prediction_source: "default".into(),
        attempts: 1,
        ..headroom_store::JobRecord::default()
    }
}
