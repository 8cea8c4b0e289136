//! Moving built kernels between machines: `export` writes one tar+zstd bundle with a manifest
//! of hashes, `import` verifies every file against it and adds them to a cache.
//!
//! Import never writes an archive path to disk: artifact bytes go into content-addressed
//! blobs and the layout is rebuilt from the verified manifest. A bundle is untrusted input, so
//! import refuses, before reading the bytes in question, anything `export` never writes: paths
//! that climb out or that no file system takes, links, devices and other non-regular members,
//! setuid or world-writable modes, duplicates, members the manifest does not list or whose size
//! it does not declare, and anything past the limits below (decompression stops there, so a
//! bomb costs what the limit allows). Bytes are staged in temp files and moved into the cache
//! only once the whole bundle checks out, so a refused import leaves the cache as it was.
//! Bundles are deterministic (sorted, zero times and owners), so an export/import/export
//! round trip is byte-identical.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::cache::{self, Cache, CacheError, Entry, Origin, SelectError};

/// The first member of every bundle.
pub const BUNDLE_MANIFEST: &str = "headroom-bundle.json";
/// Version 2: entries record their origin (what built them), which version 1 left out.
const BUNDLE_SCHEMA: u32 = 2;
const ZSTD_LEVEL: i32 = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BundleManifest {
    schema: u32,
    artifacts: Vec<BundleArtifact>,
}

/// The schema alone, read first so that a bundle of another version is named as such.
#[derive(Deserialize)]
struct BundleSchema {
    schema: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BundleArtifact {
    /// The member path: `<backend>/<kernel>/<origin>/<target>.<ext>`.
    path: String,
    blake3: String,
    size: u64,
    entry: Entry,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("cannot write the bundle {path}: {source}; check that its directory is writable, or write it elsewhere")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot read the bundle {path}: {source}; give the path of a bundle that `headroom kernels export` wrote")]
    Read { path: PathBuf, source: io::Error },
    #[error("artifact {path} is missing or corrupt in the cache; run `headroom kernels build` again before exporting")]
    BadArtifact { path: PathBuf },
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The bundle is malformed, hostile, or past a limit; nothing was imported.
    #[error("refusing bundle: {reason}; {advice}")]
    Rejected {
        reason: String,
        advice: &'static str,
    },
}

/// What an export or import moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BundleSummary {
    pub artifacts: usize,
    pub bytes: u64,
}

fn deterministic_header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_entry_type(tar::EntryType::Regular);
    header
}

/// Writes the artifacts of one build of each named kernel (of every kernel of the cache at
/// its newest build, when none is named) into `path`: a bundle holds one version of each
/// kernel, so whoever imports it resolves to that version.
pub fn export(
    cache: &Cache,
    path: &Path,
    kernels: &[(String, Origin)],
) -> Result<BundleSummary, BundleError> {
    let io_error = |source| BundleError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut members = Vec::new();
    for entry in cache.selected_builds(kernels)? {
        let artifact_path = entry.artifact_path();
        let bytes =
            cache
                .read_blob(&entry.record.blob)?
                .ok_or_else(|| BundleError::BadArtifact {
                    path: artifact_path.clone(),
                })?;
        let member = artifact_path.to_string_lossy().replace('\\', "/");
        members.push((
            BundleArtifact {
                path: member,
                blake3: entry.record.blob.clone(),
                size: bytes.len() as u64,
                entry,
            },
            bytes,
        ));
    }
    members.sort_by(|a, b| a.0.path.cmp(&b.0.path));
    let manifest = BundleManifest {
        schema: BUNDLE_SCHEMA,
        artifacts: members
            .iter()
            .map(|(artifact, _)| artifact.clone())
            .collect(),
    };
    let manifest_bytes =
        serde_json::to_vec_pretty(&manifest).expect("bundle manifests always serialize");

    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let temp = cache::temp_file_in(dir).map_err(io_error)?;
    let encoder = zstd::Encoder::new(temp.as_file(), ZSTD_LEVEL).map_err(io_error)?;
    let mut archive = tar::Builder::new(encoder);
    archive.mode(tar::HeaderMode::Deterministic);
    archive
        .append_data(
            &mut deterministic_header(manifest_bytes.len() as u64),
            BUNDLE_MANIFEST,
            manifest_bytes.as_slice(),
        )
        .map_err(io_error)?;
    for (artifact, bytes) in &members {
        archive
            .append_data(
                &mut deterministic_header(bytes.len() as u64),
                &artifact.path,
                bytes.as_slice(),
            )
            .map_err(io_error)?;
    }
    archive
        .into_inner()
        .and_then(|encoder| encoder.finish())
        .map_err(io_error)?;
    temp.as_file().sync_all().map_err(io_error)?;
    temp.persist(path).map_err(|err| io_error(err.error))?;
    Ok(BundleSummary {
        artifacts: members.len(),
        bytes: members.iter().map(|(artifact, _)| artifact.size).sum(),
    })
}

