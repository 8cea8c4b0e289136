//! Reads a log of any size and lists each distinct failure in it, root cause first: what
//! `headroom diagnose` prints, and what [`crate::classify`] picks its answer from.
//!
//! The log is read in blocks of whole lines. One pass of the whole rule set over a block says
//! whether anything in it matches at all; only blocks that do are looked at line by line, so
//! a 100 MB build log costs little more than reading it. Colour codes and CR line ends are
//! taken out first; bytes that are not UTF-8 are matched as bytes and shown as `\u{FFFD}`.
//!
//! What a scan keeps does not grow with the log: each distinct failure is kept once with a
//! count of its repeats, the kernel's OOM kills as the first and the last of each process and
//! limit, and at most [`MAX_FINDINGS`] distinct failures.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::LazyLock;

use regex::bytes::Regex;
use serde::Serialize;

use crate::kernel::{Constraint, OomKill, OomKills, Victim};
use crate::rules::{Kind, RULES};
use crate::{advice_with_numbers, numbers, Diagnosis, OomNumbers, COMPILED, KERNEL_OOM_ADVICE};

/// The marker a command prints to start a stage: `##headroom stage NAME`.
pub const STAGE_MARKER: &str = "##headroom stage";

/// How much of a log is looked at in one piece. Longer lines are cut into pieces this long.
const BLOCK: usize = 1 << 20;
/// How much is read at a time.
const READ: usize = 64 << 10;
/// Evidence lines longer than this are cut when shown.
const EVIDENCE_CHARS: usize = 400;
/// How many distinct failures a scan keeps. A log with more (one whose every line names
/// another stage or process) has the rest counted in [`Scan::left_out`].
pub const MAX_FINDINGS: usize = 1000;

/// One distinct failure found in a log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    #[serde(flatten)]
    pub diagnosis: Diagnosis,
    /// 1-based line number of its evidence's first occurrence.
    pub line: u64,
    /// How many lines reported it.
    pub count: u64,
    /// The stage marked (`##headroom stage NAME`) where it first occurred.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The time stamp its line carries, for kernel log lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The process the kernel killed, for an OOM kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<Victim>,
    /// Whose limit the kernel enforced, for an OOM kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
}

/// What one look through a log found.
#[derive(Debug, Default, Serialize)]
pub struct Scan {
    /// Root cause first: the kernel's record of a kill, then other memory failures, then
    /// compilers reporting that a child was killed (the usual consequence of a kill), then
    /// failures that are not memory; in each group, the earliest first.
    pub findings: Vec<Finding>,
    /// The first and the last OOM kill the kernel logged for each process and limit, in
    /// order; `oom_kill_count` says how many it logged in all.
    pub oom_kills: Vec<OomKill>,
    pub oom_kill_count: u64,
    /// Failure lines (or OOM kills) of distinct failures beyond the first [`MAX_FINDINGS`],
    /// counted but not listed.
    pub left_out: u64,
    pub lines: u64,
    pub bytes: u64,
}

/// Reads `reader` to its end and says what failed in it.
pub fn scan(mut reader: impl Read) -> io::Result<Scan> {
    let mut scanner = Scanner::default();
    let mut buffer = Vec::new();
    loop {
        // Read in steps, so that a short text (a compiler's stderr) costs no block's worth
        // of zeroed buffer.
        let filled = buffer.len();
        buffer.resize(filled + READ, 0);
        let read = match reader.read(&mut buffer[filled..]) {
            Ok(read) => read,
            // A signal, not the end: read again.
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                buffer.truncate(filled);
                continue;
            }
            Err(err) => return Err(err),
        };
        buffer.truncate(filled + read);
        if read == 0 {
            scanner.feed(&buffer);
            return Ok(scanner.finish());
        }
        if buffer.len() < BLOCK {
            continue;
        }
        // Whole lines now; the rest waits for the next read. A line longer than a block is
        // cut where the block ends.
        let end = memchr::memrchr(b'\n', &buffer).map_or(buffer.len(), |newline| newline + 1);
        scanner.feed(&buffer[..end]);
        buffer.drain(..end);
    }
}

