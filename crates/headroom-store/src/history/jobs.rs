//! The `jobs` table: every job a build ran, one transaction each, so a crash loses at most the
//! job being written.

use headroom_report::JobRecord;
use headroom_sched::Profile;
use rusqlite::{params, Transaction};

use super::peaks::learn;
use super::{History, StoreError};

impl History {
    /// Records a finished job; a clean run also becomes its peak, under its key and, for
    /// sharing, its `portable_key`.
    pub fn record_job(
        &mut self,
        build_id: i64,
        job: &JobRecord,
        portable_key: &str,
        profile: Option<&Profile>,
    ) -> Result<(), StoreError> {
        self.in_transaction(|tx| insert_job(tx, build_id, job, portable_key, profile))
    }

    pub(super) fn load_jobs(&self, id: i64) -> rusqlite::Result<Vec<JobRecord>> {
        let mut query = self.conn.prepare(
            "SELECT job_id, key, grp, label, compiler, command, cwd, offered_ms, start_ms, end_ms, peak,
                    cpu_ms, exit_code, signal, predicted, prediction_source, attempts, suspends, requeues,
                    oom_retries, lowered_flags, over_budget, nice, node, node_start_ms
             FROM jobs WHERE build_id = ?1 ORDER BY job_id",
        )?;
        let rows = query.query_map([id], |row| {
            let unsigned = |i| row.get::<_, i64>(i).map(|v| v as u64);
            Ok(JobRecord {
                job_id: unsigned(0)?,
                key: row.get(1)?,
                group: row.get(2)?,
                label: row.get(3)?,
                compiler: row.get(4)?,
                command: row.get(5)?,
                cwd: row.get(6)?,
                offered_ms: unsigned(7)?,
                start_ms: unsigned(8)?,
                end_ms: unsigned(9)?,
                peak: unsigned(10)?,
                cpu_ms: unsigned(11)?,
                exit_code: row.get(12)?,
                signal: row.get(13)?,
                predicted: unsigned(14)?,
                prediction_source: row.get(15)?,
                attempts: row.get(16)?,
                suspends: row.get(17)?,
                requeues: row.get(18)?,
                oom_retries: row.get(19)?,
                lowered_flags: row.get(20)?,
                over_budget: row.get(21)?,
                nice: row.get(22)?,
                node: row.get(23)?,
                node_start_ms: row.get::<_, Option<i64>>(24)?.map(|ms| ms as u64),
            })
        })?;
        rows.collect()
    }
}

/// Inserts finished job `job` of build `build_id`; a clean run also becomes its peak, under its
/// key and, for sharing, its `portable_key` ([`learn`]).
pub(super) fn insert_job(
    tx: &Transaction,
    build_id: i64,
    job: &JobRecord,
    portable_key: &str,
    profile: Option<&Profile>,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO jobs VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12,
         ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26)",
    )?
    .execute(params![
        build_id,
        job.job_id as i64,
        job.key,
        job.group,
        job.label,
        job.compiler,
        job.command,
        job.cwd,
        job.offered_ms as i64,
        job.start_ms as i64,
        job.end_ms as i64,
        job.peak as i64,
        job.cpu_ms as i64,
        job.exit_code,
        job.signal,
        job.predicted as i64,
        job.prediction_source,
        job.attempts,
        job.suspends,
        job.requeues,
        job.oom_retries,
        job.lowered_flags,
        job.over_budget,
        job.nice,
        job.node,
        job.node_start_ms.map(|ms| ms as i64),
    ])?;
    learn(tx, job, portable_key, profile)
}