/// Threads that publish imported entries: each publish is a few small fsynced writes, so
/// overlapping them hides most of the file system's latency.
const PUBLISH_THREADS: usize = 8;

fn publish_in_parallel(cache: &Cache, entries: &[&Entry]) -> Result<(), CacheError> {
    let chunk = entries.len().div_ceil(PUBLISH_THREADS).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = entries
            .chunks(chunk)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .try_for_each(|entry| cache.publish(entry).map(drop))
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })
}

/// A member path made only of plain names: no root, no `..`, no `.`.
fn is_plain_relative(path: &Path) -> bool {
    path.components().next().is_some()
        && path
            .components()
            .all(|component| matches!(component, Component::Normal(_)))
}

// What an import accepts. Each limit is far above anything `export` writes, and each is checked
// before the bytes it guards are read, so a hostile bundle costs at most a few of them.

/// Artifacts one bundle may list: a thousand kernels for twenty targets each, where a big
/// project exports a few hundred.
const MAX_ARTIFACTS: usize = 20_000;
/// Bytes of `headroom-bundle.json`: under a KiB per artifact, for `MAX_ARTIFACTS` of them.
const MAX_MANIFEST_BYTES: u64 = 32 << 20;
/// Bytes all artifacts of one bundle may declare together: whole kernel caches are a few GiB.
const MAX_ARTIFACT_BYTES: u64 = 16 << 30;
/// Bytes of one path component: NAME_MAX on Linux and macOS file systems.
const MAX_NAME_BYTES: usize = 255;
/// Bytes of one member path: PATH_MAX on Linux.
const MAX_PATH_BYTES: usize = 4096;
/// Decompressed bytes of tar framing before each member's data: the previous member's padding,
/// its header, and a long-name or pax record for a path of `MAX_PATH_BYTES`, with room to spare.
/// The tar reader holds such records in memory, so this also bounds what a bomb hidden in one
/// can allocate.
const MEMBER_FRAMING_BYTES: u64 = 16 << 10;
/// Mode bits no member may carry: setuid, setgid, sticky, and writable by anyone.
const FORBIDDEN_MODE_BITS: u32 = 0o7002;

/// Advice for a bundle that is malformed or hostile.
const EXPORT_AGAIN: &str =
    "it was not written by `headroom kernels export` or was changed since, so export it again";
/// Advice for a bundle that is well formed but bigger than an import takes.
const EXPORT_LESS: &str = "export fewer kernels per bundle with `headroom kernels export --kernel`";

fn rejected(reason: String) -> BundleError {
    BundleError::Rejected {
        reason,
        advice: EXPORT_AGAIN,
    }
}

fn too_big(reason: String) -> BundleError {
    BundleError::Rejected {
        reason,
        advice: EXPORT_LESS,
    }
}

