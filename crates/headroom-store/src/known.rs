//! What the history knows of every job, read into memory once before a build starts: the
//! governor predicts each job from it while it holds the lock every admission takes, so no
//! compiler call ever waits on SQLite (another process may hold the history's write lock for
//! as long as it likes).

use std::collections::HashMap;

use headroom_sched::PastRun;

use crate::history::peaks::{measured_of, newer_of, Measured, PEAK_COLUMNS};
use crate::history::{History, StoreError};

/// Every measured peak, this machine's and shared, and every farmed job's local share.
#[derive(Debug, Default)]
pub struct KnownPeaks {
    /// By job key.
    own: HashMap<String, Measured>,
    /// By portable key.
    shared: HashMap<String, Measured>,
    /// By job key.
    local_shares: HashMap<String, u64>,
}

impl KnownPeaks {
    /// Job `key`'s last clean run, as [`History::past_run`] would answer.
    pub fn past_run(&self, key: &str, portable_key: &str) -> Option<PastRun> {
        newer_of(
            self.own.get(key).cloned(),
            self.shared.get(portable_key).cloned(),
        )
    }

    /// What job `key` used here when a farm node last compiled it, as
    /// [`History::local_share`] would answer.
    pub fn local_share(&self, key: &str) -> Option<u64> {
        self.local_shares.get(key).copied()
    }
}

impl History {
    /// Reads every peak and local share into memory.
    pub fn known_peaks(&self) -> Result<KnownPeaks, StoreError> {
        let by_key = |table: &str, key: &str| -> rusqlite::Result<HashMap<String, Measured>> {
            let mut query = self.conn.prepare(&format!(
                "SELECT {PEAK_COLUMNS}, {key} FROM {table} WHERE {key} IS NOT NULL"
            ))?;
            let rows = query.query_map([], |row| Ok((row.get(5)?, measured_of(row)?)))?;
            rows.collect()
        };
        let read = || -> rusqlite::Result<KnownPeaks> {
            let mut query = self.conn.prepare("SELECT key, bytes FROM local_shares")?;
            let local_shares = query
                .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as u64)))?
                .collect::<rusqlite::Result<_>>()?;
            Ok(KnownPeaks {
                own: by_key("peaks", "key")?,
                shared: by_key("shared_peaks", "portable_key")?,
                local_shares,
            })
        };
        read().map_err(|e| self.sqlite(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::tests::{build, job};
    use crate::SharedPeak;

    const PA: &str = "00000000000000aa";
    const PS: &str = "00000000000000bb";
    const PF: &str = "00000000000000cc";

    #[test]
    fn known_peaks_answer_as_the_history_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let id = history.begin_build(&build()).unwrap();
        history.record_job(id, &job(0, "a", 100), PA, None).unwrap();
        let farmed = crate::JobRecord {
            node: Some("10.0.0.5:3632".into()),
            ..job(1, "f", 90)
        };
        history.record_job(id, &farmed, PF, None).unwrap();
        let shared = SharedPeak {
            peak: 500,
            cpu_ms: None,
            wall_ms: None,
            profile: None,
            measured_unix_ms: crate::history::peaks::unix_ms_now() + 60_000,
            waiting_ms: None,
        };
        history
            .take_shared(&[(PA.to_string(), shared.clone()), (PS.to_string(), shared)].into())
            .unwrap();
        let known = history.known_peaks().unwrap();
        for (key, portable_key) in [("a", PA), ("a", "-"), ("b", PS), ("b", "-"), ("f", PF)] {
            assert_eq!(
                known.past_run(key, portable_key),
                history.past_run(key, portable_key).unwrap(),
                "{key} {portable_key}"
            );
            assert_eq!(known.local_share(key), history.local_share(key).unwrap());
        }
        assert_eq!(
            known.past_run("a", PA).unwrap().peak,
            500,
            "the newer shared one"
        );
        assert_eq!(known.local_share("f"), Some(90));
    }
}
