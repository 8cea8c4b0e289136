//! The `samples`, `job_events` and `room` tables: what a running build's sampler saw over time
//! (each job's memory, what was done to it, the machine's room). They are written in batches
//! and kept only for the most recent builds.

use headroom_report::{JobEvent, JobEventKind, Room, Sample};
use rusqlite::{params, Transaction};

use super::{History, StoreError};

impl History {
    /// Appends what a running build's sampler saw: the jobs' memory, what was done to them,
    /// and the machine's room.
    pub fn record_samples(
        &mut self,
        build_id: i64,
        samples: &[Sample],
        events: &[JobEvent],
        room: &[Room],
    ) -> Result<(), StoreError> {
        self.in_transaction(|tx| insert_samples(tx, build_id, samples, events, room))
    }

    pub(super) fn load_events(&self, id: i64) -> rusqlite::Result<Vec<JobEvent>> {
        let mut query = self.conn.prepare(
            "SELECT t_ms, job_id, kind FROM job_events WHERE build_id = ?1 ORDER BY t_ms, rowid",
        )?;
        let rows = query.query_map([id], |row| {
            let kind: String = row.get(2)?;
            Ok((
                row.get::<_, i64>(0)? as u64,
                row.get::<_, i64>(1)? as u64,
                kind,
            ))
        })?;
        // A kind this version does not know (written by a newer one) is left out.
        Ok(rows
            .collect::<rusqlite::Result<Vec<_>>>()?
            .into_iter()
            .filter_map(|(t_ms, job_id, kind)| {
                let kind = JobEventKind::ALL.into_iter().find(|k| k.name() == kind)?;
                Some(JobEvent { t_ms, job_id, kind })
            })
            .collect())
    }

    pub(super) fn load_room(&self, id: i64) -> rusqlite::Result<Vec<Room>> {
        let mut query = self
            .conn
            .prepare("SELECT t_ms, bytes FROM room WHERE build_id = ?1 ORDER BY t_ms")?;
        let rows = query.query_map([id], |row| {
            Ok(Room {
                t_ms: row.get::<_, i64>(0)? as u64,
                bytes: row.get::<_, i64>(1)? as u64,
            })
        })?;
        rows.collect()
    }

    pub(super) fn load_samples(&self, id: i64) -> rusqlite::Result<Vec<Sample>> {
        let mut query = self.conn.prepare(
            "SELECT t_ms, job_id, bytes FROM samples WHERE build_id = ?1 ORDER BY t_ms, job_id",
        )?;
        let rows = query.query_map([id], |row| {
            Ok(Sample {
                t_ms: row.get::<_, i64>(0)? as u64,
                job_id: row.get::<_, i64>(1)? as u64,
                bytes: row.get::<_, i64>(2)? as u64,
            })
        })?;
        rows.collect()
    }
}

/// Appends a running build's samples, the events of its jobs and the machine's room.
pub(super) fn insert_samples(
    tx: &Transaction,
    build_id: i64,
    samples: &[Sample],
    events: &[JobEvent],
    room: &[Room],
) -> rusqlite::Result<()> {
    let mut insert = tx.prepare_cached("INSERT INTO samples VALUES (?1, ?2, ?3, ?4)")?;
    for sample in samples {
        insert.execute(params![
            build_id,
            sample.t_ms as i64,
            sample.job_id as i64,
            sample.bytes as i64
        ])?;
    }
    let mut insert = tx.prepare_cached("INSERT INTO job_events VALUES (?1, ?2, ?3, ?4)")?;
    for event in events {
        insert.execute(params![
            build_id,
            event.t_ms as i64,
            event.job_id as i64,
            event.kind.name()
        ])?;
    }
    let mut insert = tx.prepare_cached("INSERT INTO room VALUES (?1, ?2, ?3)")?;
    for reading in room {
        insert.execute(params![build_id, reading.t_ms as i64, reading.bytes as i64])?;
    }
    Ok(())
}
