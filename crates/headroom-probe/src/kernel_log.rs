//! The kernel log, from whichever source this machine lets us read: the only place that names
//! a process the OOM killer took when no cgroup of ours was watching (`headroom_diagnose::kernel`
//! reads the kills in it). Reading it may be forbidden (`kernel.dmesg_restrict`, a container without
//! `/dev/kmsg`, a user outside the journal's groups); callers must then say so plainly, with
//! how to get access, rather than guess.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// Where the kernel log was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `/dev/kmsg`, the kernel's own buffer.
    Kmsg,
    /// `journalctl -k`, the journal's copy of this boot's kernel messages.
    Journal,
    /// `dmesg`, which reads the kernel's buffer through `syslog(2)` or `/dev/kmsg`.
    Dmesg,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::Kmsg => "/dev/kmsg",
            Source::Journal => "journalctl -k",
            Source::Dmesg => "dmesg",
        }
    }
}

/// One message of the kernel log.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Seconds since boot, as the kernel stamped the message (derived from the wall clock for
    /// the journal's copy). Absent where neither says.
    pub uptime_s: Option<f64>,
    /// Wall-clock time, in seconds since the Unix epoch: the journal's own stamp, or the boot
    /// time plus `uptime_s`. Like `dmesg -T`, the latter runs late by any time the machine
    /// spent suspended since boot.
    pub unix_s: Option<f64>,
    /// The message, without time stamp, host or priority.
    pub message: String,
}

/// The kernel log, oldest message first.
#[derive(Debug, Clone)]
pub struct KernelLog {
    pub source: Source,
    pub records: Vec<Record>,
}

/// The kernel log could not be read from any source.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the kernel log (/dev/kmsg: {kmsg}; journalctl -k: {journal}; dmesg: {dmesg}); {advice}")]
pub struct KernelLogError {
    kmsg: String,
    journal: String,
    dmesg: String,
    /// How to get access, from what failed.
    advice: String,
}

/// This boot's kernel log from the first source that can be read: `/dev/kmsg`, then
/// `journalctl -k`, then `dmesg`. Where none can, the error says why and how to get access.
pub fn read() -> Result<KernelLog, KernelLogError> {
    let boot = boot_time_unix();
    let found = |source, records| Ok(KernelLog { source, records });
    let kmsg = match read_kmsg(boot) {
        Ok(records) => return found(Source::Kmsg, records),
        Err(e) => e,
    };
    let journal = match read_journal(boot) {
        Ok(records) => return found(Source::Journal, records),
        Err(e) => e,
    };
    let dmesg = match read_dmesg(boot) {
        Ok(records) => return found(Source::Dmesg, records),
        Err(e) => e,
    };
    let restricted = std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict")
        .is_ok_and(|value| value.trim() == "1");
    Err(KernelLogError {
        advice: access_advice(&kmsg, &journal, restricted),
        kmsg: kmsg.to_string(),
        journal,
        dmesg,
    })
}

/// How to get at the kernel log, given why `/dev/kmsg` and the journal could not be read.
fn access_advice(kmsg: &std::io::Error, journal: &str, restricted: bool) -> String {
    let mut ways = Vec::new();
    if kmsg.kind() == std::io::ErrorKind::NotFound {
        ways.push(
            "this looks like a container without /dev/kmsg: run the command on the host, or \
start the container with `--device /dev/kmsg --cap-add SYSLOG`"
                .to_string(),
        );
    } else if restricted {
        ways.push(
            "kernel.dmesg_restrict=1 lets only root (CAP_SYSLOG) read it: run with sudo, or \
allow every user with `sudo sysctl kernel.dmesg_restrict=0`"
                .to_string(),
        );
    } else {
        ways.push(
            "run as root, or check `sysctl kernel.dmesg_restrict` (1 lets only root read it)"
                .to_string(),
        );
    }
    if !journal.contains("not found") && !journal.contains("No such file") {
        ways.push(
            "to read `journalctl -k` without root, join the systemd-journal (or adm) group: \
`sudo usermod -aG systemd-journal $USER`, then log in again"
                .to_string(),
        );
    }
    ways.join("; ")
}

