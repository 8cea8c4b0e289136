//! `headroom diagnose`: why a build or job failed, from what people already have after the
//! fact — a build or CI log of any size, a pasted `dmesg`, a `headroom run --json` report, or
//! this machine's kernel log — with the root cause first, the numbers, and what to do.
//!
//! The reading, merging and rendering is `headroom_diagnose::report`; the kernel log's
//! sources are `headroom_probe::kernel_log`. This module opens the inputs, prints the report
//! and lists the kernel log's OOM kills.

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use headroom_diagnose::report::{
    self, describe_victim, plural, printable, wrap, EXIT_MEMORY, EXIT_NOTHING,
};
use headroom_diagnose::{Constraint, Victim};
use headroom_probe::kernel_log;
use serde::Serialize;

use headroom_doctor::ago;

const EXIT_POLICY: &str = "Exit status:
  0  a memory failure was found (--kernel-log: OOM kills were found)
  1  failures were found, none of them memory
  3  nothing recognised (--kernel-log: no OOM kill in the log)
  2  headroom's own error: a FILE that cannot be read, a kernel log that no source lets it read

FILE may be any log (build output, CI logs, a pasted `dmesg` or `journalctl -k`), of any size, \
or a JSON report written by `headroom run --json`, whose rungs' diagnoses are listed.";

/// How many of the kernel log's OOM kills the human report shows, newest; `--json` has all.
const SHOWN_KILLS: usize = 10;

/// Arguments of `headroom diagnose`.
#[derive(clap::Args)]
#[command(after_help = EXIT_POLICY)]
pub struct DiagnoseArgs {
    /// Logs to read, or `headroom run --json` reports; none, or `-`, reads stdin.
    #[arg(value_name = "FILE", conflicts_with = "kernel_log")]
    files: Vec<PathBuf>,
    /// List the OOM kills in this machine's kernel log (/dev/kmsg, else `journalctl -k`, else
    /// `dmesg`): when, which process and its memory, and whose limit the kernel enforced.
    #[arg(long)]
    kernel_log: bool,
    /// Print JSON on stdout instead of the human report.
    #[arg(long)]
    json: bool,
}

pub fn main(args: DiagnoseArgs) -> Result<u8> {
    if args.kernel_log {
        return kernel_log_main(args.json);
    }
    let report = report::diagnose(open_inputs(&args.files)?)?;
    headroom_output::print_json_or(args.json, &report, || report::render(&report))?;
    Ok(report.exit_code())
}

/// An input, named as the report names it, opened.
type Input = (String, Box<dyn Read>);

/// Opens every input before reading any, so a mistyped name fails at once.
fn open_inputs(paths: &[PathBuf]) -> Result<Vec<Input>> {
    let stdin = || -> Input {
        if io::stdin().is_terminal() {
            headroom_output::say!(
                "headroom diagnose: reading a log from the terminal; end it with Ctrl-D, or name a \
FILE, or use --kernel-log"
            );
        }
        ("<stdin>".to_string(), Box::new(io::stdin().lock()))
    };
    if paths.is_empty() {
        return Ok(vec![stdin()]);
    }
    paths
        .iter()
        .map(|path| {
            if path.as_os_str() == "-" {
                return Ok(stdin());
            }
            let name = path.display().to_string();
            let file = std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?;
            Ok((name, Box::new(file) as Box<dyn Read>))
        })
        .collect()
}

/// What `--kernel-log` found, as `--json` prints it.
#[derive(Debug, Serialize)]
struct KernelReport {
    /// Where the log was read from: `/dev/kmsg`, `journalctl -k` or `dmesg`.
    source: &'static str,
    /// Messages in the log.
    messages: usize,
    /// Wall-clock time of the oldest message, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    /// Oldest first.
    kills: Vec<KernelKill>,
}

/// One OOM kill from this machine's kernel log.
#[derive(Debug, Serialize)]
struct KernelKill {
    /// Wall-clock time (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unix_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uptime_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<Victim>,
    /// The process whose allocation set the OOM killer off.
    #[serde(skip_serializing_if = "Option::is_none")]
    invoked_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    constraint: Option<Constraint>,
    constraint_description: &'static str,
    evidence: String,
}

fn kernel_log_main(json: bool) -> Result<u8> {
    let log = kernel_log::read()?;
    let report = kernel_report(&log);
    headroom_output::print_json_or(json, &report, || render_kernel(&report, now_unix()))?;
    Ok(if report.kills.is_empty() {
        EXIT_NOTHING
    } else {
        EXIT_MEMORY
    })
}

