//! Hostile bundles (decompression bombs, a million entries, over-long names, duplicates,
//! links and devices, dangerous modes, manifests that lie): each is refused with a message
//! that names the member and the limit, fast, and leaves the cache exactly as it was: no new
//! blob, no entry, no temp file.
//!
//! With `HEADROOM_HOSTILE_BUNDLES_DIR` set, the bundles are also kept there, for
//! `bench/reliability/hostile-bundles.sh` to import through the real binary.

use std::path::Path;
use std::time::Instant;

use headroom_kernels::bundle::{import, BundleError, BUNDLE_MANIFEST};
use headroom_kernels::cache::Cache;

use crate::hostile::{artifact, listing, manifest_of, regular, write_members, HOSTILE};

/// A cache that already holds one imported artifact, so that "unchanged" means something.
fn cache_with_one_artifact(dir: &Path) -> Cache {
    let bundle = dir.join("other.tar.zst");
    let manifest = manifest_of(vec![artifact("other", b"other")]);
    write_members(
        &bundle,
        &[
            regular(BUNDLE_MANIFEST.as_bytes(), &manifest),
            regular(
                concat!("cuda/other/", origin!(), "/sm_80.ptx").as_bytes(),
                b"other",
            ),
        ],
    );
    let cache = Cache::open(&dir.join("cache")).unwrap();
    import(&cache, &bundle).unwrap();
    cache
}

#[test]
fn every_hostile_bundle_is_refused_and_leaves_the_cache_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_with_one_artifact(dir.path());
    let before = listing(cache.root());
    let keep = std::env::var_os("HEADROOM_HOSTILE_BUNDLES_DIR");
    let mut refused = 0;
    for (index, kind) in HOSTILE.iter().enumerate() {
        let bundle = match &keep {
            Some(keep) => Path::new(keep).join(format!("{index:02}.tar.zst")),
            None => dir.path().join("hostile.tar.zst"),
        };
        let started = Instant::now();
        (kind.write)(&bundle);
        let written = started.elapsed();
        let started = Instant::now();
        let outcome = import(&cache, &bundle);
        let took = started.elapsed();
        let size = std::fs::metadata(&bundle).unwrap().len();
        eprintln!(
            "{index:02} {}: {size}-byte bundle, written in {:.3} s, refused in {:.3} s",
            kind.name,
            written.as_secs_f64(),
            took.as_secs_f64()
        );
        match outcome {
            Err(err @ BundleError::Rejected { .. }) => {
                let message = err.to_string();
                assert!(
                    message.contains(kind.refusal),
                    "{}: the refusal says `{message}`, not `{}`",
                    kind.name,
                    kind.refusal
                );
                assert!(message.starts_with("refusing bundle: "), "{message}");
                assert!(message.contains("export"), "{message} says what to do");
            }
            other => panic!("{}: not refused: {other:?}", kind.name),
        }
        assert_eq!(
            listing(cache.root()),
            before,
            "{}: the cache changed",
            kind.name
        );
        refused += 1;
    }
    println!(
        "{refused} of {} hostile bundles refused, cache unchanged",
        HOSTILE.len()
    );
}

#[test]
fn a_refused_bundle_leaves_no_staged_bytes_behind_even_after_good_members() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_with_one_artifact(dir.path());
    let before = listing(cache.root());
    let manifest = manifest_of(vec![artifact("add", b"good"), artifact("mul", b"fine")]);
    let bundle = dir.path().join("late.tar.zst");
    write_members(
        &bundle,
        &[
            regular(BUNDLE_MANIFEST.as_bytes(), &manifest),
            regular(
                concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                b"good",
            ),
            regular(
                concat!("cuda/mul/", origin!(), "/sm_80.ptx").as_bytes(),
                b"evil",
            ),
        ],
    );
    let err = import(&cache, &bundle).unwrap_err().to_string();
    assert!(
        err.contains(concat!(
            "member `cuda/mul/",
            origin!(),
            "/sm_80.ptx` does not match its blake3 hash"
        )),
        "{err}"
    );
    assert_eq!(listing(cache.root()), before);
}
