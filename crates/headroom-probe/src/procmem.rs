//! Per-process memory details the process table does not carry: the proportional set size
//! (PSS, shared pages split between their users) from `smaps_rollup`, and the kernel's own
//! peak resident set (`VmHWM`) from `status`. Both cost a file read per process, so callers read
//! them less often than RSS.

use std::path::PathBuf;

use crate::ProbeError;

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
            Err(e) => eprintln!("skipping PSS: {e} (smaps_rollup needs Linux 4.14)"),
        }
    }

    #[test]
    fn missing_process_is_an_error() {
        assert!(peak_rss(i32::MAX).is_err());
    }
}
