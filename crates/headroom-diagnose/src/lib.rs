//! Failure classification rules (data) and the advice that goes with them.
//!
//! `headroom diagnose` lists every failure in a log with [`scan`]; `headroom run` calls
//! [`classify`] on a failed command's output to name the failure and decide whether a fallback
//! rung should run; `headroom build` calls it on a failed compiler's stderr to decide on an
//! OOM retry. All three read text the same way, through the same table of rules.

mod kernel;
mod numbers;
pub mod report;
mod rules;
mod scan;

use std::sync::LazyLock;

use regex::bytes::{RegexSet, RegexSetBuilder};
use serde::Serialize;

pub use kernel::{kills_in_log, Constraint, LoggedKill, OomKill, OomKills, Victim};
pub use numbers::OomNumbers;
pub use rules::{Kind, Rule, NOT_FAILURES, RULES};
pub use scan::{scan, scan_bytes, stage_marked, Finding, Scan, MAX_FINDINGS, STAGE_MARKER};

/// How the command ended, as far as the caller knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit status when the command exited normally.
    pub code: Option<i32>,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// Proof that the kernel OOM killer struck, e.g. `memory.events oom_kill 0 -> 1` or a
    /// kernel log line. `None` when there is none or it could not be read.
    pub kernel_oom_evidence: Option<String>,
}

impl ExitInfo {
    pub fn exited(code: i32) -> Self {
        ExitInfo {
            code: Some(code),
            ..ExitInfo::default()
        }
    }

    pub fn signaled(signal: i32) -> Self {
        ExitInfo {
            signal: Some(signal),
            ..ExitInfo::default()
        }
    }

    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none()
    }

    /// SIGKILL, either directly or as a shell's `128 + 9` exit status.
    fn sigkilled(&self) -> bool {
        const SIGKILL: i32 = 9;
        self.signal == Some(SIGKILL) || self.code == Some(128 + SIGKILL)
    }
}

/// What went wrong, and what to do about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub kind: Kind,
    /// The table row that matched, or `exit-status` when only the exit status told.
    pub rule: &'static str,
    /// The output line that matched (trimmed), or a description of the exit evidence.
    pub evidence: String,
    /// Sizes pulled out of the message.
    #[serde(skip_serializing_if = "OomNumbers::is_empty")]
    pub numbers: OomNumbers,
    /// The kernel's own word that it OOM-killed the command, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_oom_evidence: Option<String>,
    pub advice: String,
}

impl Diagnosis {
    pub fn is_memory(&self) -> bool {
        self.kind.is_memory()
    }
}

/// The whole table as one set, to ask in one pass which rules match a piece of text.
struct CompiledRules {
    set: RegexSet,
    not_failures: regex::bytes::Regex,
}

static COMPILED: LazyLock<CompiledRules> = LazyLock::new(|| CompiledRules {
    // ASCII classes: the messages' own words are ASCII, and Unicode classes over binary
    // bytes made the search 400 times slower (1 MB/s on random bytes).
    set: RegexSetBuilder::new(RULES.iter().map(|rule| rule.pattern))
        .unicode(false)
        .build()
        .expect("every rule pattern is valid (tested)"),
    not_failures: regex::bytes::Regex::new(&NOT_FAILURES.join("|"))
        .expect("valid patterns (tested)"),
});

const KERNEL_OOM_ADVICE: &str = "the kernel killed the command for lack of memory: lower its \
parallelism or batch size, add swap, close other memory users, or give it a larger \
`--memory-limit`; `headroom run` shows which stage peaked";

