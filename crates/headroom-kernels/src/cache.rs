//! The kernel cache: content-addressed blobs behind a human-browsable layout, safe for many
//! builders at once without lock files, verified on every read, and capped in size by LRU.
//!
//! ```text
//! <root>/blobs/ab/abcdef….            artifact bytes, named by their blake3 hash
//! <root>/keys/12/1234….json           build key -> the blob it produced
//! <root>/<backend>/<kernel>/<origin>/<target>.<ext>   symlink to the blob, for people and loaders
//! <root>/<backend>/<kernel>/<origin>/<target>.json    the artifact's manifest entry, written last
//! ```
//!
//! `<origin>` names what built the artifact: the blake3 hash of the kernel's sources, the headers
//! they include, its flags and defines ([`crate::build::origin`]). Projects that share a kernel
//! name, and one project before and after an edit, so keep apart, and a resolve takes the
//! artifacts of one origin only ([`Origin`]): never one build's target beside another's.
//!
//! Every file appears by `rename` of a fully written and fsynced temp file in the same
//! directory, so a reader sees either nothing or a whole file, and two builders writing the
//! same artifact write the same bytes. A blob whose bytes no longer hash to its name is
//! deleted and reported as a miss, so it is rebuilt.
//!
//! Temp files carry their writer's process id (`.tmp<pid>-…`, see `headroom_paths::temp`),
//! and a writer keeps a work directory of that name in the root from its first write to its
//! end. A writer killed mid-write leaves that directory behind: the next process to open the
//! cache finds it and removes every temp file of ended writers, wherever they are.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::manifest::{is_valid_kernel_name, UnknownKernel};
use crate::resolve::{explain, Candidate, Device, Explanation, Format, PtxIsa, ResolveOptions};
use crate::target::{Backend, Target};

/// Bumped whenever the layout, the key derivation or what an entry records changes: old
/// entries then simply miss. Version 2: fatbin entries record the PTX ISA of the PTX they
/// carry, which version 1 left out (the resolver took such PTX for any driver). Version 3:
/// entries record their origin and live under it, where version 2 kept one entry per kernel
/// and target for every project (two projects' `vector_add` overwrote each other's targets
/// and resolved to each other's artifacts). Version 2 entries cannot be told apart by project,
/// so they are not used ([`Cache::legacy_entries`]) and `gc` removes them.
pub const SCHEMA_VERSION: u32 = 3;

/// Environment variable that moves the cache (the `--cache` flag wins over it).
pub const CACHE_ENV: &str = "HEADROOM_KERNEL_CACHE";

/// How stale a blob's last-use time may get before a read refreshes it.
const LRU_RESOLUTION: Duration = Duration::from_secs(3600);

/// Temp files older than this belong to a builder that died (on another machine, or in another
/// process id namespace, where its id says nothing); `gc` removes them.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Temp files and work directories start so, then their writer's process id.
const TEMP_KIND: &str = ".tmp";

/// Why the entries of some named kernels could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    UnknownKernel(#[from] UnknownKernel),
    #[error("the cache {} holds no build of kernel `{kernel}` from the sources and flags its manifest has now; run `headroom kernels build` first", cache.display())]
    NotBuilt { kernel: String, cache: PathBuf },
}

/// Every backend, in the order the layout is listed.
const BACKENDS: [Backend; 3] = [Backend::Cuda, Backend::Hip, Backend::Metal];

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("kernel cache I/O on {path}: {source}; check permissions or move the cache with --cache or {CACHE_ENV}")]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot find a home directory for the kernel cache; set {CACHE_ENV} or pass --cache")]
    NoHome,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A temporary file in `dir`, to be renamed over a final path. It is created as a plain file
/// would be (0666 less the umask), not private to its owner: a cache shared by a team, or a
/// bundle shipped from CI, must be readable by others wherever the umask lets them.
pub(crate) fn temp_file_in(dir: &Path) -> io::Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    let prefix = headroom_paths::temp::prefix(TEMP_KIND);
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    builder.tempfile_in(dir)
}

/// Writes `bytes` to `path` whole (`headroom_paths::atomic`), making its directory first.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    headroom_paths::atomic::write(path, bytes, TEMP_KIND)
}

/// Points `link` at `target` in one rename (`headroom_paths::atomic`), making its directory
/// first.
fn link_atomic(target: &Path, link: &Path) -> io::Result<()> {
    fs::create_dir_all(link.parent().unwrap_or(Path::new(".")))?;
    headroom_paths::atomic::replace_symlink(target, link, TEMP_KIND)
}

