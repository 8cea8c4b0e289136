//! The kernel's own record of an OOM kill, read from its log lines in whatever form they were
//! pasted: `dmesg` (`[ 123.456]`), `dmesg -T`, syslog and `journalctl -k` prefixes, or
//! `/dev/kmsg` records turned into lines. One kill spans several lines (`invoked
//! oom-killer`, `oom-kill:constraint=…`, `Out of memory: Killed process …`); [`OomKills`]
//! joins them into one [`OomKill`].

use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

/// Which limit the kill enforced, from `oom-kill:constraint=` (or the `Memory cgroup` wording).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// `CONSTRAINT_MEMCG`: a cgroup's memory limit (a container's, a systemd unit's, a
    /// build's), not the machine's.
    Cgroup,
    /// `CONSTRAINT_NONE`: the whole machine ran out.
    Machine,
    /// `CONSTRAINT_CPUSET` or `CONSTRAINT_MEMORY_POLICY`: the memory of some NUMA nodes.
    Nodes,
}

impl Constraint {
    pub fn describe(self) -> &'static str {
        match self {
            Constraint::Cgroup => {
                "a cgroup's limit (your container's or your build's), not the machine's"
            }
            Constraint::Machine => "the whole machine ran out of memory",
            Constraint::Nodes => "the memory of the NUMA nodes the process may use",
        }
    }
}

/// The process the kernel killed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Victim {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Resident memory when killed (`anon-rss` + `file-rss` + `shmem-rss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
}

/// One OOM kill, from the lines the kernel logged for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomKill {
    /// The line's time stamp as printed (`[ 1638.977956]`, `Apr 29 23:52:21`…), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The process whose allocation set the OOM killer off (not always the one killed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invoked_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub victim: Option<Victim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
    /// The most telling line: the `Killed process` one when there is one.
    pub evidence: String,
    /// 1-based line number of the first line of this kill.
    pub line: u64,
    /// 1-based line number of `evidence`.
    pub evidence_line: u64,
}

static TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^\s*(?:",
        r"\[\s*\d+\.\d+\]",                               // dmesg
        r"|\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\]", // dmesg -T
        r"|\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?",       // syslog, journalctl
        r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?", // ISO
        r")"
    ))
    .expect("valid time pattern")
});
static INVOKED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(\S+) invoked oom-killer:").expect("valid"));
static CONSTRAINT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"oom-kill:constraint=CONSTRAINT_(\w+)(?:.*?,task=([^,]+),pid=(\d+))?")
        .expect("valid")
});
static REAPED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"oom_reaper: reaped process (\d+) \(([^)]*)\)").expect("valid"));
static KILLED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(Memory cgroup out of memory: )?Kill(?:ed)? process (\d+)(?:, UID \d+,)? \(([^)]*)\)",
        r"(?:.*?anon-rss:(\d+)kB)?(?:.*?file-rss:(\d+)kB)?(?:.*?shmem-rss:(\d+)kB)?"
    ))
    .expect("valid")
});

/// Collects OOM kills from log lines fed in order.
#[derive(Debug, Default)]
pub struct OomKills {
    kills: Vec<OomKill>,
    /// Whether the last kill still waits for its `Killed process` line.
    open: bool,
}

impl OomKills {
    /// Reads one line (without its newline); `line` is its 1-based number. Returns whether it
    /// was part of an OOM kill.
    pub fn feed(&mut self, text: &str, line: u64) -> bool {
        if let Some(found) = INVOKED.captures(text) {
            // A new kill begins, whatever the last one still waited for.
            self.open = false;
            self.current(text, line).invoked_by = Some(found[1].to_string());
            return true;
        }
        if let Some(found) = CONSTRAINT.captures(text) {
            let kill = self.current(text, line);
            kill.constraint = Some(match &found[1] {
                "MEMCG" => Constraint::Cgroup,
                "NONE" => Constraint::Machine,
                _ => Constraint::Nodes,
            });
            if let (Some(task), Some(pid)) = (found.get(2), found.get(3)) {
                kill.victim.get_or_insert_with(|| Victim {
                    name: task.as_str().to_string(),
                    pid: pid.as_str().parse().ok(),
                    rss_bytes: None,
                });
            }
            return true;
        }
        if let Some(found) = KILLED.captures(text) {
            let kib = |group: usize| {
                found
                    .get(group)
                    .and_then(|m| m.as_str().parse::<u64>().ok())
            };
            let rss = [kib(4), kib(5), kib(6)]
                .into_iter()
                .flatten()
                .reduce(|a, b| a + b)
                .map(|total| total << 10);
            let kill = self.current(text, line);
            kill.victim = Some(Victim {
                name: found[3].to_string(),
                pid: found[2].parse().ok(),
                rss_bytes: rss,
            });
            if found.get(1).is_some() {
                kill.constraint.get_or_insert(Constraint::Cgroup);
            }
            // Older kernels first name the process they chose (`Kill process N (x) score S
            // or sacrifice child`), then the one they killed: the kill goes on.
            if !text.contains("or sacrifice child") {
                kill.evidence = text.trim().to_string();
                kill.evidence_line = line;
                self.open = false;
            }
            return true;
        }
        if let Some(found) = REAPED.captures(text) {
            // The reaper frees a killed process's memory: part of the kill before it, or the
            // only line left of one.
            let pid = found[1].parse().ok();
            let known = self
                .kills
                .last()
                .and_then(|kill| kill.victim.as_ref())
                .is_some_and(|victim| victim.pid == pid);
            if !known {
                let kill = self.current(text, line);
                kill.victim = Some(Victim {
                    name: found[2].to_string(),
                    pid,
                    rss_bytes: None,
                });
                self.open = false;
            }
            return true;
        }
        false
    }

