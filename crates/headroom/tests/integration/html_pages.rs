//! The HTML pages people open, written by the built binary from realistic data and opened in
//! headless Chromium: `headroom report --html` (a small build under a large budget, with a job
//! too short to be sampled), `headroom run --html` (a ladder whose first rung runs out of
//! memory) and `headroom sim --html` (a committed trace). Each page's screenshot must show a
//! drawn chart, not a blank page, and its DOM, after the page's inline script has run, must
//! hold what the page promises. Skips, saying why, where `chromium` is missing
//! (`.ci/chromium.sh` installs it).

use crate::support::{self, run};

use std::path::Path;
use std::process::Command;

use regex::Regex;
use run::{can_make_cgroups, have_python, Scratch};
use support::stderr;

const MIB: u64 = 1 << 20;

/// Whether Chromium is here; prints why a test skips when not.
fn have_chromium() -> bool {
    let ok = Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !ok {
        headroom_testkit::skip(
            "chromium",
            "chromium is not installed (bash .ci/chromium.sh installs it)",
        );
    }
    ok
}

/// `chromium --headless` on `page` (with `fragment`, such as `#sort=-peak`) and `args`, with a
/// profile of its own so tests running at once do not share one; returns stdout.
fn chromium(scratch: &Scratch, page: &str, fragment: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}{fragment}", scratch.path(page).display()))
        .output()
        .expect("chromium runs");
    assert!(output.status.success(), "chromium: {}", stderr(&output));
    String::from_utf8(output.stdout).expect("UTF-8 DOM")
}

/// The page's DOM after its scripts ran.
fn dom(scratch: &Scratch, page: &str, fragment: &str) -> String {
    chromium(scratch, page, fragment, &["--dump-dom"])
}

/// Takes a screenshot of `page` and checks that it shows a chart: many colours, and a share of
/// saturated pixels (the chart's layers, bars or lines; text alone is grey).
fn assert_screenshot_shows_a_chart(scratch: &Scratch, page: &str) {
    let png = scratch.path(&format!("{page}.png"));
    chromium(
        scratch,
        page,
        "",
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1200,1000",
        ],
    );
    let file = std::fs::read(&png).expect("screenshot written");
    let mut decoder = png::Decoder::new(std::io::Cursor::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("a size")];
    let frame = reader.next_frame(&mut pixels).expect("a frame");
    let channels = frame.color_type.samples();
    let pixels: Vec<&[u8]> = pixels[..frame.buffer_size()]
        .chunks(channels)
        .map(|pixel| &pixel[..3])
        .collect();
    let distinct: std::collections::HashSet<&[u8]> = pixels.iter().copied().collect();
    let saturated = pixels
        .iter()
        .filter(|rgb| rgb.iter().max().unwrap() - rgb.iter().min().unwrap() > 60)
        .count();
    assert!(
        distinct.len() > 50 && saturated * 100 > pixels.len(),
        "{page}'s screenshot looks blank: {} colours, {saturated} of {} pixels in colour",
        distinct.len(),
        pixels.len()
    );
}

/// The screenshot check has teeth: a page of text alone fails it.
#[test]
fn a_page_of_text_alone_fails_the_screenshot_check() {
    if !have_chromium() {
        return;
    }
    let scratch = Scratch::new();
    std::fs::write(scratch.path("text.html"), "<h1>no chart here</h1>").unwrap();
    let check = std::panic::catch_unwind(|| assert_screenshot_shows_a_chart(&scratch, "text.html"));
    assert!(check.is_err(), "a page without a chart passed");
}

/// The cells of each row of the table of class `class`, as text, in the DOM's order.
fn rows(dom: &str, class: &str) -> Vec<Vec<String>> {
    let table = Regex::new(&format!(
        r#"(?s)<table class="sortable {class}">.*?<tbody>(.*?)</tbody>"#
    ))
    .unwrap();
    let tags = Regex::new("<[^>]*>").unwrap();
    let body = &table.captures(dom).expect("the table")[1];
    Regex::new(r"(?s)<tr>(.*?)</tr>")
        .unwrap()
        .captures_iter(body)
        .map(|row| {
            Regex::new(r"(?s)<td[^>]*>(.*?)</td>")
                .unwrap()
                .captures_iter(&row[1])
                .map(|cell| tags.replace_all(&cell[1], "").replace("&lt;", "<"))
                .collect()
        })
        .collect()
}

