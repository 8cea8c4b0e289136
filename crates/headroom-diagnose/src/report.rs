//! What `headroom diagnose` makes of its inputs: each log's findings ([`crate::scan`]) or each
//! `headroom run --json` report's rungs, merged root cause first, with the exit status they
//! call for, as JSON and as the human report ([`render`]).
//!
//! A `headroom run` report is read through the few fields of it named here
//! ([`StoredReport`]) rather than `headroom-run`'s own types: `headroom-run` depends on this
//! crate, and a report written by a newer `headroom run`, with a failure kind this version
//! does not know, must still be listed. `headroom`'s `diagnose_cli` test reads a report that
//! `headroom run --json` has just written, so the two cannot drift apart.

use std::fmt::Write as _;
use std::io::{self, Read};

use headroom_size::format_size;
use serde::{Deserialize, Serialize};

use crate::{Constraint, Finding, Kind, OomKill, OomNumbers, Scan, Victim, MAX_FINDINGS};

/// A memory failure was found (with `--kernel-log`: OOM kills were found).
pub const EXIT_MEMORY: u8 = 0;
/// Failures were found, none of them memory.
pub const EXIT_NOT_MEMORY: u8 = 1;
/// Nothing was recognised (with `--kernel-log`: no OOM kill in the log).
pub const EXIT_NOTHING: u8 = 3;

/// How much of an input is looked at to tell a `headroom run` report from a log.
const PEEK: u64 = 64 << 10;
/// Lines of the human report are wrapped at this width.
const WIDTH: usize = 100;

/// An input that could not be read to its end.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {name}")]
pub struct ReadError {
    /// The input, as the report names it.
    name: String,
    #[source]
    source: io::Error,
}

/// Reads every input (named as the report names it) to its end, and merges what they show.
pub fn diagnose(
    inputs: impl IntoIterator<Item = (String, Box<dyn Read>)>,
) -> Result<Report, ReadError> {
    let mut files = Vec::new();
    let mut findings = Vec::new();
    for (name, reader) in inputs {
        let (file, found) = read_input(&name, reader)?;
        files.push(file);
        findings.extend(found);
    }
    // Each input's findings are already root cause first; a stable sort on the same rank keeps
    // that order and puts, say, one file's kernel kill before another's killed compiler.
    findings.sort_by_key(|entry| entry.rank);
    Ok(Report::new(files, findings))
}

/// Reads one input to its end: a `headroom run` report's rungs, or a log's findings.
fn read_input(
    name: &str,
    mut reader: Box<dyn Read>,
) -> Result<(FileSummary, Vec<Entry>), ReadError> {
    let cannot = |source| ReadError {
        name: name.to_string(),
        source,
    };
    let mut head = Vec::new();
    reader
        .by_ref()
        .take(PEEK)
        .read_to_end(&mut head)
        .map_err(cannot)?;
    if looks_like_run_report(&head) {
        // A report is read whole (its samples make it tens of MiB at most; they are skipped,
        // not kept). Anything that does not parse as one is read as a log after all.
        reader.read_to_end(&mut head).map_err(cannot)?;
        if let Ok(report) = serde_json::from_slice::<StoredReport>(&head) {
            return Ok(from_run_report(name, report, head.len() as u64));
        }
        tracing::debug!("{name} looked like a `headroom run` report but is not one");
        return Ok(from_scan(name, crate::scan_bytes(&head)));
    }
    let scan = crate::scan(io::Cursor::new(head).chain(reader)).map_err(cannot)?;
    Ok(from_scan(name, scan))
}

/// A JSON object with a `rungs` key near its start, as `headroom run --json` writes.
fn looks_like_run_report(head: &[u8]) -> bool {
    head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
        && head.windows(7).any(|window| window == b"\"rungs\"")
}

fn from_scan(name: &str, scan: Scan) -> (FileSummary, Vec<Entry>) {
    let entries: Vec<Entry> = scan
        .findings
        .into_iter()
        .map(|finding| Entry::from_finding(name, finding))
        .collect();
    let summary = FileSummary {
        file: name.to_string(),
        format: Format::Log,
        lines: Some(scan.lines),
        bytes: scan.bytes,
        rungs: None,
        findings: entries.len(),
        left_out: scan.left_out,
        oom_kill_count: scan.oom_kill_count,
        oom_kills: scan.oom_kills,
    };
    (summary, entries)
}

