//! Measured peaks that travel between machines: what this history exports for `headroom
//! history push`, and how it takes in what `headroom history pull` fetched. Entries are keyed
//! by portable keys (no paths of the machine that measured them) and carry when they were
//! measured, so that the newer of two measurements of one job wins everywhere. Each also
//! carries the seconds of build work that waited on the job, so a first build from shared
//! history also starts the jobs on its longest path first, as a warm rebuild does.

use std::collections::{BTreeMap, HashMap};

use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::history::peaks::profile_of;
use crate::history::{History, StoreError};

/// A peak larger than this is no compiler's: an entry claiming one is refused.
const LARGEST_BELIEVABLE_PEAK: u64 = 1 << 44;

/// One job's last clean run, as machines share it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedPeak {
    pub peak: u64,
    /// The run's CPU and wall milliseconds and its shape (fractions of the peak per slice),
    /// when a profile was recorded.
    pub cpu_ms: Option<u64>,
    pub wall_ms: Option<u64>,
    pub profile: Option<String>,
    pub measured_unix_ms: i64,
    /// Milliseconds of the build's work that waited on the job when it last ran there.
    #[serde(default)]
    pub waiting_ms: Option<u64>,
}

/// What [`History::take_shared`] did with the entries it was given.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Taken {
    /// Entries for jobs the shared table did not know.
    pub new: usize,
    /// Entries newer than what the table had.
    pub newer: usize,
    /// Entries no newer than what the table had.
    pub kept: usize,
    /// Entries that are not believable (a bad key, a zero or huge peak, a broken profile),
    /// by key.
    pub refused: Vec<String>,
}

impl History {
    /// The newest clean peak of every job recorded with a portable key, by that key, with the
    /// seconds that waited on it (`waiting_seconds`, by local key).
    pub fn shareable_peaks(
        &self,
        waiting_seconds: &HashMap<String, f64>,
    ) -> Result<BTreeMap<String, SharedPeak>, StoreError> {
        // SQLite takes the other columns from the row holding MAX().
        let sql = "SELECT portable_key, peak, profile_cpu_ms, profile_wall_ms, profile,
                          MAX(measured_unix_ms), key
                   FROM peaks WHERE portable_key IS NOT NULL AND measured_unix_ms IS NOT NULL
                   GROUP BY portable_key";
        let read = || -> rusqlite::Result<BTreeMap<String, SharedPeak>> {
            let mut statement = self.conn.prepare(sql)?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    SharedPeak {
                        peak: row.get::<_, i64>(1)? as u64,
                        cpu_ms: row.get::<_, Option<i64>>(2)?.map(|ms| ms as u64),
                        wall_ms: row.get::<_, Option<i64>>(3)?.map(|ms| ms as u64),
                        profile: row.get(4)?,
                        measured_unix_ms: row.get(5)?,
                        waiting_ms: waiting_seconds
                            .get(&row.get::<_, String>(6)?)
                            .map(|seconds| (seconds * 1000.0).round() as u64),
                    },
                ))
            })?;
            rows.collect()
        };
        read().map_err(|e| self.sqlite(e))
    }

    /// Takes in peaks other machines measured, in one transaction: an entry replaces what the
    /// shared table has for its key only when it was measured later.
    pub fn take_shared(
        &mut self,
        entries: &BTreeMap<String, SharedPeak>,
    ) -> Result<Taken, StoreError> {
        let mut taken = Taken::default();
        self.in_transaction(|tx| {
            let mut known =
                tx.prepare("SELECT measured_unix_ms FROM shared_peaks WHERE portable_key = ?1")?;
            let mut upsert = tx.prepare(
                "INSERT INTO shared_peaks (portable_key, peak, profile_cpu_ms, profile_wall_ms,
                     profile, measured_unix_ms, waiting_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(portable_key) DO UPDATE SET peak = excluded.peak,
                     profile_cpu_ms = excluded.profile_cpu_ms,
                     profile_wall_ms = excluded.profile_wall_ms, profile = excluded.profile,
                     measured_unix_ms = excluded.measured_unix_ms,
                     waiting_ms = excluded.waiting_ms",
            )?;
            for (key, entry) in entries {
                if !believable(key, entry) {
                    taken.refused.push(key.escape_debug().to_string());
                    continue;
                }
                let measured: Option<i64> = known
                    .query_row([key], |row| row.get(0))
                    .map(Some)
                    .or_else(|err| match err {
                        rusqlite::Error::QueryReturnedNoRows => Ok(None),
                        err => Err(err),
                    })?;
                match measured {
                    Some(measured) if measured >= entry.measured_unix_ms => {
                        taken.kept += 1;
                        continue;
                    }
                    Some(_) => taken.newer += 1,
                    None => taken.new += 1,
                }
                upsert.execute(params![
                    key,
                    entry.peak as i64,
                    entry.cpu_ms.map(|ms| ms as i64),
                    entry.wall_ms.map(|ms| ms as i64),
                    entry.profile,
                    entry.measured_unix_ms,
                    entry.waiting_ms.map(|ms| ms as i64),
                ])?;
            }
            Ok(())
        })?;
        Ok(taken)
    }

    /// The seconds of work that waited on each job where it last ran on another machine, by
    /// portable key.
    pub fn shared_waiting_seconds(&self) -> Result<HashMap<String, f64>, StoreError> {
        let read = || -> rusqlite::Result<HashMap<String, f64>> {
            let mut statement = self.conn.prepare(
                "SELECT portable_key, waiting_ms FROM shared_peaks WHERE waiting_ms IS NOT NULL",
            )?;
            let rows = statement.query_map([], |row| {
                Ok((row.get(0)?, row.get::<_, i64>(1)? as f64 / 1000.0))
            })?;
            rows.collect()
        };
        read().map_err(|e| self.sqlite(e))
    }
}