/// [`scan`] of text already in memory.
pub fn scan_bytes(text: &[u8]) -> Scan {
    scan(text).expect("reading a slice cannot fail")
}

#[derive(Default)]
struct Scanner {
    /// Newlines read so far.
    lines: u64,
    ends_in_newline: bool,
    bytes: u64,
    stage: Option<String>,
    findings: Vec<Finding>,
    /// Index into `findings` by rule and stage: one finding per distinct failure.
    seen: HashMap<(&'static str, Option<String>), usize>,
    kernel: OomKills,
    /// The stage in effect at the first line of the OOM kill being read.
    kill_stage: Option<String>,
    /// The OOM kills read whole, by process name and limit.
    kill_kinds: HashMap<(Option<String>, Option<Constraint>), KillKind>,
    oom_kill_count: u64,
    left_out: u64,
}

/// The OOM kills of one process name and limit.
struct KillKind {
    /// Its index in `findings`.
    finding: usize,
    first: OomKill,
    /// The latest, when there was more than one.
    last: Option<OomKill>,
}

impl Scanner {
    fn feed(&mut self, block: &[u8]) {
        if block.is_empty() {
            return;
        }
        self.bytes += block.len() as u64;
        let cleaned;
        let block = if memchr::memchr(0x1b, block).is_some() {
            cleaned = ANSI.replace_all(block, &b""[..]);
            &cleaned[..]
        } else {
            block
        };
        let first_line = self.lines + 1;
        self.lines += memchr::memchr_iter(b'\n', block).count() as u64;
        self.ends_in_newline = block.ends_with(b"\n");
        if !COMPILED.set.is_match(block) {
            if let Some(marker) = memchr::memmem::rfind(block, STAGE_MARKER.as_bytes()) {
                let line_end =
                    memchr::memchr(b'\n', &block[marker..]).map_or(block.len(), |i| marker + i);
                if let Some(stage) = stage_marked(&block[marker..line_end]) {
                    self.stage = Some(stage);
                }
            }
            return;
        }
        let lines: Vec<&[u8]> = block.split(|&b| b == b'\n').collect();
        for (index, line) in lines.iter().enumerate() {
            // The empty piece after a block's last newline is not a line.
            if index == lines.len() - 1 && line.is_empty() {
                break;
            }
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(stage) = stage_marked(line) {
                self.stage = Some(stage);
                continue;
            }
            self.look_at(line, first_line + index as u64, &lines[index + 1..]);
        }
    }

    /// Classifies line number `number`; `after` are the lines that follow it in the block,
    /// read only for the numbers of a message the console wrapped.
    fn look_at(&mut self, line: &[u8], number: u64, after: &[&[u8]]) {
        let Some(index) = COMPILED.set.matches(line).into_iter().next() else {
            return;
        };
        if says_it_is_no_failure(line, after) {
            return;
        }
        let rule = &RULES[index];
        let text = String::from_utf8_lossy(line);
        if rule.kind == Kind::KernelOomKill && self.kernel.feed(&text, number) {
            let started_here = self.kernel.last().is_some_and(|kill| kill.line == number);
            // A kill starting here settles the one before it, whose stage is still kept.
            let settled: Vec<OomKill> = self.kernel.take_settled().collect();
            for kill in settled {
                self.settle(kill);
            }
            if started_here {
                self.kill_stage = self.stage.clone();
            }
            return;
        }
        let key = (rule.name, self.stage.clone());
        if let Some(&seen) = self.seen.get(&key) {
            self.findings[seen].count += 1;
            return;
        }
        if !self.room_for_another() {
            return;
        }
        let mut numbers = numbers::extract(&text);
        if numbers.is_empty() {
            let wrapped: Vec<u8> = std::iter::once(line)
                .chain(after.iter().take(3).copied())
                .collect::<Vec<_>>()
                .join(&b' ');
            numbers = numbers::extract(&String::from_utf8_lossy(&wrapped));
        }
        self.seen.insert(key, self.findings.len());
        self.findings.push(Finding {
            diagnosis: Diagnosis {
                kind: rule.kind,
                rule: rule.name,
                evidence: shorten(text.trim()),
                advice: advice_with_numbers(rule.advice, &numbers),
                numbers,
                kernel_oom_evidence: None,
            },
            line: number,
            count: 1,
            stage: self.stage.clone(),
            time: None,
            process: None,
            constraint: None,
        });
    }

