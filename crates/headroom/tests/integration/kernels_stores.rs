//! `headroom kernels push`, `pull` and `resolve --fetch` through the real binary, against real
//! servers on loopback ([`stores`]): moto's S3 server, redis-server, the wsgidav WebDAV server,
//! and a plain directory.
//!
//! The artifacts are published straight into a cache with the cache's own API: the store is
//! what is tested here, and builds are tested elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use headroom_kernels::cache::{hash_bytes, Cache, Entry, KeyRecord};
use headroom_kernels::resolve::Format;
use headroom_kernels::target::Backend;
use headroom_remote::kernels::index_key;
use headroom_remote::store::blob_key;
use headroom_remote::Store;

use crate::support::{self, stores};

use stores::{down_url, Kind, Server, AWS_SECRET, DAV_PASSWORD, REDIS_PASSWORD};
use support::{stdout, HEADROOM};

/// `headroom kernels` with a cache, a store and nothing from this machine's settings.
fn command(cache: &Path, store: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let dir = cache.parent().unwrap();
    let mut command = Command::new(HEADROOM);
    command
        .current_dir(dir)
        .arg("kernels")
        .arg("--cache")
        .arg(cache)
        .arg("--manifest")
        .arg(dir.join("no-kernels.toml"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("HEADROOM_KERNEL_STORE")
        .env_remove("HEADROOM_KERNEL_STORE_READ_ONLY")
        .env_remove("HEADROOM_KERNEL_CACHE")
        .env("HEADROOM_CONFIG", dir.join("no-config.toml"))
        .env("AWS_ACCESS_KEY_ID", "headroom-test")
        .env("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
        .env("AWS_CONFIG_FILE", dir.join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("no-aws-credentials"),
        )
        .env("HEADROOM_LOG", "trace")
        .envs(env.iter().copied());
    command
}

/// Stderr less headroom's own tracing (the commands run with `HEADROOM_LOG=trace`, so that
/// the secrets check sees everything the libraries log).
fn stderr_less_tracing(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| line.starts_with("headroom"))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Asserts that no password or key is anywhere in an output, the logs included.
fn assert_no_secret(output: &Output) {
    for stream in [&output.stdout, &output.stderr] {
        let text = String::from_utf8_lossy(stream);
        for secret in [REDIS_PASSWORD, "s3cr3t%2Fp%40ss", DAV_PASSWORD, AWS_SECRET] {
            assert!(!text.contains(secret), "`{secret}` leaked: {text}");
        }
    }
}

/// Runs, checks that nothing leaked, and checks the exit code.
fn run(cache: &Path, store: &str, args: &[&str], env: &[(&str, &str)], code: i32) -> Output {
    let output = command(cache, store, args, env).output().unwrap();
    assert_no_secret(&output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "{args:?}: {}{}",
        stdout(&output),
        stderr_less_tracing(&output)
    );
    output
}

/// What CI built: a CUDA kernel for four targets and PTX, a HIP kernel for three targets.
const ARTIFACTS: &[(&str, &str, Format)] = &[
    ("vector_add", "sm_75", Format::Cubin),
    ("vector_add", "sm_80", Format::Cubin),
    ("vector_add", "sm_86", Format::Cubin),
    ("vector_add", "sm_90a", Format::Cubin),
    ("vector_add", "compute_80", Format::Ptx),
    ("vector_add_hip", "gfx90a:xnack-", Format::CodeObject),
    ("vector_add_hip", "gfx1100", Format::CodeObject),
    ("vector_add_hip", "gfx11-generic", Format::CodeObject),
];

fn artifact_bytes(kernel: &str, target: &str) -> Vec<u8> {
    format!("{kernel} built for {target}\n")
        .repeat(200)
        .into_bytes()
}

/// The origin of what CI built (any hash will do).
fn ci_origin() -> String {
    hash_bytes(b"the sources CI built")
}

/// Where the cache keeps `file` of CI's build of a kernel: `<backend>/<kernel>/<origin>/<file>`.
fn in_layout(kernel_dir: &str, file: &str) -> String {
    format!("{kernel_dir}/{}/{file}", ci_origin())
}

/// Publishes one artifact into a cache.
fn publish(cache: &Cache, kernel: &str, target: &str, format: Format) -> Entry {
    let target: headroom_kernels::target::Target = target.parse().unwrap();
    let bytes = artifact_bytes(kernel, &target.to_string());
    cache
        .publish(&Entry {
            kernel: kernel.into(),
            backend: target.backend(),
            origin: ci_origin(),
            key: hash_bytes(format!("{kernel} {target}").as_bytes()),
            target,
            record: KeyRecord {
                blob: cache.store_blob(&bytes).unwrap(),
                size: bytes.len() as u64,
                format,
                ptx_isa: None,
                toolchain: "scripted".into(),
            },
        })
        .unwrap()
}

/// A cache at `dir` holding [`ARTIFACTS`].
fn built_cache(dir: &Path) -> PathBuf {
    let cache = Cache::open(dir).unwrap();
    for (kernel, target, format) in ARTIFACTS {
        publish(&cache, kernel, target, *format);
    }
    dir.to_path_buf()
}

fn targets_in(cache: &Path) -> Vec<String> {
    Cache::open(cache)
        .unwrap()
        .entries()
        .unwrap()
        .iter()
        .map(|entry| format!("{}/{}", entry.kernel, entry.target))
        .collect()
}

fn push_pull_and_resolve_fetch(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let store = server.url.as_str();
    let built = built_cache(&server.path("built"));
    let pushed = run(&built, store, &["push"], &[], 0);
    assert!(
        stdout(&pushed).starts_with("pushed 8 artifacts to ")
            && stdout(&pushed).contains("(8 new,"),
        "{}",
        stdout(&pushed)
    );
    let again = run(&built, store, &["push", "--json"], &[], 0);
    let summary: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (
            summary["summary"]["new"].as_u64(),
            summary["summary"]["bytes_sent"].as_u64()
        ),
        (Some(0), Some(0)),
        "a second push sends nothing: {summary}"
    );

    // Pull for one device fetches the one artifact the resolver picks, nothing else.
    let user = server.path("user");
    let pulled = run(
        &user,
        store,
        &["pull", "--kernel", "vector_add", "--device", "sm_89"],
        &[],
        0,
    );
    assert_eq!(
        targets_in(&user),
        ["vector_add/sm_86"],
        "{}",
        stdout(&pulled)
    );

    // resolve --fetch, cold then warm, prints a ready file with the pushed bytes.
    let fresh = server.path("fresh");
    for _ in 0..2 {
        let resolved = run(
            &fresh,
            store,
            &[
                "resolve",
                "vector_add_hip",
                "--device",
                "gfx1102",
                "--fetch",
            ],
            &[],
            0,
        );
        assert_eq!(stderr_less_tracing(&resolved), "");
        let path = stdout(&resolved).trim().to_string();
        assert!(
            path.ends_with(&in_layout("hip/vector_add_hip", "gfx11-generic.hsaco")),
            "{path}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            artifact_bytes("vector_add_hip", "gfx11-generic")
        );
    }
    assert_eq!(targets_in(&fresh), ["vector_add_hip/gfx11-generic"]);

    // Without a device, every target; nothing that runs is exit 1.
    run(
        &user,
        store,
        &["pull", "--kernel", "vector_add_hip"],
        &[],
        0,
    );
    assert_eq!(targets_in(&user).len(), 4);
    let none = run(
        &user,
        store,
        &["resolve", "vector_add", "--device", "sm_70", "--fetch"],
        &[],
        1,
    );
    assert!(
        stderr_less_tracing(&none).contains("none of the"),
        "{}",
        stderr_less_tracing(&none)
    );

    // Read-only, three ways: pulls work, pushes are refused.
    let separator = if store.contains('?') { '&' } else { '?' };
    let read_only_url = format!("{store}{separator}read-only");
    for (url, args, env) in [
        (store, &["--read-only", "push"][..], &[][..]),
        (
            store,
            &["push"],
            &[("HEADROOM_KERNEL_STORE_READ_ONLY", "1")],
        ),
        (read_only_url.as_str(), &["push"], &[]),
    ] {
        let refused = run(&built, url, args, env, 2);
        assert!(
            stderr_less_tracing(&refused).contains("is read-only"),
            "{}",
            stderr_less_tracing(&refused)
        );
        run(&fresh, url, &["pull", "--kernel", "vector_add"], env, 0);
    }
}

fn concurrent_pushers(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let store = server.url.as_str();
    // Eight pushers of the same kernel: the same artifacts, and one target of each one's own.
    let caches: Vec<PathBuf> = (0..8)
        .map(|pusher| {
            let cache_dir = built_cache(&server.path(&format!("built-{pusher}")));
            let own = format!("sm_5{pusher}");
            publish(
                &Cache::open(&cache_dir).unwrap(),
                "vector_add",
                &own,
                Format::Cubin,
            );
            cache_dir
        })
        .collect();
    let push = |cache_dir: &PathBuf| {
        command(cache_dir, store, &["push"], &[("HEADROOM_LOG", "")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let pushers: Vec<Child> = caches.iter().map(push).collect();
    for mut pusher in pushers {
        assert!(pusher.wait().unwrap().success());
    }
    // Every reader resolves correctly, and the index lost no pusher's target.
    let readers: Vec<(PathBuf, Child)> = (0..4)
        .map(|reader| {
            let cache_dir = server.path(&format!("reader-{reader}"));
            let child = Command::new(HEADROOM)
                .args(["kernels", "--cache"])
                .arg(&cache_dir)
                .args([
                    "--store",
                    store,
                    "resolve",
                    "vector_add",
                    "--device",
                    "sm_89",
                    "--fetch",
                ])
                .env("HEADROOM_CONFIG", server.path("no-config.toml"))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            (cache_dir, child)
        })
        .collect();
    for (cache_dir, reader) in readers {
        let output = reader.wait_with_output().unwrap();
        assert!(output.status.success());
        let path = stdout(&output).trim().to_string();
        assert!(
            path.ends_with(&in_layout("cuda/vector_add", "sm_86.cubin")),
            "{path}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            artifact_bytes("vector_add", "sm_86")
        );
        assert_eq!(targets_in(&cache_dir), ["vector_add/sm_86"]);
    }
    let pull_everything = |name: &str| {
        let everything = server.path(name);
        run(
            &everything,
            store,
            &["pull", "--kernel", "vector_add"],
            &[],
            0,
        );
        targets_in(&everything).len()
    };
    // The targets every pusher shares are never lost. Without compare-and-swap in every
    // store, a pusher that stalls between reading the index and writing it may drop another
    // pusher's own target (its blob stays); the next push of that target restores it.
    let after_the_race = pull_everything("after-the-race");
    assert!((5..=5 + 8).contains(&after_the_race), "{after_the_race}");
    for cache_dir in &caches {
        assert!(push(cache_dir).wait().unwrap().success());
    }
    assert_eq!(pull_everything("everything"), 5 + 8);
}

/// The store key of the blob a `sm_86` device would resolve to in the cache at `built`.
fn best_blob_key(built: &Path) -> String {
    let best = Cache::open(built)
        .unwrap()
        .entry(
            Backend::Cuda,
            "vector_add",
            &ci_origin(),
            &"sm_86".parse().unwrap(),
        )
        .unwrap()
        .unwrap();
    blob_key(&best.record.blob)
}

/// Resolves `vector_add` for an `sm_89` device with `--fetch` into the cache at `user`, when
/// the best artifact in the store cannot be used: the next best (`sm_80`) serves, with one
/// warning line, which is returned.
fn resolve_falls_back_with_one_warning(user: &Path, store_url: &str) -> String {
    let resolve = ["resolve", "vector_add", "--device", "sm_89", "--fetch"];
    let resolved = run(user, store_url, &resolve, &[], 0);
    assert!(
        stdout(&resolved)
            .trim()
            .ends_with(&in_layout("cuda/vector_add", "sm_80.cubin")),
        "{}",
        stdout(&resolved)
    );
    let warning = stderr_less_tracing(&resolved);
    assert_eq!(warning.lines().count(), 1, "{warning}");
    warning
}

fn a_flipped_byte_is_a_miss(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let store_url = server.url.as_str();
    let built = built_cache(&server.path("built"));
    run(&built, store_url, &["push"], &[], 0);
    let key = best_blob_key(&built);
    let store = Store::open(store_url, false).unwrap();
    let good = store.get(&key, u64::MAX).unwrap().unwrap();
    let mut flipped = good.clone();
    flipped[100] ^= 0x01;
    for bad in [flipped, good[..good.len() / 2].to_vec()] {
        store.put(&key, &bad).unwrap();
        let user = server.path("user");
        // The next best artifact serves, the bad blob is named, and it never entered the cache.
        let warnings = resolve_falls_back_with_one_warning(&user, store_url);
        assert!(
            warnings.contains(&key) && warnings.contains("blake3"),
            "{warnings}"
        );
        assert!(!user.join(&key).exists());
        assert_eq!(targets_in(&user), ["vector_add/sm_80"]);
        std::fs::remove_dir_all(&user).unwrap();
    }
    // Pulling every target skips that one and names it.
    let every = server.path("every");
    let pulled = run(
        &every,
        store_url,
        &["pull", "--kernel", "vector_add"],
        &[],
        0,
    );
    assert!(
        stderr_less_tracing(&pulled).contains(&key),
        "{}",
        stderr_less_tracing(&pulled)
    );
    assert_eq!(targets_in(&every).len(), 4);
}

fn a_store_that_is_down_warns_once_and_resolves_locally(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let (store, _closed) = down_url(kind, dir.path());
    let user = dir.path().join("user");
    publish(
        &Cache::open(&user).unwrap(),
        "vector_add",
        "sm_80",
        Format::Cubin,
    );

    let started = Instant::now();
    let resolved = run(
        &user,
        &store,
        &["resolve", "vector_add", "--device", "sm_89", "--fetch"],
        &[],
        0,
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(stdout(&resolved)
        .trim()
        .ends_with(&in_layout("cuda/vector_add", "sm_80.cubin")));
    let warning = stderr_less_tracing(&resolved);
    assert_eq!(warning.lines().count(), 1, "{warning}");
    assert!(
        warning.starts_with("headroom: warning: the store ")
            && warning
                .trim_end()
                .ends_with("going on with the local cache"),
        "{warning}"
    );
    // As if the store had nothing: what the cache has is there, what it lacks is exit 1.
    run(
        &user,
        &store,
        &["pull", "--kernel", "vector_add", "--device", "sm_89"],
        &[],
        0,
    );
    let lacking = run(&user, &store, &["pull", "--kernel", "softmax"], &[], 1);
    assert_eq!(
        stderr_less_tracing(&lacking).lines().count(),
        2,
        "{}",
        stderr_less_tracing(&lacking)
    );

    // A push is an error that names the store, without its password, and what to check.
    let pushed = run(&user, &store, &["push"], &[], 2);
    let error = stderr_less_tracing(&pushed);
    assert!(
        error.starts_with("headroom: error: ") && error.contains("check "),
        "{error}"
    );
    let shown = store.split('@').next_back().unwrap();
    assert!(error.contains(shown.split('?').next().unwrap()), "{error}");
}

/// A value bigger than headroom ever writes under its key (a blob longer than its entry
/// records, an index of 8 MiB) is not read past its limit: it is a miss with one warning, and
/// the command goes on with the next best artifact or the local cache. An empty value reads
/// back empty (S3 answers a range on one with 416).
fn an_oversized_value_is_a_miss_with_one_warning(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let store_url = server.url.as_str();
    let built = built_cache(&server.path("built"));
    run(&built, store_url, &["push"], &[], 0);
    let store = Store::open(store_url, false).unwrap();
    store.put("kernels/empty", b"").unwrap();
    assert_eq!(store.get("kernels/empty", 10).unwrap(), Some(Vec::new()));

    let key = best_blob_key(&built);
    let mut long = store.get(&key, u64::MAX).unwrap().unwrap();
    long.resize(long.len() + (8 << 20), 0);
    store.put(&key, &long).unwrap();
    let err = store.get(&key, 1 << 20).unwrap_err().to_string();
    assert!(err.contains("more than 1048576 bytes"), "{err}");
    let user = server.path("user");
    // Resolving goes on with the next best artifact and says why in one warning line.
    let warnings = resolve_falls_back_with_one_warning(&user, store_url);
    assert!(warnings.contains(&key), "{warnings}");

    let index = index_key(Backend::Cuda, "vector_add");
    store.put(&index, &vec![b' '; 8 << 20]).unwrap();
    let warning = resolve_falls_back_with_one_warning(&user, store_url);
    assert!(
        warning.starts_with(&format!(
            "headroom: warning: ignoring {index}: it is over 4194304 bytes"
        )),
        "{warning}"
    );
}

/// Wrong credentials are the same warning and error, and do not show either password.
fn wrong_credentials_are_never_shown(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let wrong = server
        .url
        .replace(DAV_PASSWORD, "dav-s3cr3t-wrong")
        .replace(
            &REDIS_PASSWORD.replace('/', "%2F").replace('@', "%40"),
            "redis-s3cr3t-wrong",
        );
    let user = server.path("user");
    publish(
        &Cache::open(&user).unwrap(),
        "vector_add",
        "sm_80",
        Format::Cubin,
    );
    let resolved = run(
        &user,
        &wrong,
        &["resolve", "vector_add", "--device", "sm_89", "--fetch"],
        &[],
        0,
    );
    assert!(
        stderr_less_tracing(&resolved).starts_with("headroom: warning: "),
        "{}",
        stderr_less_tracing(&resolved)
    );
    let pushed = run(
        &built_cache(&server.path("built")),
        &wrong,
        &["push"],
        &[],
        2,
    );
    assert!(
        stderr_less_tracing(&pushed).contains("check"),
        "{}",
        stderr_less_tracing(&pushed)
    );
    for output in [&resolved, &pushed] {
        assert!(!String::from_utf8_lossy(&output.stderr).contains("s3cr3t-wrong"));
    }
}

macro_rules! each_store {
    ($($kind:ident: $value:expr;)*) => {$(
        mod $kind {
            use super::*;

            #[test]
            fn push_pull_and_resolve_fetch() {
                super::push_pull_and_resolve_fetch($value);
            }

            #[test]
            fn eight_concurrent_pushers_leave_a_store_every_reader_resolves() {
                super::concurrent_pushers($value);
            }

            #[test]
            fn a_flipped_or_truncated_blob_is_a_miss_and_never_cached() {
                super::a_flipped_byte_is_a_miss($value);
            }

            #[test]
            fn an_oversized_value_is_a_miss_with_one_warning() {
                super::an_oversized_value_is_a_miss_with_one_warning($value);
            }

            #[test]
            fn a_store_that_is_down_warns_once_and_resolves_locally() {
                super::a_store_that_is_down_warns_once_and_resolves_locally($value);
            }
        }
    )*};
}

each_store! {
    s3: Kind::S3;
    redis: Kind::Redis;
    webdav: Kind::Webdav;
    directory: Kind::Directory;
}

#[test]
fn redis_wrong_credentials_are_never_shown() {
    wrong_credentials_are_never_shown(Kind::Redis);
}

#[test]
fn webdav_wrong_credentials_are_never_shown() {
    wrong_credentials_are_never_shown(Kind::Webdav);
}

#[test]
fn the_store_comes_from_the_flag_the_variable_headroom_toml_or_the_user_settings() {
    let dir = tempfile::tempdir().unwrap();
    let built = built_cache(&dir.path().join("built"));
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    // The user's settings file, named by HEADROOM_CONFIG, must exist: empty until the test
    // names a store in it.
    let user_settings = dir.path().join("config.toml");
    std::fs::write(&user_settings, "").unwrap();
    let push = |env: &[(&str, &str)]| {
        Command::new(HEADROOM)
            .current_dir(&project)
            .args(["kernels", "--cache"])
            .arg(&built)
            .arg("push")
            .env_remove("HEADROOM_KERNEL_STORE")
            .env("HEADROOM_CONFIG", &user_settings)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let pushed_to = |name: &str| {
        dir.path()
            .join(name)
            .join(index_key(Backend::Cuda, "vector_add"))
            .is_file()
    };
    let none = push(&[]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        stderr_less_tracing(&none).contains("no kernel store"),
        "{}",
        stderr_less_tracing(&none)
    );

    let setting = |name: &str| {
        let url = format!("file://{}", dir.path().join(name).display());
        format!("[kernels]\nstore = \"{url}\"\n")
    };
    std::fs::write(&user_settings, setting("from-user")).unwrap();
    assert!(push(&[]).status.success() && pushed_to("from-user"));
    std::fs::write(project.join("headroom.toml"), setting("from-project")).unwrap();
    assert!(push(&[]).status.success() && pushed_to("from-project"));
    let url = format!("file://{}", dir.path().join("from-variable").display());
    assert!(push(&[("HEADROOM_KERNEL_STORE", &url)]).status.success());
    assert!(pushed_to("from-variable"));

    std::fs::write(project.join("headroom.toml"), "[kernels]\nstor = \"x\"\n").unwrap();
    let typo = String::from_utf8_lossy(&push(&[]).stderr).into_owned();
    assert!(typo.contains("unknown field `stor`"), "{typo}");
}
