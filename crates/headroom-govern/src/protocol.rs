//! The wire protocol between shims (and the CLI) and the governor: serde enums in
//! length-prefixed JSON frames over a Unix socket.

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use headroom_farm::{FarmSettings, RemoteLaunch};
use headroom_report::BuildReport;
use headroom_sched::ladder::Rung;
use headroom_sched::SessionId;

/// Frames larger than this are refused: no honest message comes close.
pub const MAX_FRAME: u32 = 16 << 20;
/// The governor's last reply carries the build's report with its samples, ten a second for
/// each running job at about 50 bytes each: an hour of 16 jobs passes 16 MiB. The CLI reads it
/// from its own child, through a socket in its private directory, so it takes up to this much.
pub const MAX_REPORT_FRAME: u32 = 1 << 30;

/// Everything the governor needs to know of a session, passed from its CLI. The first
/// session's also sets what is the governor's own: how often it samples, and the CPU cgroup's
/// levels.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GovernorConfig {
    pub budget: u64,
    pub budget_source: String,
    pub slots: usize,
    /// Where the history lives; `None` runs without one.
    pub history: Option<PathBuf>,
    pub command: String,
    pub cwd: String,
    pub started_unix_ms: i64,
    /// Lower-memory rungs for jobs that run out of memory alone; empty when not opted in.
    pub ladder: Vec<Rung>,
    pub sample_interval_ms: u64,
    /// Whether jobs start at the niceness the scheduler chose; otherwise all at 0.
    pub priorities: bool,
    /// The variables headroom set for the build (`MAX_JOBS=4`, `TORCH_NO_COMPILER_WRAPPER=1`;
    /// see [`crate::session::build_variables`]), for the report.
    pub parallelism_set: Vec<String>,
    /// The project's root, which portable keys name `$ROOT` ([`crate::portable`]).
    pub project_root: String,
    /// The build farm, with the nodes that answered when the build began; `None` builds here
    /// only.
    pub farm: Option<FarmSettings>,
    /// The id the session's compilers must know it by from one build to the next, when it
    /// is free (Bazel's actions: their environment is part of their cache keys); else the
    /// session's id is its CLI's process id.
    #[serde(default)]
    pub session_id: Option<SessionId>,
}

/// The version of this protocol, which a session's CLI and the governor it joins share. A
/// shim starts the compiler before the governor answers and ends it on [`Reply::Queued`], so
/// a build never joins a governor of another version, which might not send that (or send
/// what this shim cannot read): it runs with a governor of its own instead. A message of a
/// version without this field reads as version 0. Version 2: `Run`'s `cpu_group` is the
/// builds' cgroup, which `Joined` names too, and no longer a cgroup per priority level.
pub const PROTOCOL: u32 = 2;

/// What a shim or the CLI says to the governor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// From a CLI: a session (a `headroom build`, a `headroom run`) begins. The connection
    /// stays open for the session's life and carries its [`Request::Shutdown`]; a connection
    /// that closes first ends the session as if its CLI had died. `root` is the CLI's process:
    /// the session's build is everything below it.
    Join {
        config: Box<GovernorConfig>,
        root: i32,
        /// The CLI's [`PROTOCOL`].
        #[serde(default)]
        protocol: u32,
    },
    /// A compiler job of session `session` asks to run. Arguments are lossy UTF-8: they only
    /// name and key the job; the shim runs the original bytes.
    Job {
        session: SessionId,
        compiler: String,
        args: Vec<String>,
        cwd: String,
    },
    /// The admitted job's attempt runs; `pid` is also its process group. A first attempt may
    /// have started before the answer; one that heard [`Reply::Queued`] first was ended then,
    /// and this is the attempt started on admission.
    Started { pid: i32 },
    /// The attempt ended.
    Finished(Attempt),
    /// From the CLI, on its session's connection: the build command exited (or was
    /// interrupted), and the session ends.
    Shutdown {
        exit_code: Option<i32>,
        kill_jobs: bool,
    },
    /// On a connection of its own: how session `session` stands now, for the live status a
    /// CLI shows on a terminal.
    Status { session: SessionId },
    /// On a connection of its own: every session and what each holds (`headroom status`).
    Sessions,
}

/// What the governor and each of its sessions hold now: the answer to [`Request::Sessions`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GovernorStatus {
    pub pid: u32,
    /// The limits every session shares: the smallest budget and slots of those running.
    pub budget: u64,
    pub slots: usize,
    /// What all the sessions' processes used at the last sample.
    pub used: u64,
    pub sessions: Vec<SessionStatus>,
}

