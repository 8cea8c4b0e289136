//! The kernel cache's side of a shared store: `push` copies artifacts up, `pull` copies down
//! what a device needs, checked on the way like a bundle import.
//!
//! ```text
//! <root>/blobs/ab/abcdef…                    artifact bytes (the cache's blobs, same hashes)
//! <root>/kernels/v2/<backend>/<kernel>.json  the kernel's index: its cache entries, by target
//! ```
//!
//! Not every service can list keys (Redis cannot), so one index per kernel says what exists:
//! a reader asks for it, resolves, and fetches only the blob it picked. A pusher stores its
//! blobs first and writes the indexes last, each merged into what is there, so every index
//! any pusher writes names only stored blobs, and pushers of the same artifacts write the same
//! index. Without compare-and-swap two pushers of different targets can still overwrite each
//! other's merge, so a pusher waits well past one read-and-write time, checks that its targets
//! stayed, and merges again where they did not. `v2` is the cache's schema version: entries of
//! another schema are simply not seen.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use headroom_kernels::cache::{BlobCheck, Cache, CacheError, Entry, SelectError, SCHEMA_VERSION};
use headroom_kernels::manifest::is_valid_kernel_name;
use headroom_kernels::resolve::{resolve, Device, ResolveOptions};
use headroom_kernels::target::Backend;

use crate::store::{blob_key, BlobRead, Store, StoreError, MAX_INDEX_BYTES};

/// How often a pusher writes an index whose entries a concurrent pusher overwrote.
const PUBLISH_ATTEMPTS: usize = 5;
/// The least wait between writing indexes and checking that they kept our entries.
pub(crate) const SETTLE: Duration = Duration::from_millis(50);

/// The store's record of one kernel in one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KernelIndex {
    kernel: String,
    backend: Backend,
    /// Sorted by target, one per target.
    entries: Vec<Entry>,
}

/// The key of a kernel's index.
pub fn index_key(backend: Backend, kernel: &str) -> String {
    format!(
        "kernels/v{SCHEMA_VERSION}/{backend}/{kernel}.json",
        backend = backend.as_str()
    )
}

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("artifact {0} is missing or corrupt in the cache; run `headroom kernels build` again before pushing")]
    BadArtifact(String),
    #[error(
        "the index of kernel `{kernel}` in {store} kept changing under other pushers; push again"
    )]
    Contended { kernel: String, store: String },
}

/// What a push did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PushSummary {
    /// Artifacts now in the store's indexes.
    pub artifacts: usize,
    /// Of those, artifacts the store did not have as they are in the cache.
    pub new: usize,
    /// Blob bytes sent (blobs already there are not sent again).
    pub bytes_sent: u64,
}

/// Copies the artifacts of the named kernels (all when none is named) to the store.
pub fn push(store: &Store, cache: &Cache, kernels: &[String]) -> Result<PushSummary, PushError> {
    if store.read_only() {
        return Err(StoreError::ReadOnly {
            store: store.shown().to_string(),
        }
        .into());
    }
    let mut summary = PushSummary::default();
    let entries = cache.selected_entries(kernels)?;
    // `entries` is sorted by backend, then kernel: each group is one index.
    let mut pending: Vec<&[Entry]> = entries
        .chunk_by(|a, b| a.backend == b.backend && a.kernel == b.kernel)
        .collect();
    for entry in &entries {
        let bytes = cache
            .read_blob(&entry.record.blob)?
            .ok_or_else(|| PushError::BadArtifact(entry.artifact_path().display().to_string()))?;
        if store.put_blob(&bytes)?.1 {
            summary.bytes_sent += bytes.len() as u64;
        }
    }
    summary.artifacts = entries.len();
    for attempt in 0..PUBLISH_ATTEMPTS {
        let started = Instant::now();
        let mut written = Vec::new();
        for group in pending {
            if let Some(new) = merge_index(store, group)? {
                written.push(group);
                if attempt == 0 {
                    summary.new += new;
                }
            }
        }
        if written.is_empty() {
            return Ok(summary);
        }
        // A pusher that read an index just before we wrote it writes it again without our
        // entries: wait well past the time one read and write take, then check that ours
        // stayed, and merge again where they did not.
        let read_and_write = started.elapsed() / written.len() as u32;
        std::thread::sleep(SETTLE + read_and_write * 4 + SETTLE.mul_f64(fastrand::f64()));
        pending = Vec::new();
        for group in written {
            if !index_holds_targets(store, group)? {
                pending.push(group);
            }
        }
        if pending.is_empty() {
            return Ok(summary);
        }
    }
    Err(PushError::Contended {
        kernel: pending[0][0].kernel.clone(),
        store: store.shown().to_string(),
    })
}

