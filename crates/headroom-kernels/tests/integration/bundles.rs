//! Export/import: a round trip is byte-identical, and hand-made malicious bundles (path
//! traversal, absolute paths, symlinks, hard links, wrong hashes, unlisted members) are
//! refused before anything lands in the layout.

use std::path::Path;

use headroom_kernels::bundle::{export, import, BUNDLE_MANIFEST};
use headroom_kernels::cache::{hash_bytes, Cache, Entry, KeyRecord};
use headroom_kernels::resolve::Format;
use headroom_kernels::target::Backend;

use crate::hostile::{self, manifest_for, regular, write_members, Member};

fn filled_cache(root: &Path) -> Cache {
    let cache = Cache::open(root).unwrap();
    for (kernel, target, bytes) in [
        ("add", "sm_80", b"ptx 80".as_slice()),
        ("add", "sm_90a", b"ptx 90a"),
        ("mul", "sm_80", b"ptx 80"),
    ] {
        let blob = cache.store_blob(bytes).unwrap();
        let record = KeyRecord {
            blob,
            size: bytes.len() as u64,
            format: Format::Ptx,
            ptx_isa: Some("8.0".parse().unwrap()),
            toolchain: "clang 19".into(),
        };
        let entry = Entry {
            kernel: kernel.into(),
            backend: Backend::Cuda,
            origin: hostile::ORIGIN.into(),
            target: target.parse().unwrap(),
            key: hash_bytes(format!("{kernel}/{target}").as_bytes()),
            record,
        };
        cache.publish(&entry).unwrap();
    }
    cache
}

#[test]
fn export_import_export_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let source = filled_cache(&dir.path().join("ci-cache"));
    let first = dir.path().join("kernels.tar.zst");
    let summary = export(&source, &first, &[]).unwrap();
    assert_eq!(summary.artifacts, 3);

    let user = Cache::open(&dir.path().join("user-cache")).unwrap();
    assert_eq!(import(&user, &first).unwrap().artifacts, 3);
    assert_eq!(user.entries().unwrap(), source.entries().unwrap());
    assert_eq!(
        std::fs::read(
            user.root()
                .join(concat!("cuda/add/", origin!(), "/sm_90a.ptx"))
        )
        .unwrap(),
        b"ptx 90a"
    );

    let second = dir.path().join("again.tar.zst");
    export(&user, &second, &[]).unwrap();
    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&second).unwrap()
    );

    let only_mul = dir.path().join("mul.tar.zst");
    assert_eq!(
        export(
            &source,
            &only_mul,
            &[("mul".to_string(), headroom_kernels::cache::Origin::Newest)]
        )
        .unwrap()
        .artifacts,
        1
    );
}

#[test]
fn bundles_and_cached_artifacts_are_as_readable_as_plain_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let source = filled_cache(&dir.path().join("ci-cache"));
    let bundle = dir.path().join("kernels.tar.zst");
    export(&source, &bundle, &[]).unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"").unwrap();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&bundle), mode(&plain));
    assert_eq!(
        mode(
            &source
                .root()
                .join(concat!("cuda/add/", origin!(), "/sm_90a.ptx"))
        ),
        mode(&plain)
    );
}

fn import_error(members: &[Member]) -> (String, Cache, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("evil.tar.zst");
    write_members(&bundle, members);
    let cache = Cache::open(&dir.path().join("cache")).unwrap();
    let err = import(&cache, &bundle).unwrap_err().to_string();
    (err, cache, dir)
}

#[test]
fn a_well_formed_hand_made_bundle_imports() {
    let manifest = manifest_for(b"good");
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ok.tar.zst");
    write_members(
        &bundle,
        &[
            regular(BUNDLE_MANIFEST.as_bytes(), &manifest),
            regular(
                concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                b"good",
            ),
        ],
    );
    let cache = Cache::open(&dir.path().join("cache")).unwrap();
    assert_eq!(import(&cache, &bundle).unwrap().artifacts, 1);
}

