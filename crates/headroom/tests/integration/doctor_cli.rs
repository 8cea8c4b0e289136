//! `headroom doctor` end to end: JSON findings on this machine, and projects from a real
//! history file that would not fit.

use crate::support;

use std::process::Command;

use headroom_store::History;
use headroom_store::{BuildRecord, JobRecord};
use support::HEADROOM;

const TIB: u64 = 1 << 40;

fn doctor(args: &[&str], history: &std::path::Path) -> (Option<i32>, String, String) {
    let output = Command::new(HEADROOM)
        .arg("doctor")
        .args(args)
        .arg("--history")
        .arg(history)
        .output()
        .expect("run headroom doctor");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn seed(path: &std::path::Path) {
    let mut history = History::open(path).unwrap();
    let build = BuildRecord {
        id: 0,
        started_unix_ms: 1,
        duration_ms: None,
        command: "ninja".into(),
        cwd: "/src/giant".into(),
        budget: TIB,
        budget_source: "test".into(),
        slots: 64,
        exit_code: None,
        peak_total: None,
        parallelism_set: Vec::new(),
    };
    let id = history.begin_build(&build).unwrap();
    let job = JobRecord {
        job_id: 1,
        key: "giant.o".into(),
        group: "g".into(),
        label: "giant.cpp".into(),
        compiler: "g++".into(),
        command: "g++ -c giant.cpp".into(),
        cwd: "/src/giant".into(),
        offered_ms: 0,
        start_ms: 0,
        end_ms: 1,
        peak: TIB,
        cpu_ms: 1,
        exit_code: Some(0),
        prediction_source: "default".into(),
        attempts: 1,
        ..JobRecord::default()
    };
    history.record_job(id, &job, "portable", None).unwrap();
    history.finish_build(id, 1, Some(0), 2 * TIB).unwrap();
}

#[test]
fn json_findings_cover_memory_budget_and_projects_that_do_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    seed(&path);
    let (code, stdout, stderr) = doctor(&["--json", "--job-memory", "1G"], &path);
    assert_eq!(code, Some(0), "{stderr}");
    let findings: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    assert!(findings["memory"]["total"].as_u64().unwrap() > 0);
    assert!(findings["budget"]["jobs"].as_u64().unwrap() >= 1);
    assert_eq!(findings["budget"]["job_memory"], 1u64 << 30);
    assert!(findings["oom_kills"]["readable"].is_boolean());
    if findings["oom_kills"]["readable"] == false {
        assert!(findings["oom_kills"]["error"]
            .as_str()
            .unwrap()
            .contains("kernel log"));
    }
    let project = &findings["history"]["projects"][0];
    assert_eq!(project["cwd"], "/src/giant");
    assert_eq!(project["fits_one_job_at_a_time"], false);
    assert!(findings["warnings"][0]
        .as_str()
        .unwrap()
        .contains("/src/giant will not build here"));
}

#[test]
fn human_report_without_history_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = doctor(&[], &dir.path().join("missing.sqlite"));
    assert_eq!(code, Some(0), "{stderr}");
    for section in ["memory", "cgroup", "pressure", "OOM kills", "budget", "-j"] {
        assert!(stdout.contains(section), "no {section} in:\n{stdout}");
    }
    assert!(stdout.contains("no build history yet"), "{stdout}");
    assert!(
        !dir.path().join("missing.sqlite").exists(),
        "doctor never creates a history"
    );
}

#[test]
fn bad_job_memory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = doctor(&["--job-memory", "lots"], &dir.path().join("h.sqlite"));
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--job-memory"), "{stderr}");
}

/// `headroom doctor --json` in `project`, with a home of its own and `env` set.
fn doctor_in(dir: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value) {
    let project = dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let mut command = Command::new(HEADROOM);
    command
        .args(["doctor", "--json", "--history"])
        .arg(dir.join("missing.sqlite"))
        .current_dir(&project)
        .env("HOME", dir.join("home"))
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("HEADROOM_CONFIG")
        .env_remove("HEADROOM_BUDGET");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run headroom doctor");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let findings = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}{}", String::from_utf8_lossy(&output.stderr)));
    (output.status.code(), findings)
}

#[test]
fn doctor_reports_the_budget_build_takes_from_headroom_toml_and_where_it_was_set() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("project/headroom.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "[build]\nbudget = \"6G\"\n").unwrap();
    let (code, findings) = doctor_in(dir.path(), &[]);
    assert_eq!(code, Some(0));
    assert_eq!(findings["budget"]["bytes"], 6u64 << 30, "{findings:#}");
    let source = findings["budget"]["source"].as_str().unwrap();
    assert_eq!(
        source,
        format!(
            "set by `budget` under [build] on line 2 of {}",
            file.display()
        )
    );
    assert_eq!(findings["settings"]["files"][0], file.display().to_string());
    // HEADROOM_BUDGET beats the file, for doctor as for build.
    let (_, findings) = doctor_in(dir.path(), &[("HEADROOM_BUDGET", "3G")]);
    assert_eq!(findings["budget"]["bytes"], 3u64 << 30, "{findings:#}");
    assert_eq!(findings["budget"]["source"], "set by HEADROOM_BUDGET");
}

#[test]
fn doctor_warns_that_build_refuses_invalid_settings_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("project/headroom.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "[build]\nbudget = 6G\n").unwrap();
    let (code, findings) = doctor_in(dir.path(), &[]);
    assert_eq!(code, Some(0), "doctor still reports the machine");
    let warning = findings["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("`headroom build` here stops")
            && warning.contains(&file.display().to_string())
            && warning.contains("line 2"),
        "{warning}"
    );
    assert!(findings["settings"]["error"].is_string(), "{findings:#}");

    std::fs::remove_file(&file).unwrap();
    let named = dir.path().join("nowhere.toml");
    let (_, findings) = doctor_in(dir.path(), &[("HEADROOM_CONFIG", named.to_str().unwrap())]);
    let warning = findings["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains(&format!("HEADROOM_CONFIG names {}", named.display())),
        "{warning}"
    );
}
