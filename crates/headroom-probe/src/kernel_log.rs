//! OOM-kill records from the kernel log, the only place that names a process the OOM killer
//! took when no cgroup of ours was watching. Reading it may be forbidden
//! (`kernel.dmesg_restrict`, containers); callers must then say so plainly rather than guess.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// One `Killed process` record.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomKill {
    pub pid: i32,
    pub comm: String,
    /// Seconds since boot, as the kernel stamped the record.
    pub uptime_s: f64,
    /// The record as logged.
    pub line: String,
}

/// The kernel log could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the kernel log (/dev/kmsg: {kmsg}; journalctl -k: {journal}); run as root or set `sysctl kernel.dmesg_restrict=0` to let headroom see OOM kills")]
pub struct KernelLogError {
    kmsg: String,
    journal: String,
}

/// Every OOM kill still in the kernel log: `/dev/kmsg` first, `journalctl -k` second.
pub fn oom_kills() -> Result<Vec<OomKill>, KernelLogError> {
    match read_kmsg() {
        Ok(text) => Ok(parse_kmsg(&text)),
        Err(kmsg) => match read_journal() {
            Ok(text) => Ok(parse_plain(&text)),
            Err(journal) => Err(KernelLogError { kmsg, journal }),
        },
    }
}

fn read_kmsg() -> Result<String, String> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    let mut record = vec![0u8; 8192];
    loop {
        // Each read returns one record; EAGAIN means the end of the buffer.
        match file.read(&mut record) {
            Ok(0) => break,
            Ok(n) => {
                text.push_str(&String::from_utf8_lossy(&record[..n]));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // A record overwritten while we read: skip it.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(text)
}

fn read_journal() -> Result<String, String> {
    let output = std::process::Command::new("journalctl")
        .args([
            "-k",
            "-q",
            "--no-pager",
            "-o",
            "short-monotonic",
            "--since",
            "-7d",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() || output.stdout.is_empty() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        return Err(if stderr.is_empty() {
            "no kernel messages".into()
        } else {
            stderr
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `/dev/kmsg` records: `PRIORITY,SEQ,USEC,FLAGS;MESSAGE`.
fn parse_kmsg(text: &str) -> Vec<OomKill> {
    text.lines()
        .filter_map(|record| {
            let (header, message) = record.split_once(';')?;
            let usec: f64 = header.split(',').nth(2)?.parse().ok()?;
            parse_message(message, usec / 1e6)
        })
        .collect()
}

/// `dmesg` / `journalctl -o short-monotonic` lines: `[  758.232082] MESSAGE` (journalctl puts
/// the host and `kernel:` after the stamp).
fn parse_plain(text: &str) -> Vec<OomKill> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('[')?;
            let (stamp, message) = rest.split_once(']')?;
            parse_message(message, stamp.trim().parse().ok()?)
        })
        .collect()
}

/// `Out of memory: Killed process 5779 (dd) …` or `Memory cgroup out of memory: Killed process …`.
fn parse_message(message: &str, uptime_s: f64) -> Option<OomKill> {
    let after = message.split_once("Killed process ")?.1;
    let (pid, rest) = after.split_once(' ')?;
    let comm = rest.strip_prefix('(')?.split_once(')')?.0;
    Some(OomKill {
        pid: pid.parse().ok()?,
        comm: comm.to_string(),
        uptime_s,
        line: message.trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kmsg_records() {
        let text = "6,1234,758232082,-;Memory cgroup out of memory: Killed process 5779 (dd) total-vm:265120kB, anon-rss:65280kB, file-rss:1564kB, shmem-rss:0kB, UID:0 pgtables:184kB oom_score_adj:0\n6,1235,758232090,-;unrelated\n";
        let kills = parse_kmsg(text);
        assert_eq!(kills.len(), 1);
        assert_eq!(kills[0].pid, 5779);
        assert_eq!(kills[0].comm, "dd");
        assert!((kills[0].uptime_s - 758.232082).abs() < 1e-6);
    }

    #[test]
    fn parses_dmesg_and_journal_lines() {
        let text = "[  758.232082] Out of memory: Killed process 42 (cc1plus) total-vm:1kB\n[12.5] host kernel: Memory cgroup out of memory: Killed process 7 (python3) total-vm:2kB\n";
        let kills = parse_plain(text);
        assert_eq!(kills.iter().map(|k| k.pid).collect::<Vec<_>>(), vec![42, 7]);
    }

    #[test]
    fn reads_this_machine_or_says_why_not() {
        match oom_kills() {
            Ok(kills) => eprintln!("{} OOM kills in the kernel log", kills.len()),
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains("dmesg_restrict"), "{message}");
                eprintln!("skipping: {message}");
            }
        }
    }
}