/// One session of a governor as `headroom status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// The CLI's process id, which is the session's id.
    pub id: SessionId,
    pub command: String,
    pub cwd: String,
    pub started_unix_ms: i64,
    /// What its running jobs hold of the budget: their predicted peaks or what they use, the
    /// larger.
    pub held: u64,
    pub status: BuildStatus,
    /// Its jobs that have not ended, for `-v`.
    pub jobs: Vec<LiveJob>,
}

/// A job of a session that has not ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveJob {
    pub label: String,
    /// `running`, `stopped`, `waiting` or `requeued`.
    pub state: String,
    pub predicted: u64,
    /// The most it was seen to use.
    pub peak: u64,
}

/// How a build stands at one moment: what the CLI's live status shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStatus {
    /// Jobs whose attempt runs, here or on a farm node; stopped ones not counted.
    pub running: usize,
    /// Jobs the governor stopped to make room.
    pub stopped: usize,
    /// Jobs waiting to start, requeued ones included.
    pub waiting: usize,
    /// Jobs over.
    pub done: usize,
    /// What the build's processes used at the last sample.
    pub used: u64,
    pub budget: u64,
    pub slots: usize,
    /// Why the waiting jobs wait; `None` while none does, or one is about to start.
    pub waiting_for: Option<Waiting>,
}

/// Why a build's jobs wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Waiting {
    /// Every slot runs a job.
    Slots,
    /// The smallest waiting job's predicted peak (`need`) does not fit beside the running
    /// jobs, or jobs were stopped to make room.
    Memory { need: u64 },
    /// A job that ran out of memory runs, or waits to run, with no other job beside it.
    Alone,
    /// The slots or the memory the waiting jobs need are held by other sessions' jobs
    /// (`jobs` of them, holding `held` bytes).
    OtherSessions { jobs: usize, held: u64 },
}

/// How one attempt of a job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Largest resident set of any one process of the attempt, from `getrusage`.
    pub max_rss: u64,
    pub cpu_ms: u64,
    /// The end of what the job wrote to stderr, to recognise out-of-memory messages.
    pub stderr_tail: String,
    /// When the attempt ended, in [`monotonic_ms`]; 0 where unknown. The shim of an attempt
    /// that exited 0 does not wait for the governor, so the build system may start the jobs
    /// that waited for this one before the governor reads this: the job's end is when the
    /// compiler ended, not when the governor heard of it.
    #[serde(default)]
    pub ended_at: u64,
}

impl Attempt {
    /// How long ago, on the shared monotonic clock, the attempt ended: at least that long, so
    /// that its end is never placed after a job admitted once it was over. The stamp is whole
    /// milliseconds rounded down, and now is read to the nanosecond: the age is over by less
    /// than a millisecond, never under (rounding both down put ends up to 1 ms late).
    pub fn age(&self) -> Duration {
        match self.ended_at {
            0 => Duration::ZERO,
            ended_at => monotonic().saturating_sub(Duration::from_millis(ended_at)),
        }
    }
}

/// Milliseconds on the system's monotonic clock, which every process of the machine reads
/// alike: a shim's stamp means the same to the governor.
pub fn monotonic_ms() -> u64 {
    monotonic().as_millis() as u64
}

/// The system's monotonic clock, to the nanosecond.
fn monotonic() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// What the governor answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The session joined: its id, the governor's process, and what the governor has to tell
    /// the session's user (a history that could not be read, …).
    Joined {
        session: SessionId,
        governor: u32,
        warnings: Vec<String>,
        /// The governor's [`PROTOCOL`].
        #[serde(default)]
        protocol: u32,
        /// The `cpu` cgroup the session's build runs in, where the governor could make one
        /// (`headroom_probe::cpu_share`).
        #[serde(default)]
        cpu_group: Option<PathBuf>,
    },
    /// Run now at CPU priority `nice` (jobs off the build's longest path run nicer), with
    /// lower-memory flags if `rung` says so, on a farm node through the engine's client if
    /// `remote` says so. The priority is `nice` steps of niceness above the user's; inside the
    /// builds' cgroup `cpu_group`, where the governor could make one, it orders the builds'
    /// own processes only. A compiler started outside that cgroup (by a build server that ran
    /// before the build) is moved into it.
    Run {
        job_id: u64,
        rung: Option<Rung>,
        nice: u8,
        cpu_group: Option<PathBuf>,
        remote: Option<RemoteLaunch>,
    },
    /// The job cannot run yet: a [`Reply::Run`] follows when it can. The shim, which may
    /// have started the compiler before asking, ends it and starts it again then.
    Queued,
    /// Report the attempt's result to the build system. A shim whose attempt exited 0 does
    /// not wait for it: such an attempt is never retried.
    Done,
    /// Do not report this attempt: the job runs again when the next `Run` arrives.
    Retry,
    /// The governor exits: the build as it saw it, from memory (`report.build.id` is its id
    /// in the history, 0 when it has none), whatever reached the history.
    ShutDown {
        report: Box<BuildReport>,
        warnings: Vec<String>,
    },
    /// How the session stands now (the answer to [`Request::Status`]).
    Status(BuildStatus),
    /// The answer to [`Request::Sessions`].
    Sessions(GovernorStatus),
    /// The governor's heartbeat, sent to every connection while it makes progress: only
    /// silence tells a hung governor from one that keeps a job queued (`crate::liveness`).
    Alive,
}

