//! Per-process memory details the process table does not carry: the proportional set size
//! (PSS, shared pages split between their users) from `smaps_rollup`, and the kernel's own
//! peak resident set (`VmHWM`) from `status`. Both cost a file read per process, so callers read
//! them less often than RSS.
//!
//! PSS costs far more than RSS: the kernel walks every page table of the process to split its
//! shared pages. For a tree of 20 forked processes sharing 380 MiB, one read of every
//! process's `smaps_rollup` took 148 ms (276 ms with torch imported) against 0.26 ms for their
//! `/proc/PID/stat`, on a loaded 2-core machine (`bench/run/pss-cost.py`).
//! [`counted_with_shared_pages`] therefore keeps each process's last reading for
//! [`PSS_FRESH`] and carries it forward with the change of RSS since: a governor sampling ten
//! times a second pays about 3 ms a sample for that tree (6 ms with torch), on average.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ProbeError;

/// How long one PSS reading of a process stands for it.
pub const PSS_FRESH: Duration = Duration::from_secs(5);

/// A process's last PSS reading and its RSS then.
struct PssReading {
    start_ticks: u64,
    at: Instant,
    rss: u64,
    pss: u64,
}

/// The last PSS reading of every process that [`counted_with_shared_pages`] was asked about,
/// by pid. One table for the whole process: every caller samples the same processes, and one
/// reading serves them all.
static READINGS: Mutex<Option<HashMap<i32, PssReading>>> = Mutex::new(None);

/// What process `pid` (started at `start_ticks` after boot, resident `rss` bytes now) counts
/// for when it shares pages with other processes: its PSS, read afresh when the last reading is
/// older than [`PSS_FRESH`], else the last reading plus what its RSS grew (or less what it
/// shrank) since: pages a forked worker touches after the fork are its own. Never more than
/// `rss`; `rss` where PSS cannot be read (a kernel before 4.14, a process gone).
pub fn counted_with_shared_pages(pid: i32, start_ticks: u64, rss: u64) -> u64 {
    let mut guard = READINGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let readings = guard.get_or_insert_with(HashMap::new);
    let now = Instant::now();
    if let Some(last) = readings
        .get(&pid)
        .filter(|last| last.start_ticks == start_ticks && now - last.at < PSS_FRESH)
    {
        return (last.pss + rss).saturating_sub(last.rss).min(rss);
    }
    let Ok(read) = pss(pid) else {
        return rss;
    };
    // Forget processes not asked about for a while: they have most likely exited.
    readings.retain(|_, reading| now - reading.at < 4 * PSS_FRESH);
    readings.insert(
        pid,
        PssReading {
            start_ticks,
            at: now,
            rss,
            pss: read,
        },
    );
    read.min(rss)
}

/// The proportional set size of `pid` in bytes (Linux 4.14+).
pub fn pss(pid: i32) -> Result<u64, ProbeError> {
    kib_field(PathBuf::from(format!("/proc/{pid}/smaps_rollup")), "Pss:")
}

/// The peak resident set of `pid` so far, as the kernel recorded it, in bytes.
pub fn peak_rss(pid: i32) -> Result<u64, ProbeError> {
    kib_field(PathBuf::from(format!("/proc/{pid}/status")), "VmHWM:")
}

fn kib_field(path: PathBuf, key: &str) -> Result<u64, ProbeError> {
    let text = std::fs::read_to_string(&path).map_err(|source| ProbeError::io(&path, source))?;
    text.lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .ok_or_else(|| ProbeError::Malformed {
            path,
            value: format!("no `{key}` line"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id() as i32;
        let peak = peak_rss(me).unwrap();
        assert!(peak > 0);
        match pss(me) {
            Ok(pss) => assert!(pss > 0 && pss <= peak * 2),
            Err(e) => {
                headroom_testkit::skip("smaps-rollup", format!("PSS: {e} (it needs Linux 4.14)"))
            }
        }
    }

    #[test]
    fn a_fresh_reading_is_carried_forward_with_the_growth_of_rss() {
        let me = std::process::id() as i32;
        let Ok(first) = pss(me) else {
            headroom_testkit::skip("smaps-rollup", "no smaps_rollup (it needs Linux 4.14)");
            return;
        };
        let rss = peak_rss(me).unwrap();
        // A start time no process of this test has: this reading is the test's own.
        let read = counted_with_shared_pages(me, u64::MAX, rss);
        assert!(
            read <= rss && read.abs_diff(first) < 16 << 20,
            "{read} vs {first}"
        );
        assert_eq!(
            counted_with_shared_pages(me, u64::MAX, rss + (100 << 20)),
            read + (100 << 20),
            "pages touched since the reading are the process's own"
        );
        assert_eq!(counted_with_shared_pages(i32::MAX, 0, 5 << 20), 5 << 20);
    }

    #[test]
    fn missing_process_is_an_error() {
        assert!(peak_rss(i32::MAX).is_err());
    }
}