    /// Whether another distinct failure may be kept; counts it as left out when not.
    fn room_for_another(&mut self) -> bool {
        let room = self.findings.len() < MAX_FINDINGS;
        if !room {
            self.left_out += 1;
        }
        room
    }

    /// Counts an OOM kill read whole. One finding per process name and limit: a build whose
    /// cc1plus was killed ten times has one failure, not ten.
    fn settle(&mut self, kill: OomKill) {
        self.oom_kill_count += 1;
        let name = kill.victim.as_ref().map(|victim| victim.name.clone());
        let key = (name, kill.constraint);
        if let Some(kind) = self.kill_kinds.get_mut(&key) {
            self.findings[kind.finding].count += 1;
            kind.last = Some(kill);
            return;
        }
        if !self.room_for_another() {
            return;
        }
        self.findings.push(Finding {
            diagnosis: Diagnosis {
                kind: Kind::KernelOomKill,
                rule: "kernel-oom-kill",
                evidence: shorten(&kill.evidence),
                numbers: OomNumbers::default(),
                kernel_oom_evidence: None,
                advice: kernel_advice(kill.constraint),
            },
            line: kill.evidence_line,
            count: 1,
            stage: self.kill_stage.clone(),
            time: kill.time.clone(),
            process: kill.victim.clone(),
            constraint: kill.constraint,
        });
        let finding = self.findings.len() - 1;
        self.kill_kinds.insert(
            key,
            KillKind {
                finding,
                first: kill,
                last: None,
            },
        );
    }

    fn finish(mut self) -> Scan {
        for kill in std::mem::take(&mut self.kernel).finish() {
            self.settle(kill);
        }
        let mut oom_kills: Vec<OomKill> = self
            .kill_kinds
            .into_values()
            .flat_map(|kind| std::iter::once(kind.first).chain(kind.last))
            .collect();
        oom_kills.sort_by_key(|kill| kill.line);
        self.findings
            .sort_by_key(|finding| (finding.diagnosis.kind.root_rank(), finding.line));
        Scan {
            findings: self.findings,
            oom_kills,
            oom_kill_count: self.oom_kill_count,
            left_out: self.left_out,
            lines: self.lines + u64::from(self.bytes > 0 && !self.ends_in_newline),
            bytes: self.bytes,
        }
    }
}

/// Whether `line` says that it is no failure, read on into the two lines after it with the
/// console's wrapping undone; what it says must begin on `line` itself.
fn says_it_is_no_failure(line: &[u8], after: &[&[u8]]) -> bool {
    let mut text = Vec::new();
    let mut first_line_ends = 0;
    for (index, piece) in std::iter::once(line)
        .chain(after.iter().take(2).copied())
        .enumerate()
    {
        for word in piece
            .split(u8::is_ascii_whitespace)
            .filter(|word| !word.is_empty())
        {
            text.extend_from_slice(word);
            text.push(b' ');
        }
        if index == 0 {
            first_line_ends = text.len();
        }
    }
    COMPILED
        .not_failures
        .find(&text)
        .is_some_and(|found| found.start() < first_line_ends)
}

fn kernel_advice(constraint: Option<Constraint>) -> String {
    match constraint {
        Some(Constraint::Cgroup) => format!(
            "{KERNEL_OOM_ADVICE}; the limit was a cgroup's (a container's `--memory`, a \
Kubernetes `resources.limits.memory`, a systemd `MemoryMax`), so raising that limit also helps"
        ),
        Some(Constraint::Machine) => {
            format!("{KERNEL_OOM_ADVICE}; the whole machine ran out, not just one container")
        }
        _ => KERNEL_OOM_ADVICE.to_string(),
    }
}

/// The stage a `##headroom stage NAME` line starts, if it is one.
pub fn stage_marked(line: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(line);
    let name = text.trim().strip_prefix(STAGE_MARKER)?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

fn shorten(text: &str) -> String {
    match text.char_indices().nth(EVIDENCE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Terminal colour and other escape sequences (CSI and OSC).
static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?-u)\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
        .expect("valid escape pattern")
});

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(scan: &Scan) -> Vec<Kind> {
        scan.findings.iter().map(|f| f.diagnosis.kind).collect()
    }

