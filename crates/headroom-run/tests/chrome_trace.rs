//! The Chrome traces of `headroom run --trace` and of a build report (`headroom build
//! --trace`), read back by real readers of the format: Chrome DevTools' trace engine and
//! TracerBench's trace model (`read_trace.mjs`, installed by `.ci/trace-consumer.sh`). Valid
//! JSON is not enough: the readers must find the tracks, slices, instants and counters meant.
//! Where the readers are not installed, the checks that need them are skipped, saying why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use headroom_report::chrome_trace::build_trace;
use headroom_report::{
    BuildRecord, BuildReport, JobEvent, JobEventKind, JobRecord, Room, Sample, REPORT_SCHEMA,
};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// Where `.ci/trace-consumer.sh` installs the readers.
fn consumer_dir() -> PathBuf {
    std::env::var_os("HEADROOM_TRACE_CONSUMER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/headroom-trace-consumer")
        })
}

/// A file of this test's own in cargo's scratch directory for integration tests.
fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chrome_trace-{name}"))
}

/// What the readers found in `trace`, or `None` (said on stderr) where they are not installed.
fn read_back(trace: &Path) -> Option<Value> {
    let dir = consumer_dir();
    let missing = ["@paulirish/trace_engine", "@tracerbench/trace-model"]
        .into_iter()
        .find(|package| !dir.join("node_modules").join(package).is_dir());
    if let Some(package) = missing {
        headroom_testkit::skip(
            "node-trace",
            format!(
                "no {package} in {}; run .ci/trace-consumer.sh to install the trace readers",
                dir.display()
            ),
        );
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/read_trace.mjs");
    let output = match Command::new("node")
        .arg(script)
        .arg(&dir)
        .arg(trace)
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            headroom_testkit::skip(
                "node-trace",
                format!("cannot run node ({error}); the trace readers need it"),
            );
            return None;
        }
    };
    assert!(
        output.status.success(),
        "read_trace.mjs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(serde_json::from_slice(&output.stdout).expect("read_trace.mjs prints JSON"))
}

/// The names of the complete events the trace file has on the track named `track`.
fn written_slices(trace: &Value, track: &str) -> Vec<String> {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let tid = events
        .iter()
        .find(|e| e["name"] == "thread_name" && e["args"]["name"] == track)
        .map(|e| e["tid"].clone())
        .expect("the track is named");
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == tid)
        .map(|e| e["name"].as_str().expect("a name").to_string())
        .collect()
}

fn sorted(names: &Value) -> Vec<String> {
    let mut names: Vec<String> = serde_json::from_value(names.clone()).expect("a list of names");
    names.sort();
    names
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: headroom_run::RunArgs,
}

/// Two stages, `load` (64 MiB) and `train` (128 MiB more, then a MemoryError) unless SMALL is
/// set, when `train` takes 32 MiB and succeeds.
const TWO_STAGES: &str = "
import os, time
print('##headroom stage load', flush=True)
a = b'x' * (64 << 20)
time.sleep(0.3)
print('##headroom stage train', flush=True)
b = b'x' * ((32 if os.environ.get('SMALL') else 128) << 20)
time.sleep(0.3)
if not os.environ.get('SMALL'):
    raise MemoryError('the test pretends train needs more')
";

