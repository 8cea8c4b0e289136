//! The machine-wide ledger of reservations: how the governors of different users in one
//! memory domain admit into one room.
//!
//! A user's sessions share a governor, but its socket lives in a directory private to that
//! user, so two users' builds in one cgroup (or on one machine) have two governors, each of
//! which took the room it saw at its start as its budget. Measured (`bench/build/sessions.sh`,
//! mode `users`), they overcommitted as separate governors do and killed each other's jobs.
//! So each governor writes, every sample, what its jobs hold and use into a file of its own
//! in a shared sticky directory, and leaves to the others what they hold: admission only, so
//! no job of one user is ever stopped to admit another user's. Entries of the governor's own
//! user are not read (that user's sessions share one governor already), nor stale ones, nor
//! any whose file another user owns. A user who writes false figures can only make the other
//! users' builds admit fewer jobs at once, never none.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where the ledger lives unless `HEADROOM_LEDGER_DIR` says otherwise: tmpfs, shared by
/// every user of the machine, emptied at boot.
const DEFAULT_DIR: &str = "/dev/shm/headroom-ledger";
/// Moves the ledger (tests keep theirs apart).
pub const LEDGER_DIR_ENV: &str = "HEADROOM_LEDGER_DIR";
/// An entry not rewritten for this long belongs to a governor that is gone or hung.
const FRESH: Duration = Duration::from_secs(2);
/// The kind of the temporary names entries are written under (`crate::temp`), which no
/// domain's entries start with.
const TEMP_KIND: &str = "ledger-";

/// What other users' governors in the domain hold and use now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Elsewhere {
    /// Their jobs' predicted peaks or use, the larger, and their processes outside jobs.
    pub held: u64,
    pub used: u64,
}

/// This governor's entry in the ledger of its memory domain.
pub struct ReservationLedger {
    dir: PathBuf,
    /// The domain's entries start so.
    domain: String,
    uid: u32,
    own: PathBuf,
}

impl ReservationLedger {
    /// The ledger of memory domain `domain`, where its directory can be used: a directory
    /// everyone may write and only owners may remove from (mode 1777, as /tmp); `None`, said
    /// at `-v`, where it cannot (the governor then admits as if it were alone).
    pub fn open(domain: &str) -> Option<ReservationLedger> {
        let dir = std::env::var_os(LEDGER_DIR_ENV)
            .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from);
        if fs::DirBuilder::new().mode(0o1777).create(&dir).is_ok() {
            // The mode asked for is cut by the umask.
            let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777));
        }
        let shared = fs::symlink_metadata(&dir)
            .is_ok_and(|meta| meta.is_dir() && meta.permissions().mode() & 0o1777 == 0o1777);
        if !shared {
            tracing::info!(
                "{} is not a directory every user may write with the sticky bit (mode 1777): \
                 this governor does not see other users' governors",
                dir.display()
            );
            return None;
        }
        let domain = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(domain.as_bytes()));
        let uid = rustix::process::getuid().as_raw();
        let own = dir.join(format!("{domain}.{uid}.{}", std::process::id()));
        Some(ReservationLedger {
            dir,
            domain,
            uid,
            own,
        })
    }

    /// Writes what this governor holds and uses now (a new file renamed over the old, so no
    /// reader sees half of it). A write that fails leaves the last entry, which goes stale.
    pub fn publish(&self, held: u64, used: u64) {
        let line = format!("{held} {used} {}\n", unix_ms());
        let _ = headroom_paths::atomic::write(&self.own, line.as_bytes(), TEMP_KIND);
    }

    /// What the other users' governors in the domain hold and use now.
    pub fn elsewhere(&self) -> Elsewhere {
        let mut total = Elsewhere::default();
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return total;
        };
        let now = unix_ms();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((uid, pid)) = self.other_users_entry(&name) else {
                continue;
            };
            let owned = entry.metadata().is_ok_and(|meta| meta.uid() == uid);
            if !owned || !Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let Some((held, used, written)) = fs::read_to_string(entry.path())
                .ok()
                .and_then(|text| parse(&text))
            else {
                continue;
            };
            if now.saturating_sub(written) <= FRESH.as_millis() as u64 {
                total.held += held;
                total.used += used;
            }
        }
        total
    }

    /// The uid and pid an entry of another user's governor in this domain is named by.
    fn other_users_entry(&self, name: &str) -> Option<(u32, u32)> {
        let rest = name.strip_prefix(&self.domain)?.strip_prefix('.')?;
        let (uid, pid) = rest.split_once('.')?;
        let (uid, pid) = (uid.parse().ok()?, pid.parse().ok()?);
        (uid != self.uid).then_some((uid, pid))
    }

    /// Removes this governor's entry: it holds nothing any more.
    pub fn withdraw(&self) {
        let _ = fs::remove_file(&self.own);
    }
}

/// `held used unix_ms` as the ledger's files hold it.
fn parse(text: &str) -> Option<(u64, u64, u64)> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some((
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(dir: &Path, domain: &str, uid: u32) -> ReservationLedger {
        let domain = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(domain.as_bytes()));
        ReservationLedger {
            own: dir.join(format!("{domain}.{uid}.{}", std::process::id())),
            dir: dir.to_path_buf(),
            domain,
            uid,
        }
    }

    /// Entries are read from other users of the same domain only, fresh and from a live
    /// process; this user's own and other domains' are not.
    #[test]
    fn other_users_entries_of_the_domain_are_summed() {
        let dir = tempfile::tempdir().unwrap();
        let me = rustix::process::getuid().as_raw();
        // Written as this user, so the owner check passes for "other users" named `me`:
        // the reader below is a different uid.
        let writer = ledger(dir.path(), "/sys/fs/cgroup/a", me);
        writer.publish(3 << 30, 1 << 30);
        ledger(dir.path(), "/sys/fs/cgroup/b", me).publish(5 << 30, 5 << 30);
        let reader = ledger(dir.path(), "/sys/fs/cgroup/a", me + 1);
        assert_eq!(
            reader.elsewhere(),
            Elsewhere {
                held: 3 << 30,
                used: 1 << 30
            }
        );
        assert_eq!(writer.elsewhere(), Elsewhere::default(), "its own user's");
        writer.withdraw();
        assert_eq!(reader.elsewhere(), Elsewhere::default());
        // Stale: written long ago.
        let stale = format!("{} {} {}\n", 1u64 << 30, 0, unix_ms() - 60_000);
        fs::write(&writer.own, stale).unwrap();
        assert_eq!(reader.elsewhere(), Elsewhere::default());
    }
}