fn from_run_report(name: &str, report: StoredReport, bytes: u64) -> (FileSummary, Vec<Entry>) {
    let rungs = report.rungs.len();
    let mut entries: Vec<Entry> = report
        .rungs
        .into_iter()
        .filter_map(|rung| Entry::from_rung(name, rung))
        .collect();
    entries.sort_by_key(|entry| entry.rank);
    let summary = FileSummary {
        file: name.to_string(),
        format: Format::RunReport,
        lines: None,
        bytes,
        rungs: Some(rungs),
        findings: entries.len(),
        left_out: 0,
        oom_kill_count: 0,
        oom_kills: Vec::new(),
    };
    (summary, entries)
}

/// What `headroom diagnose` found, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    files: Vec<FileSummary>,
    /// Root cause first, across all files.
    findings: Vec<Entry>,
    summary: Summary,
}

impl Report {
    /// The exit status `headroom diagnose` ends with for this report.
    pub fn exit_code(&self) -> u8 {
        self.summary.exit_code
    }

    fn new(files: Vec<FileSummary>, findings: Vec<Entry>) -> Report {
        let memory = findings.iter().filter(|entry| entry.is_memory).count();
        let exit_code = if memory > 0 {
            EXIT_MEMORY
        } else if findings.is_empty() {
            EXIT_NOTHING
        } else {
            EXIT_NOT_MEMORY
        };
        let summary = Summary {
            findings: findings.len(),
            memory,
            root_cause: findings.first().map(|entry| entry.label.clone()),
            exit_code,
        };
        Report {
            files,
            findings,
            summary,
        }
    }
}

#[derive(Debug, Serialize)]
struct Summary {
    /// Distinct failures found.
    findings: usize,
    /// How many of them are memory failures.
    memory: usize,
    /// The label of the first finding.
    root_cause: Option<String>,
    /// The exit status of this run of `headroom diagnose`.
    exit_code: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Format {
    Log,
    RunReport,
}

/// One input, as read.
#[derive(Debug, Serialize)]
struct FileSummary {
    file: String,
    format: Format,
    #[serde(skip_serializing_if = "Option::is_none")]
    lines: Option<u64>,
    bytes: u64,
    /// Rungs in a `headroom run` report.
    #[serde(skip_serializing_if = "Option::is_none")]
    rungs: Option<usize>,
    findings: usize,
    /// Failure lines of distinct failures beyond the first `MAX_FINDINGS`, not listed.
    #[serde(skip_serializing_if = "is_zero")]
    left_out: u64,
    /// How many OOM kills the kernel logged in this file.
    #[serde(skip_serializing_if = "is_zero")]
    oom_kill_count: u64,
    /// The first and the last OOM kill of each process and limit, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    oom_kills: Vec<OomKill>,
}

/// A failure's kind: one this version knows, or one a newer `headroom run` recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum KindName {
    Known(Kind),
    Other(String),
}

/// One distinct failure, from a log or a report's rung.
#[derive(Debug, Serialize)]
struct Entry {
    file: String,
    /// The line of its evidence's first occurrence, in a log.
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
    /// The rung of a `headroom run` report, and its command.
    #[serde(skip_serializing_if = "Option::is_none")]
    rung: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    kind: KindName,
    label: String,
    is_memory: bool,
    rule: String,
    evidence: String,
    /// How many lines reported it.
    count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<String>,
    /// The time stamp of a kernel log line, as printed.
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    /// The process the kernel killed.
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<Victim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    constraint: Option<Constraint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    constraint_description: Option<&'static str>,
    #[serde(skip_serializing_if = "OomNumbers::is_empty")]
    numbers: OomNumbers,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_oom_evidence: Option<String>,
    advice: String,
    #[serde(skip)]
    rank: u8,
}