/// A build as `headroom build --report` writes it: 113 MiB of jobs under a 20.9 GiB budget;
/// b.o's recorded peak (the kernel's max RSS) is above its highest sample, and the link ended
/// before it was sampled.
fn build_report() -> serde_json::Value {
    let job = |job_id: u64, label: &str, command: &str, start_ms: u64, end_ms: u64, peak: u64| {
        serde_json::json!({
            "job_id": job_id, "key": format!("k{job_id}"), "group": "g++ -O2", "label": label,
            "compiler": "/usr/bin/g++", "command": command, "cwd": "/src/demo",
            "offered_ms": start_ms, "start_ms": start_ms, "end_ms": end_ms, "peak": peak,
            "cpu_ms": end_ms - start_ms, "exit_code": 0, "signal": null,
            "predicted": 512 * MIB, "prediction_source": if job_id == 2 { "group" } else { "default" },
            "attempts": 1, "suspends": 0, "requeues": 0, "oom_retries": 0,
            "lowered_flags": null, "over_budget": false, "nice": if job_id == 0 { 4 } else { 0 }
        })
    };
    let mut samples = Vec::new();
    for (t_ms, a, b) in [(200, 20, 30), (600, 38, 52), (1000, 45, 67), (1400, 41, 64)] {
        samples.push(serde_json::json!({"t_ms": t_ms, "job_id": 0, "bytes": a * MIB}));
        samples.push(serde_json::json!({"t_ms": t_ms, "job_id": 1, "bytes": b * MIB}));
    }
    serde_json::json!({
        "schema": 1,
        "build": {
            "id": 41, "started_unix_ms": 1_732_000_000_000u64, "duration_ms": 2300,
            "command": "make -j2 demo", "cwd": "/src/demo", "budget": 21_440 * MIB,
            "budget_source": "MemAvailable 21.9 GiB − reserve 1.0 GiB", "slots": 16,
            "exit_code": 0, "peak_total": 113 * MIB, "parallelism_set": ["MAKEFLAGS=-j32"]
        },
        "jobs": [
            job(0, "a.o", "g++ -O2 -c a.cpp -o a.o", 100, 1500, 46 * MIB),
            job(1, "b.o", "g++ -O2 -c b.cpp -o b.o", 120, 1700, 74 * MIB + 100 * 1024),
            job(2, "demo", "g++ a.o b.o -o demo", 1750, 1790, 9 * MIB),
        ],
        "samples": samples,
        "outside": []
    })
}

/// The terminal summary's job table: label → peak.
fn summary_peaks(summary: &str) -> Vec<(String, String)> {
    let line = Regex::new(r"^\s+(\S+ [KMG]?i?B)\s+[\d.]+ s\s+\S+\s+(\S+)$").unwrap();
    summary
        .lines()
        .skip_while(|line| !line.contains("predicted  job"))
        .skip(1)
        .filter_map(|l| line.captures(l))
        .map(|c| (c[2].to_string(), c[1].to_string()))
        .collect()
}

