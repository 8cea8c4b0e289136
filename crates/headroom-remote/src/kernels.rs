//! The kernel cache's side of a shared store: `push` copies artifacts up, `pull` copies down
//! what a device needs, checked on the way like a bundle import.
//!
//! ```text
//! <root>/blobs/ab/abcdef…                    artifact bytes (the cache's blobs, same hashes)
//! <root>/kernels/v3/<backend>/<kernel>.json  the kernel's index: its builds, each its entries
//! ```
//!
//! Not every service can list keys (Redis cannot), so one index per kernel says what exists:
//! a reader asks for it, takes one build (its project's origin, else the one pushed last),
//! resolves among that build's entries only, and fetches only the blob it picked. An index
//! keeps the [`MAX_BUILDS`] builds pushed last, oldest first, so it stays small while CI
//! pushes a new build of every edit. A pusher stores its
//! blobs first and writes the indexes last, each merged into what is there, so every index
//! any pusher writes names only stored blobs, and pushers of the same artifacts write the same
//! index. Without compare-and-swap two pushers of different targets can still overwrite each
//! other's merge, so a pusher waits well past one read-and-write time, checks that its targets
//! stayed, and merges again where they did not. `v3` is the cache's schema version: entries of
//! another schema are simply not seen.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use headroom_kernels::cache::{
    is_hash, BlobCheck, Cache, CacheError, Entry, Origin, SelectError, SCHEMA_VERSION,
};
use headroom_kernels::manifest::is_valid_kernel_name;
use headroom_kernels::resolve::{resolve, Device, ResolveOptions};
use headroom_kernels::target::Backend;

use crate::store::{blob_key, BlobRead, Store, StoreError, MAX_INDEX_BYTES};

/// How often a pusher writes an index whose entries a concurrent pusher overwrote.
const PUBLISH_ATTEMPTS: usize = 5;
/// The least wait between writing indexes and checking that they kept our entries.
pub(crate) const SETTLE: Duration = Duration::from_millis(50);

/// Builds of one kernel an index keeps: those pushed last.
pub const MAX_BUILDS: usize = 16;

/// The store's record of one kernel in one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KernelIndex {
    kernel: String,
    backend: Backend,
    /// Oldest push first, one per origin, at most [`MAX_BUILDS`].
    builds: Vec<IndexedBuild>,
}

/// The entries of one build (one origin) of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct IndexedBuild {
    origin: String,
    /// Sorted by target, one per target, all of this origin.
    entries: Vec<Entry>,
}

