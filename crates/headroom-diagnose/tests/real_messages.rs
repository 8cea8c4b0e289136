//! The classification table checked against a corpus of messages people really got, each with
//! the public thread it came from (`tests/corpus/*.toml`). Look-alikes (messages that read like
//! a memory failure and are not one) are there too: none may ever be called memory.

use std::path::Path;
use std::sync::LazyLock;

use headroom_diagnose::{classify, ExitInfo, Kind};
use serde::Deserialize;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

#[derive(Deserialize)]
struct Corpus {
    case: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    source: String,
    /// A kind in snake case, or `none` when the message is not a failure headroom names.
    expected: String,
    #[serde(default)]
    note: String,
    output: String,
}

impl Case {
    fn expected(&self) -> Option<Kind> {
        (self.expected != "none").then(|| {
            serde_json::from_value(serde_json::Value::String(self.expected.clone()))
                .unwrap_or_else(|_| panic!("{}: unknown kind {}", self.source, self.expected))
        })
    }

    fn is_lookalike(&self) -> bool {
        self.expected().is_none_or(|kind| !kind.is_memory())
    }

    /// Right when the kind matches; for a message that is no failure of a known kind, right
    /// when nothing or something that is not memory is reported.
    fn is_right(&self, got: Option<Kind>) -> bool {
        match self.expected() {
            None => got.is_none_or(|kind| !kind.is_memory()),
            expected => got == expected,
        }
    }
}

static CASES: LazyLock<Vec<Case>> = LazyLock::new(|| {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/corpus exists")
        .map(|entry| entry.expect("readable").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("readable corpus file");
            toml::from_str::<Corpus>(&text)
                .unwrap_or_else(|err| panic!("{}: {err}", file.display()))
                .case
        })
        .collect()
});

fn classified(case: &Case) -> Option<headroom_diagnose::Diagnosis> {
    classify(case.output.as_bytes(), &ExitInfo::exited(1))
}

#[test]
fn corpus_is_real_and_large_enough() {
    let lookalikes = CASES.iter().filter(|case| case.is_lookalike()).count();
    assert!(CASES.len() >= 150, "only {} messages", CASES.len());
    assert!(lookalikes >= 25, "only {lookalikes} look-alikes");
    for case in CASES.iter() {
        assert!(
            case.source.starts_with("https://"),
            "{}: every message names the public page it came from",
            case.source
        );
        case.expected();
    }
}

/// The corpus figures the README quotes: at least 97% right, and no look-alike called memory.
#[test]
fn corpus_is_classified_as_expected() {
    let mut wrong = Vec::new();
    let mut lookalikes_called_memory = 0;
    for case in CASES.iter() {
        let got = classified(case);
        let kind = got.as_ref().map(|diagnosis| diagnosis.kind);
        if case.is_lookalike() && kind.is_some_and(Kind::is_memory) {
            lookalikes_called_memory += 1;
        }
        if !case.is_right(kind) {
            wrong.push(format!(
                "{}: expected {}, got {:?} (rule {:?})",
                case.source,
                case.expected,
                kind,
                got.map(|diagnosis| diagnosis.rule)
            ));
        }
    }
    let right = CASES.len() - wrong.len();
    let lookalikes = CASES.iter().filter(|case| case.is_lookalike()).count();
    println!(
        "corpus: {right} of {} right ({:.1}%); look-alikes called memory: {lookalikes_called_memory} of {lookalikes}",
        CASES.len(),
        100.0 * right as f64 / CASES.len() as f64
    );
    for line in &wrong {
        println!("  {line}");
    }
    assert_eq!(
        lookalikes_called_memory, 0,
        "a look-alike was called memory"
    );
    assert!(
        right as f64 >= 0.97 * CASES.len() as f64,
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_rule_matches_a_real_message() {
    let unused: Vec<&str> = headroom_diagnose::RULES
        .iter()
        .filter(|rule| {
            let pattern = regex::bytes::Regex::new(rule.pattern).expect("valid pattern");
            !CASES
                .iter()
                .any(|case| pattern.is_match(case.output.as_bytes()))
        })
        .map(|rule| rule.name)
        .collect();
    assert!(
        unused.is_empty(),
        "rules without a real message: {unused:?}"
    );
}

#[test]
fn rust_allocation_failure_numbers() {
    let diagnosis = classify(
        b"memory allocation of 59768848 bytes failed",
        &ExitInfo::exited(1),
    )
    .unwrap();
    assert_eq!(diagnosis.numbers.requested, Some(59_768_848));
}

fn approx(value: Option<u64>, expected: f64) -> bool {
    value.is_some_and(|v| (v as f64 - expected).abs() <= expected * 1e-3 + 1.0)
}

/// The message whose source and note mention `text`.
fn case(text: &str) -> &'static str {
    let matching: Vec<&Case> = CASES
        .iter()
        .filter(|c| format!("{} {}", c.source, c.note).contains(text))
        .collect();
    assert_eq!(matching.len(), 1, "exactly one case from {text}");
    &matching[0].output
}

fn numbers_of(output: &str) -> headroom_diagnose::OomNumbers {
    classify(output.as_bytes(), &ExitInfo::exited(1))
        .expect("classified")
        .numbers
}

#[test]
fn pytorch_1_0_cached_form_numbers() {
    let n = numbers_of(case("pytorch/pytorch/issues/16417 PyTorch 1.0"));
    assert!(approx(n.requested, 12.5 * MIB));
    assert!(approx(n.capacity, 10.92 * GIB));
    assert!(approx(n.allocated, 8.57 * MIB));
    assert!(approx(n.free, 9.28 * GIB));
    assert!(approx(n.reserved_unallocated, 4.68 * MIB));
    assert!(approx(n.reserved, 8.57 * MIB + 4.68 * MIB));
    assert_eq!(n.device, Some(0));
}

#[test]
fn pytorch_1_x_reserved_form_numbers() {
    let n = numbers_of(case("iPASSR"));
    assert!(approx(n.requested, 10.73 * GIB));
    assert!(approx(n.capacity, 8.0 * GIB));
    assert!(approx(n.allocated, 17.20 * GIB));
    assert_eq!(n.free, Some(0));
    assert!(approx(n.reserved, 19.15 * GIB));
}

#[test]
fn pytorch_2_1_typo_form_numbers() {
    let n = numbers_of(case("MGFN"));
    assert!(approx(n.requested, 1.70 * GIB));
    assert!(approx(n.capacity, 6.0 * GIB));
    assert_eq!(n.free, Some(0));
    assert!(approx(n.allocated, 2.93 * GIB));
    assert!(approx(n.reserved_unallocated, 2.30 * GIB));
}

#[test]
fn pytorch_2_x_form_numbers_with_other_processes() {
    let n = numbers_of(case("FireRedTTS2"));
    assert!(approx(n.requested, 26.0 * MIB));
    assert!(approx(n.capacity, 11.66 * GIB));
    assert!(approx(n.free, 9.81 * MIB));
    assert!(approx(n.process_in_use, 9.74 * GIB));
    assert!(approx(n.allocated, 9.30 * GIB));
}

#[test]
fn xla_and_numpy_numbers() {
    assert_eq!(
        numbers_of(case("alphafold/issues/1023")).requested,
        Some(7_406_166_528)
    );
    assert_eq!(numbers_of(case("LLNeRF")).requested, Some(20_029_400_304));
    assert!(approx(
        numbers_of(case("KeypointFusion")).requested,
        58.0 * GIB
    ));
    assert!(approx(
        numbers_of(case("numpy/numpy/issues/17595")).requested,
        201.0 * GIB
    ));
}
