//! The governor: one process per user, memory domain and history, which every session on
//! them joins (`headroom build`, `headroom run`, `headroom kernels build`; see
//! [`crate::session`]). It admits the jobs of all its sessions through one
//! `headroom-sched` driver, so they share one budget, one set of slots and one safety net;
//! samples their memory; stops, resumes and kills their process groups; retries jobs that ran
//! out of memory; and keeps each session's report in memory for its CLI, handing every
//! finished job to the session's history writer (`headroom_store::recorder`), which no job
//! ever waits for. It exits when its last session has ended.
//!
//! One thread per connection (reused from one to the next), one sampling thread, one lock
//! around the state: simple to follow, and cheap enough for the few hundred jobs a machine
//! has in flight at most.
//!
//! By step: `connection` reads requests, lets sessions join and leave and sends replies;
//! `jobs` takes a job from its offer to the end of its last attempt; `sampler` samples
//! and acts on what the driver decides; `record` reads and writes the history and the
//! reports; `state` is what they share under the lock. Only the binary, which runs
//! `headroom __governor`, builds this module (the crate's `governor` feature): it brings SQLite.

mod connection;
mod jobs;
mod record;
mod sampler;
mod state;

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use headroom_probe::cpu_share::CpuShare;
use headroom_process::Interrupts;
use headroom_sched::SessionId;

use crate::ledger::{Elsewhere, ReservationLedger};
use crate::liveness::silence_bound;
use crate::protocol::GovernorConfig;

use connection::{Connections, Handlers};
use state::{SessionState, State};

pub use record::{driver_for, open_history, warm_start, Past};

/// How many silence bounds (`crate::liveness`) a new governor waits for its first session
/// before it takes its starter for dead or hung, and leaves.
const FIRST_JOIN_BOUNDS: u32 = 3;

struct Governor {
    /// The first session's configuration: how often to sample, and the limits until sessions
    /// say otherwise.
    defaults: GovernorConfig,
    /// Each compiler's name and version, by the path a build called it by: asked once,
    /// outside the state's lock.
    compiler_ids: Mutex<HashMap<String, String>>,
    /// The driver's clock starts here.
    start: Instant,
    state: Mutex<State>,
    /// Signalled whenever a job is admitted or a session or the governor ends.
    admitted: Condvar,
    /// Where farmed jobs keep their engine's state, a directory per job.
    farm_state: PathBuf,
    /// Every open connection, for the heartbeat.
    connections: Connections,
    /// The cgroup the builds run in, where one could be made and priorities are on: inside
    /// it, the jobs' niceness orders the builds' own processes only.
    cpu_share: Option<CpuShare>,
    /// How the governor leaves its socket when its last session has ended.
    exit: crate::session::Exit,
    /// Where it tells other users' governors in its memory domain what it holds, and hears
    /// what they hold; `None` where the ledger cannot be used.
    ledger: Option<ReservationLedger>,
}