/// The blake3 hash of some bytes, as lowercase hex.
pub fn hash_bytes(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Whether a name is a blake3 hash as this cache writes them: 64 lowercase hex digits.
pub fn is_hash(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The build key's record: which blob a key produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub blob: String,
    pub size: u64,
    pub format: Format,
    pub ptx_isa: Option<PtxIsa>,
    pub toolchain: String,
}

/// One artifact in the layout: the manifest entry `<backend>/<kernel>/<origin>/<target>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kernel: String,
    pub backend: Backend,
    /// What built it ([`crate::build::origin`]): the same for every target of one build.
    pub origin: String,
    pub target: Target,
    pub key: String,
    #[serde(flatten)]
    pub record: KeyRecord,
}

impl Entry {
    /// The artifact's path relative to the cache root:
    /// `<backend>/<kernel>/<origin>/<target>.<ext>`.
    pub fn artifact_path(&self) -> PathBuf {
        origin_dir(self.backend, &self.kernel, &self.origin).join(format!(
            "{}.{}",
            self.target.file_stem(),
            self.record.format.extension()
        ))
    }

    fn entry_path(&self) -> PathBuf {
        entry_path(self.backend, &self.kernel, &self.origin, &self.target)
    }

    /// Whether an entry from outside (a bundle, a shared store) is safe to publish: a valid
    /// kernel name, a target of its own backend, and hashes as its origin, key and blob, so that
    /// every path made from it stays inside the cache.
    pub fn is_well_formed(&self) -> bool {
        is_valid_kernel_name(&self.kernel)
            && self.backend == self.target.backend()
            && is_hash(&self.origin)
            && is_hash(&self.key)
            && is_hash(&self.record.blob)
    }

    pub fn candidate(&self) -> Candidate {
        Candidate {
            target: self.target.clone(),
            format: self.record.format,
            ptx_isa: self.record.ptx_isa,
        }
    }
}

/// Which build of a kernel a resolve or a pull takes its artifacts from. Builds never mix:
/// every artifact a resolve weighs comes from the same sources and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The build published last: the only one in a cache that serves one project, and the
    /// newest version where a cache or store holds several.
    Newest,
    /// The build of these sources and flags ([`crate::build::origin`]): a project's own.
    Exactly(String),
}

/// The artifacts of one build of a kernel, and when the last of them was published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    pub origin: String,
    /// Sorted by target.
    pub entries: Vec<Entry>,
    pub published: SystemTime,
}

fn layout_dir(backend: Backend, kernel: &str) -> PathBuf {
    Path::new(backend.as_str()).join(kernel)
}

fn origin_dir(backend: Backend, kernel: &str, origin: &str) -> PathBuf {
    layout_dir(backend, kernel).join(origin)
}

fn entry_path(backend: Backend, kernel: &str, origin: &str, target: &Target) -> PathBuf {
    origin_dir(backend, kernel, origin).join(format!("{}.json", target.file_stem()))
}

fn blob_path(hash: &str) -> PathBuf {
    Path::new("blobs").join(&hash[..2]).join(hash)
}

fn key_path(key: &str) -> PathBuf {
    Path::new("keys")
        .join(&key[..2])
        .join(format!("{key}.json"))
}

/// What `gc` did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub blobs_removed: usize,
    pub bytes_freed: u64,
    pub bytes_kept: u64,
    pub entries_removed: usize,
    pub temp_files_removed: usize,
}

/// The state of a blob after checking its bytes against its name.
pub enum BlobCheck {
    Valid,
    Missing,
    Corrupt,
}

/// A kernel cache rooted at one directory.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
    /// This process's work directory in the root, made before its first write and removed
    /// when the last clone of the cache is dropped.
    work: Arc<OnceLock<tempfile::TempDir>>,
}

impl Cache {
    /// `--cache` if given, else `$HEADROOM_KERNEL_CACHE`, else `$XDG_CACHE_HOME/headroom/kernels`,
    /// else `~/.cache/headroom/kernels`.
    pub fn default_root(flag: Option<&Path>) -> Result<PathBuf, CacheError> {
        if let Some(path) = flag {
            return Ok(path.to_path_buf());
        }
        headroom_paths::kernel_cache_dir(CACHE_ENV).ok_or(CacheError::NoHome)
    }

    /// Opens (creating) the cache at `root`. When a writer died there (its work directory is
    /// left in the root), first removes what every ended writer left.
    pub fn open(root: &Path) -> Result<Self, CacheError> {
        fs::create_dir_all(root).map_err(io_error(root))?;
        let writer_died = fs::read_dir(root)
            .map_err(io_error(root))?
            .flatten()
            .any(|entry| {
                headroom_paths::temp::is_orphaned(&entry.file_name().to_string_lossy(), TEMP_KIND)
            });
        if writer_died {
            remove_temp_files(root, false)?;
        }
        Ok(Cache {
            root: root.to_path_buf(),
            work: Arc::default(),
        })
    }