#[test]
fn the_build_page_lists_every_job_with_the_summarys_peaks_and_sorts() {
    if !have_chromium() {
        return;
    }
    let scratch = Scratch::new();
    std::fs::write(scratch.path("report.json"), build_report().to_string()).unwrap();
    let output = scratch.headroom(&["report", "--html", "build.html", "report.json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = String::from_utf8(output.stdout).unwrap();
    let peaks = summary_peaks(&summary);
    assert_eq!(peaks.len(), 3, "{summary}");
    assert!(
        peaks.contains(&("b.o".into(), "74.1 MiB".into())),
        "{summary}"
    );

    let page = dom(&scratch, "build.html", "");
    let jobs = rows(&page, "jobs");
    let labels: Vec<&str> = jobs.iter().map(|row| row[0].as_str()).collect();
    assert_eq!(labels, ["a.o", "b.o", "demo"], "every job, the link too");
    for (label, peak) in &peaks {
        let row = jobs.iter().find(|row| &row[0] == label).unwrap();
        assert_eq!(&row[4], peak, "{label}'s peak in the table");
        assert!(
            page.contains(&format!("{label} — peak {peak}")),
            "{label}'s peak in the legend: {page}"
        );
    }
    assert_eq!(jobs[2][6], "group", "the prediction's source");
    assert!(page.contains("budget 20.9 GiB, above the chart"), "{page}");
    assert!(page.contains("<dd>MAKEFLAGS=-j32</dd>") && page.contains("<dd>/src/demo</dd>"));

    // The address sorts the table through the same function a click on a header calls.
    let sorted = dom(&scratch, "build.html", "#sort=-peak");
    let by_peak: Vec<String> = rows(&sorted, "jobs")
        .into_iter()
        .map(|row| row[0].clone())
        .collect();
    let summary_order: Vec<String> = peaks.iter().map(|(label, _)| label.clone()).collect();
    assert_eq!(
        by_peak, summary_order,
        "largest first, as the summary lists them"
    );
    assert!(sorted.contains(r#"data-key="peak" title="sort by peak" aria-sort="descending""#));
    let sorted = dom(&scratch, "build.html", "#sort=label");
    let by_label: Vec<String> = rows(&sorted, "jobs")
        .into_iter()
        .map(|row| row[0].clone())
        .collect();
    assert_eq!(by_label, ["a.o", "b.o", "demo"]);

    assert_screenshot_shows_a_chart(&scratch, "build.html");
}

#[test]
fn the_run_page_shows_each_rungs_command_outcome_diagnosis_and_peaks() {
    if !have_chromium() || !have_python() {
        return;
    }
    let scratch = Scratch::new();
    // Rung 0 runs out of memory in its `compile` stage; rung 1, smaller, does not.
    let script = format!(
        "python3 {} load:20:0.2 compile:${{MB:-60}}:0.3 && \
         if [ -z \"$SMALL\" ]; then python3 -c 'raise MemoryError'; fi",
        scratch.alloc_py()
    );
    let mut args = vec!["run", "--html", "run.html", "--fallback", "SMALL=1 MB=10"];
    // With a cgroup of its own, each rung also has the kernel's peak.
    let cgroup = can_make_cgroups();
    if cgroup {
        args.extend(["--memory-limit", "1G"]);
    }
    args.extend(["--", "sh", "-c", &script]);
    let output = scratch.headroom(&args);
    assert!(output.status.success(), "{}", stderr(&output));

    let page = dom(&scratch, "run.html", "");
    for text in [
        "<h2 class=\"rung\">Rung 0: failed (exit 1)</h2>",
        "<h2 class=\"rung\">Rung 1: succeeded</h2>",
        "<dt>diagnosis</dt><dd>Python MemoryError in stage `compile` (memory)</dd>",
        "rung 0 · Python MemoryError</text>",
        "<dt>tree RSS</dt>",
        "<strong>tree RSS</strong> is sampled every 0.05 s",
        ">time (s)</text>",
        ">memory</text>",
    ] {
        assert!(page.contains(text), "{text} is not in {page}");
    }
    assert!(page.contains(&format!(
        "<dd>SMALL=1 MB=10 sh -c {}</dd>",
        html_escape(&script)
    )));
    if cgroup {
        assert!(
            page.contains("<dt>cgroup (kernel)</dt>")
                && page
                    .contains("<strong>cgroup (kernel)</strong> is the kernel's high-water mark")
                && page.contains("rung 0 · cgroup peak (kernel) "),
            "{page}"
        );
    }
    let stages: Vec<String> = rows(&page, "stages")
        .into_iter()
        .map(|row| row[0].clone())
        .collect();
    assert!(stages.contains(&"compile".to_string()), "{stages:?}");
    assert_screenshot_shows_a_chart(&scratch, "run.html");
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[test]
fn the_sim_page_titles_its_axes_draws_the_budget_and_tells_policies_apart() {
    if !have_chromium() {
        return;
    }
    let scratch = Scratch::new();
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/torch-extension.json");
    let output = scratch.headroom(&[
        "sim",
        "--machine",
        "16c/32G",
        "--html",
        "sim.html",
        trace.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let page = dom(&scratch, "sim.html", "");
    for text in [
        ">time (s)</text>",
        ">memory</text>",
        ">makespan, time (s)</text>",
        "headroom's budget 30.0 GiB</text>",
    ] {
        assert!(page.contains(text), "{text} is not in {page}");
    }
    // Each line of the memory chart in a colour and a dash of its own.
    let lines: std::collections::HashSet<(String, String)> = Regex::new(
        r#"<polyline fill="none" stroke="([^"]+)" stroke-width="2" stroke-dasharray="([^"]+)""#,
    )
    .unwrap()
    .captures_iter(&page)
    .map(|c| (c[1].to_string(), c[2].to_string()))
    .collect();
    let colours: std::collections::HashSet<&str> = lines.iter().map(|l| l.0.as_str()).collect();
    let dashes: std::collections::HashSet<&str> = lines.iter().map(|l| l.1.as_str()).collect();
    assert!(
        colours.len() >= 3 && dashes.len() == colours.len(),
        "{lines:?}"
    );
    assert_screenshot_shows_a_chart(&scratch, "sim.html");
}
