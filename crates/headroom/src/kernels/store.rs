//! `headroom kernels push`, `pull` and `resolve --fetch`: which shared store to use (`--store`,
//! `HEADROOM_KERNEL_STORE`, then `[kernels] store` in the project's `headroom.toml` or the
//! user's settings: [`KERNEL_STORE`]) and what users see of it. The work is `headroom_remote::kernels`; a store
//! that cannot be reached while reading is one warning, and the local cache carries on.

use std::path::PathBuf;

use anyhow::Context;
use headroom_kernels::cache::{Cache, Origin};
use headroom_kernels::resolve::{Device, ResolveOptions};
use headroom_remote::kernels::{self as remote, PullSummary};
use headroom_remote::{Store, StoreError};

use headroom_config::KERNEL_STORE;

/// Opens the configured store to write to it.
pub fn open(flag: Option<&str>, read_only: bool) -> anyhow::Result<Store> {
    Ok(Store::open(&KERNEL_STORE.url(flag)?, read_only)?)
}

/// A store opened to read from, or why it cannot be reached (the caller then goes on with
/// the local cache alone).
pub type Reading = Result<Store, String>;

/// Opens the configured store to read from it.
pub fn open_for_reading(flag: Option<&str>, read_only: bool) -> anyhow::Result<Reading> {
    match Store::open(&KERNEL_STORE.url(flag)?, read_only) {
        Ok(store) => Ok(Ok(store)),
        Err(err @ StoreError::Service { .. }) => Ok(Err(err.to_string())),
        Err(err) => Err(err.into()),
    }
}

/// Pulls from the store, where it could be opened, and says what went wrong with it, one
/// warning a line.
fn pull_and_warn(
    store: &Reading,
    cache: &Cache,
    kernels: &[(String, Origin)],
    device: Option<(&Device, &ResolveOptions)>,
) -> anyhow::Result<PullSummary> {
    let (summary, shown) = match store {
        Ok(store) => (remote::pull(store, cache, kernels, device)?, store.shown()),
        Err(unreachable) => {
            let summary = PullSummary {
                unreachable: Some(unreachable.clone()),
                ..PullSummary::default()
            };
            (summary, "")
        }
    };
    if let Some(err) = &summary.unreachable {
        headroom_output::say!("headroom: warning: {err}; going on with the local cache");
    }
    for key in &summary.corrupt {
        headroom_output::say!(
            "headroom: warning: {key} in the kernel store {shown} is missing or does not match its blake3 hash, so it was not used; delete it there and push that artifact again"
        );
    }
    for refused in &summary.refused {
        headroom_output::say!("headroom: warning: ignoring {refused} in the kernel store {shown}");
    }
    Ok(summary)
}

/// `resolve --fetch`: pulls what the resolver picks for the device, among the artifacts of
/// one build of the kernel, before resolving locally.
pub fn fetch(
    store: &Reading,
    cache: &Cache,
    (kernel, origin): (&str, &Origin),
    device: &Device,
    options: &ResolveOptions,
) -> anyhow::Result<()> {
    let wanted = [(kernel.to_string(), origin.clone())];
    pull_and_warn(store, cache, &wanted, Some((device, options))).map(drop)
}

pub fn push(
    store: &Store,
    cache: &Cache,
    kernels: &[(String, Origin)],
    json: bool,
) -> anyhow::Result<u8> {
    let summary = remote::push(store, cache, kernels)
        .with_context(|| format!("pushing to the kernel store {}", store.shown()))?;
    headroom_output::print_json_or(
        json,
        &serde_json::json!({ "store": store.shown(), "summary": summary }),
        || {
            format!(
                "pushed {} to {} ({} new, {} sent)\n",
                artifacts(summary.artifacts),
                store.shown(),
                summary.new,
                headroom_size::format_size(summary.bytes_sent)
            )
        },
    )?;
    Ok(0)
}

/// `pull`: exits 1 when a kernel asked for has nothing, in the store or the cache, for the
/// device (or at all, without one).
pub fn pull(
    store: &Reading,
    cache: &Cache,
    kernels: &[(String, Origin)],
    device: Option<(&Device, &ResolveOptions)>,
    json: bool,
) -> anyhow::Result<u8> {
    let summary = pull_and_warn(store, cache, kernels, device)?;
    let shown = store.as_ref().ok().map(Store::shown);
    let artifact = |entry: &headroom_kernels::cache::Entry| -> PathBuf {
        cache.root().join(entry.artifact_path())
    };
    let mut lacking = Vec::new();
    for (kernel, origin) in kernels {
        let found = match device {
            Some((device, options)) => cache
                .resolve_origin(kernel, origin, device, options)?
                .1
                .chosen
                .is_some(),
            None => cache.entries()?.iter().any(|entry| {
                &entry.kernel == kernel
                    && match origin {
                        Origin::Newest => true,
                        Origin::Exactly(origin) => &entry.origin == origin,
                    }
            }),
        };
        if !found {
            lacking.push(kernel.clone());
        }
    }
    let fetched: Vec<_> = summary
        .fetched
        .iter()
        .map(|entry| serde_json::json!({ "kernel": entry.kernel, "target": entry.target, "format": entry.record.format, "artifact": artifact(entry) }))
        .collect();
    headroom_output::print_json_or(
        json,
        &serde_json::json!({ "store": shown, "fetched": fetched, "cached": summary.cached, "bytes": summary.bytes, "corrupt": summary.corrupt, "refused": summary.refused, "unreachable": summary.unreachable, "lacking": lacking }),
        || {
            let mut out: String = summary
                .fetched
                .iter()
                .map(|entry| format!("{}\n", artifact(entry).display()))
                .collect();
            out.push_str(&format!(
                "pulled {} ({}) from {}; {} already cached\n",
                artifacts(summary.fetched.len()),
                headroom_size::format_size(summary.bytes),
                shown.unwrap_or("no store"),
                summary.cached
            ));
            out
        },
    )?;
    for kernel in &lacking {
        headroom_output::say!(
            "headroom: kernel `{kernel}` has no artifact {} in the kernel store or the cache {}",
            if device.is_some() {
                "for that device"
            } else {
                "at all"
            },
            cache.root().display()
        );
    }
    Ok(if lacking.is_empty() {
        0
    } else {
        super::EXIT_INCOMPLETE
    })
}

fn artifacts(count: usize) -> String {
    match count {
        1 => "1 artifact".to_string(),
        _ => format!("{count} artifacts"),
    }
}