    /// This process's work directory in the cache (`.tmp<pid>-…`), made on first use: every
    /// write makes sure it exists first, so a writer killed mid-write always leaves it, and
    /// builds keep their compiler outputs in it.
    pub fn work_dir(&self) -> Result<&Path, CacheError> {
        if self.work.get().is_none() {
            let made = tempfile::Builder::new()
                .prefix(&headroom_paths::temp::prefix(TEMP_KIND))
                .tempdir_in(&self.root)
                .map_err(io_error(&self.root))?;
            // Another thread may have made one first: then this one is removed again.
            let _ = self.work.set(made);
        }
        Ok(self
            .work
            .get()
            .map_or(self.root.as_path(), tempfile::TempDir::path))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Checks a blob's bytes against its name; deletes it when they differ.
    pub fn check_blob(&self, hash: &str) -> Result<BlobCheck, CacheError> {
        if !is_hash(hash) {
            return Ok(BlobCheck::Missing);
        }
        let path = self.root.join(blob_path(hash));
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(BlobCheck::Missing),
            Err(err) => return Err(io_error(&path)(err)),
        };
        let mut hasher = blake3::Hasher::new();
        hasher.update_reader(&mut file).map_err(io_error(&path))?;
        if hasher.finalize().to_hex().as_str() != hash {
            // Another builder may have just replaced it with a good copy; deleting that too
            // only costs one more rebuild.
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(io_error(&path)(err)),
            }
            return Ok(BlobCheck::Corrupt);
        }
        // Recency for LRU eviction, at most hourly so a no-op rebuild does not dirty every
        // inode; failing to record it is harmless.
        let stale = file
            .metadata()
            .and_then(|metadata| metadata.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_none_or(|age| age > LRU_RESOLUTION);
        if stale {
            let _ = file.set_modified(SystemTime::now());
        }
        Ok(BlobCheck::Valid)
    }

