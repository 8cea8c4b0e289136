//! Reports of a comparison: a plain-text table for people, and a self-contained HTML page with,
//! per trace and machine, an SVG bar chart of makespans and a chart of memory over time (JSON
//! comes straight from serde); and a table of several sessions at once.

use std::fmt::Write;

use headroom_report::html::escape;
use headroom_sched::Profile;
use headroom_size::format_size;

use crate::compare::Comparison;
use crate::engine::Outcome;
use crate::sessions::{Governors, SessionsComparison};

/// Makespan over the lower bound.
fn ratio(outcome: &Outcome, comparison: &Comparison) -> f64 {
    outcome.makespan / comparison.lower_bound.seconds
}

/// The machine (and its farm), and how much of its memory headroom was given.
fn machine_and_budget(comparison: &Comparison) -> String {
    format!(
        "{} (headroom's budget {})",
        comparison.site(),
        format_size(comparison.headroom_budget)
    )
}

/// The verdict line under each trace × machine: headroom against the bound and the best
/// baseline that had no OOM event.
fn verdict(comparison: &Comparison) -> String {
    let bound = &comparison.lower_bound;
    let mut line = format!(
        "lower bound {:.1}s (cpu {:.1}s, memory {:.1}s, critical path {:.1}s, prerequisites then chain {:.1}s)",
        bound.seconds, bound.cpu, bound.memory, bound.critical_path, bound.prerequisites_then_chain
    );
    let best = comparison.best_zero_oom_baseline();
    for name in ["headroom (cold)", "headroom (warm)"] {
        let Some(outcome) = comparison.outcome(name) else {
            continue;
        };
        if !outcome.completed() {
            let _ = write!(line, "; {name} stalled");
            continue;
        }
        let _ = write!(line, "; {name} {:.2}× bound", ratio(outcome, comparison));
        if let Some(best) = best {
            let _ = write!(
                line,
                ", {:.2}× {}",
                outcome.makespan / best.makespan,
                best.policy
            );
        }
    }
    line
}

/// A table of every comparison; of the `-jN` sweep only the best N are shown unless
/// `every_static` is set. With a farm, a last column counts the OOM events on its nodes.
pub fn table(comparisons: &[Comparison], every_static: bool) -> String {
    let mut text = String::new();
    for comparison in comparisons {
        let _ = writeln!(
            text,
            "{} on {}",
            comparison.trace,
            machine_and_budget(comparison)
        );
        let farm = comparison.farm.is_some();
        let _ = writeln!(
            text,
            "  {:<30} {:>10} {:>7} {:>11} {:>5} {:>6} {:>6} {:>10}{}",
            "policy",
            "makespan",
            "×bound",
            "peak",
            "OOM",
            "kills",
            "susp",
            "wasted",
            if farm { "  on nodes" } else { "" }
        );
        let shown: Vec<&Outcome> = if every_static {
            comparison.outcomes.iter().collect()
        } else {
            comparison.summary()
        };
        for outcome in shown {
            let (makespan, versus_bound) = if outcome.completed() {
                (
                    format!("{:.1}s", outcome.makespan),
                    format!("{:.2}", ratio(outcome, comparison)),
                )
            } else {
                ("stalled".to_string(), "-".to_string())
            };
            let on_nodes = if farm {
                format!(" {:>9}", outcome.node_oom_events)
            } else {
                String::new()
            };
            let _ = writeln!(
                text,
                "  {:<30} {:>10} {:>7} {:>11} {:>5} {:>6} {:>6} {:>9.1}s{on_nodes}",
                outcome.policy,
                makespan,
                versus_bound,
                format_size(outcome.peak_memory),
                outcome.oom_events,
                outcome.policy_kills,
                outcome.suspensions,
                outcome.wasted_seconds
            );
        }
        for outcome in &comparison.outcomes {
            if let Some(reason) = &outcome.stalled {
                let _ = writeln!(text, "  {}: {reason}", outcome.policy);
            }
        }
        let _ = writeln!(text, "  {}\n", verdict(comparison));
    }
    text
}

