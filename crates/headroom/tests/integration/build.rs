//! `headroom build` end to end: the real binary, real `make`, real processes, and the fake
//! compiler (`headroom-fakecc`, linked as `g++` first on PATH) that allocates what it is told.

use crate::support::{self, fakecc, reliability};

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use headroom_store::BuildReport;
use reliability::{below, compilers, output_within_patience, process_state, shims, wait_until};
use support::{assert_said, stderr};

const MIB: u64 = 1 << 20;

/// A fresh project directory with its own history and a `bin/` holding the fake `g++`.
/// The jobs of a Makefile whose objects all compile with the same fake-compiler `args`.
fn each<'a>(objects: &[&'a str], args: &str) -> Vec<(&'a str, String)> {
    objects.iter().map(|o| (*o, args.to_string())).collect()
}

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        std::os::unix::fs::symlink(fakecc::path(), dir.path().join("bin/g++")).unwrap();
        Project { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).unwrap();
    }

    /// A Makefile with one fake compile per `(object, recipe arguments)`.
    fn makefile(&self, jobs: &[(&str, String)]) {
        let objects: Vec<&str> = jobs.iter().map(|(o, _)| *o).collect();
        let mut text = format!("all: {}\n", objects.join(" "));
        for (object, args) in jobs {
            text += &format!("{object}:\n\tg++ {args} -c {object}.cpp -o {object}\n");
        }
        self.write("Makefile", &text);
    }

    /// `headroom build ARGS…` in this project, with the fake compiler first on PATH.
    fn headroom(&self, args: &[&str]) -> Command {
        let mut command = self.command("build");
        command.args(args);
        command
    }

    /// `headroom SUBCOMMAND` in this project, with its own history and runtime directory and
    /// the fake compiler first on PATH.
    fn command(&self, subcommand: &str) -> Command {
        let mut command = support::headroom_in(self.dir.path(), &[subcommand]);
        command
            .env("HEADROOM_SAMPLE_INTERVAL_MS", "20")
            .env("HOME", self.dir.path());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.headroom(args).output().unwrap()
    }

    fn report(&self) -> BuildReport {
        serde_json::from_slice(&std::fs::read(self.path("report.json")).unwrap()).unwrap()
    }
}