/// How many decompressed bytes the tar reader may still take; shared with `Budgeted`, which
/// the reader owns.
#[derive(Debug, Default)]
struct Budget {
    read: Cell<u64>,
    limit: Cell<u64>,
    exceeded: Cell<bool>,
}

impl Budget {
    /// From now on, `bytes` more may be read.
    fn allow(&self, bytes: u64) {
        self.limit.set(self.read.get().saturating_add(bytes));
    }
}

/// The decompressed stream, cut off with an error at the budget's limit: decompression stops
/// there instead of running on through a bomb.
struct Budgeted<R> {
    inner: R,
    budget: Rc<Budget>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let budget = &self.budget;
        let left = budget.limit.get().saturating_sub(budget.read.get());
        if left == 0 && !buf.is_empty() {
            budget.exceeded.set(true);
            return Err(io::Error::other("the bundle's decompressed size limit"));
        }
        let wanted = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let read = self.inner.read(&mut buf[..wanted])?;
        budget.read.set(budget.read.get() + read as u64);
        Ok(read)
    }
}

/// Refuses a member path no file system takes, before anything is made from it.
fn check_name_lengths(shown: &str, bytes: &[u8]) -> Result<(), BundleError> {
    if bytes.len() > MAX_PATH_BYTES {
        return Err(rejected(format!(
            "member `{}…` has a {}-byte path, over the {MAX_PATH_BYTES}-byte limit of file systems",
            shown.chars().take(64).collect::<String>(),
            bytes.len()
        )));
    }
    if let Some(long) = bytes
        .split(|b| *b == b'/')
        .find(|c| c.len() > MAX_NAME_BYTES)
    {
        return Err(rejected(format!(
            "member `{}…` has a {}-byte name, over the {MAX_NAME_BYTES}-byte limit of file systems",
            shown.chars().take(64).collect::<String>(),
            long.len()
        )));
    }
    Ok(())
}

/// Checks a member's header: its path, its type and its mode. Returns the path.
fn check_header<R: Read>(member: &tar::Entry<R>) -> Result<String, BundleError> {
    let bytes = member.path_bytes();
    let shown = String::from_utf8_lossy(&bytes).into_owned();
    check_name_lengths(&shown, &bytes)?;
    if !is_plain_relative(Path::new(&shown)) || std::str::from_utf8(&bytes).is_err() {
        return Err(rejected(format!(
            "member `{shown}` is not a plain relative path (absolute, `..`, or not UTF-8)"
        )));
    }
    let kind = member.header().entry_type();
    if kind != tar::EntryType::Regular {
        return Err(rejected(format!(
            "member `{shown}` is a {kind:?}, only regular files are allowed"
        )));
    }
    let mode = member
        .header()
        .mode()
        .map_err(|err| rejected(format!("member `{shown}` has a malformed mode: {err}")))?;
    if mode & FORBIDDEN_MODE_BITS != 0 {
        return Err(rejected(format!(
            "member `{shown}` has mode {mode:o}; setuid, setgid, sticky and world-writable modes are refused"
        )));
    }
    Ok(shown)
}

