//! The `peaks` and `local_shares` tables: what a job's clean run teaches the next build. A run
//! here becomes its job's peak (and profile); a run a farm node compiled becomes only what it
//! used on this machine, its local share. Reads take the newer of this machine's peak and the
//! one other machines shared (`shared_peaks`, written by [`crate::shared`]).

use headroom_report::JobRecord;
use headroom_sched::{PastRun, Profile, Ran};
use rusqlite::{params, OptionalExtension, Row, Transaction};

use super::{History, StoreError};

/// What finished job `job` teaches: a clean run on a farm node its local share, a clean run
/// here with its own flags its peak (and profile), under its key and its `portable_key`.
pub(super) fn learn(
    tx: &Transaction,
    job: &JobRecord,
    portable_key: &str,
    profile: Option<&Profile>,
) -> rusqlite::Result<()> {
    let clean = job.exit_code == Some(0) && job.peak > 0;
    if clean && job.node.is_some() {
        // A farm node compiled it: what it used here is its local share, not its peak.
        tx.prepare_cached(
            "INSERT INTO local_shares (key, bytes) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET bytes = excluded.bytes",
        )?
        .execute(params![job.key, job.peak as i64])?;
    }
    // Only a clean run here tells the job's real peak; lowered flags change it too.
    if clean && job.node.is_none() && job.lowered_flags.is_none() {
        tx.prepare_cached(
            "INSERT INTO peaks (key, peak, runs, profile_cpu_ms, profile_wall_ms, profile,
                 portable_key, measured_unix_ms)
             VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(key) DO UPDATE SET peak = excluded.peak, runs = runs + 1,
                 profile_cpu_ms = excluded.profile_cpu_ms,
                 profile_wall_ms = excluded.profile_wall_ms, profile = excluded.profile,
                 portable_key = excluded.portable_key,
                 measured_unix_ms = excluded.measured_unix_ms",
        )?
        .execute(params![
            job.key,
            job.peak as i64,
            profile.map(|p| millis(p.cpu_seconds())),
            profile.map(|p| millis(p.wall_seconds())),
            profile.map(encode_shape),
            portable_key,
            unix_ms_now(),
        ])?;
    }
    Ok(())
}

/// A past run and when it was measured (Unix milliseconds; unknown for old rows).
pub(crate) type Measured = (PastRun, Option<i64>);

/// The columns of `peaks` and `shared_peaks` that [`measured_of`] reads, in its order.
pub(crate) const PEAK_COLUMNS: &str =
    "peak, profile_cpu_ms, profile_wall_ms, profile, measured_unix_ms";

impl History {
    /// The peak and profile of job `key`'s last clean run, here or, by its `portable_key`, on
    /// another machine that shared its history: this machine's own measurement wins unless
    /// the shared one is newer.
    pub fn past_run(&self, key: &str, portable_key: &str) -> Result<Option<PastRun>, StoreError> {
        let read = |sql: &str, key: &str| -> rusqlite::Result<Option<Measured>> {
            self.conn
                .prepare_cached(sql)?
                .query_row([key], measured_of)
                .optional()
        };
        let own = read(
            &format!("SELECT {PEAK_COLUMNS} FROM peaks WHERE key = ?1"),
            key,
        )
        .map_err(|e| self.sqlite(e))?;
        let shared = read(
            &format!("SELECT {PEAK_COLUMNS} FROM shared_peaks WHERE portable_key = ?1"),
            portable_key,
        )
        .map_err(|e| self.sqlite(e))?;
        Ok(newer_of(own, shared))
    }

    /// What job `key` used on this machine the last time a farm node compiled it.
    pub fn local_share(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.conn
            .prepare_cached("SELECT bytes FROM local_shares WHERE key = ?1")
            .and_then(|mut query| {
                query
                    .query_row([key], |row| row.get::<_, i64>(0))
                    .optional()
            })
            .map(|bytes| bytes.map(|b| b as u64))
            .map_err(|e| self.sqlite(e))
    }
}

/// A row of [`PEAK_COLUMNS`] as a past run, not yet marked shared.
pub(crate) fn measured_of(row: &Row) -> rusqlite::Result<Measured> {
    let peak: i64 = row.get(0)?;
    let cpu_ms: Option<i64> = row.get(1)?;
    let wall_ms: Option<i64> = row.get(2)?;
    let shape: Option<String> = row.get(3)?;
    Ok((
        PastRun {
            peak: peak as u64,
            profile: profile_of(peak, cpu_ms, wall_ms, shape.as_deref()),
            shared: false,
        },
        row.get(4)?,
    ))
}

/// What predicts a job: this machine's own measurement, unless the shared one is newer.
pub(crate) fn newer_of(own: Option<Measured>, shared: Option<Measured>) -> Option<PastRun> {
    match (own, shared) {
        (Some((_, Some(measured))), Some((shared, Some(shared_measured))))
            if shared_measured > measured =>
        {
            Some(PastRun {
                shared: true,
                ..shared
            })
        }
        (Some((own, _)), _) => Some(own),
        (None, Some((shared, _))) => Some(PastRun {
            shared: true,
            ..shared
        }),
        (None, None) => None,
    }
}

/// A profile's shape as text: the fraction of the peak per slice, to a thousandth.
fn encode_shape(profile: &Profile) -> String {
    let fractions: Vec<String> = profile
        .shape()
        .iter()
        .map(|fraction| format!("{fraction:.3}"))
        .collect();
    fractions.join(" ")
}

fn millis(seconds: f64) -> i64 {
    (seconds * 1000.0).round() as i64
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The profile a peak's row holds, when it holds a whole one.
pub(crate) fn profile_of(
    peak: i64,
    cpu_ms: Option<i64>,
    wall_ms: Option<i64>,
    shape: Option<&str>,
) -> Option<Profile> {
    let ran = cpu_ms.zip(wall_ms).map(|(cpu, wall)| Ran {
        cpu_seconds: cpu as f64 / 1000.0,
        wall_seconds: wall as f64 / 1000.0,
    })?;
    decode_shape(ran, peak as u64, shape?)
}

/// The profile that [`encode_shape`] wrote; `None` if the text is not one.
fn decode_shape(ran: Ran, peak: u64, text: &str) -> Option<Profile> {
    let slices: Option<Vec<u64>> = text
        .split(' ')
        .map(|fraction| {
            let fraction: f64 = fraction.parse().ok()?;
            (0.0..=1.0)
                .contains(&fraction)
                .then(|| (fraction * peak as f64).round() as u64)
        })
        .collect();
    Profile::new(ran, &slices?)
}
