//! Moving built kernels between machines: `export` writes one tar+zstd bundle with a manifest
//! of hashes, `import` verifies every file against it and adds them to a cache.
//!
//! Import never writes an archive path to disk: artifact bytes go into content-addressed
//! blobs and the layout is rebuilt from the verified manifest. Paths that climb out (`..`,
//! absolute), symlinks, hard links and anything else that is not a regular file are still
//! refused outright, so a hostile bundle fails loudly instead of half-importing. Bundles are
//! deterministic (sorted, zero times and owners), so an export/import/export round trip is
//! byte-identical.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::{self, Cache, CacheError, Entry, SelectError};

/// The first member of every bundle.
pub const BUNDLE_MANIFEST: &str = "headroom-bundle.json";
const BUNDLE_SCHEMA: u32 = 1;
const ZSTD_LEVEL: i32 = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BundleManifest {
    schema: u32,
    artifacts: Vec<BundleArtifact>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BundleArtifact {
    /// The member path: `<backend>/<kernel>/<target>.<ext>`.
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
    #[error("refusing bundle: {0}; it was not written by `headroom kernels export` or was changed since, so export it again")]
    Rejected(String),
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

/// Writes every artifact of the cache (or of the named kernels) into `path`.
pub fn export(
    cache: &Cache,
    path: &Path,
    kernels: &[String],
) -> Result<BundleSummary, BundleError> {
    let io_error = |source| BundleError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut members = Vec::new();
    for entry in cache.selected_entries(kernels)? {
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

/// Verifies every member of the bundle at `path` and adds its artifacts to the cache.
pub fn import(cache: &Cache, path: &Path) -> Result<BundleSummary, BundleError> {
    let io_error = |source| BundleError::Read {
        path: path.to_path_buf(),
        source,
    };
    let reject = |reason: String| BundleError::Rejected(reason);
    let file = File::open(path).map_err(io_error)?;
    let decoder = zstd::Decoder::new(file).map_err(io_error)?;
    let mut archive = tar::Archive::new(decoder);
    let mut manifest: Option<BTreeMap<String, BundleArtifact>> = None;
    let mut verified: BTreeSet<String> = BTreeSet::new();
    for member in archive.entries().map_err(io_error)? {
        let member = member.map_err(io_error)?;
        let member_path = member.path().map_err(io_error)?.into_owned();
        let shown = member_path.display().to_string();
        if !is_plain_relative(&member_path) {
            return Err(reject(format!(
                "member `{shown}` is not a plain relative path (absolute or `..`)"
            )));
        }
        if member.header().entry_type() != tar::EntryType::Regular {
            return Err(reject(format!(
                "member `{shown}` is a {:?}, only regular files are allowed",
                member.header().entry_type()
            )));
        }
        let size = member.header().size().map_err(io_error)?;
        let Some(artifacts) = manifest.as_mut() else {
            if shown != BUNDLE_MANIFEST {
                return Err(reject(format!(
                    "the first member is `{shown}`, expected {BUNDLE_MANIFEST}"
                )));
            }
            let mut bytes = Vec::new();
            member
                .take(64 << 20)
                .read_to_end(&mut bytes)
                .map_err(io_error)?;
            let parsed: BundleManifest = serde_json::from_slice(&bytes)
                .map_err(|err| reject(format!("{BUNDLE_MANIFEST} is malformed: {err}")))?;
            if parsed.schema != BUNDLE_SCHEMA {
                return Err(reject(format!("bundle schema {} is not {BUNDLE_SCHEMA}; import it with the headroom version that exported it", parsed.schema)));
            }
            let mut by_path = BTreeMap::new();
            for artifact in parsed.artifacts {
                let expected = artifact
                    .entry
                    .artifact_path()
                    .to_string_lossy()
                    .replace('\\', "/");
                if artifact.path != expected
                    || !is_plain_relative(Path::new(&artifact.path))
                    || !artifact.entry.is_well_formed()
                    || artifact.blake3 != artifact.entry.record.blob
                {
                    return Err(reject(format!(
                        "manifest entry `{}` does not match its kernel and target",
                        artifact.path
                    )));
                }
                by_path.insert(artifact.path.clone(), artifact);
            }
            manifest = Some(by_path);
            continue;
        };
        let artifact = artifacts.get(&shown).ok_or_else(|| {
            reject(format!(
                "member `{shown}` is not listed in {BUNDLE_MANIFEST}"
            ))
        })?;
        if size != artifact.size || verified.contains(&shown) {
            return Err(reject(format!(
                "member `{shown}` is duplicated or its size differs from the manifest"
            )));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        member
            .take(size)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        if cache::hash_bytes(&bytes) != artifact.blake3 {
            return Err(reject(format!(
                "member `{shown}` does not match its blake3 hash in {BUNDLE_MANIFEST}"
            )));
        }
        cache.store_blob(&bytes)?;
        verified.insert(shown);
    }
    let artifacts = manifest.ok_or_else(|| reject(format!("it has no {BUNDLE_MANIFEST}")))?;
    if let Some(missing) = artifacts.keys().find(|path| !verified.contains(*path)) {
        return Err(reject(format!(
            "`{missing}` is listed in {BUNDLE_MANIFEST} but not in the bundle"
        )));
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
