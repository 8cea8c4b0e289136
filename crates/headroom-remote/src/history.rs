//! Shared build history: `push` publishes this machine's measured peaks for a project, `pull`
//! takes in what every machine published, so a first build on a new machine is predicted from
//! peaks measured elsewhere (prediction source `shared`).
//!
//! ```text
//! <root>/blobs/ab/abcdef…                 the project's peaks, by portable key (JSON)
//! <root>/history/v1/<project>.json        the project's index: which blob holds its peaks
//! ```
//!
//! Entries are keyed by portable keys (`headroom_govern::portable`: no paths, the compiler's
//! name and version) and carry when they were measured; merging keeps the newer measurement
//! of each job. A pusher stores the merged blob before the index that names it, waits, reads
//! the index again, and merges again if a concurrent pusher's index left its entries out.

use std::collections::BTreeMap;
use std::time::Instant;

use headroom_store::{History, SharedPeak, Taken};
use serde::{Deserialize, Serialize};

use crate::kernels::SETTLE;
use crate::store::{check_key, BlobRead, Store, StoreError, MAX_INDEX_BYTES};

/// What the index says it is, so that another file in its place is refused.
const FORMAT: &str = "headroom-history";
/// The layout's version: indexes of another version are not read.
const VERSION: u32 = 1;
/// How often a pusher merges again after a concurrent pusher's index left its entries out.
/// Every pusher of a project writes the same index, so each round at least one of them gets
/// through: this covers a team's CI jobs pushing together, with a backoff that spreads them.
const PUBLISH_ATTEMPTS: usize = 16;
/// The most a peaks blob is read: a peak is about 150 bytes, so this is over a million jobs.
const MAX_PEAKS_BYTES: u64 = 256 << 20;

/// The store's record of one project's shared peaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct HistoryIndex {
    format: String,
    version: u32,
    project: String,
    /// The blake3 hash of the blob that holds the peaks.
    blob: String,
    entries: usize,
}

/// The peaks blob: measured peaks by portable key.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Peaks {
    entries: BTreeMap<String, SharedPeak>,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    History(#[from] headroom_store::StoreError),
    #[error("the project name `{0}` has a character other than A-Z a-z 0-9 . _ - +; pass another with --project")]
    BadProject(String),
    #[error("the shared history of `{project}` in {store} kept changing under other pushers; push again")]
    Contended { project: String, store: String },
}

/// What a push did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PushSummary {
    /// Peaks this machine has to share.
    pub local: usize,
    /// Of those, peaks the store lacked or had older.
    pub published: usize,
    /// Peaks in the store's history of the project now.
    pub entries: usize,
    /// What was there before could not be read (corrupt, or not ours) and was replaced.
    pub replaced: Option<String>,
}

/// What a pull found.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PullSummary {
    /// Peaks in the store's history of the project.
    pub entries: usize,
    /// What the local history did with them.
    pub taken: Taken,
    /// Why nothing could be used, when nothing could: no history for the project yet, or
    /// what is there is corrupt.
    pub unusable: Option<String>,
}

/// The key of a project's index. A project's name may hold only `A-Z a-z 0-9 . _ - +`.
pub fn index_key(project: &str) -> Result<String, HistoryError> {
    let plain = !project.is_empty()
        && !project.starts_with('.')
        && project
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b));
    if !plain {
        return Err(HistoryError::BadProject(project.escape_debug().to_string()));
    }
    let key = format!("history/v{VERSION}/{project}.json");
    check_key(&key)?;
    Ok(key)
}

/// A name for `text` (a directory's name) that [`index_key`] takes: every other character
/// becomes `-`.
pub fn project_name(text: &str) -> String {
    let name: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    match name.trim_start_matches('.') {
        "" => "project".to_string(),
        name => name.to_string(),
    }
}