impl KernelIndex {
    fn build(&self, origin: &str) -> Option<&IndexedBuild> {
        self.builds.iter().find(|build| build.origin == origin)
    }
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

/// Copies the artifacts of one build of each named kernel (of every kernel at its newest
/// build, when none is named) to the store, where it becomes the kernel's newest build.
pub fn push(
    store: &Store,
    cache: &Cache,
    kernels: &[(String, Origin)],
) -> Result<PushSummary, PushError> {
    if store.read_only() {
        return Err(StoreError::ReadOnly {
            store: store.shown().to_string(),
        }
        .into());
    }
    let mut summary = PushSummary::default();
    let entries = cache.selected_builds(kernels)?;
    // Each kernel's entries come together, by backend: each group is one build of one index.
    let mut pending: Vec<&[Entry]> = entries
        .chunk_by(|a, b| a.backend == b.backend && a.kernel == b.kernel && a.origin == b.origin)
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

/// Merges `mine` (one build of one kernel in one backend) into the store's index, as its
/// newest build; returns `None` when the index already holds them all in its newest build,
/// else how many it lacked.
fn merge_index(store: &Store, mine: &[Entry]) -> Result<Option<usize>, StoreError> {
    let (kernel, backend, origin) = (&mine[0].kernel, mine[0].backend, &mine[0].origin);
    let mut index = read_index(store, kernel, backend)?
        .found()
        .unwrap_or_else(|| KernelIndex {
            kernel: kernel.clone(),
            backend,
            builds: Vec::new(),
        });
    let missing = mine
        .iter()
        .filter(|entry| {
            !index
                .build(origin)
                .is_some_and(|build| build.entries.contains(entry))
        })
        .count();
    let newest = index
        .builds
        .last()
        .is_some_and(|build| &build.origin == origin);
    if missing == 0 && newest {
        return Ok(None);
    }
    let position = index
        .builds
        .iter()
        .position(|build| &build.origin == origin);
    let mut build = match position {
        Some(position) => index.builds.remove(position),
        None => IndexedBuild {
            origin: origin.clone(),
            entries: Vec::new(),
        },
    };
    build
        .entries
        .retain(|there| !mine.iter().any(|entry| entry.target == there.target));
    build.entries.extend(mine.iter().cloned());
    build.entries.sort_by(|a, b| a.target.cmp(&b.target));
    index.builds.push(build);
    let excess = index.builds.len().saturating_sub(MAX_BUILDS);
    index.builds.drain(..excess);
    let bytes = serde_json::to_vec_pretty(&index).expect("indexes always serialize");
    store.put(&index_key(backend, kernel), &bytes)?;
    Ok(Some(missing))
}

/// Whether the store's index has, in the build of `mine`, an entry for each of its targets. A
/// concurrent pusher's entry for one of them may have won: it names a stored blob too.
fn index_holds_targets(store: &Store, mine: &[Entry]) -> Result<bool, StoreError> {
    let (kernel, backend, origin) = (&mine[0].kernel, mine[0].backend, &mine[0].origin);
    Ok(read_index(store, kernel, backend)?
        .found()
        .is_some_and(|index| {
            index.build(origin).is_some_and(|build| {
                mine.iter().all(|entry| {
                    build
                        .entries
                        .iter()
                        .any(|there| there.target == entry.target)
                })
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
    let well_formed_build = |build: &IndexedBuild| {
        is_hash(&build.origin)
            && build.entries.iter().all(|entry| {
                entry.is_well_formed()
                    && entry.kernel == kernel
                    && entry.backend == backend
                    && entry.origin == build.origin
            })
            && build
                .entries
                .windows(2)
                .all(|pair| pair[0].target < pair[1].target)
    };
    let origins_once = index.builds.iter().enumerate().all(|(at, build)| {
        index.builds[..at]
            .iter()
            .all(|before| before.origin != build.origin)
    });
    let well_formed = index.kernel == kernel
        && index.backend == backend
        && origins_once
        && index.builds.iter().all(well_formed_build);
    Ok(if well_formed {
        IndexRead::Found(index)
    } else {
        IndexRead::Refused(format!(
            "it does not hold builds of kernel `{kernel}` ({backend}) only, each once, with well-formed entries sorted by target"
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

/// Copies artifacts of the named kernels, each of its build (`Origin`), from the store into
/// the cache: with a device, only the one the resolver picks for it (the next best where that
/// one's blob is corrupt); without, every target.
pub fn pull(
    store: &Store,
    cache: &Cache,
    kernels: &[(String, Origin)],
    device: Option<(&Device, &ResolveOptions)>,
) -> Result<PullSummary, CacheError> {
    let mut summary = PullSummary::default();
    let backends = match device {
        Some((device, _)) => vec![device.backend()],
        None => vec![Backend::Cuda, Backend::Hip, Backend::Metal],
    };
    for (kernel, origin) in kernels
        .iter()
        .filter(|(kernel, _)| is_valid_kernel_name(kernel))
    {
        for &backend in &backends {
            match pull_kernel(
                store,
                cache,
                (kernel, origin),
                backend,
                device,
                &mut summary,
            ) {
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

/// Pulls one build of one kernel of one backend.
fn pull_kernel(
    store: &Store,
    cache: &Cache,
    (kernel, origin): (&str, &Origin),
    backend: Backend,
    device: Option<(&Device, &ResolveOptions)>,
    summary: &mut PullSummary,
) -> Result<(), Failure> {
    let mut entries = match read_index(store, kernel, backend)? {
        IndexRead::Found(mut index) => {
            let chosen = match origin {
                Origin::Newest => index.builds.pop(),
                Origin::Exactly(origin) => index
                    .builds
                    .into_iter()
                    .find(|build| &build.origin == origin),
            };
            match chosen {
                Some(build) => build.entries,
                None => return Ok(()),
            }
        }
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
        .entry(entry.backend, &entry.kernel, &entry.origin, &entry.target)?
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

    /// The origin of the sources `name` stands for.
    fn origin(name: &str) -> String {
        hash_bytes(format!("sources {name}").as_bytes())
    }

    /// Publishes a cubin of `kernel` for `target` into `cache`.
    fn artifact(cache: &Cache, kernel: &str, target: &str) -> Entry {
        built_from(cache, "main", kernel, target)
    }

    /// Publishes a cubin of `kernel` for `target`, built from the sources `sources`.
    fn built_from(cache: &Cache, sources: &str, kernel: &str, target: &str) -> Entry {
        let bytes = format!("cubin of {kernel} for {target} from {sources}");
        let entry = Entry {
            kernel: kernel.into(),
            backend: Backend::Cuda,
            origin: origin(sources),
            target: target.parse().unwrap(),
            key: hash_bytes(format!("key {kernel} {target} {sources}").as_bytes()),
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

    /// The newest build of each named kernel.
    fn newest(names: &[&str]) -> Vec<(String, Origin)> {
        names
            .iter()
            .map(|name| (name.to_string(), Origin::Newest))
            .collect()
    }

    /// Two projects push a `vector_add` each (the second without sm_86): a pull for one
    /// project's origin gets only its own artifacts, and a pull of the newest build gets the
    /// last pushed, never a target of the other beside it.
    #[test]
    fn builds_of_one_kernel_name_stay_apart_in_the_store() {
        let fixture = Fixture::new();
        let first = fixture.cache("first");
        for target in ["sm_80", "sm_86"] {
            built_from(&first, "first", "vector_add", target);
        }
        let second = fixture.cache("second");
        built_from(&second, "second", "vector_add", "sm_80");
        push(&fixture.store, &first, &[]).unwrap();
        push(&fixture.store, &second, &[]).unwrap();

        let options = ResolveOptions::default();
        let pulled_origins = |wanted: Origin| {
            let user = fixture.cache(&format!("user-{}", fastrand::u64(..)));
            let names = [("vector_add".to_string(), wanted)];
            pull(&fixture.store, &user, &names, Some((&sm89(), &options)))
                .unwrap()
                .fetched
                .iter()
                .map(|entry| (entry.origin.clone(), entry.target.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pulled_origins(Origin::Exactly(origin("first"))),
            [(origin("first"), "sm_86".to_string())]
        );
        assert_eq!(
            pulled_origins(Origin::Exactly(origin("second"))),
            [(origin("second"), "sm_80".to_string())]
        );
        assert_eq!(
            pulled_origins(Origin::Newest),
            [(origin("second"), "sm_80".to_string())],
            "the newest build alone, not the first's sm_86 beside it"
        );
        assert_eq!(pulled_origins(Origin::Exactly(origin("third"))), []);
    }

    /// An index keeps the builds pushed last, so it stays small as CI pushes every edit.
    #[test]
    fn an_index_keeps_the_builds_pushed_last() {
        let fixture = Fixture::new();
        for version in 0..MAX_BUILDS + 2 {
            let cache = fixture.cache(&format!("v{version}"));
            built_from(&cache, &format!("v{version}"), "add", "sm_80");
            push(&fixture.store, &cache, &[]).unwrap();
        }
        let IndexRead::Found(index) = read_index(&fixture.store, "add", Backend::Cuda).unwrap()
        else {
            panic!("no index");
        };
        let origins: Vec<&str> = index
            .builds
            .iter()
            .map(|build| build.origin.as_str())
            .collect();
        let expected: Vec<String> = (2..MAX_BUILDS + 2)
            .map(|v| origin(&format!("v{v}")))
            .collect();
        assert_eq!(origins, expected);
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
        let names = newest(&["add"]);
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
            &newest(&["add"]),
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
            builds: vec![IndexedBuild {
                origin: entry.origin.clone(),
                entries: vec![entry],
            }],
        };
        let key = index_key(Backend::Cuda, "add");
        fixture
            .store
            .put(&key, &serde_json::to_vec(&index).unwrap())
            .unwrap();
        let user = fixture.cache("user");
        let pulled = pull(&fixture.store, &user, &newest(&["add"]), None).unwrap();
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
        let pulled = pull(&fixture.store, &user, &newest(&["add"]), None).unwrap();
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