/// Classifies a failed command from its output and exit. Returns `None` when the command
/// succeeded or when nothing in the output or the exit explains the failure. The output's
/// root cause is the answer, as [`scan`] orders them.
pub fn classify(output: &[u8], exit: &ExitInfo) -> Option<Diagnosis> {
    if exit.success() {
        return None;
    }
    let from_text = scan_bytes(output)
        .findings
        .into_iter()
        .next()
        .map(|finding| finding.diagnosis);
    match (from_text, &exit.kernel_oom_evidence) {
        (Some(diagnosis), None) => Some(diagnosis),
        (Some(diagnosis), Some(evidence)) if diagnosis.is_memory() => Some(Diagnosis {
            kernel_oom_evidence: Some(evidence.clone()),
            ..diagnosis
        }),
        (_, Some(evidence)) => Some(Diagnosis {
            kind: Kind::KernelOomKill,
            rule: "kernel-oom-kill",
            evidence: evidence.clone(),
            numbers: OomNumbers::default(),
            kernel_oom_evidence: Some(evidence.clone()),
            advice: KERNEL_OOM_ADVICE.to_string(),
        }),
        (None, None) if exit.sigkilled() => Some(Diagnosis {
            kind: Kind::SigkillUnexplained,
            rule: "exit-status",
            evidence: "the command was killed by SIGKILL and no kernel OOM record could be read"
                .to_string(),
            numbers: OomNumbers::default(),
            kernel_oom_evidence: None,
            advice: format!(
                "{KERNEL_OOM_ADVICE}; to confirm, look for `Killed process` in `dmesg` or \
`journalctl -k`, or run `headroom diagnose --kernel-log`"
            ),
        }),
        (None, None) => None,
    }
}

/// Adds what the numbers say to the rule's advice: how far short the device was, and whether
/// fragmentation (memory reserved but not handed out) is the problem.
pub(crate) fn advice_with_numbers(advice: &str, numbers: &OomNumbers) -> String {
    use headroom_size::format_size;
    let mut notes = Vec::new();
    if let (Some(requested), Some(free)) = (numbers.requested, numbers.free) {
        notes.push(format!(
            "it asked for {} with {} free",
            format_size(requested),
            format_size(free)
        ));
        if let Some(unallocated) = numbers.reserved_unallocated {
            if unallocated >= requested {
                notes.push(format!(
                    "{} is reserved but unallocated, so fragmentation is the likely cause",
                    format_size(unallocated)
                ));
            }
        }
    } else if let Some(requested) = numbers.requested {
        notes.push(format!("it asked for {}", format_size(requested)));
    }
    if notes.is_empty() {
        advice.to_string()
    } else {
        format!("{} — {advice}", notes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_pattern_compiles_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for rule in RULES {
            regex::bytes::Regex::new(rule.pattern)
                .unwrap_or_else(|e| panic!("rule {}: {e}", rule.name));
            assert!(names.insert(rule.name), "duplicate rule name {}", rule.name);
        }
    }

    #[test]
    fn success_is_never_a_failure() {
        assert_eq!(classify(b"CUDA out of memory", &ExitInfo::exited(0)), None);
    }

    #[test]
    fn unexplained_failure_is_none() {
        assert_eq!(classify(b"error: expected ';'", &ExitInfo::exited(1)), None);
    }

    #[test]
    fn kernel_evidence_overrides_a_non_memory_message() {
        let exit = ExitInfo {
            signal: Some(9),
            kernel_oom_evidence: Some("memory.events oom_kill 0 -> 1".into()),
            ..ExitInfo::default()
        };
        let diagnosis = classify(b"OSError: [Errno 28] No space left on device", &exit).unwrap();
        assert_eq!(diagnosis.kind, Kind::KernelOomKill);
        assert!(diagnosis.is_memory());
    }

    #[test]
    fn bare_sigkill_is_a_suspected_oom_kill() {
        let diagnosis = classify(b"", &ExitInfo::signaled(9)).unwrap();
        assert_eq!(diagnosis.kind, Kind::SigkillUnexplained);
        let shell = classify(b"", &ExitInfo::exited(137)).unwrap();
        assert_eq!(shell.kind, Kind::SigkillUnexplained);
    }

    #[test]
    fn the_last_error_wins() {
        let text = b"OSError: [Errno 28] No space left on device\nretrying\nMemoryError\n";
        let diagnosis = classify(text, &ExitInfo::exited(1)).unwrap();
        assert_eq!(diagnosis.kind, Kind::PythonMemoryError);
    }

    #[test]
    fn numbers_feed_the_advice() {
        let text = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.32 GiB is free. Of the allocated memory 12.09 GiB is allocated by PyTorch, and 4.84 GiB is reserved by PyTorch but unallocated.";
        let diagnosis = classify(text, &ExitInfo::exited(1)).unwrap();
        assert!(
            diagnosis
                .advice
                .contains("asked for 2.00 GiB with 1.32 GiB free"),
            "{}",
            diagnosis.advice
        );
        assert!(
            diagnosis.advice.contains("fragmentation"),
            "{}",
            diagnosis.advice
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512), code in -1i32..256) {
            let _ = classify(&bytes, &ExitInfo::exited(code));
        }
    }
}