/// A table of several sessions at once per machine: how each way of governing them did
/// against one session over their union, and when each session ended.
pub fn sessions_table(comparisons: &[SessionsComparison]) -> String {
    let mut text = String::new();
    for comparison in comparisons {
        let _ = writeln!(
            text,
            "{} sessions of {} on {} (headroom's budget {}), {}",
            comparison.sessions,
            comparison.trace,
            comparison.machine,
            format_size(comparison.headroom_budget),
            comparison.policy
        );
        let _ = writeln!(
            text,
            "  {:<28} {:>10} {:>7} {:>11} {:>5} {:>6} {:>6} {:>10}  session ends",
            "governors", "makespan", "×union", "peak", "OOM", "kills", "susp", "wasted"
        );
        let union = comparison
            .outcome(Governors::Union)
            .map(|union| union.outcome.makespan);
        for row in &comparison.outcomes {
            let outcome = &row.outcome;
            let (makespan, versus_union) = match (outcome.completed(), union) {
                (true, Some(union)) => (
                    format!("{:.1}s", outcome.makespan),
                    format!("{:.2}", outcome.makespan / union),
                ),
                _ => ("stalled".to_string(), "-".to_string()),
            };
            let ends: Vec<String> = row
                .session_ends
                .iter()
                .map(|end| format!("{end:.1}s"))
                .collect();
            let _ = writeln!(
                text,
                "  {:<28} {:>10} {:>7} {:>11} {:>5} {:>6} {:>6} {:>9.1}s  {}",
                row.governors.name(),
                makespan,
                versus_union,
                format_size(outcome.peak_memory),
                outcome.oom_events,
                outcome.policy_kills,
                outcome.suspensions,
                outcome.wasted_seconds,
                ends.join(" ")
            );
            if let Some(reason) = &outcome.stalled {
                let _ = writeln!(text, "  {}: {reason}", row.governors.name());
            }
        }
        text.push('\n');
    }
    text
}

const BAR_HEIGHT: f64 = 18.0;
const LABEL_WIDTH: f64 = 230.0;
const CHART_WIDTH: f64 = 900.0;
/// The machine's memory and headroom's budget on the memory chart.
const MACHINE_COLOR: &str = "#b2182b";

/// How a policy is drawn on both charts, in a qualitative palette (Okabe and Ito's, which
/// colour-blind readers tell apart): headroom warm in blue and cold in green, the clairvoyant
/// reference in reddish purple, baselines in grey, or in vermillion where they ran out of
/// memory or stalled. Each has its own dash on the memory chart, for greyscale prints.
fn style(outcome: &Outcome) -> (&'static str, &'static str) {
    match (outcome.policy.as_str(), outcome.family.as_str()) {
        _ if !outcome.completed() || outcome.oom_events > 0 => ("#d55e00", "1 0"),
        ("headroom (warm)", _) => ("#0072b2", "1 0"),
        ("headroom (cold)", _) => ("#009e73", "8 4"),
        (_, "reference") => ("#cc79a7", "2 3"),
        _ => ("#595959", "10 3 2 3"),
    }
}

/// One SVG bar chart of makespans for one machine, coloured by [`style`], with a time axis and
/// the lower bound as a dashed line.
fn chart(comparison: &Comparison) -> String {
    let outcomes = comparison.summary();
    let longest = outcomes
        .iter()
        .map(|outcome| outcome.makespan)
        .fold(comparison.lower_bound.seconds, f64::max);
    let plot = CHART_WIDTH - LABEL_WIDTH - 160.0;
    let x = |seconds: f64| LABEL_WIDTH + plot * seconds / longest;
    let bars = (outcomes.len() as f64 + 0.5) * BAR_HEIGHT * 1.4;
    let height = bars + 64.0;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{height:.0}" font-family="sans-serif" font-size="12"><text x="{:.1}" y="12" text-anchor="end" font-weight="600">policy</text>"#,
        LABEL_WIDTH - 6.0
    );
    for (row, outcome) in outcomes.iter().enumerate() {
        let y = (row as f64 + 0.5) * BAR_HEIGHT * 1.4 + 8.0;
        let (color, _) = style(outcome);
        let note = if !outcome.completed() {
            " (stalled)".to_string()
        } else if outcome.oom_events > 0 {
            format!(" ({} OOM)", outcome.oom_events)
        } else {
            String::new()
        };
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{LABEL_WIDTH}" y="{y:.1}" width="{:.1}" height="{BAR_HEIGHT}" fill="{color}"/><text x="{:.1}" y="{:.1}">{:.0}s{}</text>"#,
            LABEL_WIDTH - 6.0,
            y + 13.0,
            escape(&outcome.policy),
            x(outcome.makespan) - LABEL_WIDTH,
            x(outcome.makespan) + 4.0,
            y + 13.0,
            outcome.makespan,
            note
        );
    }
    let axis = bars + 14.0;
    let _ = write!(
        svg,
        r##"<line x1="{LABEL_WIDTH}" y1="{axis:.1}" x2="{:.1}" y2="{axis:.1}" stroke="#888"/>"##,
        x(longest)
    );
    for seconds in second_ticks(longest) {
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{seconds:.0}</text>"#,
            x(seconds),
            axis + 15.0
        );
    }
    let bound = x(comparison.lower_bound.seconds);
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="600">makespan, time (s)</text><line x1="{bound:.1}" y1="8" x2="{bound:.1}" y2="{axis:.1}" stroke="#000" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}">lower bound {:.0}s</text></svg>"##,
        x(longest / 2.0),
        axis + 34.0,
        bound + 4.0,
        axis - 4.0,
        comparison.lower_bound.seconds
    );
    svg
}

const TIMELINE_HEIGHT: f64 = 260.0;

/// Ticks of a time axis from 0 to `longest` seconds: about four, a whole number of seconds
/// apart.
fn second_ticks(longest: f64) -> impl Iterator<Item = f64> {
    let step = (longest / 4.0).ceil().max(1.0);
    (0..)
        .map(move |tick| f64::from(tick) * step)
        .take_while(move |&t| t <= longest + 1e-9)
}