/// Publishes this machine's peaks for `project` (`History::shareable_peaks`), merged into what
/// the store has.
pub fn push(
    store: &Store,
    local: &BTreeMap<String, SharedPeak>,
    project: &str,
) -> Result<PushSummary, HistoryError> {
    let key = index_key(project)?;
    if store.read_only() {
        return Err(StoreError::ReadOnly {
            store: store.shown().to_string(),
        }
        .into());
    }
    let mut summary = PushSummary {
        local: local.len(),
        ..PushSummary::default()
    };
    for attempt in 0..=PUBLISH_ATTEMPTS {
        let started = Instant::now();
        let there = match read(store, &key)? {
            Read::Found(peaks) => peaks,
            Read::Absent => Peaks::default(),
            Read::Unusable(why) => {
                summary.replaced.get_or_insert(why);
                Peaks::default()
            }
        };
        let mut merged = there.clone();
        let published = merge(&mut merged.entries, local);
        if attempt == 0 {
            summary.published = published;
        }
        summary.entries = merged.entries.len();
        if published == 0 {
            return Ok(summary);
        }
        if attempt == PUBLISH_ATTEMPTS {
            break;
        }
        let bytes = serde_json::to_vec(&merged).expect("peaks always serialize");
        let (blob, _) = store.put_blob(&bytes)?;
        let index = HistoryIndex {
            format: FORMAT.to_string(),
            version: VERSION,
            project: project.to_string(),
            blob,
            entries: merged.entries.len(),
        };
        let index = serde_json::to_vec_pretty(&index).expect("indexes always serialize");
        store.put(&key, &index)?;
        // A pusher that read the index just before we wrote it writes it again without our
        // entries, up to its own read-and-write time later: wait well past ours, longer each
        // round and by a random share so that pushers spread out, then read it again (the
        // loop's next turn) and merge where it did.
        let pause = SETTLE * (attempt as u32 + 1) + started.elapsed() * 4;
        std::thread::sleep(pause + pause.mul_f64(fastrand::f64()));
    }
    Err(HistoryError::Contended {
        project: project.to_string(),
        store: store.shown().to_string(),
    })
}

/// Takes in the store's peaks for `project`.
pub fn pull(
    store: &Store,
    history: &mut History,
    project: &str,
) -> Result<PullSummary, HistoryError> {
    let key = index_key(project)?;
    let peaks = match read(store, &key)? {
        Read::Found(peaks) => peaks,
        Read::Absent => {
            return Ok(PullSummary {
                unusable: Some(format!(
                    "no shared history of `{project}` in {} yet: push some with `headroom history push`",
                    store.shown()
                )),
                ..PullSummary::default()
            })
        }
        Read::Unusable(why) => {
            return Ok(PullSummary {
                unusable: Some(why),
                ..PullSummary::default()
            })
        }
    };
    Ok(PullSummary {
        entries: peaks.entries.len(),
        taken: history.take_shared(&peaks.entries)?,
        unusable: None,
    })
}

/// Merges `mine` into `there`, keeping the newer measurement of each job; returns how many of
/// `mine` changed it.
fn merge(there: &mut BTreeMap<String, SharedPeak>, mine: &BTreeMap<String, SharedPeak>) -> usize {
    let mut changed = 0;
    for (key, peak) in mine {
        let newer = there
            .get(key)
            .is_none_or(|old| old.measured_unix_ms < peak.measured_unix_ms);
        if newer {
            there.insert(key.clone(), peak.clone());
            changed += 1;
        }
    }
    changed
}

/// A project's peaks as read from the store.
enum Read {
    Found(Peaks),
    Absent,
    /// What is there cannot be used, for this reason.
    Unusable(String),
}