/// Parses and checks `headroom-bundle.json`: every entry well formed and listed once, sizes
/// that agree, and within the limits. Returns the artifacts by member path.
fn read_manifest(
    mut member: impl Read,
    size: u64,
    read_error: impl FnOnce(io::Error) -> BundleError,
) -> Result<BTreeMap<String, BundleArtifact>, BundleError> {
    if size > MAX_MANIFEST_BYTES {
        return Err(too_big(format!(
            "{BUNDLE_MANIFEST} is {size} bytes, over the limit of {MAX_MANIFEST_BYTES}"
        )));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    member.read_to_end(&mut bytes).map_err(read_error)?;
    let malformed =
        |err: serde_json::Error| rejected(format!("{BUNDLE_MANIFEST} is malformed: {err}"));
    let schema = serde_json::from_slice::<BundleSchema>(&bytes)
        .map_err(malformed)?
        .schema;
    if schema != BUNDLE_SCHEMA {
        return Err(BundleError::Rejected {
            reason: format!("bundle schema {schema} is not {BUNDLE_SCHEMA}"),
            advice: "export it again with this headroom version (schema 1 bundles do not say which sources built each artifact), or import it with the headroom version that exported it",
        });
    }
    let parsed: BundleManifest = serde_json::from_slice(&bytes).map_err(malformed)?;
    if parsed.artifacts.len() > MAX_ARTIFACTS {
        return Err(too_big(format!(
            "{BUNDLE_MANIFEST} lists {} artifacts, over the limit of {MAX_ARTIFACTS}",
            parsed.artifacts.len()
        )));
    }
    let mut by_path = BTreeMap::new();
    let mut declared: u64 = 0;
    for artifact in parsed.artifacts {
        let expected = artifact
            .entry
            .artifact_path()
            .to_string_lossy()
            .replace('\\', "/");
        check_name_lengths(&artifact.path, artifact.path.as_bytes())?;
        if artifact.path != expected
            || !is_plain_relative(Path::new(&artifact.path))
            || !artifact.entry.is_well_formed()
            || artifact.blake3 != artifact.entry.record.blob
        {
            return Err(rejected(format!(
                "manifest entry `{}` does not match its kernel and target",
                artifact.path
            )));
        }
        if artifact.size != artifact.entry.record.size {
            return Err(rejected(format!(
                "manifest entry `{}` declares {} bytes but its record {}",
                artifact.path, artifact.size, artifact.entry.record.size
            )));
        }
        declared = declared.saturating_add(artifact.size);
        if declared > MAX_ARTIFACT_BYTES {
            return Err(too_big(format!(
                "{BUNDLE_MANIFEST} declares more than {MAX_ARTIFACT_BYTES} bytes of artifacts (at `{}`)",
                artifact.path
            )));
        }
        if let Some(twice) = by_path.insert(artifact.path.clone(), artifact) {
            return Err(rejected(format!(
                "manifest entry `{}` is listed twice",
                twice.path
            )));
        }
    }
    Ok(by_path)
}

/// Streams one member's bytes from the bundle at `bundle` into a temp file in the cache,
/// hashing them on the way. Returns their hash, their length and the temp file, not yet
/// fsynced: `Cache::adopt_blob` does that only where the cache lacks the blob.
fn stage_member(
    cache: &Cache,
    bundle: &Path,
    mut member: impl Read,
) -> Result<(String, u64, tempfile::TempPath), BundleError> {
    let mut temp = cache.blob_temp()?;
    let temp_path = temp.path().to_path_buf();
    let temp_error = |source| CacheError::Io {
        path: temp_path.clone(),
        source,
    };
    let mut hasher = blake3::Hasher::new();
    let mut buffer = vec![0; 256 << 10];
    let mut written = 0;
    loop {
        let read = match member.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(BundleError::Read {
                    path: bundle.to_path_buf(),
                    source,
                })
            }
        };
        hasher.update(&buffer[..read]);
        temp.write_all(&buffer[..read]).map_err(temp_error)?;
        written += read as u64;
    }
    Ok((
        hasher.finalize().to_hex().to_string(),
        written,
        temp.into_temp_path(),
    ))
}