/// Merges `mine` (one kernel, one backend) into the store's index; returns `None` when the
/// index already holds them all, else how many it lacked.
fn merge_index(store: &Store, mine: &[Entry]) -> Result<Option<usize>, StoreError> {
    let (kernel, backend) = (&mine[0].kernel, mine[0].backend);
    let mut index = read_index(store, kernel, backend)?
        .found()
        .unwrap_or_else(|| KernelIndex {
            kernel: kernel.clone(),
            backend,
            entries: Vec::new(),
        });
    let missing = mine
        .iter()
        .filter(|entry| !index.entries.contains(entry))
        .count();
    if missing == 0 {
        return Ok(None);
    }
    index
        .entries
        .retain(|there| !mine.iter().any(|entry| entry.target == there.target));
    index.entries.extend(mine.iter().cloned());
    index.entries.sort_by(|a, b| a.target.cmp(&b.target));
    let bytes = serde_json::to_vec_pretty(&index).expect("indexes always serialize");
    store.put(&index_key(backend, kernel), &bytes)?;
    Ok(Some(missing))
}

/// Whether the store's index has an entry for each target of `mine`. A concurrent pusher's
/// entry for one of them may have won: it names a stored blob too.
fn index_holds_targets(store: &Store, mine: &[Entry]) -> Result<bool, StoreError> {
    let (kernel, backend) = (&mine[0].kernel, mine[0].backend);
    Ok(read_index(store, kernel, backend)?
        .found()
        .is_some_and(|index| {
            mine.iter().all(|entry| {
                index
                    .entries
                    .iter()
                    .any(|there| there.target == entry.target)
            })
        }))
}

/// A kernel's index as read from the store.
enum IndexRead {
    Found(KernelIndex),
    Absent,
    /// What is there is not a well-formed index of that kernel, for this reason; it is ignored.
    Refused(String),
}

impl IndexRead {
    fn found(self) -> Option<KernelIndex> {
        match self {
            IndexRead::Found(index) => Some(index),
            IndexRead::Absent | IndexRead::Refused(_) => None,
        }
    }
}

fn read_index(store: &Store, kernel: &str, backend: Backend) -> Result<IndexRead, StoreError> {
    let bytes = match store.get(&index_key(backend, kernel), MAX_INDEX_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(IndexRead::Absent),
        Err(err @ StoreError::BadKey { .. }) => return Ok(IndexRead::Refused(err.to_string())),
        Err(StoreError::TooBig { limit, .. }) => {
            return Ok(IndexRead::Refused(format!(
                "it is over {limit} bytes, more than an index ever is"
            )))
        }
        Err(err) => return Err(err),
    };
    let index: KernelIndex = match serde_json::from_slice(&bytes) {
        Ok(index) => index,
        Err(err) => return Ok(IndexRead::Refused(format!("it is not an index: {err}"))),
    };
    let well_formed = index.kernel == kernel
        && index.backend == backend
        && index.entries.iter().all(|entry| {
            entry.is_well_formed() && entry.kernel == kernel && entry.backend == backend
        })
        && index
            .entries
            .windows(2)
            .all(|pair| pair[0].target < pair[1].target);
    Ok(if well_formed {
        IndexRead::Found(index)
    } else {
        IndexRead::Refused(format!(
            "it does not hold well-formed, sorted entries of kernel `{kernel}` ({backend}) only"
        ))
    })
}

/// What a pull did. Store trouble is reported here, not as an error: the caller goes on with
/// the local cache.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PullSummary {
    /// Artifacts written into the cache.
    pub fetched: Vec<Entry>,
    /// Artifacts picked that the cache already held.
    pub cached: usize,
    /// Blob bytes received.
    pub bytes: u64,
    /// Blobs that were missing or did not match their hash (keys in the store); none entered
    /// the cache.
    pub corrupt: Vec<String>,
    /// Indexes that were not well-formed (key and reason); they were ignored.
    pub refused: Vec<String>,
    /// The store's error, redacted, when it could not be reached; nothing after it was asked.
    pub unreachable: Option<String>,
}