/// The boot time in seconds since the Unix epoch (`btime` in `/proc/stat`).
fn boot_time_unix() -> Option<f64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn read_kmsg(boot: Option<f64>) -> Result<Vec<Record>, std::io::Error> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")?;
    let mut records = Vec::new();
    let mut buffer = vec![0u8; 8192];
    loop {
        // Each read returns one record; EAGAIN means the end of the buffer.
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => records.extend(parse_kmsg_record(&buffer[..n], boot)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A record overwritten while we read: skip it.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(records)
}

/// One `/dev/kmsg` record: `PRIORITY,SEQ,USEC,FLAGS[,…];MESSAGE`, then continuation lines
/// (`KEY=VALUE`, each starting with a space) that are not part of the message.
fn parse_kmsg_record(record: &[u8], boot: Option<f64>) -> Option<Record> {
    let first = record.split(|&b| b == b'\n').next()?;
    let text = String::from_utf8_lossy(first);
    let (header, message) = text.split_once(';')?;
    let uptime_s = header
        .split(',')
        .nth(2)?
        .parse::<u64>()
        .ok()
        .map(|usec| usec as f64 / 1e6);
    Some(Record {
        uptime_s,
        unix_s: boot.zip(uptime_s).map(|(boot, uptime)| boot + uptime),
        message: message.trim_end().to_string(),
    })
}

fn read_journal(boot: Option<f64>) -> Result<Vec<Record>, String> {
    // `-k` implies this boot. No `-q`: its warning that other users' messages are hidden says
    // what is wrong when nothing comes back.
    let output = std::process::Command::new("journalctl")
        .args(["-k", "--no-pager", "-o", "short-unix"])
        .output()
        .map_err(|e| e.to_string())?;
    let records = parse_journal(&String::from_utf8_lossy(&output.stdout), boot);
    if output.status.success() && !records.is_empty() {
        return Ok(records);
    }
    let stderr = String::from_utf8_lossy(&output.stderr)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    Err(if stderr.is_empty() {
        "no kernel messages".into()
    } else {
        stderr
    })
}

/// `journalctl -o short-unix` lines: `1700000000.123456 HOST kernel: MESSAGE`. Lines that
/// start with `--` are the journal's own notes.
fn parse_journal(text: &str, boot: Option<f64>) -> Vec<Record> {
    text.lines()
        .filter_map(|line| {
            let (stamp, rest) = line.split_once(' ')?;
            let unix_s: f64 = stamp.parse().ok()?;
            let message = rest.split_once("kernel: ").map_or(rest, |(_, m)| m);
            Some(Record {
                uptime_s: boot.map(|boot| unix_s - boot),
                unix_s: Some(unix_s),
                message: message.trim_end().to_string(),
            })
        })
        .collect()
}

fn read_dmesg(boot: Option<f64>) -> Result<Vec<Record>, String> {
    let output = std::process::Command::new("dmesg")
        .output()
        .map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if !output.status.success() {
        return Err(if stderr.is_empty() {
            format!("it exited with {}", output.status)
        } else {
            stderr
        });
    }
    Ok(parse_dmesg(&String::from_utf8_lossy(&output.stdout), boot))
}

/// `dmesg` lines: `[  758.232082] MESSAGE`, or a message without a stamp.
fn parse_dmesg(text: &str, boot: Option<f64>) -> Vec<Record> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let stamped = line
                .trim_start()
                .strip_prefix('[')
                .and_then(|rest| rest.split_once(']'))
                .and_then(|(stamp, message)| Some((stamp.trim().parse::<f64>().ok()?, message)));
            match stamped {
                Some((uptime, message)) => Record {
                    uptime_s: Some(uptime),
                    unix_s: boot.map(|boot| boot + uptime),
                    message: message.trim().to_string(),
                },
                None => Record {
                    uptime_s: None,
                    unix_s: None,
                    message: line.trim().to_string(),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kmsg_records() {
        let record = b"6,1234,758232082,-;Memory cgroup out of memory: Killed process 5779 (dd) total-vm:265120kB, anon-rss:65280kB, file-rss:1564kB, shmem-rss:0kB, UID:0 pgtables:184kB oom_score_adj:0\n SUBSYSTEM=memory\n";
        let parsed = parse_kmsg_record(record, Some(1_700_000_000.0)).unwrap();
        assert!((parsed.uptime_s.unwrap() - 758.232082).abs() < 1e-6);
        assert!((parsed.unix_s.unwrap() - 1_700_000_758.232082).abs() < 1e-3);
        assert!(
            parsed.message.ends_with("oom_score_adj:0"),
            "continuation lines are not the message: {}",
            parsed.message
        );
        assert_eq!(parse_kmsg_record(b"garbage", None), None);
        assert_eq!(parse_kmsg_record(&[0xff, b';', 0xfe], None), None);
        let odd = parse_kmsg_record(br"6,1,soon,-;x\xff", None).unwrap();
        assert_eq!((odd.uptime_s, odd.message.as_str()), (None, r"x\xff"));
    }

    #[test]
    fn parses_dmesg_and_journal_lines() {
        let text = "[  758.232082] Out of memory: Killed process 42 (cc1plus) total-vm:1kB\nno stamp here\n";
        let records = parse_dmesg(text, Some(1000.0));
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].uptime_s, Some(758.232082));
        assert_eq!(records[0].unix_s, Some(1758.232082));
        assert!(records[0].message.starts_with("Out of memory"));
        assert_eq!(records[1].uptime_s, None);
        let journal = "-- Journal begins at Mon 2024-01-01 --\n1700000100.500000 ws1 kernel: Memory cgroup out of memory: Killed process 7 (python3) total-vm:2kB\n";
        let records = parse_journal(journal, Some(1_700_000_000.0));
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].unix_s, Some(1_700_000_100.5));
        assert_eq!(records[0].uptime_s, Some(100.5));
        assert!(records[0].message.starts_with("Memory cgroup"));
    }

    #[test]
    fn advice_names_the_way_in() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(access_advice(&missing, "no kernel messages", false).contains("container"));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let advice = access_advice(
            &denied,
            "No journal files were opened due to insufficient permissions.",
            true,
        );
        assert!(advice.contains("dmesg_restrict=1"), "{advice}");
        assert!(advice.contains("systemd-journal"), "{advice}");
    }

    #[test]
    fn reads_this_machine_or_says_why_not() {
        match read() {
            Ok(log) => eprintln!(
                "{} messages from {}",
                log.records.len(),
                log.source.describe()
            ),
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains("cannot read the kernel log"), "{message}");
                headroom_testkit::skip("kernel-log", message);
            }
        }
    }
}
