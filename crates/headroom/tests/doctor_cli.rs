//! `headroom doctor` end to end: JSON findings on this machine, and projects from a real
//! history file that would not fit.

use std::process::Command;

use headroom_store::model::{BuildRecord, JobRecord};
use headroom_store::History;

const TIB: u64 = 1 << 40;

fn doctor(args: &[&str], history: &std::path::Path) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_headroom"))
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
