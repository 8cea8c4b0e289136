//! One self-contained HTML page around a memory timeline (inline SVG, CSS and a few lines of
//! script, nothing fetched from the network), shared by `headroom run --html` (memory per
//! stage) and `headroom report --html` (memory per build job), so both read the same: facts
//! above, stacked memory over time with titled axes, tables below.
//!
//! The y axis fits the data, not the limit: a 100 MiB build under a 20 GiB budget must not be
//! a flat line. A limit near the data is drawn as a line; one far above it is named in a note
//! at the top, off the scale. Events (an OOM kill) and levels (the kernel's own peak, which
//! counts what fell between samples) mark what the samples cannot show.
//!
//! Series are stacked: at any time a series contributes its last sample at or before that time,
//! and zero outside its first..last sample.

use std::fmt::Write as _;

use headroom_size::format_size;

use crate::html::{escape, facts, SORT_SCRIPT};

/// A page: facts, a chart of stacked memory series over time with an optional limit, labelled
/// time bands, events and levels, and sections of HTML under it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub title: String,
    /// `name: value` pairs shown above the chart (the command, the budget…).
    pub facts: Vec<(String, String)>,
    pub series: Vec<Series>,
    pub limit: Option<Limit>,
    pub bands: Vec<Band>,
    pub events: Vec<Event>,
    pub levels: Vec<Level>,
    /// Seconds the time axis covers at least: the whole build, past its last sample.
    pub end: f64,
    /// HTML under the chart and its legend, such as a [`Table`](crate::html::Table).
    pub sections: Vec<String>,
}

/// One stacked layer: `(seconds since start, bytes)` samples in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, u64)>,
    /// The peak the legend names: the highest sample, or the caller's better figure (a build
    /// job's recorded peak also counts the kernel's max RSS, which samples can miss).
    pub peak: u64,
}

/// A horizontal line such as a memory limit or budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub label: String,
    pub bytes: u64,
}

/// A labelled span of time, such as a stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub label: String,
    pub start: f64,
    pub end: f64,
}

/// A moment marked by a vertical line, such as the OOM kill that ended a rung.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub label: String,
    pub t: f64,
}

/// A figure held over a span that the samples do not show, such as the kernel's high-water
/// mark of a rung's cgroup: drawn as a dotted level from `start` to `end`.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    pub label: String,
    pub bytes: u64,
    pub start: f64,
    pub end: f64,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
/// About this many ticks on each axis.
const TICKS: f64 = 5.0;
/// Room above the data's top, so the highest layer does not touch the frame.
const HEADROOM: f64 = 1.1;
/// A limit up to this many times the data's top is drawn as a line on the scale; a higher one
/// would squash the data, so it is named off the scale instead.
const LIMIT_ON_SCALE: f64 = 2.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

impl Series {
    /// A series whose legend names its highest sample.
    pub fn sampled(name: String, points: Vec<(f64, u64)>) -> Series {
        let peak = points.iter().map(|p| p.1).max().unwrap_or(0);
        Series { name, points, peak }
    }

    /// The value this series contributes at time `t`.
    fn value_at(&self, t: f64) -> u64 {
        let (Some(first), Some(last)) = (self.points.first(), self.points.last()) else {
            return 0;
        };
        if t < first.0 || t > last.0 {
            return 0;
        }
        let after = self.points.partition_point(|&(time, _)| time <= t);
        self.points[after.saturating_sub(1)].1
    }
}

impl Timeline {
    /// Every sample time of every series, sorted and deduplicated.
    fn times(&self) -> Vec<f64> {
        let mut times: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .filter(|t| t.is_finite())
            .collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        times
    }

    /// The stacked totals at each of `times`: `stack[i][j]` is the top of series `i` at time `j`.
    fn stack(&self, times: &[f64]) -> Vec<Vec<u64>> {
        let mut below = vec![0u64; times.len()];
        self.series
            .iter()
            .map(|series| {
                for (total, &t) in below.iter_mut().zip(times) {
                    *total += series.value_at(t);
                }
                below.clone()
            })
            .collect()
    }
}