impl Entry {
    fn from_finding(file: &str, finding: Finding) -> Entry {
        let kind = finding.diagnosis.kind;
        Entry {
            file: file.to_string(),
            line: Some(finding.line),
            rung: None,
            command: None,
            kind: KindName::Known(kind),
            label: kind.label().to_string(),
            is_memory: kind.is_memory(),
            rule: finding.diagnosis.rule.to_string(),
            evidence: finding.diagnosis.evidence,
            count: finding.count,
            stage: finding.stage,
            time: finding.time,
            process: finding.process,
            constraint: finding.constraint,
            constraint_description: finding.constraint.map(Constraint::describe),
            numbers: finding.diagnosis.numbers,
            kernel_oom_evidence: finding.diagnosis.kernel_oom_evidence,
            advice: finding.diagnosis.advice,
            rank: root_rank(Some(kind), kind.is_memory()),
        }
    }

    fn from_rung(file: &str, rung: StoredRung) -> Option<Entry> {
        let diagnosis = rung.diagnosis?;
        let (label, is_memory, known) = match &diagnosis.kind {
            KindName::Known(kind) => (kind.label().to_string(), kind.is_memory(), Some(*kind)),
            KindName::Other(name) => (name.replace('_', " "), diagnosis.is_memory, None),
        };
        let env: String = rung.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        Some(Entry {
            file: file.to_string(),
            line: None,
            rung: Some(rung.rung),
            command: Some(format!("{env}{}", rung.command.join(" "))),
            kind: diagnosis.kind,
            label,
            is_memory,
            rule: diagnosis.rule,
            evidence: diagnosis.evidence,
            count: 1,
            stage: Some(diagnosis.stage),
            time: None,
            process: None,
            constraint: None,
            constraint_description: None,
            numbers: diagnosis.numbers,
            kernel_oom_evidence: diagnosis.kernel_oom_evidence,
            advice: diagnosis.advice,
            rank: root_rank(known, is_memory),
        })
    }
}

/// Where a failure goes in the root-cause order when several inputs are merged: the
/// library's order, and for a kind a newer `headroom run` recorded, memory before the rest.
fn root_rank(kind: Option<Kind>, is_memory: bool) -> u8 {
    match kind {
        Some(kind) => kind.root_rank(),
        None if is_memory => Kind::PythonMemoryError.root_rank(),
        None => Kind::DiskFull.root_rank(),
    }
}

