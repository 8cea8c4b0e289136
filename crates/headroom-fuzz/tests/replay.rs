//! Replays every fuzz target's seed corpus (`fuzz/corpus/<target>/`) and the inputs that once
//! crashed it (`fuzz/regressions/<target>/`) through its body, on the stable toolchain, so
//! `cargo test` keeps each fixed crash fixed without libFuzzer.

use std::path::{Path, PathBuf};

use headroom_fuzz::TARGETS;

/// The files directly under `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a readable corpus folder").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_and_regression_input_runs_cleanly() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    for target in &TARGETS {
        let corpus = inputs(&fuzz.join("corpus").join(target.name));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{} holds no seed inputs; add a few real ones",
            target.name
        );
        let regressions = inputs(&fuzz.join("regressions").join(target.name));
        for path in corpus.iter().chain(&regressions) {
            let data = std::fs::read(path).expect("a readable fuzz input");
            eprintln!("{}: {}", target.name, path.display());
            (target.body)(&data);
        }
    }
}

#[test]
fn every_target_has_a_cargo_fuzz_binary() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for target in &TARGETS {
        let source = fuzz
            .join("fuzz_targets")
            .join(format!("{}.rs", target.name));
        let text = std::fs::read_to_string(&source)
            .unwrap_or_else(|err| panic!("{}: {err}", source.display()));
        assert!(
            text.contains(&format!("headroom_fuzz::{}", target.name)),
            "{} does not call headroom_fuzz::{}",
            source.display(),
            target.name
        );
        assert!(
            manifest.contains(&format!("name = \"{}\"", target.name)),
            "fuzz/Cargo.toml has no [[bin]] {}",
            target.name
        );
    }
}