    /// Reads a blob and checks it; `None` when missing or corrupt.
    pub fn read_blob(&self, hash: &str) -> Result<Option<Vec<u8>>, CacheError> {
        if !is_hash(hash) {
            return Ok(None);
        }
        let path = self.root.join(blob_path(hash));
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(io_error(&path)(err)),
        };
        if hash_bytes(&bytes) != hash {
            let _ = fs::remove_file(&path);
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    /// Stores bytes as a blob and returns its hash. Existing valid blobs are kept as they are.
    pub fn store_blob(&self, bytes: &[u8]) -> Result<String, CacheError> {
        let hash = hash_bytes(bytes);
        // An intact copy is already there (another kernel, target or builder made the same
        // bytes): hashing it is cheaper than writing and fsyncing it again.
        if matches!(self.check_blob(&hash)?, BlobCheck::Valid) {
            return Ok(hash);
        }
        self.work_dir()?;
        let path = self.root.join(blob_path(&hash));
        write_atomic(&path, bytes).map_err(io_error(&path))?;
        Ok(hash)
    }

    /// A temp file in the cache root for bytes that may become a blob once verified; it is
    /// removed when dropped, and `gc` removes it if its writer died.
    pub fn blob_temp(&self) -> Result<tempfile::NamedTempFile, CacheError> {
        temp_file_in(&self.root).map_err(io_error(&self.root))
    }

    /// Moves a fully written temp file (from `blob_temp`) into place as the blob `hash`, which
    /// the caller has checked its bytes hash to, after an fsync; an intact copy already there
    /// is kept and the temp file removed.
    pub fn adopt_blob(&self, temp: tempfile::TempPath, hash: &str) -> Result<(), CacheError> {
        if matches!(self.check_blob(hash)?, BlobCheck::Valid) {
            return Ok(());
        }
        File::open(&temp)
            .and_then(|file| file.sync_all())
            .map_err(io_error(&temp))?;
        let path = self.root.join(blob_path(hash));
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        temp.persist(&path)
            .map_err(|err| io_error(&path)(err.error))
    }

    fn read_json<T: for<'de> Deserialize<'de>>(
        &self,
        relative: &Path,
    ) -> Result<Option<T>, CacheError> {
        let path = self.root.join(relative);
        match fs::read(&path) {
            // Unparsable JSON is a torn or foreign file: treat it as absent, it gets rewritten.
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(io_error(&path)(err)),
        }
    }

    fn write_json<T: Serialize>(&self, relative: &Path, value: &T) -> Result<(), CacheError> {
        self.work_dir()?;
        let path = self.root.join(relative);
        let bytes = serde_json::to_vec_pretty(value).expect("cache records always serialize");
        write_atomic(&path, &bytes).map_err(io_error(&path))
    }

    /// The record a build key produced, if its blob is still there and intact.
    pub fn lookup_key(&self, key: &str) -> Result<Option<KeyRecord>, CacheError> {
        if !is_hash(key) {
            return Ok(None);
        }
        let Some(record) = self.read_json::<KeyRecord>(&key_path(key))? else {
            return Ok(None);
        };
        match self.check_blob(&record.blob)? {
            BlobCheck::Valid => Ok(Some(record)),
            BlobCheck::Missing | BlobCheck::Corrupt => Ok(None),
        }
    }

    /// The layout entry of one (kernel, origin, target), without checking its blob.
    pub fn entry(
        &self,
        backend: Backend,
        kernel: &str,
        origin: &str,
        target: &Target,
    ) -> Result<Option<Entry>, CacheError> {
        if !is_hash(origin) {
            return Ok(None);
        }
        self.read_json(&entry_path(backend, kernel, origin, target))
    }

    /// Records a finished artifact: key record, layout link, then the entry, in that order, so
    /// whoever sees an entry also finds everything it points at.
    ///
    /// The first valid key record wins: a compiler that is not bit-for-bit reproducible can
    /// give two concurrent builders different bytes for one key, and both must then publish
    /// the same blob. Returns the entry as published (with the winning record).
    pub fn publish(&self, entry: &Entry) -> Result<Entry, CacheError> {
        self.work_dir()?;
        let record = self.claim_key(&entry.key, &entry.record)?;
        let entry = Entry {
            record,
            ..entry.clone()
        };
        let previous: Option<Entry> = self.read_json(&entry.entry_path())?;
        let link = self.root.join(entry.artifact_path());
        let blob_from_link_dir = Path::new("../../..").join(blob_path(&entry.record.blob));
        link_atomic(&blob_from_link_dir, &link).map_err(io_error(&link))?;
        if let Some(previous) =
            previous.filter(|previous| previous.record.format != entry.record.format)
        {
            let _ = fs::remove_file(self.root.join(previous.artifact_path()));
        }
        self.write_json(&entry.entry_path(), &entry)?;
        Ok(entry)
    }

    /// Writes the key record unless a valid one exists; returns the record that holds.
    fn claim_key(&self, key: &str, record: &KeyRecord) -> Result<KeyRecord, CacheError> {
        let path = self.root.join(key_path(key));
        let bytes = serde_json::to_vec_pretty(record).expect("cache records always serialize");
        let written = fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
            .and_then(|()| headroom_paths::atomic::write_new(&path, &bytes, TEMP_KIND));
        match written {
            Ok(_) => Ok(record.clone()),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => match self.lookup_key(key)? {
                Some(existing) => Ok(existing),
                // The holder's blob is gone or corrupt: ours replaces it.
                None => {
                    write_atomic(&path, &bytes).map_err(io_error(&path))?;
                    Ok(record.clone())
                }
            },
            Err(err) => Err(io_error(&path)(err)),
        }
    }

    /// Every entry of the layout, sorted by backend and kernel, then by build (oldest first),
    /// then by target.
    pub fn entries(&self) -> Result<Vec<Entry>, CacheError> {
        let mut entries = Vec::new();
        for backend in BACKENDS {
            let backend_dir = self.root.join(backend.as_str());
            for kernel_dir in read_dir_sorted(&backend_dir)? {
                let Some(kernel) = kernel_dir
                    .file_name()
                    .and_then(|name| name.to_str())
                    .map(String::from)
                else {
                    continue;
                };
                for build in self.builds(backend, &kernel)? {
                    entries.extend(build.entries);
                }
            }
        }
        Ok(entries)
    }

    /// The entries of one build of each named kernel, or of every kernel at its newest build
    /// when none is named: what a bundle or a store receives, the build a resolve here takes.
    /// A name the cache lacks is an error that lists the names it has; so is a build it lacks.
    pub fn selected_builds(&self, wanted: &[(String, Origin)]) -> Result<Vec<Entry>, SelectError> {
        let all = self.entries()?;
        let known: BTreeSet<&String> = all.iter().map(|entry| &entry.kernel).collect();
        let unknown: Vec<String> = wanted
            .iter()
            .map(|(name, _)| name)
            .filter(|name| !known.contains(name))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(UnknownKernel {
                wanted: unknown,
                place: format!("the cache {}", self.root.display()),
                known: known.into_iter().cloned().collect(),
                advice: "check --kernel",
            }
            .into());
        }
        let every_newest: Vec<(String, Origin)>;
        let wanted = if wanted.is_empty() {
            every_newest = known
                .into_iter()
                .map(|kernel| (kernel.clone(), Origin::Newest))
                .collect();
            &every_newest
        } else {
            wanted
        };
        let mut entries = Vec::new();
        for (kernel, origin) in wanted {
            let before = entries.len();
            for backend in BACKENDS {
                entries.extend(self.origin_entries(backend, kernel, origin)?);
            }
            if entries.len() == before {
                return Err(SelectError::NotBuilt {
                    kernel: kernel.clone(),
                    cache: self.root.clone(),
                });
            }
        }
        Ok(entries)
    }