/// `asked for 2.00 GiB · 1.32 GiB free of 23.7 GiB · …`, or `None` when nothing was stated.
fn describe_numbers(numbers: &OomNumbers) -> Option<String> {
    let size = |bytes: u64| format_size(bytes);
    let mut parts = Vec::new();
    if let Some(requested) = numbers.requested {
        parts.push(format!("asked for {}", size(requested)));
    }
    match (numbers.free, numbers.capacity) {
        (Some(free), Some(capacity)) => {
            parts.push(format!("{} free of {}", size(free), size(capacity)))
        }
        (Some(free), None) => parts.push(format!("{} free", size(free))),
        (None, Some(capacity)) => parts.push(format!("{} in all", size(capacity))),
        (None, None) => {}
    }
    if let Some(allocated) = numbers.allocated {
        parts.push(format!("{} allocated", size(allocated)));
    }
    if let Some(reserved) = numbers.reserved {
        parts.push(format!("{} reserved", size(reserved)));
    }
    if let Some(unallocated) = numbers.reserved_unallocated {
        parts.push(format!("{} reserved but unallocated", size(unallocated)));
    }
    if let Some(in_use) = numbers.process_in_use {
        parts.push(format!("{} in use by the process", size(in_use)));
    }
    if let Some(device) = numbers.device {
        parts.push(format!("on device {device}"));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// The parts of a `headroom run --json` report (`run::report::Report`) that say what failed.
#[derive(Debug, Deserialize)]
struct StoredReport {
    rungs: Vec<StoredRung>,
}

#[derive(Debug, Deserialize)]
struct StoredRung {
    rung: usize,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    env: Vec<(String, String)>,
    #[serde(default)]
    diagnosis: Option<StoredDiagnosis>,
}

/// `run::report::StagedDiagnosis`: a diagnosis and its stage.
#[derive(Debug, Deserialize)]
struct StoredDiagnosis {
    stage: String,
    #[serde(default)]
    is_memory: bool,
    kind: KindName,
    #[serde(default)]
    rule: String,
    #[serde(default)]
    evidence: String,
    #[serde(default)]
    numbers: OomNumbers,
    #[serde(default)]
    kernel_oom_evidence: Option<String>,
    #[serde(default)]
    advice: String,
}

/// The human report.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for file in &report.files {
        let what = match file.format {
            Format::Log => format!(
                "{} lines, {}",
                file.lines.unwrap_or(0),
                format_size(file.bytes)
            ),
            Format::RunReport => format!(
                "`headroom run` report, {} rung{}",
                file.rungs.unwrap_or(0),
                plural(file.rungs.unwrap_or(0))
            ),
        };
        let found = match file.findings {
            0 => "nothing recognised".to_string(),
            n => format!("{n} failure{}", plural(n)),
        };
        let _ = writeln!(out, "{} ({what}): {found}", printable(&file.file));
        if file.left_out > 0 {
            let _ = writeln!(
                out,
                "   (only the first {MAX_FINDINGS} distinct failures are listed; {} more failure \
line{} left out)",
                file.left_out,
                if file.left_out == 1 { " is" } else { "s are" }
            );
        }
    }
    let summary = &report.summary;
    if report.findings.is_empty() {
        let _ = writeln!(
            out,
            "\nNo failure headroom knows was recognised. If the command died without a word \
(a bare `Killed`, exit 137), the kernel may have killed it: run `headroom diagnose \
--kernel-log`."
        );
        return out;
    }
    let _ = writeln!(
        out,
        "\n{} distinct failure{}, {} of them memory; root cause first:",
        summary.findings,
        plural(summary.findings),
        summary.memory
    );
    for (index, entry) in report.findings.iter().enumerate() {
        let _ = writeln!(out);
        let root = if index == 0 { " — root cause" } else { "" };
        let _ = writeln!(out, "{}. {}{root}", index + 1, entry.label);
        let place = match (entry.line, entry.rung, &entry.command) {
            (Some(line), _, _) => format!("{}:{line}", entry.file),
            (None, Some(rung), Some(command)) => {
                format!("{}: rung {rung} (`{command}`)", entry.file)
            }
            _ => entry.file.clone(),
        };
        let _ = writeln!(
            out,
            "   {}: {}",
            printable(&place),
            printable(&entry.evidence)
        );
        let mut fact = |name: &str, value: String| {
            out.push_str(&wrap(name, &value));
        };
        if let Some(process) = &entry.process {
            fact("process", describe_victim(process));
        }
        if let Some(description) = entry.constraint_description {
            fact("limit", description.to_string());
        }
        if let Some(numbers) = describe_numbers(&entry.numbers) {
            fact("numbers", numbers);
        }
        if let Some(time) = &entry.time {
            fact("time", printable(time));
        }
        if let Some(stage) = &entry.stage {
            fact("stage", printable(stage));
        }
        if entry.count > 1 {
            fact("seen", format!("{} times", entry.count));
        }
        if let Some(kernel) = &entry.kernel_oom_evidence {
            fact("kernel", printable(kernel));
        }
        fact("advice", entry.advice.clone());
    }
    out
}

/// `cc1plus, pid 9253, 2.95 GiB resident when killed`.
pub fn describe_victim(victim: &Victim) -> String {
    let mut text = printable(&victim.name);
    if let Some(pid) = victim.pid {
        let _ = write!(text, ", pid {pid}");
    }
    if let Some(rss) = victim.rss_bytes {
        let _ = write!(text, ", {} resident when killed", format_size(rss));
    }
    text
}

