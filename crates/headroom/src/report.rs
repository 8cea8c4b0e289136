//! `headroom report`: the last build (or a given one, or a `--report` JSON file) as the
//! terminal summary, JSON, a self-contained HTML page, or a Chrome trace; or, with `--list`,
//! the past builds. It says which build it shows, and whether that build's record is whole:
//! a build with no end is still running, or its governor died.

use std::path::{Path, PathBuf};

use anyhow::Result;
use headroom_report::chart::Timeline;
use headroom_report::chrome_trace;
use headroom_report::summary;
use headroom_size::Size;
use headroom_store::{shown, BuildRecord, BuildReport, Listed};
use serde::Serialize;

use headroom_output as output;

/// Arguments of `headroom report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// A build id from the history, or a JSON file written by `headroom build --report`
    /// [default: the last build].
    #[arg(value_name = "BUILD|FILE")]
    build: Option<String>,
    /// List the most recent builds of the history instead (id, when, project, command,
    /// duration, jobs, exit code, peak); with --json, as JSON.
    #[arg(long, conflicts_with_all = ["build", "html", "trace"])]
    list: bool,
    /// How many builds --list shows.
    #[arg(long, value_name = "N", default_value_t = 20, requires = "list")]
    last: usize,
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
    if args.list {
        return list(args.last, args.json.as_deref());
    }
    let (report, state) = load_with_state(args.build.as_deref())?;
    // The summary is this command's output: it goes to stdout, for `less` or a file, unless
    // an output was asked for there (`--json -`).
    let outputs = [&args.json, &args.trace, &args.html];
    if !outputs
        .into_iter()
        .flatten()
        .any(|path| output::is_stdout(path))
    {
        print!(
            "{}{}",
            header(&report.build, state),
            summary::render(&report)
        );
    }
    if let Some(path) = &args.json {
        output::write("--json", path, &report.to_json()?)?;
    }
    if let Some(path) = &args.trace {
        output::write("--trace", path, &chrome_trace::to_json(&report)?)?;
    }
    if let Some(path) = &args.html {
        let html = headroom_report::chart::render_html(&timeline(&report));
        output::write("--html", path, html.as_bytes())?;
        if !output::is_stdout(path) {
            headroom_output::say!("headroom: wrote {}", path.display());
        }
    }
    Ok(0)
}

/// Where a build's record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum State {
    /// It has its end: duration, exit code and peak.
    Ended,
    /// No end yet, and its governor is alive.
    Running,
    /// No end, and its governor is gone: it died before the build ended.
    GovernorDied,
}

impl State {
    /// The state of `build`, whose governor was `governor_pid` (unknown for old builds).
    fn of(build: &BuildRecord, governor_pid: Option<u32>) -> State {
        if build.duration_ms.is_some() {
            State::Ended
        } else if governor_pid.is_some_and(governor_alive) {
            State::Running
        } else {
            State::GovernorDied
        }
    }
}

/// Whether process `pid` is still a headroom governor (and not another process that was given
/// the same id since).
fn governor_alive(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
        cmdline
            .split(|&byte| byte == 0)
            .any(|arg| arg == headroom_govern::session::GOVERNOR_SUBCOMMAND.as_bytes())
    })
}

/// Which build the summary shows, and a warning when its record is not whole.
fn header(build: &BuildRecord, state: State) -> String {
    let id = if build.id > 0 {
        format!("build {}", build.id)
    } else {
        "a build not in the history".to_string()
    };
    let mut out = format!(
        "{id} · {} · {} · {}\n",
        when(build.started_unix_ms),
        build.cwd,
        build.command
    );
    match state {
        State::Ended => {}
        State::Running => out.push_str(
            "headroom: this build is still running: its record so far is below, without its end\n",
        ),
        State::GovernorDied => out.push_str(
            "headroom: WARNING: this build's governor died before the build ended, so its record \
             is incomplete: the jobs that ended after, its duration, exit code and peak are \
             missing (the build itself went on ungoverned)\n",
        ),
    }
    out
}