/// The OOM kills in `log`, each with the wall-clock time of the message that names the process.
fn kernel_report(log: &kernel_log::KernelLog) -> KernelReport {
    let kills = headroom_diagnose::kills_in_log(log)
        .into_iter()
        .map(|logged| {
            let kill = logged.kill;
            KernelKill {
                time: logged.unix_s.map(rfc3339),
                unix_s: logged.unix_s,
                uptime_s: logged.uptime_s,
                process: kill.victim,
                invoked_by: kill.invoked_by,
                constraint: kill.constraint,
                constraint_description: kill.constraint.map_or(
                    "not stated (the log has no `oom-kill:constraint=` line for it)",
                    Constraint::describe,
                ),
                evidence: kill.evidence,
            }
        })
        .collect();
    KernelReport {
        source: log.source.describe(),
        messages: log.records.len(),
        since: log.records.iter().find_map(|r| r.unix_s).map(rfc3339),
        kills,
    }
}

fn render_kernel(report: &KernelReport, now: f64) -> String {
    let mut out = String::new();
    let since = report
        .since
        .as_ref()
        .map_or(String::new(), |since| format!(" since {since}"));
    if report.kills.is_empty() {
        let _ = writeln!(
            out,
            "No OOM kill in the kernel log ({}, {} messages{since}).",
            report.source, report.messages
        );
        return out;
    }
    let _ = writeln!(
        out,
        "{} OOM kill{} in the kernel log ({}, {} messages{since}), oldest first:",
        report.kills.len(),
        plural(report.kills.len()),
        report.source,
        report.messages
    );
    let hidden = report.kills.len().saturating_sub(SHOWN_KILLS);
    if hidden > 0 {
        let _ = writeln!(
            out,
            "(the {hidden} oldest are left out here; --json lists them all)"
        );
    }
    for kill in &report.kills[hidden..] {
        let when = match (&kill.time, kill.unix_s) {
            (Some(time), Some(unix)) => format!("{time} ({})", ago(now - unix)),
            _ => "at an unknown time".to_string(),
        };
        let process = kill
            .process
            .as_ref()
            .map_or("an unnamed process".to_string(), describe_victim);
        let _ = writeln!(out, "\n{when}: {process}");
        out.push_str(&wrap("limit", kill.constraint_description));
        if let Some(invoker) = &kill.invoked_by {
            out.push_str(&wrap(
                "trigger",
                &format!("{} asked for memory", printable(invoker)),
            ));
        }
        let _ = writeln!(out, "   {:<9} {}", "evidence", printable(&kill.evidence));
    }
    out
}

/// `2026-11-22T19:28:05Z`.
fn rfc3339(unix_s: f64) -> String {
    // `as` saturates, and takes NaN to 0.
    headroom_report::utc_time((unix_s * 1000.0) as i64)
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_kills_get_wall_clock_times_and_their_limit() {
        let record = |uptime: f64, message: &str| kernel_log::Record {
            uptime_s: Some(uptime),
            unix_s: Some(1_700_000_000.0 + uptime),
            message: message.to_string(),
        };
        let log = kernel_log::KernelLog {
            source: kernel_log::Source::Kmsg,
            records: vec![
                record(1.0, "Linux version 6.1"),
                record(50.0, "cc1plus invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0"),
                record(50.1, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/build,task_memcg=/build,task=cc1plus,pid=26958,uid=0"),
                record(50.2, "Memory cgroup out of memory: Killed process 26958 (cc1plus) total-vm:3970108kB, anon-rss:3090636kB, file-rss:4kB, shmem-rss:0kB, UID:0"),
                record(60.0, "Out of memory: Killed process 7 (ld) total-vm:1kB, anon-rss:1024kB, file-rss:0kB, shmem-rss:0kB, UID:0"),
            ],
        };
        let report = kernel_report(&log);
        assert_eq!(report.kills.len(), 2);
        assert_eq!(
            report.kills[0].time.as_deref(),
            Some("2023-11-14T22:14:10Z")
        );
        assert_eq!(report.kills[0].constraint, Some(Constraint::Cgroup));
        let text = render_kernel(&report, 1_700_000_000.0 + 3660.0);
        assert!(
            text.contains("2023-11-14T22:14:10Z (60 min ago): cc1plus, pid 26958, 2.95 GiB resident when killed"),
            "{text}"
        );
        assert!(text.contains("your container's or your build's"), "{text}");
        assert!(text.contains("ld, pid 7, 1.00 MiB resident"), "{text}");
        assert!(text.contains("not stated"), "{text}");
    }
}