#[test]
fn import_rejects_malicious_bundles() {
    let manifest = manifest_for(b"good");
    let manifest_member = || regular(BUNDLE_MANIFEST.as_bytes(), &manifest);
    let cases: Vec<(&str, Vec<Member>, &str)> = vec![
        (
            "traversal",
            vec![manifest_member(), regular(b"../../etc/evil", b"good")],
            "not a plain relative path",
        ),
        (
            "nested traversal",
            vec![manifest_member(), regular(b"cuda/../../evil", b"good")],
            "not a plain relative path",
        ),
        (
            "absolute",
            vec![manifest_member(), regular(b"/tmp/evil", b"good")],
            "not a plain relative path",
        ),
        (
            "symlink",
            vec![
                manifest_member(),
                Member {
                    kind: tar::EntryType::Symlink,
                    link: b"/etc/passwd",
                    ..regular(
                        concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                        b"",
                    )
                },
            ],
            "only regular files are allowed",
        ),
        (
            "hard link",
            vec![
                manifest_member(),
                Member {
                    kind: tar::EntryType::Link,
                    link: b"/etc/passwd",
                    ..regular(
                        concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                        b"",
                    )
                },
            ],
            "only regular files are allowed",
        ),
        (
            "wrong hash",
            vec![
                manifest_member(),
                regular(
                    concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                    b"evil",
                ),
            ],
            "does not match its blake3 hash",
        ),
        (
            "unlisted member",
            vec![
                manifest_member(),
                regular(
                    concat!("cuda/add/", origin!(), "/sm_90.ptx").as_bytes(),
                    b"good",
                ),
            ],
            "is not listed",
        ),
        (
            "missing member",
            vec![manifest_member()],
            "listed in headroom-bundle.json but not in the bundle",
        ),
        (
            "no manifest first",
            vec![
                regular(
                    concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                    b"good",
                ),
                manifest_member(),
            ],
            "the first member is",
        ),
        (
            "duplicate",
            vec![
                manifest_member(),
                regular(
                    concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                    b"good",
                ),
                regular(
                    concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
                    b"good",
                ),
            ],
            "duplicated",
        ),
    ];
    for (name, members, expected) in cases {
        let (err, cache, _dir) = import_error(&members);
        assert!(err.contains(expected), "{name}: {err}");
        assert!(
            cache.entries().unwrap().is_empty(),
            "{name}: nothing may be published"
        );
    }
}

#[test]
fn import_rejects_kernel_names_that_nest_directories() {
    let manifest = String::from_utf8(manifest_for(b"good"))
        .unwrap()
        .replace(
            concat!("\"cuda/add/", origin!(), "/sm_80.ptx\""),
            concat!("\"cuda/add/x/", origin!(), "/sm_80.ptx\""),
        )
        .replace("\"kernel\":\"add\"", "\"kernel\":\"add/x\"");
    assert!(manifest.contains("add/x\""), "{manifest}");
    let (err, _cache, _dir) = import_error(&[
        regular(BUNDLE_MANIFEST.as_bytes(), manifest.as_bytes()),
        regular(
            concat!("cuda/add/x/", origin!(), "/sm_80.ptx").as_bytes(),
            b"good",
        ),
    ]);
    assert!(
        err.contains("does not match its kernel and target"),
        "{err}"
    );
}

#[test]
fn import_rejects_a_manifest_whose_paths_do_not_match_its_entries() {
    let manifest = String::from_utf8(manifest_for(b"good")).unwrap().replace(
        concat!("\"cuda/add/", origin!(), "/sm_80.ptx\""),
        "\"../escape.ptx\"",
    );
    let (err, _cache, _dir) = import_error(&[
        regular(BUNDLE_MANIFEST.as_bytes(), manifest.as_bytes()),
        regular(
            concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
            b"good",
        ),
    ]);
    assert!(
        err.contains("does not match its kernel and target"),
        "{err}"
    );
}

#[test]
fn import_rejects_a_build_key_that_is_not_a_hash() {
    // The key names the key record's file, `keys/<key[..2]>/<key>.json`: this one would land
    // beside the cache.
    let key = hash_bytes(b"add");
    let manifest = String::from_utf8(manifest_for(b"good"))
        .unwrap()
        .replace(&key, "../outside");
    let (err, _cache, dir) = import_error(&[
        regular(BUNDLE_MANIFEST.as_bytes(), manifest.as_bytes()),
        regular(
            concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes(),
            b"good",
        ),
    ]);
    assert!(
        err.contains("does not match its kernel and target"),
        "{err}"
    );
    assert!(!dir.path().join("outside.json").exists());
}
