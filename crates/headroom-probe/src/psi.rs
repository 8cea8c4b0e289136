//! Memory pressure stall information (PSI): the share of time tasks waited for memory. A run
//! that "fits" but spends 30% of its time stalled on reclaim is one step from an OOM kill, and
//! PSI is the only reading that says so.

use std::path::Path;

use crate::ProbeError;

/// One line of a PSI file: the share of wall time (in percent) that tasks were stalled.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Stall {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time in microseconds since boot (or since the cgroup was created).
    pub total_us: u64,
}

/// `some`: at least one task stalled; `full`: all non-idle tasks stalled at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Pressure {
    pub some: Stall,
    pub full: Stall,
}

/// The system-wide memory pressure, from `/proc/pressure/memory`. Fails on kernels without PSI
/// (before 4.20, or booted without `psi=1` where it is off by default).
pub fn system_memory_pressure() -> Result<Pressure, ProbeError> {
    read_pressure(Path::new("/proc/pressure/memory"))
}

/// Memory pressure from a PSI file such as `/proc/pressure/memory` or a v2 cgroup's
/// `memory.pressure`.
pub fn read_pressure(path: &Path) -> Result<Pressure, ProbeError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProbeError::io(path, source))?;
    parse(&text).ok_or_else(|| ProbeError::Malformed {
        path: path.to_path_buf(),
        value: text.trim().to_string(),
    })
}

fn parse(text: &str) -> Option<Pressure> {
    let mut pressure = Pressure::default();
    let mut seen_some = false;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let target = match fields.next()? {
            "some" => {
                seen_some = true;
                &mut pressure.some
            }
            "full" => &mut pressure.full,
            _ => continue,
        };
        for field in fields {
            let (key, value) = field.split_once('=')?;
            match key {
                "avg10" => target.avg10 = value.parse().ok()?,
                "avg60" => target.avg60 = value.parse().ok()?,
                "avg300" => target.avg300 = value.parse().ok()?,
                "total" => target.total_us = value.parse().ok()?,
                _ => {}
            }
        }
    }
    seen_some.then_some(pressure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_some_and_full() {
        let text = "some avg10=1.50 avg60=0.25 avg300=0.08 total=1188467\nfull avg10=0.75 avg60=0.00 avg300=0.08 total=1176285\n";
        let pressure = parse(text).unwrap();
        assert_eq!(pressure.some.avg10, 1.5);
        assert_eq!(pressure.full.total_us, 1_176_285);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse("nonsense"), None);
        assert_eq!(parse("some avg10=x"), None);
    }

    /// The `total=` of the `kind` line of a PSI file's text, found without the reader.
    fn raw_total(text: &str, kind: &str) -> u64 {
        let line = text
            .lines()
            .find(|line| line.starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind} line in {text:?}"));
        let (_, total) = line.rsplit_once("total=").expect("a total field");
        total.trim().parse().expect("a total in microseconds")
    }

    #[test]
    fn reads_this_machine_or_explains() {
        let path = Path::new("/proc/pressure/memory");
        let Ok(before) = std::fs::read_to_string(path) else {
            headroom_testkit::skip(
                "psi",
                format!("no PSI on this kernel ({} is missing)", path.display()),
            );
            return;
        };
        let pressure = system_memory_pressure().expect("the file was just read");
        let after = std::fs::read_to_string(path).unwrap();
        // Totals only grow: the reader's lie between two raw reads of the same file, each in
        // its own line, so a reader of another file, of swapped lines or of nothing fails.
        for (kind, read) in [("some", pressure.some), ("full", pressure.full)] {
            let range = raw_total(&before, kind)..=raw_total(&after, kind);
            assert!(
                range.contains(&read.total_us),
                "{kind}: {read:?} outside {range:?}"
            );
            for avg in [read.avg10, read.avg60, read.avg300] {
                assert!((0.0..=100.0).contains(&avg), "{kind}: {read:?}");
            }
        }
        assert!(
            pressure.full.total_us <= pressure.some.total_us,
            "{pressure:?}"
        );
    }
}