/// `   name      value`, with the value wrapped at [`WIDTH`] under itself.
pub fn wrap(name: &str, value: &str) -> String {
    const INDENT: usize = 13;
    let mut out = format!("   {name:<9} ");
    let mut column = INDENT;
    for (index, word) in value.split_whitespace().enumerate() {
        let width = word.chars().count();
        if index > 0 {
            if column + 1 + width > WIDTH {
                out.push('\n');
                out.push_str(&" ".repeat(INDENT));
                column = INDENT;
            } else {
                out.push(' ');
                column += 1;
            }
        }
        out.push_str(word);
        column += width;
    }
    out.push('\n');
    out
}

/// `text` safe to print on a terminal: control characters (a log's stray bells, NULs,
/// backspaces) are shown escaped instead of acting.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diagnose(text: &[u8]) -> Report {
        let (file, entries) = from_scan("build.log", crate::scan_bytes(text));
        Report::new(vec![file], entries)
    }

    #[test]
    fn the_kernel_kill_comes_before_the_compiler_it_killed() {
        let report = diagnose(
            b"[ 10/400] g++ -c a.cc\n\
g++: fatal error: Killed signal terminated program cc1plus\n\
[ 1638.977956] Out of memory: Killed process 9253 (cc1plus) total-vm:3970108kB, anon-rss:3090636kB, file-rss:4kB, shmem-rss:0kB, UID:0\n",
        );
        assert_eq!(report.summary.exit_code, EXIT_MEMORY);
        let first = &report.findings[0];
        assert_eq!(first.kind, KindName::Known(Kind::KernelOomKill));
        assert_eq!(first.line, Some(3));
        let text = render(&report);
        assert!(
            text.contains("1. killed by the kernel OOM killer — root cause"),
            "{text}"
        );
        assert!(
            text.contains("cc1plus, pid 9253, 2.95 GiB resident"),
            "{text}"
        );
        assert!(text.contains("build.log:2: g++: fatal error"), "{text}");
    }

    #[test]
    fn exit_codes_follow_the_policy() {
        assert_eq!(diagnose(b"all good\n").summary.exit_code, EXIT_NOTHING);
        assert_eq!(
            diagnose(b"OSError: [Errno 28] No space left on device\n")
                .summary
                .exit_code,
            EXIT_NOT_MEMORY
        );
    }

    #[test]
    fn numbers_are_described_in_headroom_sizes() {
        let numbers = OomNumbers {
            requested: Some(2 << 30),
            free: Some(1 << 30),
            capacity: Some(24 << 30),
            device: Some(0),
            ..OomNumbers::default()
        };
        assert_eq!(
            describe_numbers(&numbers).unwrap(),
            "asked for 2.00 GiB · 1.00 GiB free of 24.0 GiB · on device 0"
        );
        assert_eq!(describe_numbers(&OomNumbers::default()), None);
    }

    #[test]
    fn long_values_wrap_under_themselves_and_controls_are_escaped() {
        let text = wrap("advice", &"word ".repeat(40));
        assert!(text.lines().count() > 1);
        assert!(text.lines().all(|line| line.chars().count() <= WIDTH));
        assert!(text
            .lines()
            .skip(1)
            .all(|line| line.starts_with("             w")));
        assert_eq!(printable("a\u{7}b\0"), "a\\u{7}b\\u{0}");
    }

    #[test]
    fn a_run_report_is_told_from_a_log() {
        assert!(looks_like_run_report(
            b"\n {\n  \"command\": [\"x\"],\n  \"rungs\": ["
        ));
        assert!(!looks_like_run_report(b"rungs: \"rungs\""));
        assert!(!looks_like_run_report(b"{\"level\":\"info\"}\n"));
    }

    #[test]
    fn a_report_from_a_newer_headroom_keeps_its_unknown_kind() {
        let report: StoredReport = serde_json::from_str(
            r#"{"rungs":[{"rung":0,"command":["x"],"diagnosis":{"stage":"s","is_memory":true,"kind":"quantum_oom","rule":"r","evidence":"e","advice":"a"}}]}"#,
        )
        .unwrap();
        let (_, entries) = from_run_report("r.json", report, 1);
        assert_eq!(entries[0].label, "quantum oom");
        assert!(entries[0].is_memory);
        assert_eq!(entries[0].rank, 1);
    }
}