/// Runs the governor on `listener` until its last session has ended or a signal ends it.
/// `defaults` is the first session's configuration.
pub fn serve(
    listener: UnixListener,
    defaults: GovernorConfig,
    exit: crate::session::Exit,
) -> io::Result<()> {
    // As the CLI's: one started ignoring a signal (`nohup headroom build`) leaves it ignored.
    let terminate = Interrupts::install(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
        .map_err(io::Error::other)?;
    // What the history says of earlier builds comes with the first session.
    let driver = driver_for(&defaults, &Past::default());
    let governor = Arc::new(Governor {
        start: Instant::now(),
        state: Mutex::new(State {
            driver,
            jobs: HashMap::new(),
            sessions: HashMap::new(),
            warmed: false,
            dying: Vec::new(),
            shutting_down: false,
            sessions_ending: 0,
            sessions_joining: 0,
            elsewhere: Elsewhere::default(),
        }),
        admitted: Condvar::new(),
        compiler_ids: Mutex::new(HashMap::new()),
        farm_state: std::env::temp_dir().join(format!("headroom-farm-{}", std::process::id())),
        connections: Connections::default(),
        cpu_share: defaults
            .priorities
            .then(|| cpu_share(defaults.slots))
            .flatten(),
        defaults,
        exit,
        ledger: ReservationLedger::open(&crate::session::memory_domain()),
    });
    {
        let governor = Arc::clone(&governor);
        std::thread::spawn(move || governor.sample_until(&terminate));
    }
    {
        let governor = Arc::clone(&governor);
        std::thread::spawn(move || governor.beat());
    }
    // Every compiler call waits on this thread and on the handlers it starts (which inherit
    // the slice): on a busy host they get a core at once (`headroom_process::slice`).
    let handlers = Handlers::new(headroom_process::slice::Slice::shorten_own());
    for stream in listener.incoming() {
        handlers.hand(stream?, &governor);
    }
    Ok(())
}

/// Set to `0`, builds run without a CPU cgroup of their own even where one could be made: the
/// jobs' niceness then yields to every process on the machine.
pub const CPU_CGROUP_ENV: &str = "HEADROOM_CPU_CGROUP";

/// The cgroup the builds run in, so that their jobs' niceness orders their own processes
/// without handing CPU to unrelated ones (`headroom_probe::cpu_share`); `None`, said at `-v`,
/// where none can be made.
fn cpu_share(slots: usize) -> Option<CpuShare> {
    if std::env::var(CPU_CGROUP_ENV).is_ok_and(|value| value == "0") {
        tracing::info!("{CPU_CGROUP_ENV}=0: job priorities are niceness, which also yields to unrelated processes");
        return None;
    }
    match CpuShare::create(slots) {
        Ok(share) => {
            tracing::info!(
                "builds run in the CPU cgroup {}, where job priorities order their own processes",
                share.dir().display()
            );
            Some(share)
        }
        Err(err) => {
            tracing::info!(
                "job priorities are niceness, which also yields to unrelated processes: {err}"
            );
            None
        }
    }
}

/// Locks `mutex`, poisoned or not: a panicking connection thread must not take the whole build
/// down.
fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Governor {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock_ignoring_poison(&self.state)
    }

    /// Seconds since the governor started: the driver's clock.
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// `seconds` on the driver's clock, in milliseconds of `session`.
    fn session_ms(&self, session: &SessionState, seconds: f64) -> u64 {
        let at = self.start + Duration::from_secs_f64(seconds.max(0.0));
        at.saturating_duration_since(session.start).as_millis() as u64
    }

    /// Whether no session has joined within [`FIRST_JOIN_BOUNDS`] silence bounds: the CLI
    /// that started the governor died before it could.
    fn never_joined(&self) -> bool {
        let state = self.lock();
        !state.warmed && self.start.elapsed() > FIRST_JOIN_BOUNDS * silence_bound()
    }

    /// A signal ends the governor: every session's jobs are released and its history
    /// completed, as far as the grace allows.
    fn end_on_signal(&self) -> ! {
        let ids: Vec<SessionId> = self.lock().sessions.keys().copied().collect();
        for id in ids {
            self.release_jobs(id, false);
            self.finish_history(id, None);
        }
        self.remove_cpu_share();
        self.leave();
    }

    /// Withdraws from the ledger, leaves the socket's place, and exits.
    fn leave(&self) -> ! {
        if let Some(ledger) = &self.ledger {
            ledger.withdraw();
        }
        self.exit.leave();
        std::process::exit(0);
    }

    /// The cgroup the builds run in, for sessions and shims.
    pub(super) fn cpu_group(&self) -> Option<PathBuf> {
        self.cpu_share
            .as_ref()
            .map(|share| share.dir().to_path_buf())
    }

    /// Takes down the builds' CPU cgroup: the process exits without dropping anything.
    fn remove_cpu_share(&self) {
        if let Some(share) = &self.cpu_share {
            share.remove();
        }
    }
}