/// Copies artifacts of the named kernels from the store into the cache: with a device, only
/// the one the resolver picks for it (the next best where that one's blob is corrupt);
/// without, every target.
pub fn pull(
    store: &Store,
    cache: &Cache,
    kernels: &[String],
    device: Option<(&Device, &ResolveOptions)>,
) -> Result<PullSummary, CacheError> {
    let mut summary = PullSummary::default();
    let backends = match device {
        Some((device, _)) => vec![device.backend()],
        None => vec![Backend::Cuda, Backend::Hip, Backend::Metal],
    };
    for kernel in kernels.iter().filter(|kernel| is_valid_kernel_name(kernel)) {
        for &backend in &backends {
            match pull_kernel(store, cache, kernel, backend, device, &mut summary) {
                Ok(()) => {}
                Err(Failure::Store(err)) => {
                    summary.unreachable = Some(err.to_string());
                    return Ok(summary);
                }
                Err(Failure::Cache(err)) => return Err(err),
            }
        }
    }
    Ok(summary)
}

/// Pulls one kernel of one backend.
fn pull_kernel(
    store: &Store,
    cache: &Cache,
    kernel: &str,
    backend: Backend,
    device: Option<(&Device, &ResolveOptions)>,
    summary: &mut PullSummary,
) -> Result<(), Failure> {
    let mut entries = match read_index(store, kernel, backend)? {
        IndexRead::Found(index) => index.entries,
        IndexRead::Absent => return Ok(()),
        IndexRead::Refused(reason) => {
            let key = index_key(backend, kernel);
            summary.refused.push(format!("{key}: {reason}"));
            return Ok(());
        }
    };
    match device {
        Some((device, options)) => loop {
            let candidates: Vec<_> = entries.iter().map(Entry::candidate).collect();
            let Some(chosen) = resolve(&candidates, device, options) else {
                return Ok(());
            };
            let entry = entries.remove(chosen);
            if fetch(store, cache, &entry, summary)? {
                return Ok(());
            }
        },
        None => entries
            .iter()
            .try_for_each(|entry| fetch(store, cache, entry, summary).map(drop)),
    }
}

enum Failure {
    Store(StoreError),
    Cache(CacheError),
}

impl From<StoreError> for Failure {
    fn from(err: StoreError) -> Self {
        Failure::Store(err)
    }
}

impl From<CacheError> for Failure {
    fn from(err: CacheError) -> Self {
        Failure::Cache(err)
    }
}

