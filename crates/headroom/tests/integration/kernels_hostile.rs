//! `headroom kernels import` of hostile bundles through the real binary: exit code 2, one
//! message on stderr that names the member and the limit and says what to do, and the cache
//! exactly as it was.

use std::process::Command;

use headroom_kernels::cache::Cache;

#[path = "../../../headroom-kernels/tests/hostile/mod.rs"]
mod hostile;
use crate::support;
use hostile::{listing, HOSTILE};
use support::HEADROOM;

#[test]
fn hostile_bundles_exit_2_with_one_clear_message_and_an_unchanged_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    Cache::open(&cache_dir).unwrap();
    let before = listing(&cache_dir);
    for name in [
        "decompression bomb: a member of 4 GiB of zeros the manifest declares as 4 bytes",
        "decompression bomb: 4 GiB of zeros in a long-name record",
        "a hard link",
        "a setuid member",
    ] {
        let kind = HOSTILE.iter().find(|kind| kind.name == name).unwrap();
        let bundle = dir.path().join("hostile.tar.zst");
        (kind.write)(&bundle);
        let output = Command::new(HEADROOM)
            .args(["kernels", "--cache"])
            .arg(&cache_dir)
            .arg("import")
            .arg(&bundle)
            .env_remove("HEADROOM_KERNEL_CACHE")
            .env_remove("HEADROOM_KERNEL_STORE")
            .env("HEADROOM_STATE_DIR", dir.path().join("state"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        assert!(output.stdout.is_empty(), "{name}: nothing on stdout");
        assert_eq!(stderr.lines().count(), 1, "{name}: one message: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "headroom: error: importing {}: refusing bundle: ",
                bundle.display()
            )),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(kind.refusal), "{name}: {stderr}");
        assert!(
            stderr.contains("export"),
            "{name} says what to do: {stderr}"
        );
        assert_eq!(listing(&cache_dir), before, "{name}: the cache changed");
    }
}
