//! `headroom sim` as users run it: the built binary on the committed trace corpus.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::headroom;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces")
}

#[test]
fn generate_reproduces_the_committed_synthetic_corpus() {
    let out = tempfile::tempdir().expect("temp dir");
    let status = headroom(&[])
        .args(["sim", "generate", "--seed", "1", "--out"])
        .arg(out.path())
        .status()
        .expect("headroom runs");
    assert!(status.success());
    for name in [
        "flash-attention",
        "torch-extension",
        "lto-links",
        "llvm-like",
        "rustc-heavy",
    ] {
        let file = format!("{name}.json");
        let generated = std::fs::read(out.path().join(&file)).expect("generated trace");
        let committed = std::fs::read(corpus().join(&file)).expect("committed trace");
        assert!(
            generated == committed,
            "traces/{file} differs from `headroom sim generate --seed 1`"
        );
    }
}

/// What a `headroom sim … --json` command prints, once it has succeeded.
fn json_of(command: &mut Command) -> serde_json::Value {
    let output = command.output().expect("headroom runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("valid JSON")
}

#[test]
fn sim_prints_json_per_trace_machine_and_policy() {
    let html = tempfile::NamedTempFile::new().expect("temp file");
    let mut command = headroom(&[]);
    command
        .args([
            "sim",
            "--machine",
            "16c/32G,2c/24G",
            "--policy",
            "headroom,static",
            "--json",
        ])
        .arg(corpus().join("torch-extension.json"))
        .arg("--html")
        .arg(html.path());
    let comparisons = json_of(&mut command);
    let comparisons = comparisons.as_array().expect("a list");
    assert_eq!(comparisons.len(), 2);
    let first = &comparisons[0];
    assert_eq!(first["trace"], "torch-extension");
    assert_eq!(first["machine"], "16c/32G");
    // headroom, then -j1 to -j16.
    assert_eq!(first["outcomes"].as_array().expect("outcomes").len(), 17);
    assert!(first["lower_bound"]["seconds"].as_f64().expect("bound") > 0.0);
    let page = std::fs::read_to_string(html.path()).expect("html written");
    assert!(page.contains("<svg") && page.contains("2c/24G"));
}

/// `--budget` is what headroom plans with, as `headroom build --budget` is.
#[test]
fn headroom_keeps_to_the_budget_it_is_given() {
    let simulate = |budget: &str| {
        let comparisons = json_of(
            headroom(&[])
                .args(["sim", "--machine", "16c/32G", "--policy", "headroom-warm"])
                .args(["--budget", budget, "--json"])
                .arg(corpus().join("torch-extension.json")),
        );
        let comparison = &comparisons[0];
        let budget = comparison["headroom_budget"].as_u64().expect("budget");
        let peak = comparison["outcomes"][0]["peak_memory"]
            .as_u64()
            .expect("peak");
        (budget, peak)
    };
    const GIB: u64 = 1 << 30;
    // The governor's own budget keeps 2 GiB of 32 back, and the build is memory-bound there.
    let (budget, peak) = simulate("auto");
    assert_eq!(budget, 30 * GIB);
    assert!(peak > 20 * GIB, "peak {peak}");
    let (budget, peak) = simulate("50%");
    assert_eq!(budget, 16 * GIB);
    assert!(peak <= budget, "peak {peak} over the budget {budget}");
}

/// `--farm`: one comparison per farm, headroom's placement against the engines' own.
#[test]
fn sim_compares_placement_on_each_farm() {
    let comparisons = json_of(
        headroom(&[])
            .args(["sim", "--machine", "16c/32G", "--json"])
            .args(["--farm", "1x16c/32G,4x16c/32G"])
            .arg(corpus().join("flash-attention.json")),
    );
    let comparisons = comparisons.as_array().expect("a list");
    assert_eq!(comparisons.len(), 2);
    assert_eq!(comparisons[0]["farm"], "1x16c/32G");
    assert_eq!(comparisons[1]["farm"], "4x16c/32G");
    let outcomes = comparisons[0]["outcomes"].as_array().expect("outcomes");
    let policies: Vec<&str> = outcomes
        .iter()
        .map(|outcome| outcome["policy"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        policies,
        [
            "headroom (cold)",
            "headroom (warm)",
            "sccache-dist -j16",
            "icecream -j16"
        ]
    );
    let node_ooms = |index: usize| outcomes[index]["node_oom_events"].as_u64().expect("count");
    assert_eq!(node_ooms(1), 0, "headroom warm knows each job's peak");
    assert!(node_ooms(2) > 0, "sixteen 4.5 GB compiles on a 32 GiB node");
}

#[test]
fn sim_compares_sessions_under_one_governor_and_one_each() {
    let mut command = headroom(&[]);
    command
        .args(["sim", "--sessions", "2", "--machine", "8c/16G"])
        .args(["--policy", "headroom-warm", "--json"])
        .arg(corpus().join("torch-extension.json"));
    let json = json_of(&mut command);
    let comparisons = json.as_array().expect("an array of comparisons");
    assert_eq!(comparisons.len(), 1, "one machine, one policy");
    let comparison = &comparisons[0];
    assert_eq!(comparison["trace"], "torch-extension + torch-extension");
    assert_eq!(comparison["sessions"], 2);
    let outcomes = comparison["outcomes"].as_array().expect("outcomes");
    let of = |governors: &str| {
        outcomes
            .iter()
            .find(|outcome| outcome["governors"] == governors)
            .unwrap_or_else(|| panic!("no {governors} outcome in {comparison}"))
    };
    let number =
        |outcome: &serde_json::Value, field: &str| outcome[field].as_f64().expect("a number");
    let (union, shared, apart) = (of("union"), of("shared"), of("per-session"));
    // One governor for both builds keeps to one budget; one governor each overcommits
    // the machine and has to kill and re-run jobs.
    assert_eq!(number(shared, "oom_events"), 0.0, "{shared}");
    assert_eq!(number(shared, "policy_kills"), 0.0, "{shared}");
    assert!(
        number(shared, "makespan") <= 1.10 * number(union, "makespan"),
        "{shared} against {union}"
    );
    assert!(
        number(apart, "oom_events") + number(apart, "policy_kills") > 0.0,
        "{apart}"
    );
    let ends = shared["session_ends"].as_array().expect("session ends");
    assert_eq!(ends.len(), 2);

    // The table names each way of governing, against the union.
    let output = headroom(&[])
        .args(["sim", "--sessions", "2", "--machine", "8c/16G"])
        .args(["--policy", "headroom-warm"])
        .arg(corpus().join("torch-extension.json"))
        .output()
        .expect("headroom runs");
    let table = String::from_utf8_lossy(&output.stdout);
    for row in [
        "×union",
        "one session over the union",
        "shared governor",
        "per-session governors",
    ] {
        assert!(table.contains(row), "{row} missing from:\n{table}");
    }
}

/// `headroom sim ARGS` exits 2, and its error names every one of `needles`.
fn refused_naming(args: &[&str], needles: &[&str]) {
    let output = headroom(&[])
        .arg("sim")
        .args(args)
        .output()
        .expect("headroom runs");
    assert_eq!(output.status.code(), Some(2), "{args:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in needles {
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn bad_input_exits_2_and_names_the_fix() {
    let trace = corpus().join("torch-extension.json");
    let trace = trace.to_str().unwrap();
    refused_naming(&["--machine", "16 cores", trace], &["16c/64G"]);
    refused_naming(&[], &["headroom sim generate"]);
    refused_naming(&["missing-trace.json"], &["missing-trace.json"]);
    refused_naming(
        &["--machine", "16c/32G", "--budget", "40G", trace],
        &["--budget", "16c/32G"],
    );
    // A farm's nodes need cores and memory; only farm policies run beside one.
    refused_naming(&["--farm", "32x64G", trace], &["--farm", "32x16c/64G"]);
    refused_naming(
        &["--farm", "2x16c/64G", "--policy", "ninja", trace],
        &["ninja", "sccache-dist"],
    );
    // Only headroom governs sessions.
    refused_naming(
        &["--sessions", "2", "--policy", "ninja", trace],
        &["--policy ninja", "headroom-warm"],
    );
    for (flag, value) in [
        ("--variation", "1.5"),
        ("--growth", "-0.9"),
        ("--budget", "lots"),
        ("--budget", "120%"),
        ("--sessions", "1"),
        ("--sessions", "many"),
    ] {
        refused_naming(&[flag, value, trace], &[flag, value]);
    }
}