/// Puts one entry and its blob into the cache, fetching the blob unless the cache has it;
/// returns false when the store's blob is missing or corrupt.
fn fetch(
    store: &Store,
    cache: &Cache,
    entry: &Entry,
    summary: &mut PullSummary,
) -> Result<bool, Failure> {
    if !matches!(cache.check_blob(&entry.record.blob)?, BlobCheck::Valid) {
        match store.get_blob(&entry.record.blob, entry.record.size)? {
            BlobRead::Intact(bytes) => {
                cache.store_blob(&bytes)?;
                summary.bytes += bytes.len() as u64;
            }
            BlobRead::Missing | BlobRead::Corrupt => {
                summary.corrupt.push(blob_key(&entry.record.blob));
                return Ok(false);
            }
        }
    } else if cache
        .entry(entry.backend, &entry.kernel, &entry.target)?
        .as_ref()
        == Some(entry)
    {
        summary.cached += 1;
        return Ok(true);
    }
    summary.fetched.push(cache.publish(entry)?);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_kernels::cache::{hash_bytes, KeyRecord};
    use headroom_kernels::resolve::Format;

    struct Fixture {
        dir: tempfile::TempDir,
        store: Store,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}/store", dir.path().display());
            let store = Store::open(&url, false).unwrap();
            Fixture { dir, store }
        }

        fn cache(&self, name: &str) -> Cache {
            Cache::open(&self.dir.path().join(name)).unwrap()
        }
    }

    /// Publishes a cubin of `kernel` for `target` into `cache`.
    fn artifact(cache: &Cache, kernel: &str, target: &str) -> Entry {
        let bytes = format!("cubin of {kernel} for {target}");
        let entry = Entry {
            kernel: kernel.into(),
            backend: Backend::Cuda,
            target: target.parse().unwrap(),
            key: hash_bytes(format!("key {kernel} {target}").as_bytes()),
            record: KeyRecord {
                blob: cache.store_blob(bytes.as_bytes()).unwrap(),
                size: bytes.len() as u64,
                format: Format::Cubin,
                ptx_isa: None,
                toolchain: "nvcc".into(),
            },
        };
        cache.publish(&entry).unwrap()
    }

    fn sm89() -> Device {
        "sm_89".parse().unwrap()
    }

    #[test]
    fn pull_for_a_device_fetches_only_the_artifact_it_resolves_to() {
        let fixture = Fixture::new();
        let built = fixture.cache("built");
        for target in ["sm_75", "sm_80", "sm_86", "sm_90"] {
            artifact(&built, "add", target);
        }
        let pushed = push(&fixture.store, &built, &[]).unwrap();
        assert_eq!((pushed.artifacts, pushed.new), (4, 4));
        assert_eq!(push(&fixture.store, &built, &[]).unwrap().new, 0);

        let user = fixture.cache("user");
        let options = ResolveOptions::default();
        let names = ["add".to_string()];
        let pulled = pull(&fixture.store, &user, &names, Some((&sm89(), &options))).unwrap();
        let targets: Vec<String> = pulled
            .fetched
            .iter()
            .map(|e| e.target.to_string())
            .collect();
        assert_eq!(targets, ["sm_86"]);
        assert_eq!(user.entries().unwrap().len(), 1);
        let again = pull(&fixture.store, &user, &names, Some((&sm89(), &options))).unwrap();
        assert_eq!((again.fetched.len(), again.cached, again.bytes), (0, 1, 0));

        let everything = pull(&fixture.store, &user, &names, None).unwrap();
        assert_eq!((everything.fetched.len(), everything.cached), (3, 1));
    }

    #[test]
    fn a_corrupt_blob_is_skipped_for_the_next_best_and_never_cached() {
        let fixture = Fixture::new();
        let built = fixture.cache("built");
        artifact(&built, "add", "sm_80");
        let best = artifact(&built, "add", "sm_86");
        push(&fixture.store, &built, &[]).unwrap();
        let key = blob_key(&best.record.blob);
        let mut bytes = fixture.store.get(&key, u64::MAX).unwrap().unwrap();
        bytes[3] ^= 0x20;
        fixture.store.put(&key, &bytes).unwrap();

        let user = fixture.cache("user");
        let pulled = pull(
            &fixture.store,
            &user,
            &["add".to_string()],
            Some((&sm89(), &ResolveOptions::default())),
        )
        .unwrap();
        assert_eq!(pulled.corrupt, [key]);
        let targets: Vec<String> = pulled
            .fetched
            .iter()
            .map(|e| e.target.to_string())
            .collect();
        assert_eq!(targets, ["sm_80"]);
        assert!(matches!(
            user.check_blob(&best.record.blob).unwrap(),
            BlobCheck::Missing
        ));
    }

    #[test]
    fn a_hostile_index_is_refused_before_anything_touches_the_cache() {
        let fixture = Fixture::new();
        let built = fixture.cache("built");
        let mut entry = artifact(&built, "add", "sm_80");
        push(&fixture.store, &built, &[]).unwrap();
        entry.key = "../../../outside".into();
        let index = KernelIndex {
            kernel: "add".into(),
            backend: Backend::Cuda,
            entries: vec![entry],
        };
        let key = index_key(Backend::Cuda, "add");
        fixture
            .store
            .put(&key, &serde_json::to_vec(&index).unwrap())
            .unwrap();
        let user = fixture.cache("user");
        let pulled = pull(&fixture.store, &user, &["add".to_string()], None).unwrap();
        assert!(pulled.fetched.is_empty());
        assert!(pulled.refused[0].starts_with(&key), "{:?}", pulled.refused);
        assert!(user.entries().unwrap().is_empty());
        assert!(!fixture.dir.path().join("outside.json").exists());
    }

    #[test]
    fn concurrent_pushers_of_different_targets_all_land() {
        let fixture = Fixture::new();
        let targets = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"];
        std::thread::scope(|scope| {
            for target in targets {
                let cache = fixture.cache(target);
                artifact(&cache, "add", target);
                let store = fixture.store.shown();
                scope.spawn(move || {
                    let store = Store::open(store, false).unwrap();
                    push(&store, &cache, &[]).unwrap();
                });
            }
        });
        let user = fixture.cache("user");
        let pulled = pull(&fixture.store, &user, &["add".to_string()], None).unwrap();
        assert_eq!(pulled.fetched.len(), targets.len());
    }

    #[test]
    fn pushing_to_a_read_only_store_is_refused() {
        let fixture = Fixture::new();
        let built = fixture.cache("built");
        artifact(&built, "add", "sm_80");
        let url = format!("{}?read-only", fixture.store.shown());
        let err = push(&Store::open(&url, false).unwrap(), &built, &[]).unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
    }
}
