//! The `outside_processes` table: the processes of a build that ran outside every admitted
//! job, so a report can say what headroom did not govern.

use headroom_report::OutsideProcess;
use rusqlite::params;

use super::{History, StoreError};

impl History {
    /// Records the processes of build `build_id` that ran outside every admitted job, in place
    /// of any recorded for it before.
    pub fn record_outside(
        &mut self,
        build_id: i64,
        processes: &[OutsideProcess],
    ) -> Result<(), StoreError> {
        self.in_transaction(|tx| {
            tx.execute(
                "DELETE FROM outside_processes WHERE build_id = ?1",
                [build_id],
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO outside_processes VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for process in processes {
                insert.execute(params![
                    build_id,
                    process.pid,
                    process.name,
                    process.compiler_like,
                    process.peak as i64,
                    process.first_seen_ms as i64,
                    process.last_seen_ms as i64,
                    process.reason,
                ])?;
            }
            Ok(())
        })
    }

    pub(super) fn load_outside(&self, id: i64) -> rusqlite::Result<Vec<OutsideProcess>> {
        let mut query = self.conn.prepare(
            "SELECT pid, name, compiler_like, peak, first_seen_ms, last_seen_ms, reason
             FROM outside_processes WHERE build_id = ?1 ORDER BY rowid",
        )?;
        let rows = query.query_map([id], |row| {
            let unsigned = |i| row.get::<_, i64>(i).map(|v| v as u64);
            Ok(OutsideProcess {
                pid: row.get(0)?,
                name: row.get(1)?,
                compiler_like: row.get(2)?,
                peak: unsigned(3)?,
                first_seen_ms: unsigned(4)?,
                last_seen_ms: unsigned(5)?,
                reason: row.get(6)?,
            })
        })?;
        rows.collect()
    }
}