/// A tick step of 1, 2 or 5 times a power of ten of `unit`, giving about [`TICKS`] ticks over
/// `span`, so ticks read 0, 50.0 MiB, 100.0 MiB… or 0, 2, 4… seconds.
fn tick_step(span: f64, unit: f64) -> f64 {
    let raw = (span / unit / TICKS).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let multiple = [1.0, 2.0, 5.0]
        .into_iter()
        .find(|&m| m * magnitude >= raw)
        .unwrap_or(10.0);
    multiple * magnitude * unit
}

/// Where times and bytes land in the SVG.
struct Scale {
    t_end: f64,
    y_top: f64,
}

impl Scale {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.t_end) * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, bytes: f64) -> f64 {
        HEIGHT - BOTTOM - (bytes / self.y_top) * (HEIGHT - TOP - BOTTOM)
    }
}

/// Renders `timeline` as one HTML page with an inline SVG chart.
pub fn render_html(timeline: &Timeline) -> String {
    let times = timeline.times();
    let stack = timeline.stack(&times);
    let stacked_peak = stack
        .last()
        .and_then(|top| top.iter().max().copied())
        .unwrap_or(0);
    let data_top = timeline
        .levels
        .iter()
        .map(|level| level.bytes)
        .fold(stacked_peak, u64::max);
    let on_scale = timeline
        .limit
        .as_ref()
        .filter(|limit| limit.bytes as f64 <= data_top as f64 * LIMIT_ON_SCALE);
    let wanted = (data_top.max(on_scale.map_or(0, |limit| limit.bytes)) as f64 * HEADROOM)
        .max(f64::from(1 << 20));
    let unit = [1u64 << 40, 1 << 30, 1 << 20, 1 << 10]
        .into_iter()
        .find(|&unit| wanted >= unit as f64)
        .unwrap_or(1) as f64;
    let y_step = tick_step(wanted, unit);
    let t_end = times
        .last()
        .copied()
        .into_iter()
        .chain(timeline.bands.iter().map(|b| b.end))
        .chain(timeline.events.iter().map(|e| e.t))
        .chain(timeline.levels.iter().map(|l| l.end))
        .fold(timeline.end, f64::max)
        .max(1e-9);
    let scale = Scale {
        t_end,
        y_top: (wanted / y_step).ceil() * y_step,
    };

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}">"#,
        escape(&timeline.title)
    );
    write_bands(&mut svg, timeline, &scale);
    write_axes(&mut svg, &scale, y_step);
    for (index, series) in timeline.series.iter().enumerate() {
        if series.points.is_empty() {
            continue;
        }
        let top = &stack[index];
        let bottom = index.checked_sub(1).map(|i| &stack[i]);
        let mut points: Vec<String> = times
            .iter()
            .zip(top)
            .map(|(&t, &v)| format!("{:.1},{:.1}", scale.x(t), scale.y(v as f64)))
            .collect();
        points.extend(times.iter().enumerate().rev().map(|(j, &t)| {
            let base = bottom.map_or(0, |b| b[j]);
            format!("{:.1},{:.1}", scale.x(t), scale.y(base as f64))
        }));
        let _ = writeln!(
            svg,
            r#"<polygon class="series" fill="{}" points="{}"><title>{}: peak {}</title></polygon>"#,
            PALETTE[index % PALETTE.len()],
            points.join(" "),
            escape(&series.name),
            format_size(series.peak),
        );
    }
    write_marks(&mut svg, timeline, &scale);
    if let Some(limit) = &timeline.limit {
        write_limit(&mut svg, limit, on_scale.is_some(), &scale);
    }
    svg.push_str("</svg>\n");

    let legend: String = timeline
        .series
        .iter()
        .enumerate()
        .map(|(index, series)| {
            let (color, note) = if series.points.is_empty() {
                ("none", " (no samples to draw)")
            } else {
                (PALETTE[index % PALETTE.len()], "")
            };
            format!(
                r#"<li><span class="swatch" style="background:{color}"></span>{} — peak {}{note}</li>"#,
                escape(&series.name),
                format_size(series.peak),
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
svg {{ width: 100%; max-width: {WIDTH}px; height: auto; }}
svg text {{ font-size: 11px; fill: #333; }}
svg text.axis-title {{ font-size: 13px; font-weight: 600; }}
.band0 rect {{ fill: #f4f4f4; }}
.band1 rect {{ fill: #e8eef6; }}
.series {{ fill-opacity: 0.8; stroke: #fff; stroke-width: 0.5; }}
.limit line {{ stroke: #d62728; stroke-width: 1.5; stroke-dasharray: 6 4; }}
.limit polygon {{ fill: #d62728; }}
svg .limit text {{ fill: #d62728; font-weight: 600; }}
.event line {{ stroke: #222; stroke-width: 2; }}
svg .event text {{ fill: #222; font-weight: 600; }}
.level line {{ stroke: #6a3d9a; stroke-width: 2; stroke-dasharray: 2 3; }}
svg .level text {{ fill: #6a3d9a; }}
.axis line {{ stroke: #888; }}
.axis line.grid {{ stroke: #ddd; }}
dl.facts {{ display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }}
dl.facts dt {{ font-weight: 600; }}
dl.facts dd {{ margin: 0; font-family: ui-monospace, monospace; }}
ul.legend {{ list-style: none; padding: 0; }}
.swatch {{ display: inline-block; width: 1em; height: 1em; margin-right: 0.5em; vertical-align: middle; border: 1px solid #888; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }}
td[data-sort] {{ text-align: right; white-space: nowrap; }}
th {{ cursor: pointer; background: #f4f4f4; user-select: none; }}
th[aria-sort=ascending]::after {{ content: " ▲"; }}
th[aria-sort=descending]::after {{ content: " ▼"; }}
td code {{ display: inline-block; min-width: 14em; overflow-wrap: anywhere; }}
</style>
</head>
<body>
<h1>{title}</h1>
{facts}<p>Memory over time, stacked; the highest sampled total drawn is {peak}.</p>
{svg}<ul class="legend">
{legend}
</ul>
{sections}{SORT_SCRIPT}</body>
</html>
"#,
        title = escape(&timeline.title),
        facts = if timeline.facts.is_empty() {
            String::new()
        } else {
            facts(&timeline.facts)
        },
        peak = format_size(stacked_peak),
        sections = timeline.sections.concat(),
    )
}

fn write_bands(svg: &mut String, timeline: &Timeline, scale: &Scale) {
    for (index, band) in timeline.bands.iter().enumerate() {
        let (x0, x1) = (scale.x(band.start), scale.x(band.end.max(band.start)));
        let _ = writeln!(
            svg,
            r#"<g class="band band{}"><rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{:.1}"><title>{} ({:.2}s – {:.2}s)</title></rect><text x="{:.1}" y="{:.1}">{}</text></g>"#,
            index % 2,
            (x1 - x0).max(0.5),
            HEIGHT - TOP - BOTTOM,
            escape(&band.label),
            band.start,
            band.end,
            x0 + 3.0,
            TOP + 12.0,
            escape(&band.label),
        );
    }
}

/// Events as vertical lines labelled at the top (left of the line in the chart's right half),
/// levels as dotted lines over their span labelled above their start.
fn write_marks(svg: &mut String, timeline: &Timeline, scale: &Scale) {
    for level in &timeline.levels {
        let (x0, x1, ly) = (
            scale.x(level.start),
            scale.x(level.end.max(level.start)),
            scale.y(level.bytes as f64),
        );
        let _ = writeln!(
            svg,
            r#"<g class="level"><line x1="{x0:.1}" y1="{ly:.1}" x2="{x1:.1}" y2="{ly:.1}"/><text x="{:.1}" y="{:.1}">{} {}</text></g>"#,
            x0 + 3.0,
            ly - 4.0,
            escape(&level.label),
            format_size(level.bytes),
        );
    }
    for event in &timeline.events {
        let ex = scale.x(event.t);
        let (anchor, text_x) = if ex > (LEFT + WIDTH - RIGHT) / 2.0 {
            ("end", ex - 4.0)
        } else {
            ("start", ex + 4.0)
        };
        let _ = writeln!(
            svg,
            r#"<g class="event"><line x1="{ex:.1}" y1="{TOP}" x2="{ex:.1}" y2="{:.1}"/><text x="{text_x:.1}" y="{:.1}" text-anchor="{anchor}">{}</text><title>{} at {:.2}s</title></g>"#,
            HEIGHT - BOTTOM,
            TOP + 28.0,
            escape(&event.label),
            escape(&event.label),
            event.t,
        );
    }
}

/// The limit as a dashed line where it is on the scale, else an arrow and a note at the top.
fn write_limit(svg: &mut String, limit: &Limit, on_scale: bool, scale: &Scale) {
    let text = format!("{} {}", escape(&limit.label), format_size(limit.bytes));
    if on_scale {
        let ly = scale.y(limit.bytes as f64);
        let _ = writeln!(
            svg,
            r#"<g class="limit"><line x1="{LEFT}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{text}</text></g>"#,
            WIDTH - RIGHT,
            WIDTH - RIGHT - 4.0,
            ly - 4.0,
        );
    } else {
        let ax = WIDTH - RIGHT - 6.0;
        let _ = writeln!(
            svg,
            r#"<g class="limit off-scale"><polygon points="{ax:.1},{:.1} {:.1},{:.1} {:.1},{:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{text}, above the chart</text></g>"#,
            TOP - 18.0,
            ax - 6.0,
            TOP - 6.0,
            ax + 6.0,
            TOP - 6.0,
            ax - 10.0,
            TOP - 8.0,
        );
    }
}

/// Frame, grid, ticks and the titles `time (s)` and `memory`.
fn write_axes(svg: &mut String, scale: &Scale, y_step: f64) {
    let (bottom, right) = (HEIGHT - BOTTOM, WIDTH - RIGHT);
    let _ = writeln!(svg, r#"<g class="axis">"#);
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}"/>"#,
    );
    let y_ticks = (scale.y_top / y_step).round() as u32;
    for tick in 0..=y_ticks {
        let bytes = f64::from(tick) * y_step;
        let py = scale.y(bytes);
        let _ = writeln!(
            svg,
            r#"<line class="grid" x1="{LEFT}" y1="{py:.1}" x2="{right}" y2="{py:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            py + 4.0,
            format_size(bytes.round() as u64),
        );
    }
    let t_step = tick_step(scale.t_end, 1.0);
    let decimals = (-t_step.log10().floor()).max(0.0) as usize;
    let t_ticks = (scale.t_end / t_step + 1e-9).floor() as u32;
    for tick in 0..=t_ticks {
        let seconds = f64::from(tick) * t_step;
        let _ = writeln!(
            svg,
            r#"<line x1="{px:.1}" y1="{bottom}" x2="{px:.1}" y2="{:.1}"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{seconds:.decimals$}</text>"#,
            bottom + 4.0,
            bottom + 16.0,
            px = scale.x(seconds),
        );
    }
    let _ = writeln!(
        svg,
        r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">time (s)</text><text class="axis-title" transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">memory</text>"#,
        (LEFT + right) / 2.0,
        HEIGHT - 10.0,
        (TOP + bottom) / 2.0,
    );
    let _ = writeln!(svg, "</g>");
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn two_jobs() -> Timeline {
        Timeline {
            title: "build <demo> & friends".into(),
            facts: vec![("command".into(), "make -j4".into())],
            series: vec![
                Series::sampled(
                    "cc1plus a.cpp".into(),
                    vec![(0.0, 100 * MIB), (1.0, 300 * MIB), (2.0, 200 * MIB)],
                ),
                Series::sampled(
                    "cc1plus b.cpp".into(),
                    vec![(1.0, 400 * MIB), (3.0, 100 * MIB)],
                ),
            ],
            limit: Some(Limit {
                label: "budget".into(),
                bytes: 800 * MIB,
            }),
            bands: vec![
                Band {
                    label: "configure".into(),
                    start: 0.0,
                    end: 1.0,
                },
                Band {
                    label: "compile".into(),
                    start: 1.0,
                    end: 3.0,
                },
            ],
            events: vec![Event {
                label: "killed".into(),
                t: 3.0,
            }],
            levels: vec![Level {
                label: "cgroup peak (kernel)".into(),
                bytes: 750 * MIB,
                start: 0.0,
                end: 3.0,
            }],
            end: 0.0,
            sections: vec!["<p>more</p>\n".into()],
        }
    }

    #[test]
    fn series_contribute_their_last_sample_and_nothing_outside_their_span() {
        let timeline = two_jobs();
        let times = timeline.times();
        assert_eq!(times, vec![0.0, 1.0, 2.0, 3.0]);
        let stack = timeline.stack(&times);
        assert_eq!(stack[0], vec![100 * MIB, 300 * MIB, 200 * MIB, 0]);
        // b starts at 1.0, holds 400 MiB at 2.0 (its last sample before), and ends at 3.0.
        assert_eq!(stack[1], vec![100 * MIB, 700 * MIB, 600 * MIB, 100 * MIB]);
    }

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(tick_step(124.0 * MIB as f64, MIB as f64), 50.0 * MIB as f64);
        assert_eq!(tick_step(4.0, 1.0), 1.0);
        assert_eq!(tick_step(0.3, 1.0), 0.1);
        assert_eq!(tick_step(70.0, 1.0), 20.0);
    }

    #[test]
    fn page_is_self_contained_and_escaped() {
        let html = render_html(&two_jobs());
        assert_eq!(html.matches("http://").count(), 1, "only the SVG namespace");
        assert!(!html.contains("https://") && !html.contains(" src="));
        assert!(html.contains("build &lt;demo&gt; &amp; friends"));
        assert!(html.contains("the highest sampled total drawn is 700.0 MiB"));
        assert!(html.contains(">time (s)</text>") && html.contains(">memory</text>"));
        assert!(html.contains("<dd>make -j4</dd>") && html.contains("<p>more</p>"));
    }

    #[test]
    fn a_limit_near_the_data_is_a_line_and_one_far_above_is_named_off_the_scale() {
        let near = render_html(&two_jobs());
        assert!(near.contains(r#"<g class="limit"><line"#), "{near}");
        assert!(near.contains(">budget 800.0 MiB</text>"));
        // The axis reaches past the limit, in round steps.
        assert!(near.contains(">1000.0 MiB</text>") && !near.contains(">1.17 GiB<"));

        let mut small = two_jobs();
        small.limit = Some(Limit {
            label: "budget".into(),
            bytes: 20 << 30,
        });
        small.levels.clear();
        let far = render_html(&small);
        assert!(
            far.contains(">budget 20.0 GiB, above the chart</text>"),
            "{far}"
        );
        assert!(!far.contains(r#"<g class="limit"><line"#));
        // The axis fits the 700 MiB stacked peak with some room, not the 20 GiB budget.
        assert!(far.contains(">800.0 MiB</text>") && !far.contains(">1.00 GiB</text>"));
    }

    #[test]
    fn a_series_without_samples_is_still_in_the_legend() {
        let mut timeline = two_jobs();
        timeline.series.push(Series {
            name: "link".into(),
            points: Vec::new(),
            peak: 70 * MIB,
        });
        let html = render_html(&timeline);
        assert!(html.contains("link — peak 70.0 MiB (no samples to draw)</li>"));
        assert_eq!(html.matches("<polygon class=\"series\"").count(), 2);
    }

    #[test]
    fn empty_timeline_still_renders() {
        let html = render_html(&Timeline {
            title: "nothing".into(),
            ..Timeline::default()
        });
        assert!(html.contains("<svg"));
    }

    #[test]
    fn snapshot_of_a_two_job_timeline() {
        insta::assert_snapshot!(render_html(&two_jobs()));
    }
}