/// Verifies every member of the bundle at `path` and adds its artifacts to the cache.
///
/// Nothing reaches the cache until the whole bundle is verified: artifact bytes are staged in
/// temp files (removed on any refusal) and moved into place only after the last member.
pub fn import(cache: &Cache, path: &Path) -> Result<BundleSummary, BundleError> {
    let budget = Rc::new(Budget::default());
    let mut last_member = String::new();
    let verified = verify(cache, path, &budget, &mut last_member).map_err(|err| {
        if !budget.exceeded.get() {
            return err;
        }
        let after = match last_member.as_str() {
            "" => "at its start".to_string(),
            last => format!("after member `{last}`"),
        };
        rejected(format!(
            "the tar headers {after} run past {MEMBER_FRAMING_BYTES} bytes, the limit for one member's headers (a long name or extended header that big is a bomb)"
        ))
    })?;
    let (artifacts, staged) = verified;
    for (hash, temp) in staged {
        cache.adopt_blob(temp, &hash)?;
    }
    publish_in_parallel(
        cache,
        &artifacts
            .values()
            .map(|artifact| &artifact.entry)
            .collect::<Vec<_>>(),
    )?;
    Ok(BundleSummary {
        artifacts: artifacts.len(),
        bytes: artifacts.values().map(|artifact| artifact.size).sum(),
    })
}

/// The artifacts of a verified bundle, and their bytes staged in temp files by hash.
type Verified = (
    BTreeMap<String, BundleArtifact>,
    BTreeMap<String, tempfile::TempPath>,
);

/// Reads the bundle at `path` through `budget`, checking every member; records the path of the
/// last member read in `last_member`.
fn verify(
    cache: &Cache,
    path: &Path,
    budget: &Rc<Budget>,
    last_member: &mut String,
) -> Result<Verified, BundleError> {
    let io_error = |source| BundleError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_error)?;
    let decoder = zstd::Decoder::new(file).map_err(io_error)?;
    budget.allow(MEMBER_FRAMING_BYTES);
    let mut archive = tar::Archive::new(Budgeted {
        inner: decoder,
        budget: Rc::clone(budget),
    });
    let mut manifest: Option<BTreeMap<String, BundleArtifact>> = None;
    let mut verified: BTreeSet<String> = BTreeSet::new();
    let mut staged: BTreeMap<String, tempfile::TempPath> = BTreeMap::new();
    for member in archive.entries().map_err(io_error)? {
        let member = member.map_err(io_error)?;
        let shown = check_header(&member)?;
        let size = member.size();
        let Some(artifacts) = manifest.as_ref() else {
            if shown != BUNDLE_MANIFEST {
                return Err(rejected(format!(
                    "the first member is `{shown}`, expected {BUNDLE_MANIFEST}"
                )));
            }
            budget.allow(size.saturating_add(MEMBER_FRAMING_BYTES));
            manifest = Some(read_manifest(member, size, io_error)?);
            *last_member = shown;
            continue;
        };
        let artifact = artifacts.get(&shown).ok_or_else(|| {
            rejected(format!(
                "member `{shown}` is not listed in {BUNDLE_MANIFEST}"
            ))
        })?;
        if verified.contains(&shown) {
            return Err(rejected(format!("member `{shown}` is duplicated")));
        }
        if size != artifact.size {
            return Err(rejected(format!(
                "member `{shown}` is {size} bytes but {BUNDLE_MANIFEST} declares {}",
                artifact.size
            )));
        }
        budget.allow(size + MEMBER_FRAMING_BYTES);
        let (hash, written, temp) = stage_member(cache, path, member)?;
        if written != size {
            return Err(rejected(format!(
                "member `{shown}` is cut short at {written} of its {size} bytes"
            )));
        }
        if hash != artifact.blake3 {
            return Err(rejected(format!(
                "member `{shown}` does not match its blake3 hash in {BUNDLE_MANIFEST}"
            )));
        }
        staged.entry(hash).or_insert(temp);
        verified.insert(shown.clone());
        *last_member = shown;
    }
    let artifacts = manifest.ok_or_else(|| rejected(format!("it has no {BUNDLE_MANIFEST}")))?;
    if let Some(missing) = artifacts.keys().find(|path| !verified.contains(*path)) {
        return Err(rejected(format!(
            "`{missing}` is listed in {BUNDLE_MANIFEST} but not in the bundle"
        )));
    }
    Ok((artifacts, staged))
}