/// A start time as people read it, in UTC.
fn when(unix_ms: i64) -> String {
    headroom_report::utc_time(unix_ms).replacen('T', " ", 1)
}

/// One build of `--list`, as its JSON says it.
#[derive(Serialize)]
struct ListedBuild<'a> {
    id: i64,
    started_unix_ms: i64,
    cwd: &'a str,
    command: &'a str,
    duration_ms: Option<u64>,
    jobs: u64,
    exit_code: Option<i32>,
    peak_total: Option<u64>,
    state: State,
}

/// `--list`: the `count` most recent builds, as a table on stdout or as JSON to `json`.
fn list(count: usize, json: Option<&Path>) -> Result<u8> {
    let history = shown::open_history()?;
    let builds = history.list_builds(count)?;
    let listed: Vec<ListedBuild> = builds
        .iter()
        .map(
            |Listed {
                 build,
                 jobs,
                 governor_pid,
             }| ListedBuild {
                id: build.id,
                started_unix_ms: build.started_unix_ms,
                cwd: &build.cwd,
                command: &build.command,
                duration_ms: build.duration_ms,
                jobs: *jobs,
                exit_code: build.exit_code,
                peak_total: build.peak_total,
                state: State::of(build, *governor_pid),
            },
        )
        .collect();
    if let Some(path) = json {
        let mut text = serde_json::to_vec_pretty(&listed)?;
        text.push(b'\n');
        return output::write("--json", path, &text).map(|()| 0);
    }
    print!("{}", render_list(&listed));
    Ok(0)
}

/// The `--list` table, newest build first.
fn render_list(builds: &[ListedBuild]) -> String {
    let mut out = format!(
        "{:>6}  {:<20}  {:>9}  {:>5}  {:>4}  {:>10}  project: command\n",
        "id", "when (UTC)", "duration", "jobs", "exit", "peak"
    );
    for build in builds {
        let duration = match build.state {
            State::Ended => format!("{:.1} s", build.duration_ms.unwrap_or(0) as f64 / 1000.0),
            State::Running => "running".into(),
            State::GovernorDied => "died".into(),
        };
        let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:>6}  {:<20}  {:>9}  {:>5}  {:>4}  {:>10}  {}: {}\n",
            build.id,
            when(build.started_unix_ms),
            duration,
            build.jobs,
            or_dash(build.exit_code.map(|code| code.to_string())),
            or_dash(build.peak_total.map(|bytes| Size(bytes).to_string())),
            build.cwd,
            build.command
        ));
    }
    if builds.is_empty() {
        out.push_str("(no builds yet: run `headroom build -- …` first)\n");
    }
    out
}

/// The report of build `which` (see [`shown::load`]), with where its record stands.
fn load_with_state(which: Option<&str>) -> Result<(BuildReport, State)> {
    let shown = shown::load(which)?;
    let state = State::of(&shown.report.build, shown.governor_pid);
    Ok((shown.report, state))
}

/// The page: the build's facts, a stacked series per job against the budget, the job table
/// (`headroom_report::build_page`, beside the summary whose figures it prints).
fn timeline(report: &BuildReport) -> Timeline {
    headroom_report::build_page::timeline(report)
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
        let (report, state) = load_with_state(file.to_str()).unwrap();
        assert_eq!(state, State::Ended);
        assert_eq!(report.build.parallelism_set, ["MAX_JOBS=4"]);
        assert_eq!(report.ungoverned_compilers().count(), 1);
        assert!(summary::render(&report).contains("ran outside admission"));
        let html = headroom_report::chart::render_html(&timeline(&report));
        assert!(html.contains("app"), "{html}");

        let again = dir.path().join("again.json");
        output::write("--json", &again, &report.to_json().unwrap()).unwrap();
        assert_eq!(load_with_state(again.to_str()).unwrap().0, report);
    }
}