/// Writes one frame: a little-endian u32 length, then the JSON body.
pub fn write_frame<T: Serialize>(mut writer: impl Write, message: &T) -> io::Result<()> {
    let body = serde_json::to_vec(message)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    writer.write_all(&frame)
}

/// Reads one frame; `UnexpectedEof` when the peer has gone.
pub fn read_frame<T: DeserializeOwned>(reader: impl Read) -> io::Result<T> {
    read_frame_up_to(reader, MAX_FRAME)
}

/// Reads one frame of at most `limit` bytes.
pub fn read_frame_up_to<T: DeserializeOwned>(mut reader: impl Read, limit: u32) -> io::Result<T> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length)?;
    let length = u32::from_le_bytes(length);
    if length > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {length} bytes is too large"),
        ));
    }
    // Grown as bytes arrive: a peer that announces 16 MiB and sends 10 bytes costs 10.
    let mut body = Vec::new();
    reader.take(u64::from(length)).read_to_end(&mut body)?;
    if body.len() < length as usize {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame of {length} bytes ended after {}", body.len()),
        ));
    }
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut wire = Vec::new();
        let job = Request::Job {
            session: 7,
            compiler: "/usr/bin/g++".into(),
            args: vec!["-c".into(), "a b.cpp".into()],
            cwd: "/".into(),
        };
        write_frame(&mut wire, &job).unwrap();
        write_frame(&mut wire, &Reply::Retry).unwrap();
        let mut reader = wire.as_slice();
        let read = read_frame::<Request>(&mut reader).unwrap();
        assert_eq!(format!("{read:?}"), format!("{job:?}"));
        assert_eq!(read_frame::<Reply>(&mut reader).unwrap(), Reply::Retry);
        let end = read_frame::<Reply>(&mut reader).unwrap_err();
        assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// An hour of 16 jobs sampled ten times a second, over 5000 jobs: too large for a shim's
    /// frame, well within the report's.
    #[test]
    fn a_long_builds_report_fits_its_frame() {
        let build = headroom_report::BuildRecord {
            id: 1,
            started_unix_ms: 1_700_000_000_000,
            duration_ms: Some(3_600_000),
            command: "ninja".into(),
            cwd: "/src/pytorch".into(),
            budget: 64 << 30,
            budget_source: "--budget 64G".into(),
            slots: 16,
            exit_code: Some(0),
            peak_total: Some(60 << 30),
            parallelism_set: Vec::new(),
        };
        let mut report = BuildReport::begun(build);
        report.jobs = (0..5000)
            .map(|job_id| headroom_report::JobRecord {
                job_id,
                label: format!("caffe2/CMakeFiles/torch_cpu.dir/aten/src/ATen/op_{job_id}.cpp.o"),
                command: format!(
                    "/usr/bin/c++ -O3 -g -std=c++17 -c op_{job_id}.cpp -o op_{job_id}.o"
                ),
                peak: 1_900_000_000,
                ..Default::default()
            })
            .collect();
        report.samples = (0..36_000u64)
            .flat_map(|tick| {
                (0..16).map(move |slot| headroom_report::Sample {
                    t_ms: tick * 100,
                    job_id: tick / 80 * 16 + slot,
                    bytes: 1_500_000_000,
                })
            })
            .collect();
        let mut wire = Vec::new();
        write_frame(
            &mut wire,
            &Reply::ShutDown {
                report: Box::new(report),
                warnings: Vec::new(),
            },
        )
        .unwrap();
        eprintln!("{} MiB", wire.len() >> 20);
        assert!(wire.len() > MAX_FRAME as usize && wire.len() < MAX_REPORT_FRAME as usize / 8);
        assert!(read_frame::<Reply>(wire.as_slice()).is_err());
        read_frame_up_to::<Reply>(wire.as_slice(), MAX_REPORT_FRAME).unwrap();
    }

    #[test]
    fn refuses_oversized_frames() {
        let wire = (MAX_FRAME + 1).to_le_bytes();
        let err = read_frame::<Reply>(wire.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_frame_cut_short_is_an_unexpected_end() {
        let mut wire = 100u32.to_le_bytes().to_vec();
        wire.extend_from_slice(b"\"Do");
        let err = read_frame::<Reply>(wire.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