    /// Hands out the first half of its text, then fails once with `Interrupted`, as a read
    /// cut short by a signal does, then hands out the rest.
    struct Interrupted<'a> {
        text: &'a [u8],
        reads: usize,
    }

    impl Read for Interrupted<'_> {
        fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            let length = match self.reads {
                1 => self.text.len() / 2,
                2 => return Err(io::ErrorKind::Interrupted.into()),
                _ => self.text.len(),
            }
            .min(buffer.len());
            buffer[..length].copy_from_slice(&self.text[..length]);
            self.text = &self.text[length..];
            Ok(length)
        }
    }

    #[test]
    fn a_read_interrupted_by_a_signal_is_not_the_end_of_the_log() {
        let log: &[u8] =
            b"[ 10%] Building CXX object a.o\nvirtual memory exhausted: Cannot allocate memory\n";
        let whole = scan_bytes(log);
        let interrupted = scan(Interrupted {
            text: log,
            reads: 0,
        })
        .unwrap();
        assert_eq!(interrupted.bytes, log.len() as u64);
        assert_eq!(kinds(&interrupted), kinds(&whole));
        assert!(!whole.findings.is_empty());
    }

    #[test]
    fn the_kernel_kill_is_the_root_of_the_compiler_kill() {
        let log = b"[ 10%] Building CXX object a.o\n\
g++: fatal error: Killed signal terminated program cc1plus\n\
compilation terminated.\n\
[ 1638.977956] Out of memory: Killed process 9253 (cc1plus) total-vm:6084172kB, anon-rss:5342044kB, file-rss:0kB, shmem-rss:0kB\n";
        let scan = scan_bytes(log);
        assert_eq!(kinds(&scan), [Kind::KernelOomKill, Kind::CompilerKilled]);
        let kill = &scan.findings[0];
        assert_eq!(kill.line, 4);
        assert_eq!(kill.process.as_ref().unwrap().name, "cc1plus");
        assert_eq!(
            kill.process.as_ref().unwrap().rss_bytes,
            Some(5_342_044 << 10)
        );
        assert_eq!(scan.findings[1].line, 2);
        assert_eq!(scan.lines, 4);
    }

    #[test]
    fn memory_comes_before_what_it_caused_and_repeats_are_counted() {
        let log = "OSError: [Errno 28] No space left on device\n\
RuntimeError: CUDA error: out of memory\n\
RuntimeError: CUDA error: out of memory\n";
        let scan = scan_bytes(log.as_bytes());
        assert_eq!(kinds(&scan), [Kind::CudaOutOfMemory, Kind::DiskFull]);
        assert_eq!(scan.findings[0].count, 2);
    }

    #[test]
    fn stages_colours_and_crlf() {
        let log = "##headroom stage load\r\nok\r\n##headroom stage compile\r\n\x1b[01;31m\x1b[Kfatal error: \x1b[m\x1b[KKilled signal terminated program cc1plus\r\n";
        let scan = scan_bytes(log.as_bytes());
        let finding = &scan.findings[0];
        assert_eq!(finding.stage.as_deref(), Some("compile"));
        assert_eq!(
            finding.diagnosis.evidence,
            "fatal error: Killed signal terminated program cc1plus"
        );
        assert_eq!(finding.line, 4);
    }

    #[test]
    fn blocks_cut_long_logs_without_losing_lines_or_stages() {
        let mut log = Vec::new();
        log.extend_from_slice(b"##headroom stage train\n");
        for n in 0..60_000 {
            log.extend_from_slice(format!("step {n}: loss 0.{n}\n").as_bytes());
        }
        // A line longer than a block, then the failure.
        log.extend(std::iter::repeat_n(b'x', BLOCK + 10));
        log.extend_from_slice(
            b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
        );
        let scan = scan(&log[..]).unwrap();
        assert_eq!(scan.lines, 60_003);
        let finding = &scan.findings[0];
        assert_eq!(finding.line, 60_003);
        assert_eq!(finding.stage.as_deref(), Some("train"));
        assert_eq!(finding.diagnosis.numbers.requested, Some(2 << 30));
    }

    #[test]
    fn repeated_kills_keep_the_first_and_last_of_each_kind_with_their_stages() {
        let mut log = String::from("##headroom stage configure\n");
        for pid in 0..1000 {
            if pid == 500 {
                log.push_str("##headroom stage compile\n");
            }
            log.push_str(&format!(
                "[{pid}.5] cc1plus invoked oom-killer: gfp_mask=0x140cca, order=0\n\
[{pid}.6] Out of memory: Killed process {pid} (cc1plus) total-vm:1kB, anon-rss:1024kB\n"
            ));
        }
        log.push_str("[9.9] Out of memory: Killed process 7 (ld) total-vm:1kB, anon-rss:1kB\n");
        let scan = scan_bytes(log.as_bytes());
        assert_eq!(scan.oom_kill_count, 1001);
        let pids: Vec<_> = scan
            .oom_kills
            .iter()
            .map(|kill| kill.victim.as_ref().unwrap().pid.unwrap())
            .collect();
        assert_eq!(pids, [0, 999, 7], "first and last cc1plus, the one ld");
        assert_eq!(scan.oom_kills[1].invoked_by.as_deref(), Some("cc1plus"));
        assert_eq!(kinds(&scan), [Kind::KernelOomKill, Kind::KernelOomKill]);
        let cc1plus = &scan.findings[0];
        assert_eq!((cc1plus.count, cc1plus.line), (1000, 3));
        assert_eq!(cc1plus.stage.as_deref(), Some("configure"));
        assert_eq!(scan.findings[1].count, 1);
        assert_eq!(scan.findings[1].stage.as_deref(), Some("compile"));
        assert_eq!(scan.left_out, 0);
    }

    #[test]
    fn distinct_failures_beyond_the_limit_are_counted_not_kept() {
        let mut log = String::new();
        for n in 0..MAX_FINDINGS + 5 {
            log.push_str(&format!("Out of memory: Killed process {n} (job{n})\n"));
        }
        log.push_str("RuntimeError: CUDA error: out of memory\n");
        let scan = scan_bytes(log.as_bytes());
        assert_eq!(scan.findings.len(), MAX_FINDINGS);
        assert_eq!(scan.left_out, 6);
        assert_eq!(scan.oom_kill_count, MAX_FINDINGS as u64 + 5);
    }

    #[test]
    fn the_allocator_warning_that_is_no_failure_is_skipped() {
        let log = "W bfc_allocator.cc:217] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.59GiB. The\n caller indicates that this is not a failure, but may mean that there\n";
        assert!(scan_bytes(log.as_bytes()).findings.is_empty());
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_counts_every_line(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let scan = scan(&bytes[..]).unwrap();
            let newlines = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
            let last_unended = u64::from(bytes.last().is_some_and(|&b| b != b'\n'));
            proptest::prop_assert_eq!(scan.lines, newlines + last_unended);
        }
    }
}
