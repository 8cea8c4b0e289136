//! `headroom report`: the last build (or a given one, or a `--report` JSON file) as the
//! terminal summary, JSON, a self-contained HTML page, or a Chrome trace.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use headroom_store::chart::Timeline;
use headroom_store::{summary, BuildReport, History};

use crate::build::{write_json_report, write_trace};
use headroom_output as output;

/// Arguments of `headroom report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// A build id from the history, or a JSON file written by `headroom build --report`
    /// [default: the last build].
    #[arg(value_name = "BUILD|FILE")]
    build: Option<String>,
    /// Write an HTML timeline (stacked memory per job over time, with the budget line).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the build as a Chrome trace, for ui.perfetto.dev or chrome://tracing.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

pub fn main(args: ReportArgs) -> Result<u8> {
    output::check_all([
        ("--json", args.json.as_deref()),
        ("--html", args.html.as_deref()),
        ("--trace", args.trace.as_deref()),
    ])?;
    let report = load(args.build.as_deref())?;
    // The summary is this command's output: it goes to stdout, for `less` or a file.
    print!("{}", summary::render(&report));
    if let Some(path) = &args.json {
        write_json_report(&report, "--json", path)?;
    }
    if let Some(path) = &args.trace {
        write_trace(&report, "--trace", path)?;
    }
    if let Some(path) = &args.html {
        let html = headroom_store::chart::render_html(&timeline(&report));
        output::write("--html", path, html.as_bytes())?;
        eprintln!("headroom: wrote {}", path.display());
    }
    Ok(0)
}

/// The report of build `which`: a build id from the history, or a JSON file written by
/// `headroom build --report` or `headroom report --json`; the last build when `None`.
pub(crate) fn load(which: Option<&str>) -> Result<BuildReport> {
    if let Some(file) = which.filter(|w| w.parse::<i64>().is_err()) {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the report {file}"))?;
        return serde_json::from_str(&text).with_context(|| {
            format!(
                "{file} is not a report written by `headroom build --report` or `headroom report --json`"
            )
        });
    }
    let path = History::default_path();
    anyhow::ensure!(
        Path::new(&path).exists(),
        "no build history at {} yet: run `headroom build -- …` first, or pass a report JSON file",
        path.display()
    );
    let history = History::open(&path)?;
    let id = match which {
        Some(id) => id.parse()?,
        None => last_real_build(&history)?,
    };
    Ok(history.load_build(id)?)
}

/// The last build that ran a job; a newer no-op rebuild is named but does not hide it.
fn last_real_build(history: &History) -> Result<i64> {
    let last = history.last_build_id()?;
    Ok(match history.last_build_with_jobs()? {
        Some(id) if id != last => {
            eprintln!(
                "headroom: build {last}, the last one, ran no job (nothing to rebuild); \
                 showing build {id}, the last that did (`headroom report {last}` shows it)"
            );
            id
        }
        _ => last,
    })
}

/// The page: the build's facts, a stacked series per job against the budget, the job table
/// (`headroom_store::build_page`, beside the summary whose figures it prints).
fn timeline(report: &BuildReport) -> Timeline {
    headroom_store::build_page::timeline(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report as `headroom build --report` writes it, with a process outside admission.
    const REPORT: &str = r#"{
        "schema": 1,
        "build": {
            "id": 9, "started_unix_ms": 0, "duration_ms": 4000, "command": "bazel build //:app",
            "cwd": "/src/app", "budget": 8589934592, "budget_source": "test", "slots": 4,
            "exit_code": 0, "peak_total": 1073741824, "parallelism_set": ["MAX_JOBS=4"]
        },
        "jobs": [{
            "job_id": 0, "key": "k", "group": "g", "label": "app", "compiler": "ld",
            "command": "ld -o app", "cwd": "/src/app", "offered_ms": 0, "start_ms": 0,
            "end_ms": 900, "peak": 52428800, "cpu_ms": 800, "exit_code": 0, "signal": null,
            "predicted": 52428800, "prediction_source": "history", "attempts": 1,
            "suspends": 0, "requeues": 0, "oom_retries": 0, "lowered_flags": null,
            "over_budget": false
        }],
        "samples": [{"t_ms": 500, "job_id": 0, "bytes": 52428800}],
        "outside": [{
            "pid": 4242, "name": "cc1plus", "compiler_like": true, "peak": 1073741824,
            "first_seen_ms": 100, "last_seen_ms": 3100,
            "reason": "started by a statically linked build driver"
        }]
    }"#;

    #[test]
    fn a_report_with_processes_outside_admission_loads_renders_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("report.json");
        std::fs::write(&file, REPORT).unwrap();
        let report = load(file.to_str()).unwrap();
        assert_eq!(report.build.parallelism_set, ["MAX_JOBS=4"]);
        assert_eq!(report.ungoverned_compilers().count(), 1);
        assert!(summary::render(&report).contains("ran outside admission"));
        let html = headroom_store::chart::render_html(&timeline(&report));
        assert!(html.contains("app"), "{html}");

        let again = dir.path().join("again.json");
        write_json_report(&report, "--json", &again).unwrap();
        assert_eq!(load(again.to_str()).unwrap(), report);
    }
}