fn read(store: &Store, key: &str) -> Result<Read, StoreError> {
    let unusable = |why: &str| Ok(Read::Unusable(format!("{key} in {}: {why}", store.shown())));
    let bytes = match store.get(key, MAX_INDEX_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(Read::Absent),
        Err(StoreError::TooBig { limit, .. }) => {
            return unusable(&format!("over {limit} bytes, more than an index ever is"))
        }
        Err(err) => return Err(err),
    };
    let index: HistoryIndex = match serde_json::from_slice(&bytes) {
        Ok(index) => index,
        Err(err) => return unusable(&format!("not a shared-history index ({err})")),
    };
    if index.format != FORMAT || index.version != VERSION {
        return unusable(&format!(
            "format `{}` version {}, where this headroom reads `{FORMAT}` version {VERSION}",
            index.format, index.version
        ));
    }
    let bytes = match store.get_blob(&index.blob, MAX_PEAKS_BYTES) {
        Ok(BlobRead::Intact(bytes)) => bytes,
        Ok(BlobRead::Missing) => return unusable("the peaks blob it names is missing"),
        Ok(BlobRead::Corrupt) | Err(StoreError::BadKey { .. }) => {
            return unusable(&format!(
                "the peaks blob it names does not match its blake3 hash or is over {MAX_PEAKS_BYTES} bytes"
            ))
        }
        Err(err) => return Err(err),
    };
    match serde_json::from_slice(&bytes) {
        Ok(peaks) => Ok(Read::Found(peaks)),
        Err(err) => unusable(&format!("its peaks blob is not a list of peaks ({err})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peak(bytes: u64, measured_unix_ms: i64) -> SharedPeak {
        SharedPeak {
            peak: bytes,
            cpu_ms: None,
            wall_ms: None,
            profile: None,
            measured_unix_ms,
            waiting_ms: None,
        }
    }

    #[test]
    fn merging_keeps_the_newer_measurement_of_each_job() {
        let mut there = BTreeMap::from([
            ("a".to_string(), peak(1, 10)),
            ("b".to_string(), peak(2, 30)),
        ]);
        let mine = BTreeMap::from([
            ("a".to_string(), peak(5, 20)),
            ("b".to_string(), peak(6, 20)),
            ("c".to_string(), peak(7, 20)),
        ]);
        assert_eq!(merge(&mut there, &mine), 2);
        assert_eq!(there["a"].peak, 5);
        assert_eq!(there["b"].peak, 2);
        assert_eq!(there["c"].peak, 7);
        assert_eq!(merge(&mut there, &mine), 0);
    }

    #[test]
    fn project_names_are_plain() {
        assert_eq!(index_key("torch-cpp").unwrap(), "history/v1/torch-cpp.json");
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(
                matches!(index_key(bad), Err(HistoryError::BadProject(_))),
                "{bad}"
            );
        }
        assert_eq!(project_name("my proj (2)"), "my-proj--2-");
        assert_eq!(project_name(".."), "project");
    }

    #[test]
    fn a_push_and_a_pull_through_a_directory_store() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("store").display());
        let store = Store::open(&url, false).unwrap();
        let mut here = History::open(&dir.path().join("here.sqlite")).unwrap();
        let absent = pull(&store, &mut here, "p").unwrap();
        assert!(absent.unusable.unwrap().contains("no shared history"));
        // Nothing to share publishes nothing.
        let empty = push(&store, &BTreeMap::new(), "p").unwrap();
        assert_eq!((empty.local, empty.published), (0, 0));
        let key = "0123456789abcdef".to_string();
        let there = BTreeMap::from([(key.clone(), peak(700, 5))]);
        let pushed = push(&store, &there, "p").unwrap();
        assert_eq!((pushed.local, pushed.published, pushed.entries), (1, 1, 1));
        let pulled = pull(&store, &mut here, "p").unwrap();
        assert_eq!((pulled.entries, pulled.taken.new), (1, 1));
        let past = here.past_run("other", &key).unwrap().unwrap();
        assert_eq!((past.peak, past.shared), (700, true));
        // A flipped byte in the blob is a miss, not a crash.
        let blobs = dir.path().join("store/blobs");
        let shard = std::fs::read_dir(&blobs)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let blob = std::fs::read_dir(shard)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&blob).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&blob, bytes).unwrap();
        let corrupt = pull(&store, &mut here, "p").unwrap();
        assert!(corrupt.unusable.unwrap().contains("blake3"));
    }
}