/// Whether an entry from another machine could be a real measurement: a portable key (16
/// lowercase hex digits), a peak above zero and below [`LARGEST_BELIEVABLE_PEAK`], and either
/// no profile or a whole one.
fn believable(key: &str, entry: &SharedPeak) -> bool {
    let key_ok = key.len() == 16 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let profile_ok = match (&entry.profile, entry.cpu_ms, entry.wall_ms) {
        (None, None, None) => true,
        (Some(shape), Some(cpu), Some(wall)) => profile_of(
            entry.peak as i64,
            Some(cpu as i64),
            Some(wall as i64),
            Some(shape),
        )
        .is_some(),
        _ => false,
    };
    key_ok && (1..LARGEST_BELIEVABLE_PEAK).contains(&entry.peak) && profile_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::tests::{build, job};

    const KEY: &str = "00112233445566ff";

    fn entry(peak: u64, measured_unix_ms: i64) -> SharedPeak {
        SharedPeak {
            peak,
            cpu_ms: None,
            wall_ms: None,
            profile: None,
            measured_unix_ms,
            waiting_ms: Some(2500),
        }
    }

    #[test]
    fn clean_runs_are_shareable_by_portable_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let id = history.begin_build(&build()).unwrap();
        history
            .record_job(id, &job(0, "a", 100), KEY, None)
            .unwrap();
        let mut failed = job(1, "b", 900);
        failed.exit_code = Some(1);
        history
            .record_job(id, &failed, "ffffffffffffffff", None)
            .unwrap();
        let waiting = HashMap::from([("a".to_string(), 1.5)]);
        let shareable = history.shareable_peaks(&waiting).unwrap();
        assert_eq!(shareable.keys().collect::<Vec<_>>(), vec![KEY]);
        assert_eq!(shareable[KEY].peak, 100);
        assert_eq!(shareable[KEY].waiting_ms, Some(1500));
        assert!(shareable[KEY].measured_unix_ms > 1_700_000_000_000);
    }

    #[test]
    fn the_newer_measurement_wins_here_and_in_the_shared_table() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let taken = history
            .take_shared(&BTreeMap::from([(KEY.to_string(), entry(300, 1000))]))
            .unwrap();
        assert_eq!(taken.new, 1);
        let past = history.past_run("local", KEY).unwrap().unwrap();
        assert_eq!((past.peak, past.shared), (300, true));
        assert_eq!(
            history.shared_waiting_seconds().unwrap(),
            HashMap::from([(KEY.to_string(), 2.5)])
        );
        // An older entry is kept out; a newer one replaces it.
        let older = BTreeMap::from([(KEY.to_string(), entry(200, 999))]);
        assert_eq!(history.take_shared(&older).unwrap().kept, 1);
        assert_eq!(history.past_run("local", KEY).unwrap().unwrap().peak, 300);
        // This machine's own measurement, made now, is newer than the shared one.
        let id = history.begin_build(&build()).unwrap();
        history
            .record_job(id, &job(0, "local", 100), KEY, None)
            .unwrap();
        let own = history.past_run("local", KEY).unwrap().unwrap();
        assert_eq!((own.peak, own.shared), (100, false));
        // Until another machine measures it later still.
        let later = BTreeMap::from([(KEY.to_string(), entry(400, i64::MAX))]);
        assert_eq!(history.take_shared(&later).unwrap().newer, 1);
        let shared = history.past_run("local", KEY).unwrap().unwrap();
        assert_eq!((shared.peak, shared.shared), (400, true));
    }

    #[test]
    fn unbelievable_entries_are_refused_and_the_rest_taken() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = History::open(&dir.path().join("h.sqlite")).unwrap();
        let broken_profile = SharedPeak {
            cpu_ms: Some(10),
            wall_ms: Some(10),
            profile: Some("0.5 seven".into()),
            ..entry(100, 1)
        };
        let whole_profile = SharedPeak {
            cpu_ms: Some(10),
            wall_ms: Some(10),
            profile: Some("0.500 1.000".into()),
            ..entry(100, 1)
        };
        let entries = BTreeMap::from([
            ("../../etc/passwd".to_string(), entry(100, 1)),
            ("000000000000000A".to_string(), entry(100, 1)),
            ("1111111111111111".to_string(), entry(0, 1)),
            ("2222222222222222".to_string(), entry(u64::MAX, 1)),
            ("3333333333333333".to_string(), broken_profile),
            ("4444444444444444".to_string(), whole_profile),
        ]);
        let taken = history.take_shared(&entries).unwrap();
        assert_eq!(taken.refused.len(), 5, "{taken:?}");
        assert_eq!(taken.new, 1);
        let past = history.past_run("-", "4444444444444444").unwrap().unwrap();
        assert!(past.profile.is_some());
    }
}
