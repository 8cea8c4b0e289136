//! Stages: named spans of a run, started by a marker line the command prints (from any
//! language) or by a `--stage-regex` match on its existing log lines, and summarised from the
//! memory samples that fall inside them.

use regex::Regex;
use serde::Serialize;

/// Finds stage starts in output lines.
#[derive(Debug, Clone, Default)]
pub struct StageDetector {
    regex: Option<Regex>,
}

impl StageDetector {
    pub fn new(regex: Option<Regex>) -> Self {
        StageDetector { regex }
    }

    /// The stage that `line` starts, if any: a `##headroom stage NAME` marker
    /// ([`headroom_diagnose::stage_marked`], the rule `headroom diagnose` reads logs by), else,
    /// with `--stage-regex`, the capture group named `stage`, else the first group, else the
    /// whole match.
    pub fn stage_in(&self, line: &[u8]) -> Option<String> {
        if let Some(name) = headroom_diagnose::stage_marked(line) {
            return Some(name);
        }
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\r', '\n']);
        let captures = self.regex.as_ref()?.captures(text)?;
        let name = captures
            .name("stage")
            .or_else(|| captures.get(1))
            .or_else(|| captures.get(0))?
            .as_str()
            .trim();
        (!name.is_empty()).then(|| name.to_string())
    }
}

/// Longest line scanned for a stage start; longer lines pass through but only their first
/// `MAX_LINE` bytes are scanned.
const MAX_LINE: usize = 64 * 1024;

/// Finds stage starts in a stream that arrives in chunks cut anywhere, lines split across
/// them included. Without `--stage-regex` only lines that hold the marker's bytes are read
/// further, so a chatty command's output (millions of lines a second) costs one substring
/// search per chunk rather than a look at every line.
pub struct StageScanner {
    detector: StageDetector,
    marker: memchr::memmem::Finder<'static>,
    /// The start of the line the last chunk ended inside, at most `MAX_LINE` bytes.
    partial: Vec<u8>,
}

impl StageScanner {
    pub fn new(detector: StageDetector) -> Self {
        StageScanner {
            detector,
            marker: memchr::memmem::Finder::new(headroom_diagnose::STAGE_MARKER.as_bytes()),
            partial: Vec::new(),
        }
    }

    /// Scans the lines `chunk` ends and keeps the start of the one it leaves open; calls
    /// `found` with each stage started, in order.
    pub fn feed(&mut self, chunk: &[u8], found: &mut impl FnMut(String)) {
        let Some(first_end) = memchr::memchr(b'\n', chunk) else {
            self.keep_partial(chunk);
            return;
        };
        self.keep_partial(&chunk[..=first_end]);
        self.check(&self.partial, found);
        self.partial.clear();
        let rest = &chunk[first_end + 1..];
        let whole_end = memchr::memrchr(b'\n', rest).map_or(0, |last| last + 1);
        let (whole, open) = rest.split_at(whole_end);
        if self.detector.regex.is_some() || self.marker.find(whole).is_some() {
            for line in whole.split_inclusive(|&b| b == b'\n') {
                self.check(&line[..line.len().min(MAX_LINE)], found);
            }
        }
        self.keep_partial(open);
    }

    /// The stage the stream's last line starts, when the stream ended without a newline.
    pub fn finish(self) -> Option<String> {
        self.detector.stage_in(&self.partial)
    }

    fn keep_partial(&mut self, piece: &[u8]) {
        let room = MAX_LINE - self.partial.len();
        self.partial
            .extend_from_slice(&piece[..piece.len().min(room)]);
    }

    fn check(&self, line: &[u8], found: &mut impl FnMut(String)) {
        if let Some(name) = self.detector.stage_in(line) {
            found(name);
        }
    }
}

/// A stage start seen in the output, in seconds since the command started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageStart {
    pub t: f64,
    pub name: String,
}