/// One SVG chart of the jobs' total memory over time (the highest use in each of 64 slices of
/// a run) for headroom cold and warm, the best zero-OOM baseline and the clairvoyant reference,
/// against the machine's memory and headroom's budget: waves of jobs that peak together, and
/// how close each policy runs to the machine, show here.
fn timeline(comparison: &Comparison) -> String {
    let lines: Vec<(&Outcome, &Profile)> = [
        comparison.outcome("headroom (warm)"),
        comparison.outcome("headroom (cold)"),
        comparison.best_zero_oom_baseline(),
        comparison
            .outcomes
            .iter()
            .find(|outcome| outcome.family == "reference"),
    ]
    .into_iter()
    .filter_map(|outcome| {
        let outcome = outcome?;
        Some((outcome, outcome.memory_over_time.as_ref()?))
    })
    .collect();
    let longest = lines
        .iter()
        .map(|(outcome, _)| outcome.makespan)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let memory = comparison.machine_memory.max(1) as f64;
    let (left, top, width, height) = (90.0, 12.0, CHART_WIDTH - 360.0, TIMELINE_HEIGHT - 60.0);
    let x = |seconds: f64| left + width * seconds / longest;
    let y = |bytes: f64| top + height * (1.0 - bytes / memory);
    let bottom = top + height;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{TIMELINE_HEIGHT}" font-family="sans-serif" font-size="12"><line x1="{left}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#888"/><line x1="{left}" y1="{top:.1}" x2="{left}" y2="{bottom:.1}" stroke="#888"/>"##,
        left + width,
    );
    for tick in 0..=4 {
        let bytes = memory * f64::from(tick) / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + width,
            left - 6.0,
            y(bytes) + 4.0,
            format_size(bytes as u64),
            py = y(bytes),
        );
    }
    for seconds in second_ticks(longest) {
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{seconds:.0}</text>"#,
            x(seconds),
            bottom + 16.0,
        );
    }
    let budget = y(comparison.headroom_budget as f64);
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="600">time (s)</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle" font-weight="600">memory</text><line x1="{left}" y1="{top:.1}" x2="{:.1}" y2="{top:.1}" stroke="{MACHINE_COLOR}" stroke-width="1.5"/><line x1="{left}" y1="{budget:.1}" x2="{:.1}" y2="{budget:.1}" stroke="{MACHINE_COLOR}" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
        left + width / 2.0,
        bottom + 36.0,
        top + height / 2.0,
        left + width,
        left + width,
    );
    let legend = |svg: &mut String, row: usize, color: &str, dash: &str, label: &str| {
        let legend_y = top + 8.0 + row as f64 * 18.0;
        let _ = write!(
            svg,
            r#"<line x1="{:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + width + 12.0,
            left + width + 40.0,
            left + width + 46.0,
            legend_y + 4.0,
            escape(label)
        );
    };
    for (row, (outcome, profile)) in lines.iter().enumerate() {
        let (color, dash) = style(outcome);
        let slice = outcome.makespan / profile.shape().len() as f64;
        let points: Vec<String> = profile
            .shape()
            .iter()
            .enumerate()
            .flat_map(|(index, &fraction)| {
                let bytes = f64::from(fraction) * outcome.peak_memory as f64;
                [index, index + 1]
                    .map(|edge| format!("{:.1},{:.1}", x(edge as f64 * slice), y(bytes)))
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" points="{}"/>"#,
            points.join(" "),
        );
        legend(&mut svg, row, color, dash, &outcome.policy);
    }
    let row = lines.len();
    legend(
        &mut svg,
        row,
        MACHINE_COLOR,
        "1 0",
        &format!("machine {}", format_size(comparison.machine_memory)),
    );
    legend(
        &mut svg,
        row + 1,
        MACHINE_COLOR,
        "6 4",
        &format!(
            "headroom's budget {}",
            format_size(comparison.headroom_budget)
        ),
    );
    svg.push_str("</svg>");
    svg
}

/// A self-contained HTML page: for each trace, the charts and a verdict per machine.
pub fn html(comparisons: &[Comparison]) -> String {
    let mut page = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>headroom sim</title></head>\n<body style=\"font-family:sans-serif\">\n<h1>headroom sim</h1>\n",
    );
    let mut previous_trace = None;
    for comparison in comparisons {
        if previous_trace != Some(&comparison.trace) {
            let _ = writeln!(page, "<h2>{}</h2>", escape(&comparison.trace));
            previous_trace = Some(&comparison.trace);
        }
        let _ = write!(
            page,
            "<h3>{}</h3>\n<p>{}</p>\n{}\n{}\n",
            escape(&machine_and_budget(comparison)),
            escape(&verdict(comparison)),
            chart(comparison),
            timeline(comparison)
        );
    }
    page.push_str("</body></html>\n");
    page
}
