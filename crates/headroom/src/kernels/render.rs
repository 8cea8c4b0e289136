//! Human-readable tables for `headroom kernels`; `--json` bypasses all of this.

use std::time::Duration;

use headroom_kernels::build::{BuildReport, PairStatus};
use headroom_kernels::cache::{Entry, GcReport};
use headroom_kernels::resolve::{Explanation, Verdict};
use headroom_kernels::toolchain::{Toolchain, ToolchainKind};
use headroom_size::format_size;

/// Left-aligned columns, two spaces apart, no trailing spaces.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn status_word(status: &PairStatus) -> &'static str {
    match status {
        PairStatus::UpToDate => "up to date",
        PairStatus::Reused => "reused",
        PairStatus::Built => "built",
        PairStatus::Failed { .. } => "FAILED",
        PairStatus::Skipped { .. } | PairStatus::Unsupported { .. } => "skipped",
    }
}

/// The status column: the word, and why for a pair this operating system cannot build.
fn status_cell(status: &PairStatus) -> String {
    match status {
        PairStatus::Unsupported { reason } => format!("skipped ({reason})"),
        other => status_word(other).to_string(),
    }
}

/// The pairs that changed or failed, then the errors, then one summary line.
pub fn build(report: &BuildReport, elapsed: Duration) -> String {
    let rows: Vec<Vec<String>> = report
        .pairs
        .iter()
        .filter(|pair| pair.status != PairStatus::UpToDate)
        .map(|pair| {
            vec![
                pair.kernel.clone(),
                pair.target.to_string(),
                status_cell(&pair.status),
                pair.artifact
                    .as_ref()
                    .map(|path| path.display().to_string())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        String::new()
    } else {
        table(&["KERNEL", "TARGET", "STATUS", "ARTIFACT"], &rows)
    };
    let mut errors_seen = Vec::new();
    for pair in &report.pairs {
        if let PairStatus::Failed { error } | PairStatus::Skipped { error } = &pair.status {
            // Skipped pairs of one kernel share one message.
            if !errors_seen.contains(&error) {
                out.push_str(&format!(
                    "\nerror: {} {}: {error}\n",
                    pair.kernel, pair.target
                ));
                errors_seen.push(error);
            }
        }
    }
    let count = |word: &str| {
        report
            .pairs
            .iter()
            .filter(|pair| status_word(&pair.status) == word)
            .count()
    };
    out.push_str(&format!(
        "{} pairs: {} built, {} reused, {} up to date, {} failed, {} skipped in {:.2}s; cache {}\n",
        report.pairs.len(),
        count("built"),
        count("reused"),
        count("up to date"),
        count("FAILED"),
        count("skipped"),
        elapsed.as_secs_f64(),
        report.cache.display()
    ));
    if report.evicted_blobs > 0 {
        out.push_str(&format!(
            "evicted {} least recently used artifacts to stay under --max-size\n",
            report.evicted_blobs
        ));
    }
    out
}

pub fn entries(entries: &[Entry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|entry| {
            vec![
                entry.backend.to_string(),
                entry.kernel.clone(),
                entry.target.to_string(),
                format_size(entry.record.size),
                entry.record.toolchain.clone(),
                entry.artifact_path().display().to_string(),
            ]
        })
        .collect();
    table(
        &[
            "BACKEND",
            "KERNEL",
            "TARGET",
            "SIZE",
            "TOOLCHAIN",
            "ARTIFACT",
        ],
        &rows,
    )
}

pub fn gc(report: &GcReport) -> String {
    format!(
        "removed {} blobs ({}), {} entries and {} stale temp files; {} kept\n",
        report.blobs_removed,
        format_size(report.bytes_freed),
        report.entries_removed,
        report.temp_files_removed,
        format_size(report.bytes_kept)
    )
}

pub fn toolchains(found: &[(ToolchainKind, Option<Toolchain>)]) -> String {
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|(kind, toolchain)| match toolchain {
            Some(toolchain) => vec![
                kind.to_string(),
                toolchain.program.display().to_string(),
                toolchain.short_version().to_string(),
            ],
            None => vec![
                kind.to_string(),
                "-".to_string(),
                format!("not found: {}", kind.install_hint()),
            ],
        })
        .collect();
    table(&["TOOLCHAIN", "PROGRAM", "VERSION"], &rows)
}

/// One row per candidate: taken, runs, or why not.
pub fn explanation(entries: &[Entry], explanation: &Explanation) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .zip(&explanation.verdicts)
        .enumerate()
        .map(|(index, (entry, verdict))| {
            let mark = if explanation.chosen == Some(index) {
                "chosen"
            } else if matches!(verdict, Verdict::Rejected(_)) {
                "rejected"
            } else {
                "usable"
            };
            let reason = match verdict {
                Verdict::Rejected(rejection) => rejection.to_string(),
                other => other.to_string(),
            };
            vec![
                mark.to_string(),
                entry.target.to_string(),
                format!("{:?}", entry.record.format).to_lowercase(),
                reason,
            ]
        })
        .collect();
    table(&["PICK", "TARGET", "FORMAT", "WHY"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_kernels::build::PairReport;
    use headroom_kernels::cache::KeyRecord;
    use headroom_kernels::resolve::{explain, Candidate, Format, ResolveOptions};
    use headroom_kernels::target::Backend;

    fn entry(target: &str, format: Format) -> Entry {
        Entry {
            kernel: "vector_add".into(),
            backend: Backend::Cuda,
            origin: "2".repeat(64),
            target: target.parse().unwrap(),
            key: "0".repeat(64),
            record: KeyRecord {
                blob: "1".repeat(64),
                size: 2048,
                format,
                ptx_isa: Some("8.0".parse().unwrap()),
                toolchain: "clang Debian clang version 19.1.7".into(),
            },
        }
    }

    #[test]
    fn explanation_table() {
        let entries = vec![
            entry("sm_80", Format::Cubin),
            entry("sm_90", Format::Cubin),
            entry("sm_90a", Format::Cubin),
            entry("compute_90", Format::Ptx),
        ];
        let candidates: Vec<Candidate> = entries.iter().map(Entry::candidate).collect();
        let explanation = explain(
            &candidates,
            &"sm_100".parse().unwrap(),
            &ResolveOptions::default(),
        );
        insta::assert_snapshot!(super::explanation(&entries, &explanation));
    }

    #[test]
    fn build_summary() {
        let pair = |target: &str, status| PairReport {
            kernel: "softmax".into(),
            target: target.parse().unwrap(),
            status,
            artifact: None,
            toolchain: None,
        };
        let report = BuildReport {
            cache: "cache".into(),
            pairs: vec![
                pair("sm_80", PairStatus::UpToDate),
                PairReport {
                    artifact: Some("cuda/softmax/sm_90.ptx".into()),
                    ..pair("sm_90", PairStatus::Built)
                },
                pair(
                    "sm_90a",
                    PairStatus::Failed {
                        error: "`clang-19 ...` exited with code 1:\nerror: boom".into(),
                    },
                ),
                pair(
                    "compute_90",
                    PairStatus::Skipped {
                        error: "no toolchain".into(),
                    },
                ),
                PairReport {
                    kernel: "scale".into(),
                    ..pair(
                        "apple7",
                        PairStatus::Unsupported {
                            reason: "Metal needs macOS".into(),
                        },
                    )
                },
            ],
            evicted_blobs: 0,
        };
        insta::assert_snapshot!(super::build(&report, Duration::from_millis(1234)));
    }

    #[test]
    fn entries_table() {
        insta::assert_snapshot!(super::entries(&[entry("sm_80", Format::Ptx)]));
    }
}
