//! The `builds` table: one row per `headroom build` (or governed run), begun when it starts
//! and finished when it ends, and the whole report of a build read back from every table.

use headroom_report::{BuildRecord, BuildReport, JobRecord, REPORT_SCHEMA};
use rusqlite::types::Type;
use rusqlite::{params, OptionalExtension, Row};

use super::{History, StoreError};

/// Samples are kept for this many most recent builds; jobs and peaks for all.
const BUILDS_WITH_SAMPLES: i64 = 50;

/// The columns of `builds` that [`build_of`] reads, in its order.
const BUILD_COLUMNS: &str = "id, started_unix_ms, duration_ms, command, cwd, budget, \
    budget_source, slots, exit_code, peak_total, parallelism_set";

impl History {
    /// Records the start of a build and returns its id.
    pub fn begin_build(&self, build: &BuildRecord) -> Result<i64, StoreError> {
        self.begin_governed_build(build, None)
    }

    /// Records the start of a build whose governor is process `governor_pid`, and returns its
    /// id: a build with no end whose governor is gone is one whose governor died
    /// ([`History::governor_pid`]).
    pub fn begin_governed_build(
        &self,
        build: &BuildRecord,
        governor_pid: Option<u32>,
    ) -> Result<i64, StoreError> {
        let parallelism_set =
            serde_json::to_string(&build.parallelism_set).expect("a list of strings is JSON");
        self.conn
            .execute(
                "INSERT INTO builds (started_unix_ms, command, cwd, budget, budget_source, slots,
                                     parallelism_set, governor_pid)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    build.started_unix_ms,
                    build.command,
                    build.cwd,
                    build.budget as i64,
                    build.budget_source,
                    build.slots,
                    parallelism_set,
                    governor_pid
                ],
            )
            .map_err(|e| self.sqlite(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records how a build ended, and drops the samples of old builds.
    pub fn finish_build(
        &self,
        build_id: i64,
        duration_ms: u64,
        exit_code: Option<i32>,
        peak_total: u64,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE builds SET duration_ms = ?2, exit_code = ?3, peak_total = ?4 WHERE id = ?1",
                params![build_id, duration_ms as i64, exit_code, peak_total as i64],
            )
            .and_then(|_| {
                ["samples", "job_events", "room"]
                    .iter()
                    .try_for_each(|table| {
                        self.conn
                            .execute(
                                &format!(
                                    "DELETE FROM {table} WHERE build_id <= (SELECT MAX(id) FROM builds) - ?1"
                                ),
                                params![BUILDS_WITH_SAMPLES],
                            )
                            .map(drop)
                    })
            })
            .map_err(|e| self.sqlite(e))
    }

    /// The id of the most recent build.
    pub fn last_build_id(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("SELECT MAX(id) FROM builds", [], |row| {
                row.get::<_, Option<i64>>(0)
            })
            .map_err(|e| self.sqlite(e))?
            .ok_or(StoreError::Empty)
    }

    /// The most recent build that ran at least one job, if any did: a no-op rebuild (`make:
    /// 'app' is up to date.`) is recorded, but is not the build a user asks about.
    pub fn last_build_with_jobs(&self) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row("SELECT MAX(build_id) FROM jobs", [], |row| row.get(0))
            .map_err(|e| self.sqlite(e))
    }

    /// The jobs of each of the `count` most recent builds, newest build first.
    pub fn recent_builds_jobs(&self, count: usize) -> Result<Vec<Vec<JobRecord>>, StoreError> {
        let ids: Vec<i64> = self
            .conn
            .prepare("SELECT id FROM builds ORDER BY id DESC LIMIT ?1")
            .and_then(|mut query| query.query_map([count as i64], |row| row.get(0))?.collect())
            .map_err(|e| self.sqlite(e))?;
        ids.into_iter()
            .map(|id| self.load_jobs(id).map_err(|e| self.sqlite(e)))
            .collect()
    }

    /// Loads everything recorded about build `id`.
    pub fn load_build(&self, id: i64) -> Result<BuildReport, StoreError> {
        let build = self
            .conn
            .query_row(
                &format!("SELECT {BUILD_COLUMNS} FROM builds WHERE id = ?1"),
                [id],
                build_of,
            )
            .optional()
            .map_err(|e| self.sqlite(e))?
            .ok_or(StoreError::NoSuchBuild(id))?;
        let jobs = self.load_jobs(id).map_err(|e| self.sqlite(e))?;
        let samples = self.load_samples(id).map_err(|e| self.sqlite(e))?;
        let outside = self.load_outside(id).map_err(|e| self.sqlite(e))?;
        let events = self.load_events(id).map_err(|e| self.sqlite(e))?;
        let room = self.load_room(id).map_err(|e| self.sqlite(e))?;
        Ok(BuildReport {
            schema: REPORT_SCHEMA,
            build,
            jobs,
            samples,
            outside,
            events,
            room,
        })
    }

    /// The process id of build `id`'s governor, when it was recorded (builds since version 8).
    pub fn governor_pid(&self, id: i64) -> Result<Option<u32>, StoreError> {
        self.conn
            .query_row(
                "SELECT governor_pid FROM builds WHERE id = ?1",
                [id],
                |row| row.get(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(|e| self.sqlite(e))
    }

    /// The `count` most recent builds, newest first, with their numbers of jobs.
    pub fn list_builds(&self, count: usize) -> Result<Vec<Listed>, StoreError> {
        let mut query = self
            .conn
            .prepare(&format!(
                "SELECT {BUILD_COLUMNS}, governor_pid,
                        (SELECT COUNT(*) FROM jobs WHERE jobs.build_id = builds.id)
                 FROM builds ORDER BY id DESC LIMIT ?1"
            ))
            .map_err(|e| self.sqlite(e))?;
        let rows = query
            .query_map([count as i64], |row| {
                Ok(Listed {
                    build: build_of(row)?,
                    governor_pid: row.get(11)?,
                    jobs: row.get::<_, i64>(12)? as u64,
                })
            })
            .map_err(|e| self.sqlite(e))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(|e| self.sqlite(e))
    }
}

/// One build of [`History::list_builds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub build: BuildRecord,
    pub jobs: u64,
    pub governor_pid: Option<u32>,
}

/// A row of [`BUILD_COLUMNS`].
fn build_of(row: &Row) -> rusqlite::Result<BuildRecord> {
    Ok(BuildRecord {
        id: row.get(0)?,
        started_unix_ms: row.get(1)?,
        duration_ms: row.get::<_, Option<i64>>(2)?.map(|v| v as u64),
        command: row.get(3)?,
        cwd: row.get(4)?,
        budget: row.get::<_, i64>(5)? as u64,
        budget_source: row.get(6)?,
        slots: row.get(7)?,
        exit_code: row.get(8)?,
        peak_total: row.get::<_, Option<i64>>(9)?.map(|v| v as u64),
        parallelism_set: parallelism_set(row, 10)?,
    })
}

/// The variables headroom set, in column `index` of a `builds` row: a JSON array, or NULL for
/// builds recorded before the history kept them.
fn parallelism_set(row: &Row, index: usize) -> rusqlite::Result<Vec<String>> {
    match row.get::<_, Option<String>>(index)? {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(e))),
    }
}