    /// The builds of one kernel in one backend, the one published last at the end.
    pub fn builds(&self, backend: Backend, kernel: &str) -> Result<Vec<Build>, CacheError> {
        let mut builds = Vec::new();
        for path in read_dir_sorted(&self.root.join(layout_dir(backend, kernel)))? {
            let Some(origin) = path.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            if is_hash(origin) {
                if let Some(build) = self.build(backend, kernel, origin)? {
                    builds.push(build);
                }
            }
        }
        builds.sort_by(|a, b| (a.published, &a.origin).cmp(&(b.published, &b.origin)));
        Ok(builds)
    }

    /// One build of a kernel, `None` when it has no entries.
    fn build(
        &self,
        backend: Backend,
        kernel: &str,
        origin: &str,
    ) -> Result<Option<Build>, CacheError> {
        let dir = origin_dir(backend, kernel, origin);
        let mut entries = Vec::new();
        let mut published = SystemTime::UNIX_EPOCH;
        for path in read_dir_sorted(&self.root.join(&dir))? {
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            if let Some(entry) = self.read_json::<Entry>(&dir.join(name))? {
                if entry.kernel == kernel && entry.backend == backend && entry.origin == origin {
                    // Each publish renames a new file over the entry: its time is the publish's.
                    let time = fs::metadata(&path).and_then(|metadata| metadata.modified());
                    published = published.max(time.unwrap_or(SystemTime::UNIX_EPOCH));
                    entries.push(entry);
                }
            }
        }
        entries.sort_by(|a, b| a.target.cmp(&b.target));
        Ok((!entries.is_empty()).then(|| Build {
            origin: origin.to_string(),
            entries,
            published,
        }))
    }

    /// The entries of one build of a kernel, sorted by target; none when it has no such build.
    pub fn origin_entries(
        &self,
        backend: Backend,
        kernel: &str,
        origin: &Origin,
    ) -> Result<Vec<Entry>, CacheError> {
        let build = match origin {
            Origin::Newest => self.builds(backend, kernel)?.pop(),
            Origin::Exactly(origin) if is_hash(origin) => self.build(backend, kernel, origin)?,
            Origin::Exactly(_) => None,
        };
        Ok(build.map(|build| build.entries).unwrap_or_default())
    }

    /// How many entries of a kernel an older headroom wrote (`<backend>/<kernel>/<target>.json`,
    /// schema 2): they do not say which project built them, so no resolve uses them.
    pub fn legacy_entries(&self, backend: Backend, kernel: &str) -> Result<usize, CacheError> {
        Ok(legacy_files(&self.root.join(layout_dir(backend, kernel)))?
            .iter()
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .count())
    }

    /// Resolves a kernel for a device against the artifacts of its newest build in this cache
    /// (see [`Cache::resolve_origin`]).
    pub fn resolve(
        &self,
        kernel: &str,
        device: &Device,
        options: &ResolveOptions,
    ) -> Result<(Vec<Entry>, Explanation), CacheError> {
        self.resolve_origin(kernel, &Origin::Newest, device, options)
    }

    /// Resolves a kernel for a device against the artifacts of one of its builds: its entries
    /// for the device's backend, and the verdict on each. The chosen artifact's blob is
    /// verified; a missing or corrupt one is dropped and the next best is chosen.
    pub fn resolve_origin(
        &self,
        kernel: &str,
        origin: &Origin,
        device: &Device,
        options: &ResolveOptions,
    ) -> Result<(Vec<Entry>, Explanation), CacheError> {
        let mut entries = self.origin_entries(device.backend(), kernel, origin)?;
        loop {
            let candidates: Vec<Candidate> = entries.iter().map(Entry::candidate).collect();
            let explanation = explain(&candidates, device, options);
            match explanation.chosen {
                Some(index)
                    if !matches!(
                        self.check_blob(&entries[index].record.blob)?,
                        BlobCheck::Valid
                    ) =>
                {
                    entries.remove(index);
                }
                _ => return Ok((entries, explanation)),
            }
        }
    }

    /// Total bytes of all blobs.
    pub fn blob_bytes(&self) -> Result<u64, CacheError> {
        Ok(self.blobs()?.iter().map(|blob| blob.size).sum())
    }