/// The most jobs that ran at the same time, from the report's start and end times.
fn max_overlap(report: &BuildReport) -> usize {
    report
        .jobs
        .iter()
        .map(|a| {
            report
                .jobs
                .iter()
                .filter(|b| b.start_ms <= a.start_ms && a.start_ms < b.end_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn admits_by_predicted_peak_and_learns_from_history() {
    let project = Project::new();
    let jobs = each(
        &["a.o", "b.o", "c.o", "d.o", "e.o", "f.o"],
        "--mem 300 --ms 600",
    );
    project.makefile(&jobs);
    let build = [
        "--budget",
        "1000M",
        "--jobs",
        "4",
        "--report",
        "report.json",
        "--",
        "make",
    ];

    let cold = project.run(&build);
    assert!(cold.status.success(), "{}", stderr(&cold));
    let cold_report = project.report();
    assert_eq!(cold_report.jobs.len(), 6);
    assert!(cold_report
        .jobs
        .iter()
        .all(|j| j.peak >= 290 * MIB && j.exit_code == Some(0)));
    // Unknown jobs are predicted at 512 MiB, then at the learned 300 MiB + 15% with the first
    // job's profile: two at a time, more only while others are near their end.
    assert!(max_overlap(&cold_report) >= 2, "{:?}", cold_report.jobs);
    assert!(
        cold_report.build.peak_total.unwrap() <= 1000 * MIB,
        "{:?}",
        cold_report
    );
    assert!(cold_report
        .jobs
        .iter()
        .any(|j| j.prediction_source == "group"));

    std::fs::remove_file(project.path("a.o")).unwrap();
    for object in ["b.o", "c.o", "d.o", "e.o", "f.o"] {
        std::fs::remove_file(project.path(object)).unwrap();
    }
    let warm = project.run(&build);
    assert!(warm.status.success(), "{}", stderr(&warm));
    let warm_report = project.report();
    // Each job's own peak + 5% is known now: three fit in 1000M.
    assert!(
        warm_report
            .jobs
            .iter()
            .all(|j| j.prediction_source == "history"),
        "{:?}",
        warm_report.jobs
    );
    assert!(max_overlap(&warm_report) >= 3, "{:?}", warm_report.jobs);
    assert!(
        warm_report.build.peak_total.unwrap() <= 1000 * MIB,
        "{:?}",
        warm_report
    );
    let summary = stderr(&warm);
    assert!(
        summary.contains("headroom: 6 jobs") && summary.contains("a.o"),
        "{summary}"
    );
}

/// A project whose 1.5 s link waits on the shortest compile: b.o (1.2 s) starts first;
/// c.o (0.9 s) and a.o (0.3 s) wait for an ungoverned step, which ends once the governor
/// says b.o runs (at most 60 s), and then queue at once. a.o's path, with the link, is the
/// longest (1.8 s).
fn long_link_project() -> Project {
    let project = Project::new();
    let b_runs = format!(
        "for i in $$(seq 1200); do {} status --json | tr -d ' \\n' \
         | grep -q '\"label\":\"b.o\",\"state\":\"running\"' && break; sleep 0.05; done",
        support::HEADROOM
    );
    project.write(
        "Makefile",
        &format!(
            "all: b.o c.o tool\n\
             stamp:\n\t{b_runs}; touch stamp\n\
             tool: a.o\n\tg++ --ms 1500 -o tool a.o\n\
             a.o: stamp\n\tg++ --ms 300 -c a.cpp -o a.o\n\
             b.o:\n\tg++ --ms 1200 -c b.cpp -o b.o\n\
             c.o: stamp\n\tg++ --ms 900 -c c.cpp -o c.o\n"
        ),
    );
    project
}

/// Builds the long-link project from scratch with `headroom build FLAGS…`; returns the
/// report.
fn build_long_link(project: &Project, flags: &[&str]) -> BuildReport {
    build_long_link_with(project, flags, &[])
}

/// The same with the environment variables `vars` set for headroom.
fn build_long_link_with(project: &Project, flags: &[&str], vars: &[(&str, &str)]) -> BuildReport {
    for file in ["stamp", "a.o", "b.o", "c.o", "tool"] {
        let _ = std::fs::remove_file(project.path(file));
    }
    let output = project
        .headroom(flags)
        .args(["--report", "report.json", "--", "make"])
        .envs(vars.iter().copied())
        .env("MAKEFLAGS", "-j8")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    project.report()
}

#[test]
fn a_compile_that_a_long_link_waited_on_goes_first_next_time() {
    let project = long_link_project();
    // With one slot, c.o and a.o queue behind b.o: c.o is the longer compile, but the link
    // waits on a.o.
    build_long_link(&project, &["--jobs", "1"]);
    let warm = build_long_link(&project, &["--jobs", "1"]);
    let start = |label: &str| {
        warm.jobs
            .iter()
            .find(|job| job.label == label)
            .unwrap_or_else(|| panic!("no {label} in {:?}", warm.jobs))
            .start_ms
    };
    assert!(start("b.o") < start("a.o"), "{:?}", warm.jobs);
    assert!(start("a.o") < start("c.o"), "{:?}", warm.jobs);
}

#[test]
fn jobs_off_the_longest_path_run_nicer_next_time() {
    let project = long_link_project();
    let nice = |object: &str| -> u8 {
        fakecc::object_says(&project.path(object), "nice")
            .parse()
            .unwrap()
    };
    // Niceness is what priorities fall back to where no CPU cgroup can be made.
    let build =
        |flags: &[&str]| build_long_link_with(&project, flags, &[("HEADROOM_CPU_CGROUP", "0")]);
    // The first build knows no paths: every job runs at the normal priority.
    build(&["--jobs", "2"]);
    assert_eq!([nice("a.o"), nice("b.o"), nice("c.o")], [0, 0, 0]);
    // With two slots, whichever of a.o and c.o comes first starts beside b.o: c.o's path
    // (0.9 s) is shorter than b.o's (1.2 s) and a.o's (1.8 s) either way.
    let warm = build(&["--jobs", "2"]);
    assert_eq!(nice("a.o"), 0, "a.o is on the longest path");
    assert!(nice("c.o") > 0, "c.o is off the longest path");
    // The report says what each job ran at.
    for job in warm.jobs.iter().filter(|job| job.label.ends_with(".o")) {
        assert_eq!(job.nice, nice(&job.label), "{job:?}");
    }
    // Turned off, every job runs at the normal priority and the report says so.
    let off = build(&["--jobs", "2", "--no-priorities"]);
    assert_eq!([nice("a.o"), nice("b.o"), nice("c.o")], [0, 0, 0]);
    assert!(off.jobs.iter().all(|job| job.nice == 0), "{:?}", off.jobs);
}

/// Whether a cpu cgroup can be made here; says why the test skips where not.
fn cpu_cgroups_can_be_made() -> bool {
    match headroom_probe::cpu_share::CpuShare::create(1).map(|share| share.remove()) {
        Ok(()) => true,
        Err(why) => {
            headroom_testkit::skip(
                "cgroup-cpu",
                format!("no cpu cgroup can be made here: {why}"),
            );
            false
        }
    }
}

/// The builds' cgroup a compile of `project` ran in (`…/headroom-cpu-<pid>-build<n>`), by
/// what the fake compiler wrote into `object`.
fn builds_cgroup_of(project: &Project, object: &str) -> String {
    let cgroup = fakecc::object_says(&project.path(object), "cpu");
    let name = cgroup.rsplit('/').next().unwrap();
    assert!(
        name.starts_with("headroom-cpu-"),
        "{object} ran outside the builds' cgroup: {cgroup}"
    );
    cgroup
}

#[test]
fn where_a_cpu_cgroup_can_be_made_the_build_runs_in_it_and_nicer_jobs_yield_inside() {
    if !cpu_cgroups_can_be_made() {
        return;
    }
    let project = long_link_project();
    let nice = |object: &str| -> u8 {
        fakecc::object_says(&project.path(object), "nice")
            .parse()
            .unwrap()
    };
    build_long_link(&project, &["--jobs", "2"]);
    assert_eq!([nice("a.o"), nice("b.o"), nice("c.o")], [0, 0, 0]);
    // As in `jobs_off_the_longest_path_run_nicer_next_time`, c.o is off the longest path: it
    // is nicer than a.o, inside the build's cgroup, so it yields nothing more to other
    // processes.
    let warm = build_long_link(&project, &["--jobs", "2"]);
    assert_eq!(nice("a.o"), 0, "a.o is on the longest path");
    assert!(nice("c.o") > 0, "c.o is off the longest path");
    for job in warm.jobs.iter().filter(|job| job.label.ends_with(".o")) {
        assert_eq!(job.nice, nice(&job.label), "{job:?}");
    }
    let cgroup = builds_cgroup_of(&project, "c.o");
    assert_eq!(builds_cgroup_of(&project, "a.o"), cgroup);
    // The build's cgroup, made under the cpu cgroup headroom (and so this test) runs in, is
    // gone with the build.
    let name = cgroup.rsplit('/').next().unwrap();
    let (_, cpu_home, _) = headroom_probe::cgroup::own_dir("cpu").unwrap().unwrap();
    assert!(!cpu_home.join(name).exists(), "{name} is left behind");
}

#[test]
fn a_compiler_started_outside_the_builds_cgroup_is_moved_into_it() {
    if !cpu_cgroups_can_be_made() {
        return;
    }
    // The build starts in the builds' cgroup. The recipe's shell leaves it for the one the
    // test runs in, as a build server started before the build would be; the compiler it
    // starts is moved back.
    let (_, cpu_home, _) = headroom_probe::cgroup::own_dir("cpu").unwrap().unwrap();
    let project = Project::new();
    project.write(
        "Makefile",
        &format!(
            "out.o:\n\tcat /proc/self/cgroup > born-in && echo $$$$ > {}/cgroup.procs \
             && cat /proc/self/cgroup > shell-cgroup && g++ --ms 300 -c out.cpp -o out.o\n",
            cpu_home.display()
        ),
    );
    let output = project.headroom(&[]).args(["--", "make"]).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let born_in = std::fs::read_to_string(project.path("born-in")).unwrap();
    assert!(born_in.contains("headroom-cpu-"), "{born_in}");
    let shell = std::fs::read_to_string(project.path("shell-cgroup")).unwrap();
    assert!(!shell.contains("headroom-cpu-"), "{shell}");
    builds_cgroup_of(&project, "out.o");
}

#[test]
fn the_longest_job_of_a_burst_starts_first_whichever_connects_first() {
    let project = Project::new();
    // make starts all four at once, s1.o first; with one slot, whichever shim connects first
    // would run first. Next time long.o, the longest, goes first. The jobs burn CPU time, as
    // compilers do, so a job's time is its work and not how long it waited.
    project.write(
        "Makefile",
        "all: s1.o s2.o s3.o long.o\n\
         long.o:\n\tg++ --cpu-ms 1500 -c long.cpp -o long.o\n\
         s%.o:\n\tg++ --cpu-ms 300 -c s$*.cpp -o $@\n",
    );
    let build = |sample_interval_ms: &str| {
        for object in ["s1.o", "s2.o", "s3.o", "long.o"] {
            let _ = std::fs::remove_file(project.path(object));
        }
        let output = project
            .headroom(&["--jobs", "1", "--report", "report.json", "--", "make"])
            .env("MAKEFLAGS", "-j8")
            .env("HEADROOM_SAMPLE_INTERVAL_MS", sample_interval_ms)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        project.report()
    };
    build("20");
    // Sampler ticks far apart, so that a job the burst holds back waits for the burst and
    // not for a tick.
    let warm = build("1000");
    let first = warm.jobs.iter().min_by_key(|job| job.start_ms).unwrap();
    assert_eq!(first.label, "long.o", "{:?}", warm.jobs);
}

#[test]
fn each_jobs_memory_over_time_is_remembered_for_the_next_build() {
    let project = Project::new();
    let jobs = each(&["a.o", "b.o"], "--mem 200 --ms 1500");
    project.makefile(&jobs);
    let build = project.run(&["--report", "report.json", "--", "make", "-j2"]);
    assert!(build.status.success(), "{}", stderr(&build));
    let history = headroom_store::History::open(&project.path("state/history.sqlite")).unwrap();
    for job in project.report().jobs {
        let past = history
            .past_run(&job.key, "-")
            .unwrap()
            .expect("a clean run is remembered");
        let profile = past.profile.expect("a profile was recorded");
        // fakecc grows steadily to its peak over 1.5 s (sleeping between steps), then writes
        // its object.
        assert!(
            (1.0..reliability::PATIENCE.as_secs_f64()).contains(&profile.wall_seconds())
                && profile.cpu_seconds() > 0.0,
            "{}: ran {} s, {} CPU s",
            job.label,
            profile.wall_seconds(),
            profile.cpu_seconds()
        );
        let shape = profile.shape();
        let peak_at = shape.iter().position(|&fraction| fraction == 1.0).unwrap();
        assert!(shape[0] < 0.5 && peak_at >= shape.len() / 2, "{shape:?}");
    }
}

#[test]
fn suspends_and_requeues_jobs_that_outgrow_their_history() {
    let project = Project::new();
    project.write("mem", "60 100");
    let jobs = each(&["a.o", "b.o", "c.o"], "--mem-file mem");
    project.makefile(&jobs);
    // All at one CPU priority: on a loaded machine a job started nicer grows so slowly that
    // the others end before it peaks, and nothing outgrows the budget together.
    let build = [
        "--budget",
        "1000M",
        "--jobs",
        "3",
        "--no-priorities",
        "--report",
        "report.json",
        "--",
        "make",
    ];
    assert!(project.run(&build).status.success());

    // Same jobs, now five times bigger than their history says: together 1350M > 1000M.
    project.write("mem", "450 1500");
    for object in ["a.o", "b.o", "c.o"] {
        std::fs::remove_file(project.path(object)).unwrap();
    }
    let verbose: Vec<&str> = std::iter::once("-v").chain(build).collect();
    let output = project.run(&verbose);
    assert!(output.status.success(), "{}", stderr(&output));
    let report = project.report();
    assert!(report.suspends() >= 1, "{:?}", report.jobs);
    // Each suspension is in the report at its moment, for traces and timelines.
    let suspended = report
        .events
        .iter()
        .filter(|event| event.kind == headroom_store::JobEventKind::Suspend)
        .count();
    assert_eq!(suspended as u32, report.suspends(), "{:?}", report.events);
    assert!(!report.room.is_empty(), "the machine's room is sampled");
    // `-v` says why, with the figures.
    let said = stderr(&output);
    assert!(
        said.contains("start job") && said.contains("from history"),
        "{said}"
    );
    assert!(
        said.contains("suspend job") && said.contains("of the 1000.0 MiB budget"),
        "{said}"
    );
    assert!(report.jobs.iter().all(|j| j.exit_code == Some(0)));
    for object in ["a.o", "b.o", "c.o"] {
        assert!(project.path(object).exists());
    }
    assert!(
        !stderr(&output).contains("Error"),
        "the build system never saw a failure: {}",
        stderr(&output)
    );
}

#[test]
fn a_job_killed_for_memory_is_retried_with_room_for_more_unseen_by_make() {
    let project = Project::new();
    project.makefile(&[
        ("a.o", "--mem 50 --ms 300 --fail-once marker".into()),
        ("b.o", "--mem 50 --ms 300".into()),
    ]);
    let output = project.run(&["-v", "--report", "report.json", "--", "make"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report = project.report();
    let a = report.jobs.iter().find(|j| j.label == "a.o").unwrap();
    assert_eq!((a.oom_retries, a.attempts), (1, 2), "{a:?}");
    let out_of_memory: Vec<u64> = report
        .events
        .iter()
        .filter(|event| event.kind == headroom_store::JobEventKind::OutOfMemory)
        .map(|event| event.job_id)
        .collect();
    assert_eq!(out_of_memory, [a.job_id], "{:?}", report.events);
    assert_said(&output, "a.o planned at");
    assert_said(&output, "it ran out of memory");
    assert!(project.path("marker").exists() && project.path("a.o").exists());
    assert_said(&output, "OOM retries 1");
}

#[test]
fn the_flag_ladder_is_opt_in_and_reported_loudly() {
    let project = Project::new();
    project.makefile(&[("a.o", "-O2 -g --mem 20 --ms 50 --oom-unless=-O0".into())]);

    let without = project.run(&["--", "make"]);
    assert!(!without.status.success());
    assert_said(&without, "virtual memory exhausted");

    let with = project.run(&["--lower-flags", "--report", "report.json", "--", "make"]);
    assert!(with.status.success(), "{}", stderr(&with));
    let report = project.report();
    let flags = report.jobs[0].lowered_flags.as_deref().unwrap();
    assert!(flags.contains("-O*=-O0"), "{flags}");
    assert_eq!(
        report.jobs[0].oom_retries, 5,
        "with room for more, alone, then three rungs"
    );
    assert_said(&with, "WARNING: 1 jobs were built with lower-memory flags");
}

#[test]
fn exit_codes_pass_through() {
    let project = Project::new();
    assert_eq!(
        project.run(&["--", "sh", "-c", "exit 7"]).status.code(),
        Some(7)
    );
    assert_eq!(project.run(&["--", "true"]).status.code(), Some(0));

    let missing = project.run(&["--", "no-such-build-tool-xyz"]);
    assert_eq!(missing.status.code(), Some(127));
    assert!(stderr(&missing).contains("command not found: no-such-build-tool-xyz"));

    // Found but not executable: 126, as a shell says, with how to run it.
    project.write("build.sh", "make\n");
    let not_executable = project.run(&["--", "./build.sh"]);
    assert_eq!(not_executable.status.code(), Some(126));
    assert!(
        stderr(&not_executable).contains("chmod +x ./build.sh"),
        "{}",
        stderr(&not_executable)
    );

    let bad_budget = project.run(&["--budget", "lots", "--", "true"]);
    assert_eq!(bad_budget.status.code(), Some(2));
    let message = stderr(&bad_budget);
    assert!(
        message.contains("--budget `lots`") && message.contains("70%"),
        "{message}"
    );

    let bad_jobs = project.run(&["--jobs", "0", "--", "true"]);
    assert_eq!(bad_jobs.status.code(), Some(2));
    assert!(stderr(&bad_jobs).contains("--jobs"));
}

#[test]
fn argv_passes_through_byte_for_byte_by_name_and_by_launcher() {
    let project = Project::new();
    // A "compiler" that records its arguments, NUL-separated.
    let recorder = project.path("bin/recorder");
    // The governor asks a compiler it has not seen for `--version`, which may now come while
    // the job's own call runs (the shim starts it before the answer): that is not recorded.
    std::fs::write(
        &recorder,
        "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\nprintf '%s\\0' \"$@\" > \"$OUT\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &recorder,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::remove_file(project.path("bin/g++")).unwrap();
    std::os::unix::fs::symlink(&recorder, project.path("bin/g++")).unwrap();
    project.write("args.rsp", "-DFROM_RESPONSE_FILE\n");

    let args: Vec<OsString> = vec![
        "-c".into(),
        "a file with spaces.cpp".into(),
        "@args.rsp".into(),
        OsString::from_vec(b"caf\xe9-\xff.cpp".to_vec()),
        "".into(),
        "-DX=\"quoted value\"".into(),
    ];
    let expected: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.clone().into_vec(), vec![0]].concat())
        .collect();

    let by_name = project
        .headroom(&["--"])
        .arg("sh")
        .arg("-c")
        .arg("exec g++ \"$@\"")
        .arg("sh")
        .args(&args)
        .env("OUT", project.path("by-name"))
        .output()
        .unwrap();
    assert!(by_name.status.success(), "{}", stderr(&by_name));
    assert_eq!(std::fs::read(project.path("by-name")).unwrap(), expected);

    let launcher = project.path("state/shims/headroom-launch");
    let by_launcher = project
        .headroom(&["--"])
        .arg(&launcher)
        .arg(&recorder)
        .args(&args)
        .env("OUT", project.path("by-launcher"))
        .output()
        .unwrap();
    assert!(by_launcher.status.success(), "{}", stderr(&by_launcher));
    assert_eq!(
        std::fs::read(project.path("by-launcher")).unwrap(),
        expected
    );
}

#[test]
fn a_budget_smaller_than_a_job_runs_it_alone_and_says_so() {
    let project = Project::new();
    project.makefile(&[
        ("big.o", "--mem 200 --ms 300".into()),
        ("small.o", "--mem 10 --ms 300".into()),
    ]);
    let output = project.run(&["--budget", "100M", "--report", "report.json", "--", "make"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(max_overlap(&project.report()), 1);
    // The second build knows big.o's peak (200M) exceeds the 100M budget.
    std::fs::remove_file(project.path("big.o")).unwrap();
    let again = project.run(&["--budget", "100M", "--", "make"]);
    assert_said(&again, "big.o is predicted at");
    assert_said(&again, "ran alone");
}

#[test]
fn a_corrupt_history_is_set_aside_and_the_build_goes_on() {
    let project = Project::new();
    std::fs::create_dir_all(project.path("state")).unwrap();
    std::fs::write(project.path("state/history.sqlite"), vec![0x42; 4096]).unwrap();
    project.makefile(&[("a.o", "--mem 10 --ms 50".into())]);
    let output = project.run(&["--", "make"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_said(&output, "is corrupt");
    assert_said(&output, "headroom: 1 jobs");
}

#[test]
fn two_builds_at_once_in_one_directory_share_an_intact_history() {
    let project = Project::new();
    let jobs: Vec<(String, String)> = (0..8)
        .map(|i| (format!("o{i}.o"), "--mem 20 --ms 200".to_string()))
        .collect();
    let borrowed: Vec<(&str, String)> = jobs.iter().map(|(o, a)| (o.as_str(), a.clone())).collect();
    project.makefile(&borrowed);
    let mut first = project
        .headroom(&["--", "make", "-B"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut second = project
        .headroom(&["--", "make", "-B"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    let history = headroom_store::History::open(&project.path("state/history.sqlite")).unwrap();
    let last = history.last_build_id().unwrap();
    let total_jobs = history.load_build(last).unwrap().jobs.len()
        + history.load_build(last - 1).unwrap().jobs.len();
    assert_eq!(total_jobs, 16);
}

#[test]
fn a_real_make_and_gpp_build_compiles_and_runs() {
    if Command::new("g++").arg("--version").output().is_err() {
        headroom_testkit::skip("g++", "g++ is not installed");
        return;
    }
    let project = Project::new();
    std::fs::remove_file(project.path("bin/g++")).unwrap();
    project.write(
        "main.cpp",
        "int twice(int);\n#include <cstdio>\nint main() { std::printf(\"%d\\n\", twice(21)); }\n",
    );
    project.write(
        "twice.cpp",
        "#include <vector>\nint twice(int x) { std::vector<int> v(2, x); return v[0] + v[1]; }\n",
    );
    project.write(
        "Makefile",
        "prog: main.o twice.o\n\tg++ -o $@ $^\n%.o: %.cpp\n\tg++ -O2 -c $< -o $@\n",
    );
    let output = project.run(&["--report", "report.json", "--", "make"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let ran = Command::new(project.path("prog")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "42\n");
    let report = project.report();
    assert_eq!(
        report.jobs.len(),
        3,
        "two compiles and a link: {:?}",
        report.jobs
    );
    assert!(report
        .jobs
        .iter()
        .all(|j| j.peak > MIB && j.compiler.ends_with("g++")));
}

/// A compile whose flags come in a response file is known by those flags: the real g++ reads
/// `@flags.rsp`, and the governor reads it the same way to key the job.
#[test]
fn a_response_files_flags_make_the_job() {
    if Command::new("g++").arg("--version").output().is_err() {
        headroom_testkit::skip("g++", "g++ is not installed");
        return;
    }
    let project = Project::new();
    std::fs::remove_file(project.path("bin/g++")).unwrap();
    project.write("a.cpp", "int answer() { return 42; }\n");
    project.write("Makefile", "a.o: a.cpp\n\tg++ @flags.rsp a.cpp -o a.o\n");
    let build = |flags: &str| {
        project.write("flags.rsp", flags);
        let _ = std::fs::remove_file(project.path("a.o"));
        let output = project.run(&["--report", "report.json", "--", "make"]);
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(
            project.path("a.o").exists(),
            "g++ compiled with the file's flags"
        );
        let report = project.report();
        assert_eq!(report.jobs.len(), 1, "{:?}", report.jobs);
        report.jobs[0].clone()
    };
    let optimised = build("-O2 '-DNAME=a b'\n-c\n");
    assert!(
        optimised
            .command
            .ends_with("g++ -O2 -DNAME=a b -c a.cpp -o a.o"),
        "{}",
        optimised.command
    );
    let unoptimised = build("-O0 -c\n");
    assert_ne!(
        optimised.key, unoptimised.key,
        "other flags in the file make another job"
    );
}

/// Whether any process in `pids` is stopped.
fn any_stopped(pids: &[i32]) -> bool {
    pids.iter()
        .any(|&pid| matches!(process_state(pid), Some('T' | 't')))
}

#[test]
fn ctrl_c_stops_every_job_and_leaves_nothing_stopped() {
    let project = Project::new();
    let jobs = each(&["a.o", "b.o", "c.o", "d.o"], "--mem-file mem");
    project.makefile(&jobs);
    // Teach a small history, so the jobs outgrow it and some are stopped when Ctrl-C comes.
    project.write("mem", "30 50");
    assert!(project.run(&["--", "make"]).status.success());
    for (object, _) in &jobs {
        std::fs::remove_file(project.path(object)).unwrap();
    }
    project.write("mem", "400 8000");
    // What the build leaves when headroom has exited comes to this test, not to init.
    reliability::become_subreaper();
    let mut child = project.headroom(&["--budget", "1000M", "--jobs", "4", "--", "make"]);
    child.process_group(0).stderr(Stdio::piped());
    let child = child.spawn().unwrap();
    let cli = child.id();
    // The shims and compilers name the project's directory (the fake g++ is in it).
    let needle = project.dir.path().to_string_lossy().into_owned();
    wait_until("a job suspended", || any_stopped(&below(cli, &needle)));
    // A terminal's Ctrl-C: SIGINT to the whole foreground process group.
    unsafe { libc::kill(-(cli as i32), libc::SIGINT) };
    let output = output_within_patience(child);
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    let me = std::process::id();
    wait_until("every process of the build ended", || {
        below(me, &needle).is_empty()
    });
}

/// The compilers below `root` that run: neither stopped nor ended.
fn running(root: u32) -> Vec<i32> {
    compilers(root)
        .into_iter()
        .filter(|&pid| !matches!(process_state(pid), Some('T' | 't' | 'Z') | None))
        .collect()
}

#[test]
fn a_queued_jobs_compiler_started_before_the_answer_is_ended_and_runs_at_its_turn() {
    let project = Project::new();
    project.makefile(&each(&["a.o", "b.o"], "--mem 20 --ms 1500"));
    // One slot: the second job's shim starts its compiler, hears that it must wait, and
    // ends it; it starts again once the first job is done. A stopped compiler would hold
    // memory the governor does not see.
    let child = project
        .headroom(&["--jobs", "1", "--", "make", "-j2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cli = child.id();
    wait_until("two jobs asked for, one compiler", || {
        shims(cli).len() == 2 && compilers(cli).len() == 1
    });
    // Not a wait for something to happen: time for a stopped compiler to show.
    for _ in 0..20 {
        let stopped: Vec<i32> = compilers(cli)
            .into_iter()
            .filter(|&pid| process_state(pid) == Some('T'))
            .collect();
        assert_eq!(
            stopped,
            Vec::<i32>::new(),
            "a queued compiler was kept stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = output_within_patience(child);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(project.path("a.o").exists() && project.path("b.o").exists());
}

#[test]
fn sigterm_stops_the_build_without_starting_the_queued_jobs() {
    let project = Project::new();
    let jobs = each(
        &["a.o", "b.o", "c.o", "d.o", "e.o", "f.o"],
        "--mem 20 --ms 6000",
    );
    project.makefile(&jobs);
    reliability::become_subreaper();
    // One slot: one job runs, make has offered the other five and their shims wait, each
    // with the compiler it started before the answer ended at it: those never run again.
    let mut child = project.headroom(&["--jobs", "1", "--", "make", "-j6"]);
    child.process_group(0).stderr(Stdio::piped());
    let mut child = child.spawn().unwrap();
    let cli = child.id();
    wait_until("six shims, one of them compiling", || {
        shims(cli).len() == 6 && running(cli).len() == 1
    });
    let first = running(cli);
    // A service manager or CI runner stops headroom alone, not its process group.
    unsafe { libc::kill(cli as i32, libc::SIGTERM) };
    let mut started = Vec::new();
    wait_until("headroom to exit", || {
        started.extend(running(cli).into_iter().filter(|pid| !first.contains(pid)));
        child.try_wait().unwrap().is_some()
    });
    let output = output_within_patience(child);
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        started,
        Vec::<i32>::new(),
        "queued jobs ran: {}",
        stderr(&output)
    );
    let needle = project.dir.path().to_string_lossy().into_owned();
    let me = std::process::id();
    wait_until("every process of the build ended", || {
        below(me, &needle).is_empty()
    });
    let objects = ["a.o", "b.o", "c.o", "d.o", "e.o", "f.o"];
    assert!(objects.iter().all(|o| !project.path(o).exists()));
}

#[test]
fn the_build_completes_when_the_governor_is_killed() {
    let project = Project::new();
    let jobs: Vec<(String, String)> = (0..6)
        .map(|i| (format!("o{i}.o"), "--mem 20 --ms 700".to_string()))
        .collect();
    let borrowed: Vec<(&str, String)> = jobs.iter().map(|(o, a)| (o.as_str(), a.clone())).collect();
    project.makefile(&borrowed);
    let child = project
        .headroom(&["--jobs", "1", "--", "make"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-build: one job done, five to go, one at a time.
    wait_until("the first object", || project.path("o0.o").exists());
    let governor = below(child.id(), "__governor");
    assert_eq!(governor.len(), 1, "{governor:?}");
    unsafe { libc::kill(governor[0], libc::SIGKILL) };
    let output = output_within_patience(child);
    let message = stderr(&output);
    assert!(output.status.success(), "{message}");
    assert!(message.contains("governor stopped"), "{message}");
    for (object, _) in &jobs {
        assert!(project.path(object).exists(), "{object} missing");
    }
}

/// The last jobs' reports race the CLI's shutdown (a shim whose compile succeeded exits
/// without waiting for the governor): every job of many short builds must be recorded. The
/// crash harness once saw a clean build record 39 of its 40 jobs.
#[test]
fn the_last_jobs_of_a_build_are_recorded() {
    let project = Project::new();
    project.makefile(&[
        ("a.o", "--mem 1 --ms 1".into()),
        ("b.o", "--mem 1 --ms 1".into()),
    ]);
    for _ in 0..20 {
        let output = project.run(&["--report", "report.json", "--", "make", "-B", "-j2"]);
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(project.report().jobs.len(), 2, "{}", stderr(&output));
    }
}

/// A CLI killed mid-build leaves its socket; one killed while installing the interceptor or the
/// launcher leaves a temp file or link (planted here, with an ended process's id): the next
/// build removes them all.
#[test]
fn what_a_killed_build_left_is_removed_by_the_next_one() {
    let project = Project::new();
    project.makefile(&[("a.o", "--mem 4 --ms 2999".into())]);
    // The killed build's make and compiler come to this test, not to init.
    reliability::become_subreaper();
    let mut child = project.headroom(&["--", "make"]).spawn().unwrap();
    let socket_dir = project.path("run/headroom");
    let has_socket = || {
        std::fs::read_dir(&socket_dir).is_ok_and(|mut entries| {
            entries.any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".sock"))
        })
    };
    // Mid-build: the compile runs, so the session has joined its governor. The socket alone
    // is there before the governor starts, and a CLI killed then leaves it to the next build.
    let me = std::process::id();
    wait_until("the compile", || !below(me, "--ms 2999").is_empty());
    assert!(has_socket());
    child.kill().unwrap();
    child.wait().unwrap();
    // The governor ends a session whose CLI is gone, and leaves with its last session.
    wait_until("the governor to leave with the killed session", || {
        !has_socket()
    });
    let dead = child.id();
    std::os::unix::fs::symlink(
        "nowhere",
        project.path(&format!("state/shims/.tmp{dead}-headroom-launch")),
    )
    .unwrap();
    project.write(
        &format!("state/lib/.tmp{dead}-libheadroom-intercept.so"),
        "half",
    );
    // The killed build's make and compiler end on their own.
    wait_until("the killed build's processes to end", || {
        below(me, "--ms 2999").is_empty()
    });

    let next = project.run(&["--", "make", "-B"]);
    assert!(next.status.success(), "{}", stderr(&next));
    let hidden = |dir: &str| {
        std::fs::read_dir(project.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with('.'))
            .collect::<Vec<_>>()
    };
    assert_eq!(hidden("state/shims"), Vec::<String>::new());
    assert_eq!(hidden("state/lib"), Vec::<String>::new());
    // The governor leaves right after its last session's report.
    wait_until("the next build's governor to leave with it", || {
        !has_socket()
    });
}

#[test]
fn a_state_directory_or_history_that_cannot_be_used_still_gives_a_governed_build_and_its_report() {
    let project = Project::new();
    project.makefile(&[
        ("a.o", "--mem 50 --ms 200".into()),
        ("b.o", "--mem 80 --ms 200".into()),
    ]);
    // A file where the state directory should be (a read-only HOME as root can be), and a
    // directory where the history file should be.
    project.write("blocked", "");
    std::fs::create_dir_all(project.path("state/history.sqlite")).unwrap();
    for (state_dir, says) in [
        (project.path("blocked/headroom"), "cannot write to"),
        (project.path("state"), "temporary history"),
    ] {
        let output = project
            .headroom(&["--report", "report.json", "make", "-B"])
            .env("HEADROOM_STATE_DIR", &state_dir)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        assert_said(&output, says);
        assert_said(&output, "2 jobs");
        assert_eq!(project.report().jobs.len(), 2, "governed, and reported");
    }
}

#[test]
fn report_renders_the_last_build_as_html_and_json() {
    let project = Project::new();
    project.makefile(&[
        ("a.o", "--mem 50 --ms 400".into()),
        ("b.o", "--mem 80 --ms 400".into()),
    ]);
    assert!(project
        .run(&["--trace", "build-trace.json", "--", "make"])
        .status
        .success());
    // Read back by real trace readers in headroom-run's tests/chrome_trace.rs; here, that
    // `build --trace` writes one with a slice per job.
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(project.path("build-trace.json")).unwrap()).unwrap();
    let slices: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["ph"] == "X")
        .filter_map(|event| event["name"].as_str())
        .collect();
    assert_eq!(slices.len(), 2, "{slices:?}");
    // A no-op rebuild (written without `--`) does not hide the build that ran the jobs.
    assert!(project.run(&["make"]).status.success());
    let output = project
        .command("report")
        .args(["--html", "timeline.html", "--json", "again.json"])
        .args(["--trace", "report-trace.json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        std::fs::read(project.path("report-trace.json")).unwrap(),
        std::fs::read(project.path("build-trace.json")).unwrap(),
        "`report --trace` writes the trace `build --trace` wrote"
    );
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(
        summary.contains("a.o"),
        "the summary is on stdout: {summary}"
    );
    assert_said(&output, "ran no job");
    let html = std::fs::read_to_string(project.path("timeline.html")).unwrap();
    assert!(
        html.contains("<svg") && html.contains("a.o") && html.contains("budget"),
        "{html}"
    );
    let report: BuildReport =
        serde_json::from_slice(&std::fs::read(project.path("again.json")).unwrap()).unwrap();
    assert_eq!(report.jobs.len(), 2);
    assert!(!report.samples.is_empty());
}

#[test]
fn sim_import_turns_the_last_build_into_a_trace_that_sim_replays() {
    let project = Project::new();
    let sim = |args: &[&str]| project.command("sim").args(args).output().unwrap();
    let import = ["import", "--out", "trace.json", "--machine", "2c/8G"];
    let output = sim(&import);
    assert!(!output.status.success());
    assert_said(&output, "no build history");

    project.write(
        "Makefile",
        "tool: a.o b.o\n\tg++ --mem 60 --ms 300 -o tool a.o b.o\n\
         a.o:\n\tg++ --mem 120 --ms 400 -c a.cpp -o a.o\n\
         b.o:\n\tg++ --mem 80 --ms 400 -c b.cpp -o b.o\n",
    );
    assert!(project.run(&["--", "make", "-j2"]).status.success());
    let output = sim(&import);
    assert!(output.status.success(), "{}", stderr(&output));
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(project.path("trace.json")).unwrap()).unwrap();
    let jobs = trace["jobs"].as_array().unwrap();
    let labels: Vec<&str> = jobs
        .iter()
        .map(|job| job["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels.len(), 3, "{trace}");
    let link = labels.iter().position(|label| *label == "tool").unwrap();
    assert_eq!(jobs[link]["deps"].as_array().unwrap().len(), 2, "{trace}");
    let a = labels.iter().position(|label| *label == "a.o").unwrap();
    assert!(jobs[a]["peak"].as_u64().unwrap() >= 120 * MIB, "{trace}");

    let output = sim(&[
        "trace.json",
        "--machine",
        "2c/8G",
        "--policy",
        "static",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let results: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let makespan = results[0]["outcomes"][0]["makespan"].as_f64().unwrap();
    assert!(makespan >= 0.7, "{results}");
}

#[test]
fn a_report_that_cannot_be_written_fails_before_the_build_runs() {
    let project = Project::new();
    project.makefile(&[("a.o", "--mem 10 --ms 50".into())]);
    std::fs::create_dir(project.path("reports")).unwrap();
    for (report, says) in [
        ("missing/report.json", "there is no directory missing"),
        ("reports", "that is a directory"),
    ] {
        let output = project.run(&["--report", report, "--", "make"]);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert_said(&output, says);
        assert!(!project.path("a.o").exists(), "the build must not have run");
    }
    let output = project.run(&["--no-history", "--report", "report.json", "--", "make"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(!project.path("a.o").exists(), "the build must not have run");
}

#[test]
fn a_report_is_as_readable_as_the_files_the_build_writes() {
    use std::os::unix::fs::PermissionsExt;
    let project = Project::new();
    project.makefile(&[("a.o", "--mem 10 --ms 50".into())]);
    let output = project.run(&["--report", "report.json", "--", "make"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|line| line.strip_prefix("Umask:"))
        .map(|value| u32::from_str_radix(value.trim(), 8).unwrap())
        .expect("Linux shows the umask in /proc/self/status");
    let mode = |name: &str| {
        std::fs::metadata(project.path(name))
            .unwrap()
            .permissions()
            .mode()
    };
    assert_eq!(mode("report.json") & 0o777, 0o666 & !umask);
    assert_eq!(mode("report.json") & 0o777, mode("a.o") & 0o666);
}

#[test]
fn probes_never_wait_for_a_slot() {
    let project = Project::new();
    // One slot, taken by a compile (its shim has started the compiler); meanwhile the build
    // probes the real compiler by its absolute path, as torch and CMake do. The probes must
    // end while the compile still holds the slot, which is then ended.
    let script = "g++ --mem 10 --ms 60000 -c a.cpp -o a.o & shim=$!; \
                  for i in $(seq 1200); do [ -n \"$(pgrep -P $shim)\" ] && break; sleep 0.05; done; \
                  /usr/bin/g++ --version >/dev/null; g++ -dumpmachine >/dev/null; \
                  kill -0 $shim && echo beside > probes; pkill -P $shim; wait; exit 0";
    let output = project.run(&[
        "-j",
        "1",
        "--report",
        "report.json",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        project.path("probes").exists(),
        "the probes waited for the compile's slot: {}",
        stderr(&output)
    );
    let report = project.report();
    assert_eq!(
        report.jobs.len(),
        1,
        "probes are not jobs: {:?}",
        report.jobs
    );
}

#[test]
fn a_compiler_the_interceptor_cannot_see_is_counted_and_named() {
    let project = Project::new();
    // A statically linked build driver: no LD_PRELOAD acts in it, so the compiler it starts
    // runs outside admission, as one started by a setuid tool or a cleared environment would.
    project.write(
        "driver.c",
        "#include <sys/wait.h>\n#include <unistd.h>\n\
         int main(int argc, char **argv) {\n\
           (void)argc; int status = 127;\n\
           if (fork() == 0) { execv(argv[1], argv + 1); _exit(127); }\n\
           wait(&status); return WEXITSTATUS(status);\n\
         }\n",
    );
    let built = Command::new("cc")
        .args(["-static", "-o", "static-driver", "driver.c"])
        .current_dir(project.path(""))
        .output()
        .unwrap();
    if !built.status.success() {
        headroom_testkit::skip(
            "libc-static",
            format!(
                "cannot link a static program here ({}); install libc6-dev",
                String::from_utf8_lossy(&built.stderr).trim()
            ),
        );
        return;
    }
    let fake_gpp = project.path("bin/g++");
    let output = project.run(&[
        "--report",
        "report.json",
        "--",
        "./static-driver",
        fake_gpp.to_str().unwrap(),
        "--mem",
        "300",
        "--ms",
        "1500",
        "-c",
        "a.cpp",
        "-o",
        "a.o",
    ]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let report = project.report();
    assert!(report.jobs.is_empty(), "{:?}", report.jobs);
    let compiler = report
        .outside
        .iter()
        .find(|process| process.compiler_like && process.name == "g++")
        .unwrap_or_else(|| panic!("the compiler is named: {:?}", report.outside));
    assert!(compiler.peak >= 250 << 20, "{compiler:?}");
    assert!(compiler.reason.contains("static-driver"), "{compiler:?}");
    assert!(text.contains("governed nothing"), "{text}");
    assert!(
        text.contains("does not load headroom's interceptor"),
        "{text}"
    );
}

/// A build step that starts a program with an environment of its own making (`env -i`, SCons's
/// `ENV`) drops headroom's variables and the interceptor with them; its compilers used to run
/// outside admission. They are governed, directly or through a shell, and the program gets
/// back every variable the session set, and nothing else the step dropped.
#[test]
fn a_step_that_clears_its_environment_keeps_its_compilers_governed() {
    let project = Project::new();
    project.write(
        "Makefile",
        "all: o0.o o1.o plain cleared
         o0.o:
	env -i PATH=\"$$PATH\" g++ --mem 4 --ms 10 -c o0.cpp -o o0.o
         o1.o:
	env -i PATH=\"$$PATH\" sh -c 'g++ --mem 4 --ms 10 -c o1.cpp -o o1.o'
         plain:
	env > plain
         cleared:
	env -i /usr/bin/env > cleared
",
    );
    let mut build = project.headroom(&["--report", "report.json", "--", "make"]);
    build
        .env("HEADROOM_UNRELATED", "the user's")
        .env("UNRELATED", "x");
    let given: Vec<String> = build
        .get_envs()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .chain(std::env::vars().map(|(name, _)| name))
        .collect();
    let output = build.output().unwrap();
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let report = project.report();
    assert_eq!(report.jobs.len(), 2, "{:?}", report.jobs);
    assert!(report.ungoverned_compilers().next().is_none(), "{text}");
    let names = |file: &str| -> Vec<String> {
        let text = std::fs::read_to_string(project.path(file)).unwrap();
        let mut names: Vec<String> = text
            .lines()
            .filter_map(|line| line.split_once('=').map(|(name, _)| name.to_string()))
            .collect();
        names.sort();
        names
    };
    let session: Vec<String> = names("plain")
        .into_iter()
        .filter(|name| name.starts_with("HEADROOM_") && !given.contains(name))
        .collect();
    let mut carried = session.clone();
    carried.push("LD_PRELOAD".to_string());
    carried.sort();
    assert!(
        session.contains(&"HEADROOM_SOCKET".to_string()),
        "{session:?}"
    );
    assert_eq!(names("cleared"), carried);
}

/// SCons runs each compiler with its construction environment's `ENV`, a `PATH` and little
/// else, so none of headroom's variables: a real SCons build of real g++ compiles.
#[test]
fn a_scons_build_is_governed() {
    if !support::have(&["scons", "g++"]) {
        return;
    }
    let project = Project::new();
    std::fs::remove_file(project.path("bin/g++")).unwrap();
    project.write(
        "a.cpp",
        "#include <vector>\nint a() { return std::vector<int>(2).size(); }\n",
    );
    project.write(
        "b.cpp",
        "#include <string>\nint b() { return std::string(\"bb\").size(); }\n",
    );
    project.write("SConstruct", "Environment().Object(['a.cpp', 'b.cpp'])\n");
    let output = project.run(&["--report", "report.json", "--", "scons", "-Q", "-j2"]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(project.path("a.o").exists() && project.path("b.o").exists());
    let report = project.report();
    assert_eq!(report.jobs.len(), 2, "{:?}", report.jobs);
    assert!(
        report.jobs.iter().all(|job| job.peak > MIB),
        "{:?}",
        report.jobs
    );
    assert!(report.ungoverned_compilers().next().is_none(), "{text}");
}

#[test]
fn a_cargo_build_script_compiling_c_through_the_cc_crate_is_governed() {
    let project = Project::new();
    project.write(
        "Cargo.toml",
        "[package]\nname = \"uses-cc\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
         [build-dependencies]\ncc = \"1\"\n",
    );
    project.write(
        "build.rs",
        "fn main() { cc::Build::new().file(\"native.c\").compile(\"native\"); }\n",
    );
    project.write("native.c", "int native_answer(void) { return 42; }\n");
    std::fs::create_dir(project.path("src")).unwrap();
    project.write(
        "src/main.rs",
        "extern \"C\" { fn native_answer() -> i32; }\n\
         fn main() { assert_eq!(unsafe { native_answer() }, 42); }\n",
    );
    // The cc crate comes from the registry cache this workspace was built with.
    let home = std::env::var("HOME").unwrap();
    let mut build = project.headroom(&[
        "--report",
        "report.json",
        "--",
        "cargo",
        "build",
        "--offline",
    ]);
    build
        .env("HOME", &home)
        .env("CARGO_TARGET_DIR", project.path("target"));
    let output = build.output().unwrap();
    let text = stderr(&output);
    if text.contains("no matching package named `cc` found") || text.contains("failed to get `cc`")
    {
        headroom_testkit::skip(
            "cargo-cc",
            "the cc crate is not in this machine's cargo registry cache",
        );
        return;
    }
    assert!(output.status.success(), "{text}");
    let report = project.report();
    let compiles_c = |job: &headroom_store::JobRecord| {
        !job.compiler.ends_with("rustc") && job.command.contains("native.c")
    };
    assert!(
        report.jobs.iter().any(compiles_c),
        "the build script's C compile is a job: {:?}",
        report.jobs
    );
    assert!(
        report
            .jobs
            .iter()
            .any(|job| job.compiler.ends_with("rustc")),
        "rustc's compiles are jobs: {:?}",
        report.jobs
    );
    assert!(report.ungoverned_compilers().next().is_none(), "{text}");
}

#[test]
fn tools_that_start_no_program_run_without_the_interceptor() {
    let project = Project::new();
    // `cat` never starts a program, so it starts without the interceptor; a shell may start a
    // compiler, so it keeps it; the launcher (here in front of the fake g++) starts without it.
    // The launcher's maps are read while its compile runs, once the shell's own child has
    // become the launcher, however long a loaded machine takes to start it.
    let script = "cat /proc/self/maps > leaf-maps; \
                  sh -c 'cat /proc/$$/maps' > shell-maps; \
                  g++ --mem 10 --ms 3000 -c a.cpp -o a.o & shim=$!; \
                  for i in $(seq 1200); do \
                    [ \"$(cat /proc/$shim/comm)\" = headroom-shim ] && break; sleep 0.05; \
                  done; \
                  cat /proc/$shim/maps > launcher-maps; wait";
    let output = project.run(&["--", "sh", "-c", script]);
    assert!(output.status.success(), "{}", stderr(&output));
    let loads_interceptor = |file: &str| {
        std::fs::read_to_string(project.path(file))
            .unwrap()
            .contains("libheadroom-intercept")
    };
    assert!(loads_interceptor("shell-maps"), "a shell keeps it");
    assert!(!loads_interceptor("leaf-maps"), "cat starts without it");
    assert!(
        !std::fs::read_to_string(project.path("launcher-maps"))
            .unwrap()
            .is_empty()
            && !loads_interceptor("launcher-maps"),
        "the launcher starts without it"
    );
}
