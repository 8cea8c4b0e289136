//! The per-machine history in SQLite: one file, no server, safe for several builds at once
//! (WAL journal, busy timeout) and for crashes (every job is its own transaction).
//!
//! This file opens the history, keeps its layout ([`SCHEMA`]) and brings older files up to it;
//! what is read and written lives with its table: builds, jobs, peaks (with the local shares
//! of farmed jobs), the samples of running builds, and the processes outside admission.

mod builds;
mod jobs;
mod outside;
pub(crate) mod peaks;
mod samples;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::recorder::Batch;
use jobs::insert_job;
use samples::insert_samples;

pub use builds::Listed;

/// Layout version, kept in `PRAGMA user_version`. Version 2 added the profile of each job's
/// last clean run to `peaks`, version 3 the niceness each job ran at to `jobs`, version 4 the
/// parallelism variables headroom set to `builds` and the `outside_processes` table, version 5
/// the `job_events` and `room` tables, version 6 each peak's portable key and time to `peaks`
/// and the `shared_peaks` table ([`crate::shared`]), version 7 the farm node of each job to
/// `jobs` (`node`, `node_start_ms`) and the `local_shares` table, version 8 the process id of
/// each build's governor to `builds` (`governor_pid`), to tell a build still running from one
/// whose governor died.
const SCHEMA_VERSION: i32 = 8;
/// How long to wait for another build's write to finish before giving up on the history.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The layout. `builds.parallelism_set` holds the variables headroom set for the build (named
/// when they were all parallelism variables) as a JSON array of `NAME=value` strings
/// (`["MAX_JOBS=4","MAKEFLAGS=-j4"]`), NULL for builds recorded before version 4. `peaks.portable_key` names the job as another machine would (no paths of
/// this one) and `peaks.measured_unix_ms` says when its peak was measured, both NULL for peaks
/// recorded before version 6. `shared_peaks` holds what other machines measured, by portable
/// key, as `headroom history pull` fetched it, with the seconds of work that waited on each job
/// there (`waiting_ms`), which set its CPU priority.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS builds (
    id INTEGER PRIMARY KEY,
    started_unix_ms INTEGER NOT NULL,
    duration_ms INTEGER,
    command TEXT NOT NULL,
    cwd TEXT NOT NULL,
    budget INTEGER NOT NULL,
    budget_source TEXT NOT NULL,
    slots INTEGER NOT NULL,
    exit_code INTEGER,
    peak_total INTEGER,
    parallelism_set TEXT,
    governor_pid INTEGER
);
CREATE TABLE IF NOT EXISTS jobs (
    build_id INTEGER NOT NULL REFERENCES builds(id),
    job_id INTEGER NOT NULL,
    key TEXT NOT NULL,
    grp TEXT NOT NULL,
    label TEXT NOT NULL,
    compiler TEXT NOT NULL,
    command TEXT NOT NULL,
    cwd TEXT NOT NULL,
    offered_ms INTEGER NOT NULL,
    start_ms INTEGER NOT NULL,
    end_ms INTEGER NOT NULL,
    peak INTEGER NOT NULL,
    cpu_ms INTEGER NOT NULL,
    exit_code INTEGER,
    signal INTEGER,
    predicted INTEGER NOT NULL,
    prediction_source TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    suspends INTEGER NOT NULL,
    requeues INTEGER NOT NULL,
    oom_retries INTEGER NOT NULL,
    lowered_flags TEXT,
    over_budget INTEGER NOT NULL,
    nice INTEGER NOT NULL DEFAULT 0,
    node TEXT,
    node_start_ms INTEGER,
    PRIMARY KEY (build_id, job_id)
);
CREATE TABLE IF NOT EXISTS local_shares (
    key TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    build_id INTEGER NOT NULL,
    t_ms INTEGER NOT NULL,
    job_id INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_build ON samples(build_id);
CREATE TABLE IF NOT EXISTS job_events (
    build_id INTEGER NOT NULL,
    t_ms INTEGER NOT NULL,
    job_id INTEGER NOT NULL,
    kind TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS job_events_by_build ON job_events(build_id);
CREATE TABLE IF NOT EXISTS room (
    build_id INTEGER NOT NULL,
    t_ms INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS room_by_build ON room(build_id);
CREATE TABLE IF NOT EXISTS peaks (
    key TEXT PRIMARY KEY,
    peak INTEGER NOT NULL,
    runs INTEGER NOT NULL,
    profile_cpu_ms INTEGER,
    profile_wall_ms INTEGER,
    profile TEXT,
    portable_key TEXT,
    measured_unix_ms INTEGER
);
CREATE TABLE IF NOT EXISTS shared_peaks (
    portable_key TEXT PRIMARY KEY,
    peak INTEGER NOT NULL,
    profile_cpu_ms INTEGER,
    profile_wall_ms INTEGER,
    profile TEXT,
    measured_unix_ms INTEGER NOT NULL,
    waiting_ms INTEGER
);
CREATE TABLE IF NOT EXISTS outside_processes (
    build_id INTEGER NOT NULL REFERENCES builds(id),
    pid INTEGER NOT NULL,
    name TEXT NOT NULL,
    compiler_like INTEGER NOT NULL,
    peak INTEGER NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS outside_processes_by_build ON outside_processes(build_id);
";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("history database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot create the history directory {path}: {source}")]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("build {0} is not in the history; leave the id out for the last build")]
    NoSuchBuild(i64),
    #[error("the history has no builds yet: run `headroom build -- …` first, or pass a report JSON file")]
    Empty,
}

impl StoreError {
    /// Another process held the history's lock for longer than the busy timeout.
    pub fn is_busy(&self) -> bool {
        matches!(self, StoreError::Sqlite { source, .. } if is_busy(source))
    }
}

/// The history, open.
pub struct History {
    pub(crate) conn: Connection,
    path: PathBuf,
}

/// The outcome of [`History::open_or_recover`]: a history if one could be had, and what
/// happened on the way, for the user to read.
pub struct Opened {
    pub history: Option<History>,
    pub warnings: Vec<String>,
}

impl History {
    /// The default location: `$HEADROOM_STATE_DIR/history.sqlite`, else
    /// `$XDG_STATE_HOME/headroom/history.sqlite`, else `~/.local/state/headroom/history.sqlite`.
    pub fn default_path() -> PathBuf {
        headroom_paths::state_dir().join("history.sqlite")
    }

    /// Opens (creating if needed) the history at `path`.
    pub fn open(path: &Path) -> Result<History, StoreError> {
        let sqlite = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Directory {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let mut conn = Connection::open(path).map_err(sqlite)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite)?;
        retry_while_busy(|| set_up(&mut conn)).map_err(sqlite)?;
        Ok(History {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Opens the history for a build, which must go on whatever state the file is in: a corrupt
    /// file is moved aside and a new one started; a file locked for too long is skipped.
    pub fn open_or_recover(path: &Path) -> Opened {
        match History::open(path) {
            Ok(history) => Opened { history: Some(history), warnings: Vec::new() },
            Err(StoreError::Sqlite { source, .. }) if is_corruption(&source) => {
                let aside = aside_path(path);
                let mut warnings = vec![format!(
                    "the history database {} is corrupt ({source}); moved it to {} and started a new one",
                    path.display(),
                    aside.display()
                )];
                for suffix in ["", "-wal", "-shm"] {
                    let from = PathBuf::from(format!("{}{suffix}", path.display()));
                    let to = PathBuf::from(format!("{}{suffix}", aside.display()));
                    let _ = std::fs::rename(from, to);
                }
                match History::open(path) {
                    Ok(history) => Opened { history: Some(history), warnings },
                    Err(err) => {
                        warnings.push(format!("{err}; this build runs without history"));
                        Opened { history: None, warnings }
                    }
                }
            }
            Err(err) => Opened {
                history: None,
                warnings: vec![format!(
                    "{err}; this build runs without history (set HEADROOM_STATE_DIR to use another location)"
                )],
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn sqlite(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Runs `work` in one transaction: all of it is recorded, or none.
    pub(crate) fn in_transaction(
        &mut self,
        work: impl FnOnce(&Transaction) -> rusqlite::Result<()>,
    ) -> Result<(), StoreError> {
        let sqlite = |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sqlite)?;
        work(&tx).and_then(|()| tx.commit()).map_err(sqlite)
    }

    /// Records `batch` of build `build_id` in one transaction: all of it, or none.
    pub fn record_batch(&mut self, build_id: i64, batch: &Batch) -> Result<(), StoreError> {
        self.in_transaction(|tx| {
            for job in &batch.jobs {
                insert_job(
                    tx,
                    build_id,
                    &job.record,
                    &job.portable_key,
                    job.profile.as_ref(),
                )?;
            }
            insert_samples(tx, build_id, &batch.samples, &batch.events, &batch.room)
        })
    }
}

/// Puts the file in WAL mode, checks it and brings its layout up to date, in one immediate
/// transaction so that two builds opening a new or older file at once do not both change it.
fn set_up(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let check: String = conn.query_row("PRAGMA quick_check", [], |row| row.get(0))?;
    if check != "ok" {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
            Some(check),
        ));
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i32 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if version < SCHEMA_VERSION {
        if version == 1 {
            tx.execute_batch(
                "ALTER TABLE peaks ADD COLUMN profile_cpu_ms INTEGER;
                 ALTER TABLE peaks ADD COLUMN profile_wall_ms INTEGER;
                 ALTER TABLE peaks ADD COLUMN profile TEXT;",
            )?;
        }
        tx.execute_batch(SCHEMA)?;
        add_missing_column(&tx, "jobs", "nice", "INTEGER NOT NULL DEFAULT 0")?;
        add_missing_column(&tx, "jobs", "node", "TEXT")?;
        add_missing_column(&tx, "jobs", "node_start_ms", "INTEGER")?;
        add_missing_column(&tx, "builds", "parallelism_set", "TEXT")?;
        add_missing_column(&tx, "builds", "governor_pid", "INTEGER")?;
        add_missing_column(&tx, "peaks", "portable_key", "TEXT")?;
        add_missing_column(&tx, "peaks", "measured_unix_ms", "INTEGER")?;
        add_missing_column(&tx, "shared_peaks", "waiting_ms", "INTEGER")?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()
}

/// Adds `column` to `table` of an older layout, whose table `SCHEMA` did not create anew.
fn add_missing_column(
    tx: &Transaction,
    table: &str,
    column: &str,
    definition: &str,
) -> rusqlite::Result<()> {
    let present: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |row| row.get(0),
    )?;
    if !present {
        tx.execute_batch(&format!(
            "ALTER TABLE {table} ADD COLUMN {column} {definition};"
        ))?;
    }
    Ok(())
}

/// Runs `step` again while SQLite reports a lock it did not wait for (switching a new file
/// to WAL does not wait on the busy timeout), until the busy timeout has passed.
fn retry_while_busy<T>(mut step: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match step() {
            Err(err) if is_busy(&err) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

fn is_busy(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn is_corruption(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

fn aside_path(path: &Path) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    PathBuf::from(format!("{}.corrupt-{stamp}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use headroom_report::{
        BuildRecord, JobEvent, JobEventKind, JobRecord, OutsideProcess, Room, Sample,
    };
    use headroom_sched::{Profile, Ran};

    pub(crate) fn job(job_id: u64, key: &str, peak: u64) -> JobRecord {
        JobRecord {
            job_id,
            key: key.into(),
            group: "g".into(),
            label: format!("{key}.o"),
            compiler: "/usr/bin/g++".into(),
            command: format!("g++ -c {key}.cpp -o {key}.o"),
            cwd: "/src".into(),
            offered_ms: job_id * 10,
            start_ms: job_id * 10,
            end_ms: job_id * 10 + 500,
            peak,
            cpu_ms: 480,
            exit_code: Some(0),
            predicted: 1 << 30,
            prediction_source: "default".into(),
            attempts: 1,
            ..JobRecord::default()
        }
    }

    pub(crate) fn build() -> BuildRecord {
        BuildRecord {
            id: 0,
            started_unix_ms: 1_700_000_000_000,
            duration_ms: None,
            command: "make -j8".into(),
            cwd: "/src".into(),
            budget: 6 << 30,
            budget_source: "--budget 6G".into(),
            slots: 2,
            exit_code: None,
            peak_total: None,
            parallelism_set: vec!["MAX_JOBS=4".into(), "MAKEFLAGS=-j4".into()],
        }
    }

    fn outside(pid: i32, name: &str, compiler_like: bool) -> OutsideProcess {
        OutsideProcess {
            pid,
            name: name.into(),
            compiler_like,
            peak: 300 << 20,
            first_seen_ms: 100,
            last_seen_ms: 2100,
            reason: "started by a statically linked build driver".into(),
        }
    }

    #[test]
    fn a_build_round_trips_and_teaches_peaks() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let id = history.begin_build(&build()).unwrap();
        let ran = Ran {
            cpu_seconds: 12.5,
            wall_seconds: 25.0,
        };
        let profile = Profile::new(ran, &[10, 100, 50]).unwrap();
        history
            .record_job(id, &job(0, "a", 100), "portable", Some(&profile))
            .unwrap();
        let mut failed = job(1, "b", 999);
        failed.exit_code = Some(1);
        history.record_job(id, &failed, "portable", None).unwrap();
        history
            .record_samples(
                id,
                &[Sample {
                    t_ms: 5,
                    job_id: 0,
                    bytes: 50,
                }],
                &[JobEvent {
                    t_ms: 6,
                    job_id: 0,
                    kind: JobEventKind::OutOfMemory,
                }],
                &[Room {
                    t_ms: 5,
                    bytes: 900,
                }],
            )
            .unwrap();
        history.finish_build(id, 1234, Some(0), 100).unwrap();

        let past = history.past_run("a", "-").unwrap().unwrap();
        assert_eq!(past.peak, 100);
        let learnt = past.profile.unwrap();
        assert_eq!((learnt.cpu_seconds(), learnt.wall_seconds()), (12.5, 25.0));
        assert_eq!(learnt.shape(), &[0.1, 1.0, 0.5]);
        assert_eq!(
            history.past_run("b", "-").unwrap(),
            None,
            "a failed run teaches nothing"
        );
        assert_eq!(history.last_build_id().unwrap(), id);
        let no_op = history.begin_build(&build()).unwrap();
        assert_eq!(history.last_build_id().unwrap(), no_op);
        assert_eq!(history.last_build_with_jobs().unwrap(), Some(id));
        let report = history.load_build(id).unwrap();
        assert_eq!(report.jobs, vec![job(0, "a", 100), failed]);
        assert_eq!(report.samples.len(), 1);
        assert_eq!(report.events[0].kind, JobEventKind::OutOfMemory);
        assert_eq!(
            report.room,
            [Room {
                t_ms: 5,
                bytes: 900
            }]
        );
        assert_eq!(report.build.duration_ms, Some(1234));
        assert_eq!(report.build.parallelism_set, build().parallelism_set);
        assert!(report.outside.is_empty());
        assert!(matches!(
            history.load_build(no_op + 1),
            Err(StoreError::NoSuchBuild(_))
        ));
    }

    #[test]
    fn processes_outside_admission_round_trip_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let id = history.begin_build(&build()).unwrap();
        let other = history.begin_build(&build()).unwrap();
        let processes = vec![
            outside(42, "make", false),
            OutsideProcess {
                peak: 2 << 30,
                ..outside(7, "cc1plus", true)
            },
        ];
        history
            .record_outside(id, &[outside(1, "stale", false)])
            .unwrap();
        history.record_outside(id, &processes).unwrap();
        history
            .record_outside(other, &[outside(9, "ld", true)])
            .unwrap();
        let report = history.load_build(id).unwrap();
        assert_eq!(
            report.outside, processes,
            "the second record replaces the first"
        );
        assert_eq!(
            report
                .ungoverned_compilers()
                .map(|p| p.pid)
                .collect::<Vec<_>>(),
            [7]
        );
        assert_eq!(history.load_build(other).unwrap().outside.len(), 1);
    }

    #[test]
    fn recent_builds_come_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        assert!(history.recent_builds_jobs(5).unwrap().is_empty());
        for key in ["first", "second"] {
            let id = history.begin_build(&build()).unwrap();
            history
                .record_job(id, &job(0, key, 1), "portable", None)
                .unwrap();
        }
        let keys = |count| -> Vec<String> {
            history
                .recent_builds_jobs(count)
                .unwrap()
                .iter()
                .map(|jobs| jobs[0].key.clone())
                .collect()
        };
        assert_eq!(keys(5), ["second", "first"]);
        assert_eq!(keys(1), ["second"]);
    }

    #[test]
    fn a_history_from_before_profiles_keeps_its_peaks_and_learns_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE peaks (key TEXT PRIMARY KEY, peak INTEGER NOT NULL, runs INTEGER NOT NULL);
             INSERT INTO peaks VALUES ('a', 100, 3);
             PRAGMA user_version = 1;",
        )
        .unwrap();
        drop(old);
        let mut history = History::open(&path).unwrap();
        let past = history.past_run("a", "-").unwrap().unwrap();
        assert_eq!((past.peak, past.profile), (100, None));
        let ran = Ran {
            cpu_seconds: 2.0,
            wall_seconds: 2.0,
        };
        let profile = Profile::new(ran, &[50, 120]).unwrap();
        let id = history.begin_build(&build()).unwrap();
        history
            .record_job(id, &job(0, "a", 120), "portable", Some(&profile))
            .unwrap();
        assert_eq!(
            history.past_run("a", "-").unwrap().unwrap().profile,
            Some(profile)
        );
    }

    #[test]
    fn a_farmed_run_teaches_its_local_share_and_keeps_the_peak_measured_here() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let id = history.begin_build(&build()).unwrap();
        history
            .record_job(id, &job(0, "a", 2 << 30), "portable", None)
            .unwrap();
        let farmed = JobRecord {
            node: Some("10.0.0.5:3632".into()),
            ..job(1, "a", 90 << 20)
        };
        history.record_job(id, &farmed, "portable", None).unwrap();
        assert_eq!(history.past_run("a", "-").unwrap().unwrap().peak, 2 << 30);
        assert_eq!(history.local_share("a").unwrap(), Some(90 << 20));
        assert_eq!(history.local_share("b").unwrap(), None);
        let jobs = history.load_build(id).unwrap().jobs;
        assert_eq!(jobs[1].node.as_deref(), Some("10.0.0.5:3632"));
        assert_eq!(jobs[0].node, None);
    }

    #[test]
    fn a_history_from_before_priorities_keeps_its_jobs_and_records_niceness() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let old = Connection::open(&path).unwrap();
        let version_2 = SCHEMA
            .replace("    nice INTEGER NOT NULL DEFAULT 0,\n", "")
            .replace("    node TEXT,\n    node_start_ms INTEGER,\n", "");
        assert_ne!(version_2, SCHEMA);
        old.execute_batch(&format!(
            "{version_2}
             INSERT INTO builds (id, started_unix_ms, command, cwd, budget, budget_source, slots)
                 VALUES (1, 0, 'make', '/src', 100, 'test', 2);
             INSERT INTO jobs VALUES (1, 0, 'old', 'g', 'old.o', 'cc', 'cc -c old.c', '/src', 0, 0,
                 10, 5, 1, 0, NULL, 5, 'default', 1, 0, 0, 0, NULL, 0);
             PRAGMA user_version = 2;"
        ))
        .unwrap();
        drop(old);
        let mut history = History::open(&path).unwrap();
        assert_eq!(history.load_build(1).unwrap().jobs[0].nice, 0);
        let id = history.begin_build(&build()).unwrap();
        let nicer = JobRecord {
            nice: 7,
            ..job(0, "new", 1)
        };
        history.record_job(id, &nicer, "portable", None).unwrap();
        assert_eq!(history.load_build(id).unwrap().jobs[0].nice, 7);
    }

    #[test]
    fn a_history_from_before_outside_processes_keeps_its_builds_and_records_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let old = Connection::open(&path).unwrap();
        let version_3 = SCHEMA.replace(",\n    parallelism_set TEXT", "");
        let (version_3, added) = version_3
            .split_once("CREATE TABLE IF NOT EXISTS outside_processes")
            .unwrap();
        assert!(!version_3.contains("parallelism_set") && added.contains("reason"));
        old.execute_batch(&format!(
            "{version_3}
             INSERT INTO builds (id, started_unix_ms, command, cwd, budget, budget_source, slots)
                 VALUES (1, 0, 'make', '/src', 100, 'test', 2);
             PRAGMA user_version = 3;"
        ))
        .unwrap();
        drop(old);
        let mut history = History::open(&path).unwrap();
        let old_build = history.load_build(1).unwrap();
        assert!(old_build.build.parallelism_set.is_empty());
        assert!(old_build.outside.is_empty());
        let id = history.begin_build(&build()).unwrap();
        history
            .record_outside(id, &[outside(7, "cicc", true)])
            .unwrap();
        let report = history.load_build(id).unwrap();
        assert_eq!(report.build.parallelism_set, build().parallelism_set);
        assert_eq!(report.outside, [outside(7, "cicc", true)]);
        drop(history);
        let version: i32 = Connection::open(&path)
            .unwrap()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[test]
    fn a_history_from_before_job_events_gains_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let (version_4, added) = SCHEMA
            .split_once("CREATE TABLE IF NOT EXISTS job_events")
            .unwrap();
        let (_, rest) = added
            .split_once("CREATE TABLE IF NOT EXISTS peaks")
            .unwrap();
        let version_4 = format!("{version_4}CREATE TABLE IF NOT EXISTS peaks{rest}");
        assert!(!version_4.contains("job_events") && !version_4.contains("room"));
        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!("{version_4}\nPRAGMA user_version = 4;"))
            .unwrap();
        let mut history = History::open(&path).unwrap();
        let id = history.begin_build(&build()).unwrap();
        let event = JobEvent {
            t_ms: 1,
            job_id: 0,
            kind: JobEventKind::Kill,
        };
        history
            .record_samples(id, &[], &[event], &[Room { t_ms: 1, bytes: 2 }])
            .unwrap();
        let report = history.load_build(id).unwrap();
        assert_eq!((report.events.len(), report.room.len()), (1, 1));
    }

    #[test]
    fn builds_that_create_the_history_at_once_all_get_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let start = std::sync::Barrier::new(4);
        std::thread::scope(|scope| {
            let opened: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        History::open(&path).map(drop)
                    })
                })
                .collect();
            for open in opened {
                open.join().unwrap().unwrap();
            }
        });
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        let opened = History::open_or_recover(&path);
        assert!(opened.history.is_some());
        assert!(
            opened.warnings[0].contains("corrupt"),
            "{:?}",
            opened.warnings
        );
        let moved: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(moved.len(), 1);
    }

    #[test]
    fn an_unusable_location_is_skipped_with_a_warning() {
        let opened = History::open_or_recover(Path::new("/proc/headroom/h.sqlite"));
        assert!(opened.history.is_none());
        assert!(
            opened.warnings[0].contains("without history"),
            "{:?}",
            opened.warnings
        );
    }
}