    /// The kill that `text` belongs to: the open one, or a new one.
    fn current(&mut self, text: &str, line: u64) -> &mut OomKill {
        if !self.open {
            self.kills.push(OomKill {
                time: time_of(text),
                invoked_by: None,
                victim: None,
                constraint: None,
                evidence: text.trim().to_string(),
                line,
                evidence_line: line,
            });
            self.open = true;
        }
        self.kills.last_mut().expect("just pushed")
    }

    /// The kill read last, which later lines may still complete.
    pub fn last(&self) -> Option<&OomKill> {
        self.kills.last()
    }

    /// Takes out the kills that later lines can no longer change: all but the last, which a
    /// line still to come may complete. A reader of a long log takes them as it goes, so that
    /// what it keeps does not grow with the log.
    pub fn take_settled(&mut self) -> std::vec::Drain<'_, OomKill> {
        let settled = self.kills.len().saturating_sub(1);
        self.kills.drain(..settled)
    }

    pub fn finish(self) -> Vec<OomKill> {
        self.kills
    }
}

/// An OOM kill read from this machine's kernel log, with the time stamps of the message that
/// names the process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoggedKill {
    #[serde(flatten)]
    pub kill: OomKill,
    /// Seconds since boot, as the kernel stamped it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uptime_s: Option<f64>,
    /// Seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix_s: Option<f64>,
}

/// Every OOM kill in `log`, oldest first.
pub fn kills_in_log(log: &headroom_probe::kernel_log::KernelLog) -> Vec<LoggedKill> {
    let mut kills = OomKills::default();
    for (index, record) in log.records.iter().enumerate() {
        kills.feed(&record.message, index as u64 + 1);
    }
    kills
        .finish()
        .into_iter()
        .map(|kill| {
            let record = usize::try_from(kill.evidence_line)
                .ok()
                .and_then(|line| log.records.get(line.checked_sub(1)?));
            LoggedKill {
                uptime_s: record.and_then(|record| record.uptime_s),
                unix_s: record.and_then(|record| record.unix_s),
                kill,
            }
        })
        .collect()
}

fn time_of(text: &str) -> Option<String> {
    TIME.find(text).map(|m| m.as_str().trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kills(lines: &str) -> Vec<OomKill> {
        let mut kills = OomKills::default();
        for (n, line) in lines.lines().enumerate() {
            kills.feed(line, n as u64 + 1);
        }
        kills.finish()
    }

    #[test]
    fn one_kill_from_its_three_lines() {
        let found = kills(
            "[13236.1] cc1plus invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0\n\
             [13236.2] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/build,task_memcg=/build,task=cc1plus,pid=26958,uid=0\n\
             [13236.245467] Memory cgroup out of memory: Killed process 26958 (cc1plus) total-vm:3970108kB, anon-rss:3090636kB, file-rss:4kB, shmem-rss:0kB, UID:0",
        );
        assert_eq!(found.len(), 1);
        let kill = &found[0];
        assert_eq!(kill.time.as_deref(), Some("[13236.1]"));
        assert_eq!(kill.invoked_by.as_deref(), Some("cc1plus"));
        assert_eq!(kill.constraint, Some(Constraint::Cgroup));
        let victim = kill.victim.as_ref().unwrap();
        assert_eq!((victim.name.as_str(), victim.pid), ("cc1plus", Some(26958)));
        assert_eq!(victim.rss_bytes, Some((3_090_636 + 4) << 10));
        assert!(kill.evidence.contains("Killed process 26958"));
    }

    #[test]
    fn every_timestamp_form() {
        for (line, time) in [
            ("[ 1638.977956] Out of memory: Killed process 9253 (cc1plus)", "[ 1638.977956]"),
            ("[Thu Dec  7 10:01:02 2023] Out of memory: Killed process 1 (x)", "[Thu Dec  7 10:01:02 2023]"),
            ("Apr 29 23:52:21 ws1 kernel: Out of memory: Kill process 7 (cc1) score 9 or sacrifice child", "Apr 29 23:52:21"),
            ("2024-01-02T03:04:05+0000 host kernel: Out of memory: Killed process 5 (ld)", "2024-01-02T03:04:05+0000"),
        ] {
            let found = kills(line);
            assert_eq!(found[0].time.as_deref(), Some(time), "{line}");
        }
    }

    #[test]
    fn separate_kills_stay_separate() {
        let found = kills(
            "Out of memory: Killed process 1 (cc1plus) total-vm:1kB, anon-rss:1024kB\n\
             Out of memory: Killed process 2 (cicc) total-vm:1kB, anon-rss:2048kB",
        );
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].victim.as_ref().unwrap().rss_bytes, Some(2 << 20));
        assert_eq!(found[1].constraint, None);
    }

    #[test]
    fn machine_constraint_and_rhel_form() {
        let found = kills(
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=java,pid=77,uid=0\n\
             Killed process 77, UID 0, (java) total-vm:100kB, anon-rss:50kB, file-rss:0kB",
        );
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].constraint, Some(Constraint::Machine));
        assert_eq!(found[0].victim.as_ref().unwrap().name, "java");
    }
}