/// What one stage cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageSummary {
    pub name: String,
    pub start_s: f64,
    pub end_s: f64,
    pub duration_s: f64,
    /// Tree memory (RSS) at the stage's first sample.
    pub entry_bytes: u64,
    /// Tree memory at the stage's last sample.
    pub exit_bytes: u64,
    pub peak_bytes: u64,
    /// Seconds since start when the peak was sampled.
    pub peak_at_s: f64,
    /// GPU memory peak of the tree during the stage, where NVML is available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_peak_bytes: Option<u64>,
    /// Neuron device memory peak during the stage, where `neuron-monitor` is available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_peak_bytes: Option<u64>,
}

/// Name of the span before the first marker.
pub const BEFORE_FIRST: &str = "(start)";
/// Name of the only stage when the command printed no marker.
pub const WHOLE_RUN: &str = "(whole run)";

/// Cuts `[0, end]` at the stage starts and summarises `samples` (`(t, bytes)`, in time order)
/// in each piece. A stage's range includes the sample taken at the next stage's start, which is
/// its exit memory.
pub fn summarise(starts: &[StageStart], samples: &[(f64, u64)], end: f64) -> Vec<StageSummary> {
    let mut spans: Vec<(String, f64)> = Vec::new();
    if starts.first().is_none_or(|first| first.t > 0.0) {
        let name = if starts.is_empty() {
            WHOLE_RUN
        } else {
            BEFORE_FIRST
        };
        spans.push((name.to_string(), 0.0));
    }
    spans.extend(starts.iter().map(|s| (s.name.clone(), s.t)));
    let mut summaries = Vec::with_capacity(spans.len());
    for (index, (name, start)) in spans.iter().enumerate() {
        let stop = spans.get(index + 1).map_or(end, |next| next.1).max(*start);
        let inside: Vec<(f64, u64)> = samples
            .iter()
            .copied()
            .filter(|&(t, _)| t >= *start && t <= stop)
            .collect();
        // A stage shorter than the sampling interval has no sample of its own: use the last
        // sample before it.
        let before = samples.iter().rev().find(|&&(t, _)| t < *start).copied();
        let entry = inside.first().copied().or(before).unwrap_or((*start, 0));
        let exit = inside.last().copied().or(before).unwrap_or((stop, 0));
        let peak = inside
            .iter()
            .copied()
            .max_by_key(|&(_, bytes)| bytes)
            .or(before)
            .unwrap_or((*start, 0));
        summaries.push(StageSummary {
            name: name.clone(),
            start_s: *start,
            end_s: stop,
            duration_s: stop - start,
            entry_bytes: entry.1,
            exit_bytes: exit.1,
            peak_bytes: peak.1,
            peak_at_s: peak.0,
            gpu_peak_bytes: None,
            neuron_peak_bytes: None,
        });
    }
    summaries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(t: f64, name: &str) -> StageStart {
        StageStart {
            t,
            name: name.into(),
        }
    }

    #[test]
    fn finds_markers_and_regex_stages() {
        let plain = StageDetector::default();
        assert_eq!(
            plain.stage_in(b"##headroom stage load model\n"),
            Some("load model".into())
        );
        assert_eq!(
            plain.stage_in(b"  ##headroom stage compile\r\n"),
            Some("compile".into())
        );
        assert_eq!(plain.stage_in(b"##headroom stage   \n"), None);
        assert_eq!(plain.stage_in(b"Memory at model_loaded_cpu: 3 GB"), None);
        let regex = StageDetector::new(Some(Regex::new(r"Memory at (\w+):").unwrap()));
        assert_eq!(
            regex.stage_in(b"Memory at model_loaded_cpu: 3 GB"),
            Some("model_loaded_cpu".into())
        );
        let named = StageDetector::new(Some(Regex::new(r"step (?<n>\d+) (?<stage>\w+)").unwrap()));
        assert_eq!(named.stage_in(b"step 3 backward"), Some("backward".into()));
        let whole = StageDetector::new(Some(Regex::new(r"compiling").unwrap()));
        assert_eq!(whole.stage_in(b"now compiling"), Some("compiling".into()));
        assert_eq!(
            plain.stage_in(&[0xff, 0xfe, b'\n']),
            None,
            "binary lines are harmless"
        );
    }

    /// Every stage `scanner` finds in `chunks`, the end of the stream included.
    fn scan(detector: StageDetector, chunks: &[&[u8]]) -> Vec<String> {
        let mut scanner = StageScanner::new(detector);
        let mut found = Vec::new();
        for chunk in chunks {
            scanner.feed(chunk, &mut |name| found.push(name));
        }
        found.extend(scanner.finish());
        found
    }

    #[test]
    fn the_scanner_finds_markers_wherever_chunks_are_cut() {
        let stream = b"y\ny\n##headroom stage load\nlog\n  ##headroom stage train\r\nz\n##headroom stage eval";
        for cut in 0..stream.len() {
            for second in cut..stream.len() {
                let chunks = [&stream[..cut], &stream[cut..second], &stream[second..]];
                assert_eq!(
                    scan(StageDetector::default(), &chunks),
                    ["load", "train", "eval"],
                    "cut at {cut} and {second}"
                );
            }
        }
    }

    #[test]
    fn the_scanner_reads_every_line_for_a_regex_and_only_the_start_of_long_lines() {
        let regex = StageDetector::new(Some(Regex::new(r"^epoch (\d+)$").unwrap()));
        assert_eq!(
            scan(
                regex,
                &[b"epoch 1\nnot epoch 2\nepoch 3\n", b"epoch", b" 4\n"]
            ),
            ["1", "3", "4"]
        );
        let mut long = b"##headroom stage late\n".to_vec();
        long.splice(0..0, std::iter::repeat_n(b'x', MAX_LINE));
        assert!(scan(StageDetector::default(), &[&long]).is_empty());
        assert!(scan(
            StageDetector::default(),
            &[&long[..MAX_LINE / 2], &long[MAX_LINE / 2..]]
        )
        .is_empty());
        assert_eq!(
            scan(
                StageDetector::default(),
                &[b"a\n", &long, b"##headroom stage next\n"]
            ),
            ["next"]
        );
        let in_one_chunk = [b"a\n".as_slice(), &long, b"##headroom stage next\n"].concat();
        assert_eq!(scan(StageDetector::default(), &[&in_one_chunk]), ["next"]);
    }

    #[test]
    fn a_run_without_markers_is_one_stage() {
        let summary = summarise(&[], &[(0.0, 10), (1.0, 30), (2.0, 20)], 2.5);
        assert_eq!(summary.len(), 1);
        assert_eq!(summary[0].name, WHOLE_RUN);
        assert_eq!(
            (
                summary[0].entry_bytes,
                summary[0].peak_bytes,
                summary[0].exit_bytes
            ),
            (10, 30, 20)
        );
    }

    #[test]
    fn stages_split_at_markers_and_share_the_boundary_sample() {
        let samples = [
            (0.0, 5),
            (0.5, 8),
            (1.0, 100),
            (1.5, 300),
            (2.0, 50),
            (2.5, 60),
        ];
        let summary = summarise(&[start(1.0, "load"), start(2.0, "run")], &samples, 3.0);
        let names: Vec<&str> = summary.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, [BEFORE_FIRST, "load", "run"]);
        assert_eq!(summary[1].entry_bytes, 100);
        assert_eq!(summary[1].peak_bytes, 300);
        assert_eq!(summary[1].peak_at_s, 1.5);
        assert_eq!(summary[1].exit_bytes, 50);
        assert_eq!(summary[2].exit_bytes, 60);
        assert!((summary[2].duration_s - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_stage_between_samples_uses_the_sample_before() {
        let summary = summarise(
            &[start(0.0, "a"), start(1.2, "b")],
            &[(0.0, 7), (1.0, 9)],
            1.3,
        );
        assert_eq!(summary[1].entry_bytes, 9);
        assert_eq!(summary[1].peak_bytes, 9);
    }
}