    fn blobs(&self) -> Result<Vec<BlobFile>, CacheError> {
        let mut blobs = Vec::new();
        for shard in read_dir_sorted(&self.root.join("blobs"))? {
            for path in read_dir_sorted(&shard)? {
                let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
                    continue;
                };
                if !is_hash(name) {
                    continue;
                }
                let Ok(metadata) = fs::metadata(&path) else {
                    continue;
                };
                blobs.push(BlobFile {
                    path: path.clone(),
                    size: metadata.len(),
                    used: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
        Ok(blobs)
    }

    /// Evicts least recently used blobs until the blobs fit in `max_bytes`, then removes the
    /// entries, links and key records left pointing at nothing, and stale temp files.
    pub fn gc(&self, max_bytes: u64) -> Result<GcReport, CacheError> {
        let mut report = GcReport::default();
        let mut blobs = self.blobs()?;
        let mut total: u64 = blobs.iter().map(|blob| blob.size).sum();
        blobs.sort_by_key(|blob| blob.used);
        for blob in blobs {
            if total <= max_bytes {
                break;
            }
            match fs::remove_file(&blob.path) {
                Ok(()) => {
                    total -= blob.size;
                    report.blobs_removed += 1;
                    report.bytes_freed += blob.size;
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => total -= blob.size,
                Err(err) => return Err(io_error(&blob.path)(err)),
            }
        }
        report.bytes_kept = total;
        for backend in BACKENDS {
            for kernel_dir in read_dir_sorted(&self.root.join(backend.as_str()))? {
                for legacy in legacy_files(&kernel_dir)? {
                    let is_entry = legacy.extension().is_some_and(|ext| ext == "json");
                    if fs::remove_file(&legacy).is_ok() && is_entry {
                        report.entries_removed += 1;
                    }
                }
            }
        }
        for entry in self.entries()? {
            if !self.root.join(blob_path(&entry.record.blob)).exists() {
                let _ = fs::remove_file(self.root.join(entry.entry_path()));
                let _ = fs::remove_file(self.root.join(entry.artifact_path()));
                let _ = fs::remove_file(self.root.join(key_path(&entry.key)));
                report.entries_removed += 1;
            }
        }
        for shard in read_dir_sorted(&self.root.join("keys"))? {
            for path in read_dir_sorted(&shard)? {
                let record: Option<KeyRecord> = fs::read(&path)
                    .ok()
                    .and_then(|bytes| serde_json::from_slice(&bytes).ok());
                if record.is_some_and(|record| !self.root.join(blob_path(&record.blob)).exists()) {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        report.temp_files_removed = remove_temp_files(&self.root, true)?;
        Ok(report)
    }
}

struct BlobFile {
    path: PathBuf,
    size: u64,
    used: SystemTime,
}

/// What an older headroom left in a kernel's directory: its entries and links, which sat beside
/// the origin directories of today's layout. Temp files are left to the temp file sweep.
fn legacy_files(kernel_dir: &Path) -> Result<Vec<PathBuf>, CacheError> {
    Ok(read_dir_sorted(kernel_dir)?
        .into_iter()
        .filter(|path| {
            let name = path.file_name().map(|name| name.to_string_lossy());
            !name.is_some_and(|name| name.starts_with('.'))
                && fs::symlink_metadata(path).is_ok_and(|metadata| !metadata.is_dir())
        })
        .collect())
}

/// Directory entries sorted by name; a missing directory is empty.
fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>, CacheError> {
    let read = match fs::read_dir(dir) {
        Ok(read) => read,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io_error(dir)(err)),
    };
    let mut paths = read
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect::<Vec<_>>();
    paths.sort();
    Ok(paths)
}

/// Removes, below `dir`, the temp files and work directories of writers that have ended, and
/// with `stale` also those older than `STALE_TEMP_AGE`; returns how many. Deeper directories
/// go first, so that a work directory, which tells that a sweep is due, goes last.
fn remove_temp_files(dir: &Path, stale: bool) -> Result<usize, CacheError> {
    let mut removed = 0;
    let mut temps = Vec::new();
    for path in read_dir_sorted(dir)? {
        let Ok(metadata) = fs::symlink_metadata(&path) else {
            continue;
        };
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with(TEMP_KIND) {
            temps.push((path, metadata, name));
        } else if metadata.is_dir() {
            removed += remove_temp_files(&path, stale)?;
        }
    }
    for (path, metadata, name) in temps {
        let old = || {
            metadata
                .modified()
                .ok()
                .and_then(|time| time.elapsed().ok())
                .is_some_and(|age| age > STALE_TEMP_AGE)
        };
        let left_behind = headroom_paths::temp::is_orphaned(&name, TEMP_KIND) || (stale && old());
        if !left_behind {
            continue;
        }
        let gone = if metadata.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed += usize::from(gone.is_ok());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cache: &Cache, kernel: &str, target: &str, bytes: &[u8]) -> Entry {
        built_from(cache, "sources", kernel, target, bytes)
    }

    /// An entry of the build of `sources`.
    fn built_from(cache: &Cache, sources: &str, kernel: &str, target: &str, bytes: &[u8]) -> Entry {
        let blob = cache.store_blob(bytes).unwrap();
        Entry {
            kernel: kernel.into(),
            backend: Backend::Cuda,
            origin: hash_bytes(sources.as_bytes()),
            target: target.parse().unwrap(),
            key: hash_bytes(format!("{sources}{kernel}{target}").as_bytes()),
            record: KeyRecord {
                blob,
                size: bytes.len() as u64,
                format: Format::Ptx,
                ptx_isa: None,
                toolchain: "clang".into(),
            },
        }
    }

    #[test]
    fn publish_makes_a_browsable_layout_and_a_key_record() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let entry = entry(&cache, "add", "sm_80", b"ptx bytes");
        cache.publish(&entry).unwrap();
        assert_eq!(
            fs::read(
                dir.path()
                    .join("cuda/add")
                    .join(&entry.origin)
                    .join("sm_80.ptx")
            )
            .unwrap(),
            b"ptx bytes"
        );
        assert_eq!(
            cache.lookup_key(&entry.key).unwrap(),
            Some(entry.record.clone())
        );
        assert_eq!(cache.entries().unwrap(), [entry]);
    }

    #[test]
    fn a_flipped_byte_is_a_miss_and_the_blob_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let entry = entry(&cache, "add", "sm_80", b"ptx bytes");
        cache.publish(&entry).unwrap();
        let blob = dir.path().join(blob_path(&entry.record.blob));
        let mut bytes = fs::read(&blob).unwrap();
        bytes[0] ^= 1;
        fs::write(&blob, bytes).unwrap();
        assert_eq!(cache.lookup_key(&entry.key).unwrap(), None);
        assert!(!blob.exists());
    }

    #[test]
    fn gc_evicts_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let old = entry(&cache, "old", "sm_80", &[1; 1000]);
        let new = entry(&cache, "new", "sm_80", &[2; 1000]);
        cache.publish(&old).unwrap();
        cache.publish(&new).unwrap();
        let long_ago = SystemTime::now() - Duration::from_secs(86_400);
        File::options()
            .write(true)
            .open(dir.path().join(blob_path(&old.record.blob)))
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        let report = cache.gc(1500).unwrap();
        assert_eq!(
            (
                report.blobs_removed,
                report.bytes_freed,
                report.bytes_kept,
                report.entries_removed
            ),
            (1, 1000, 1000, 1)
        );
        assert_eq!(cache.entries().unwrap(), std::slice::from_ref(&new));
        assert!(!dir.path().join(old.artifact_path()).exists());
        assert_eq!(cache.lookup_key(&old.key).unwrap(), None);
        assert!(cache.lookup_key(&new.key).unwrap().is_some());
    }

    #[test]
    fn the_first_valid_key_record_wins() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let first = entry(&cache, "add", "gfx1100", b"first build");
        let mut second = entry(&cache, "add", "gfx1100", b"second, different bytes");
        second.key = first.key.clone();
        assert_eq!(cache.publish(&first).unwrap(), first);
        assert_eq!(
            cache.publish(&second).unwrap(),
            first,
            "the loser adopts the winner's blob"
        );
        assert_eq!(
            fs::read(dir.path().join(first.artifact_path())).unwrap(),
            b"first build"
        );

        // Once the winner's blob is gone, a new record takes its place.
        fs::remove_file(dir.path().join(blob_path(&first.record.blob))).unwrap();
        assert_eq!(cache.publish(&second).unwrap(), second);
    }

    /// Two builds of one kernel name (two projects, or one before and after an edit) keep
    /// their own entries, and a resolve weighs the artifacts of one build only: its own, or
    /// by default the one published last, never a target of the other beside it.
    #[test]
    fn builds_of_one_kernel_never_mix_in_a_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let first = ["sm_80", "sm_90a"]
            .map(|target| built_from(&cache, "first", "add", target, target.as_bytes()));
        let second = ["sm_80", "sm_90"].map(|target| {
            built_from(
                &cache,
                "second",
                "add",
                target,
                format!("other {target}").as_bytes(),
            )
        });
        for entry in first.iter().chain(&second) {
            cache.publish(entry).unwrap();
        }
        let hopper: Device = "sm_90".parse().unwrap();
        let options = ResolveOptions::default();
        let pick = |origin: &Origin| {
            let (entries, explanation) = cache
                .resolve_origin("add", origin, &hopper, &options)
                .unwrap();
            (entries.len(), entries[explanation.chosen.unwrap()].clone())
        };
        assert_eq!(
            pick(&Origin::Exactly(first[0].origin.clone())),
            (2, first[1].clone())
        );
        assert_eq!(
            pick(&Origin::Exactly(second[0].origin.clone())),
            (2, second[1].clone())
        );
        assert_eq!(pick(&Origin::Newest), (2, second[1].clone()));
        assert_eq!(cache.resolve("add", &hopper, &options).unwrap().0, second);
        assert_eq!(cache.entries().unwrap().len(), 4);

        // Publishing the first again makes it the newest.
        cache.publish(&first[0]).unwrap();
        assert_eq!(pick(&Origin::Newest), (2, first[1].clone()));
        assert!(cache
            .resolve_origin("add", &Origin::Exactly("..".into()), &hopper, &options)
            .unwrap()
            .0
            .is_empty());
    }

    /// What an older headroom wrote beside the builds is not resolved, is counted, and goes
    /// with `gc`.
    #[test]
    fn entries_of_an_older_layout_are_counted_and_collected() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let current = entry(&cache, "add", "sm_80", b"ptx");
        cache.publish(&current).unwrap();
        let kernel_dir = dir.path().join("cuda/add");
        fs::write(kernel_dir.join("sm_86.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("../../blobs", kernel_dir.join("sm_86.ptx")).unwrap();
        assert_eq!(cache.legacy_entries(Backend::Cuda, "add").unwrap(), 1);
        assert_eq!(cache.entries().unwrap(), std::slice::from_ref(&current));
        assert_eq!(cache.gc(u64::MAX).unwrap().entries_removed, 1);
        assert_eq!(cache.legacy_entries(Backend::Cuda, "add").unwrap(), 0);
        assert!(fs::symlink_metadata(kernel_dir.join("sm_86.ptx")).is_err());
        assert_eq!(cache.entries().unwrap(), [current]);
    }

    #[test]
    fn resolve_skips_a_corrupt_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let sm80 = entry(&cache, "add", "sm_80", b"ptx 80");
        let sm86 = entry(&cache, "add", "sm_86", b"ptx 86");
        cache.publish(&sm80).unwrap();
        cache.publish(&sm86).unwrap();
        fs::write(dir.path().join(blob_path(&sm86.record.blob)), b"ptx 8X").unwrap();
        let (entries, explanation) = cache
            .resolve("add", &"sm_89".parse().unwrap(), &ResolveOptions::default())
            .unwrap();
        assert_eq!(entries[explanation.chosen.unwrap()], sm80);
    }

    /// What a writer killed mid-publish leaves (its work directory, a temp blob, a temp link)
    /// is gone once the next process opens the cache; a live writer's temp files stay.
    #[test]
    fn opening_removes_what_a_killed_writer_left() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let published = entry(&cache, "k", "sm_80", b"ptx");
        cache.publish(&published).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let shard = dir.path().join("blobs").join(&published.record.blob[..2]);
        let left = [
            dir.path().join(format!(".tmp{dead}-work")),
            shard.join(format!(".tmp{dead}-blob")),
            dir.path()
                .join("cuda/k")
                .join(&published.origin)
                .join(format!(".tmp{dead}-link")),
        ];
        fs::create_dir(&left[0]).unwrap();
        fs::write(left[0].join("sm_80.ptx"), "half").unwrap();
        fs::write(&left[1], "half a blob").unwrap();
        std::os::unix::fs::symlink("../../blobs", &left[2]).unwrap();
        let live = shard.join(format!("{}blob", headroom_paths::temp::prefix(TEMP_KIND)));
        fs::write(&live, "being written").unwrap();

        let reopened = Cache::open(dir.path()).unwrap();
        for path in &left {
            assert!(
                fs::symlink_metadata(path).is_err(),
                "{} is left",
                path.display()
            );
        }
        assert!(live.exists(), "a live writer's temp file stays");
        assert_eq!(reopened.entries().unwrap(), [published]);
    }

    /// A build's work directory exists from its first write and goes with the cache.
    #[test]
    fn the_work_directory_lasts_as_long_as_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let hidden = || {
            fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with('.')
                })
                .count()
        };
        assert_eq!(hidden(), 0, "a cache only read makes nothing");
        cache.store_blob(b"bytes").unwrap();
        assert_eq!(hidden(), 1);
        drop(cache);
        assert_eq!(hidden(), 0);
    }

    #[test]
    fn the_flag_beats_the_environment() {
        let flag = Path::new("/somewhere");
        assert_eq!(Cache::default_root(Some(flag)).unwrap(), flag);
    }
}
