//! One self-contained HTML memory timeline (inline SVG and CSS, nothing fetched from the
//! network), shared by `headroom run --html` (memory per stage) and `headroom report --html`
//! (memory per build job), so both reports look and read the same.
//!
//! Series are stacked: at any time a series contributes its last sample at or before that time,
//! and zero outside its first..last sample.

use std::fmt::Write as _;

use headroom_size::format_size;

/// A chart: stacked memory series over time, an optional limit line, and labelled time bands.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub title: String,
    pub series: Vec<Series>,
    pub limit: Option<Limit>,
    pub bands: Vec<Band>,
}

/// One stacked layer: `(seconds since start, bytes)` samples in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, u64)>,
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

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

impl Series {
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

    fn peak(&self) -> u64 {
        self.points.iter().map(|p| p.1).max().unwrap_or(0)
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

/// Renders `timeline` as one HTML page with an inline SVG chart.
pub fn render_html(timeline: &Timeline) -> String {
    let times = timeline.times();
    let stack = timeline.stack(&times);
    let stacked_peak = stack
        .last()
        .and_then(|top| top.iter().max().copied())
        .unwrap_or(0);
    let y_max = stacked_peak
        .max(timeline.limit.as_ref().map_or(0, |l| l.bytes))
        .max(1) as f64
        * 1.05;
    let t_end = times
        .last()
        .copied()
        .into_iter()
        .chain(timeline.bands.iter().map(|b| b.end))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let x = |t: f64| LEFT + (t / t_end) * (WIDTH - LEFT - RIGHT);
    let y = |bytes: f64| HEIGHT - BOTTOM - (bytes / y_max) * (HEIGHT - TOP - BOTTOM);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}">"#,
        escape(&timeline.title)
    );
    for (index, band) in timeline.bands.iter().enumerate() {
        let (x0, x1) = (x(band.start), x(band.end.max(band.start)));
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
    for (index, series) in timeline.series.iter().enumerate() {
        let top = &stack[index];
        let bottom = index.checked_sub(1).map(|i| &stack[i]);
        let mut points: Vec<String> = times
            .iter()
            .zip(top)
            .map(|(&t, &v)| format!("{:.1},{:.1}", x(t), y(v as f64)))
            .collect();
        points.extend(times.iter().enumerate().rev().map(|(j, &t)| {
            let base = bottom.map_or(0, |b| b[j]);
            format!("{:.1},{:.1}", x(t), y(base as f64))
        }));
        let _ = writeln!(
            svg,
            r#"<polygon class="series" fill="{}" points="{}"><title>{}: peak {}</title></polygon>"#,
            PALETTE[index % PALETTE.len()],
            points.join(" "),
            escape(&series.name),
            format_size(series.peak()),
        );
    }
    if let Some(limit) = &timeline.limit {
        let ly = y(limit.bytes as f64);
        let _ = writeln!(
            svg,
            r#"<g class="limit"><line x1="{LEFT}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}: {}</text></g>"#,
            WIDTH - RIGHT,
            WIDTH - RIGHT - 4.0,
            ly - 4.0,
            escape(&limit.label),
            format_size(limit.bytes),
        );
    }
    write_axes(&mut svg, y_max, t_end, x, y);
    svg.push_str("</svg>\n");

    let legend: String = timeline
        .series
        .iter()
        .enumerate()
        .map(|(index, series)| {
            format!(
                r#"<li><span class="swatch" style="background:{}"></span>{} — peak {}</li>"#,
                PALETTE[index % PALETTE.len()],
                escape(&series.name),
                format_size(series.peak())
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
.band0 rect {{ fill: #f4f4f4; }}
.band1 rect {{ fill: #e8eef6; }}
.series {{ fill-opacity: 0.8; stroke: #fff; stroke-width: 0.5; }}
.limit line {{ stroke: #d62728; stroke-width: 1.5; stroke-dasharray: 6 4; }}
.limit text {{ fill: #d62728; }}
.axis line {{ stroke: #888; }}
.grid {{ stroke: #ddd; }}
ul.legend {{ list-style: none; padding: 0; }}
.swatch {{ display: inline-block; width: 1em; height: 1em; margin-right: 0.5em; vertical-align: middle; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>Peak of the stacked total: {peak}.</p>
{svg}<ul class="legend">
{legend}
</ul>
</body>
</html>
"#,
        title = escape(&timeline.title),
        peak = format_size(stacked_peak),
    )
}

fn write_axes(
    svg: &mut String,
    y_max: f64,
    t_end: f64,
    x: impl Fn(f64) -> f64,
    y: impl Fn(f64) -> f64,
) {
    const TICKS: u32 = 5;
    let _ = writeln!(svg, r#"<g class="axis">"#);
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}"/>"#,
        HEIGHT - BOTTOM,
        WIDTH - RIGHT,
        HEIGHT - BOTTOM,
        HEIGHT - BOTTOM
    );
    for tick in 0..=TICKS {
        let fraction = f64::from(tick) / f64::from(TICKS);
        let bytes = y_max / 1.05 * fraction;
        let _ = writeln!(
            svg,
            r#"<line class="grid" x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y(bytes) + 4.0,
            format_size(bytes as u64),
            py = y(bytes),
        );
        let seconds = t_end * fraction;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{seconds:.1}s</text>"#,
            x(seconds),
            HEIGHT - BOTTOM + 16.0,
        );
    }
    let _ = writeln!(svg, "</g>");
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn two_jobs() -> Timeline {
        Timeline {
            title: "build <demo> & friends".into(),
            series: vec![
                Series {
                    name: "cc1plus a.cpp".into(),
                    points: vec![(0.0, 100 * MIB), (1.0, 300 * MIB), (2.0, 200 * MIB)],
                },
                Series {
                    name: "cc1plus b.cpp".into(),
                    points: vec![(1.0, 400 * MIB), (3.0, 100 * MIB)],
                },
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
    fn page_is_self_contained_and_escaped() {
        let html = render_html(&two_jobs());
        assert!(
            !html.contains("http://") || html.matches("http://").count() == 1,
            "only the SVG namespace"
        );
        assert!(!html.contains("https://"));
        assert!(!html.contains("<script"));
        assert!(html.contains("build &lt;demo&gt; &amp; friends"));
        assert!(html.contains("Peak of the stacked total: 700.0 MiB"));
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
