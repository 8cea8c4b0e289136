//! `headroom report`: the last build (or a given one, or a `--report` JSON file) as the
//! terminal summary, JSON, or a self-contained HTML timeline of memory per job.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use headroom_store::chart::{Limit, Series, Timeline};
use headroom_store::{summary, BuildReport, History};

use crate::build::write_json_report;
use crate::output;

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
}

pub fn main(args: ReportArgs) -> Result<u8> {
    output::check_all([
        ("--json", args.json.as_deref()),
        ("--html", args.html.as_deref()),
    ])?;
    let report = load(args.build.as_deref())?;
    eprint!("{}", summary::render(&report));
    if let Some(path) = &args.json {
        write_json_report(&report, "--json", path)?;
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
        None => history.last_build_id()?,
    };
    Ok(history.load_build(id)?)
}

/// One stacked series per job, with the budget as the limit line.
fn timeline(report: &BuildReport) -> Timeline {
    let series = report
        .jobs
        .iter()
        .map(|job| Series {
            name: job.label.clone(),
            points: report
                .samples
                .iter()
                .filter(|s| s.job_id == job.job_id)
                .map(|s| (s.t_ms as f64 / 1000.0, s.bytes))
                .collect(),
        })
        .filter(|series| !series.points.is_empty())
        .collect();
    Timeline {
        title: format!(
            "headroom build {}: {}",
            report.build.id, report.build.command
        ),
        series,
        limit: Some(Limit {
            label: "budget".into(),
            bytes: report.build.budget,
        }),
        bands: Vec::new(),
    }
}