#[test]
fn a_run_reads_back_as_rungs_stages_an_oom_and_memory_counters() {
    let (trace_path, json_path) = (scratch("run.trace"), scratch("run.json"));
    let cli = Cli::parse_from([
        "headroom-run".as_ref(),
        "--interval".as_ref(),
        "20ms".as_ref(),
        "--trace".as_ref(),
        trace_path.as_os_str(),
        "--json".as_ref(),
        json_path.as_os_str(),
        "--fallback".as_ref(),
        "SMALL=1".as_ref(),
        "--".as_ref(),
        "python3".as_ref(),
        "-c".as_ref(),
        TWO_STAGES.as_ref(),
    ]);
    assert_eq!(headroom_run::main(cli.run).unwrap(), 0, "rung 1 succeeds");
    let report: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let trace: Value = serde_json::from_slice(&std::fs::read(&trace_path).unwrap()).unwrap();

    // What was written: each rung and each of its stages on the one track.
    let rungs = report["rungs"].as_array().unwrap();
    assert_eq!(rungs.len(), 2, "{report}");
    let written = written_slices(&trace, "rungs");
    let stages: usize = rungs
        .iter()
        .map(|r| r["stages"].as_array().unwrap().len())
        .sum();
    assert_eq!(written.len(), rungs.len() + stages, "{written:?}");
    for name in ["load", "train"] {
        assert_eq!(
            written.iter().filter(|n| *n == name).count(),
            2,
            "{written:?}"
        );
    }

    let Some(read) = read_back(&trace_path) else {
        return;
    };
    let mut expected = written.clone();
    expected.sort();
    assert_eq!(sorted(&read["devtools"]["slices"]["rungs"]), expected);
    assert_eq!(sorted(&read["tracerbench"]["slices"]["rungs"]), expected);
    let tracerbench = &read["tracerbench"];
    assert!(
        tracerbench["process"]
            .as_str()
            .unwrap()
            .starts_with("headroom run: python3 -c"),
        "{tracerbench}"
    );
    assert_eq!(tracerbench["instants"]["rungs"], json!(["out of memory"]));
    let rss: Vec<(f64, u64)> =
        serde_json::from_value(tracerbench["counters"]["RSS"].clone()).unwrap();
    let samples: usize = rungs
        .iter()
        .map(|r| r["samples"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        rss.len(),
        samples + rungs.len(),
        "a point per sample and per rung's end"
    );
    let peak = rss.iter().map(|&(_, bytes)| bytes).max().unwrap();
    assert!(
        peak >= 192 * MIB,
        "train held 192 MiB on top of the interpreter: {peak}"
    );
    assert_eq!(
        rss.last().unwrap().1,
        0,
        "nothing is left after the last rung"
    );
    assert!(
        tracerbench["counters"]["MemAvailable"].as_array().is_some(),
        "{tracerbench}"
    );
}

#[test]
fn a_trace_path_is_checked_before_the_command_runs() {
    let ran = scratch("ran");
    let _ = std::fs::remove_file(&ran);
    let missing = scratch("missing/run.trace");
    let cli = Cli::parse_from([
        "headroom-run".as_ref(),
        "--trace".as_ref(),
        missing.as_os_str(),
        "--".as_ref(),
        "touch".as_ref(),
        ran.as_os_str(),
    ]);
    let error = headroom_run::main(cli.run).unwrap_err().to_string();
    assert!(
        error.starts_with("--trace ") && error.contains("there is no directory"),
        "{error}"
    );
    assert!(!ran.exists(), "the command did not run");
}

fn job(job_id: u64, label: &str, start_ms: u64, end_ms: u64, peak: u64) -> JobRecord {
    JobRecord {
        job_id,
        label: label.into(),
        command: format!("g++ -c {label}.cc -o {label}"),
        start_ms,
        end_ms,
        peak,
        predicted: peak,
        prediction_source: "history".into(),
        attempts: 1,
        ..JobRecord::default()
    }
}

#[test]
fn a_build_reads_back_as_slot_tracks_a_kill_and_memory_counters() {
    let mut killed = job(2, "c.o", 1000, 2000, 300 * MIB);
    killed.signal = Some(9);
    let samples = [(500, 0, 100), (500, 1, 200), (1500, 2, 300)]
        .map(|(t_ms, job_id, mib)| Sample {
            t_ms,
            job_id,
            bytes: mib * MIB,
        })
        .to_vec();
    let report = BuildReport {
        schema: REPORT_SCHEMA,
        build: BuildRecord {
            id: 7,
            started_unix_ms: 1_700_000_000_000,
            duration_ms: Some(2500),
            command: "make -j2".into(),
            cwd: "/src".into(),
            budget: 1024 * MIB,
            budget_source: "--budget 1G".into(),
            slots: 2,
            exit_code: Some(2),
            peak_total: Some(300 * MIB),
            parallelism_set: vec!["MAKEFLAGS=-j4".into()],
        },
        jobs: vec![
            job(0, "a.o", 0, 1000, 100 * MIB),
            job(1, "b.o", 200, 900, 200 * MIB),
            killed,
        ],
        samples,
        outside: Vec::new(),
        events: vec![
            JobEvent {
                t_ms: 1200,
                job_id: 2,
                kind: JobEventKind::Suspend,
            },
            JobEvent {
                t_ms: 1400,
                job_id: 2,
                kind: JobEventKind::Resume,
            },
        ],
        room: vec![
            Room {
                t_ms: 500,
                bytes: 700 * MIB,
            },
            Room {
                t_ms: 1500,
                bytes: 600 * MIB,
            },
        ],
    };
    let path = scratch("build.trace");
    std::fs::write(&path, serde_json::to_vec(&build_trace(&report)).unwrap()).unwrap();

    let Some(read) = read_back(&path) else {
        return;
    };
    let slots = json!({"slot 1": ["a.o", "c.o"], "slot 2": ["b.o"]});
    assert_eq!(read["devtools"]["slices"], slots);
    let tracerbench = &read["tracerbench"];
    assert_eq!(tracerbench["slices"], slots);
    assert_eq!(tracerbench["process"], "headroom build 7: make -j2");
    assert_eq!(
        tracerbench["instants"]["slot 1"],
        json!(["suspend", "resume", "killed by signal 9"])
    );
    let counters: BTreeMap<String, Vec<(u64, u64)>> =
        serde_json::from_value(tracerbench["counters"].clone()).unwrap();
    let points = |list: &[(u64, u64)]| {
        list.iter()
            .map(|&(ms, mib)| (ms * 1000, mib * MIB))
            .collect()
    };
    assert_eq!(
        counters,
        BTreeMap::from([
            (
                "memory of jobs".to_string(),
                points(&[(500, 300), (900, 100), (1000, 0), (1500, 300), (2000, 0)])
            ),
            ("budget".to_string(), points(&[(0, 1024), (2500, 1024)])),
            (
                "MemAvailable".to_string(),
                points(&[(500, 700), (1500, 600)])
            ),
        ])
    );
}
