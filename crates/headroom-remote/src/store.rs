//! One shared store behind a URL, through OpenDAL, driven by a private current-thread tokio
//! runtime so that callers stay synchronous.
//!
//! ```text
//! <root>/blobs/ab/abcdef…     bytes named by their blake3 hash, verified in and out
//! <root>/<namespace>/…        entries that name blobs: kernels/…, later history/…
//! ```
//!
//! Every key is checked before it is used. Every write lands whole: under a temp key renamed
//! over the final one where the service can rename (a directory, WebDAV), as one PUT or SET
//! where it cannot (S3, Redis), so a reader sees an old value or the new one, never half.
//! Every message about the store is redacted.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;

use headroom_kernels::cache::{hash_bytes, is_hash};
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::{services, ErrorKind, Operator};

use crate::address::{Address, Service};

/// A store answers each request within this, or the request counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading or writing one chunk of a blob.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries of a request that failed in a way that may pass (a dropped connection, a 503).
const RETRIES: usize = 2;
/// The most an index (one kernel's entries, one project's pointer to its peaks) is read: they
/// are a few KiB, so this is room for thousands of targets.
pub const MAX_INDEX_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid store URL `{url}`: {reason}")]
    Url { url: String, reason: String },
    #[error("the store {store} is read-only (--read-only, HEADROOM_KERNEL_STORE_READ_ONLY or `?read-only` in its URL); push to it without those")]
    ReadOnly { store: String },
    #[error("refusing the store key `{key}`: {reason}")]
    BadKey { key: String, reason: &'static str },
    /// The service failed or could not be reached; `action` says what was tried.
    #[error("the store {store} failed to {action}: {message}; check {advice}")]
    Service {
        store: String,
        action: String,
        message: String,
        advice: &'static str,
    },
    /// A value was bigger than anything headroom writes under its key; it was not read past
    /// the limit.
    #[error("the store {store} holds more than {limit} bytes under `{key}`, more than headroom writes there; ignoring it (remove it, or push again)")]
    TooBig {
        store: String,
        key: String,
        limit: u64,
    },
    #[error("cannot start the store's I/O runtime: {0}")]
    Runtime(std::io::Error),
}

/// Checks a store key before it is used: plain relative names made of `A-Z a-z 0-9 . _ - +
/// :`, separated by single `/`; no `..` or `.`, no absolute path, no backslash, no NUL.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._-+:".contains(&b);
    let reason = if key.contains('\0') {
        "it contains a NUL byte"
    } else if key.contains('\\') {
        "it contains a backslash"
    } else if key.starts_with('/') {
        "it is absolute"
    } else if key.split('/').any(|part| part == "..") {
        "it climbs out with `..`"
    } else if key.split('/').any(|part| part.is_empty() || part == ".") {
        "it has an empty or `.` component"
    } else if !key.bytes().all(|b| b == b'/' || allowed(b)) {
        "it has a character other than A-Z a-z 0-9 . _ - + : /"
    } else {
        return Ok(());
    };
    Err(StoreError::BadKey {
        key: key.escape_debug().to_string(),
        reason,
    })
}

/// The key of the blob with this blake3 hash.
pub fn blob_key(hash: &str) -> String {
    format!("blobs/{}/{hash}", &hash[..2])
}

/// A blob as read back from the store.
#[derive(Debug, PartialEq, Eq)]
pub enum BlobRead {
    Intact(Vec<u8>),
    Missing,
    /// Its bytes do not hash to its name (flipped, truncated, or not a blob at all).
    Corrupt,
}

/// What a stat says of a value ([`Store::stored_size`]).
#[derive(Debug, PartialEq, Eq)]
enum Stored {
    Absent,
    Size(u64),
    Unknown,
}

/// What a bounded read found under a key.
enum Got {
    Absent,
    Value(Vec<u8>),
    TooBig,
}

/// An open store.
pub struct Store {
    address: Address,
    read_only: bool,
    operator: Operator,
    runtime: tokio::runtime::Runtime,
}

impl Store {
    /// Opens the store a URL names; `read_only` refuses writes even where the URL allows them.
    /// Nothing is sent until the first request, so an unreachable store opens fine.
    pub fn open(url: &str, read_only: bool) -> Result<Store, StoreError> {
        let address = Address::parse(url)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StoreError::Runtime)?;
        let failed = |action: &str, err: &dyn std::error::Error| StoreError::Service {
            store: address.shown().to_string(),
            action: action.to_string(),
            message: address.redact(&describe(err)),
            advice: address.advice(),
        };
        let operator = {
            let _inside = runtime.enter();
            operator(&address).map_err(|err| failed("open", &err))?
        };
        if let Service::Redis {
            endpoint,
            db,
            user,
            password,
        } = &address.service
        {
            // OpenDAL's connection pool retries for 30 s and then says only that it timed out;
            // the client's own handshake says at once that nothing listens or the password is
            // wrong.
            check_redis(endpoint, *db, user, password).map_err(|err| failed("connect", &err))?;
        }
        Ok(Store {
            read_only: read_only || address.read_only,
            address,
            operator,
            runtime,
        })
    }

    /// The URL as it may be shown: no credentials.
    pub fn shown(&self) -> &str {
        self.address.shown()
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// `text` with this store's credentials hidden.
    pub fn redact(&self, text: &str) -> String {
        self.address.redact(text)
    }

    /// What a stat says of the value under `key`. A stat only saves work (a read refused
    /// before it starts, an upload skipped), so an answer that cannot be read is `Unknown`
    /// and the read or the write that follows tells what is wrong: wsgidav answers a stat of
    /// a value another builder is writing with a second `propstat` group, which opendal 0.55
    /// cannot parse (apache/opendal#7822).
    async fn stored_size(&self, key: &str) -> Stored {
        match self.operator.stat(key).await {
            Ok(metadata) => Stored::Size(metadata.content_length()),
            Err(err) if err.kind() == ErrorKind::NotFound => Stored::Absent,
            Err(_) => Stored::Unknown,
        }
    }

    fn run<T>(
        &self,
        action: &'static str,
        key: &str,
        request: impl Future<Output = opendal::Result<T>>,
    ) -> Result<T, StoreError> {
        self.runtime
            .block_on(request)
            .map_err(|err| StoreError::Service {
                store: self.shown().to_string(),
                action: format!("{action} `{key}`"),
                message: self.redact(&describe(&err)),
                advice: self.address.advice(),
            })
    }

    /// The value under `key`, or `None` where there is none. A value of more than `max_bytes`
    /// is refused (`TooBig`). Where the service tells a value's size without sending it (all
    /// but Redis, whose size query is a GET), such a value is refused before a byte of it is
    /// read; either way the read stops as soon as it has more than `max_bytes`, so a server
    /// that sends endless bytes costs at most that and one chunk. (Redis itself sends no value
    /// over its `proto-max-bulk-len`, 512 MiB.)
    pub fn get(&self, key: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        if self.address.service == Service::Fs {
            self.refuse_links(key)?;
        }
        let got = self.run("read", key, async {
            if !matches!(self.address.service, Service::Redis { .. }) {
                match self.stored_size(key).await {
                    Stored::Size(size) if size > max_bytes => return Ok(Got::TooBig),
                    Stored::Size(0) => return Ok(Got::Value(Vec::new())),
                    Stored::Absent => return Ok(Got::Absent),
                    Stored::Size(_) | Stored::Unknown => {}
                }
            }
            // The whole value as it is now, not the size the stat told: another builder may
            // have replaced it since, and a read of the old size would then fail.
            let stream = match self.operator.reader(key).await {
                Ok(reader) => reader.into_stream(..).await,
                Err(err) => Err(err),
            };
            let mut stream = match stream {
                Ok(stream) => stream,
                Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Got::Absent),
                Err(err) => return Err(err),
            };
            let mut bytes = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Got::Absent),
                    Err(err) => return Err(err),
                };
                if (bytes.len() + chunk.len()) as u64 > max_bytes {
                    return Ok(Got::TooBig);
                }
                for part in chunk {
                    bytes.extend_from_slice(&part);
                }
            }
            Ok(Got::Value(bytes))
        })?;
        match got {
            Got::Absent => Ok(None),
            Got::Value(bytes) => Ok(Some(bytes)),
            Got::TooBig => Err(StoreError::TooBig {
                store: self.shown().to_string(),
                key: key.to_string(),
                limit: max_bytes,
            }),
        }
    }

    /// In a directory store, refuses a key that is, or passes through, a link, or that is not a
    /// regular file (a FIFO, a device): such a key could read from anywhere, or never end.
    fn refuse_links(&self, key: &str) -> Result<(), StoreError> {
        let refuse = |reason| StoreError::BadKey {
            key: key.to_string(),
            reason,
        };
        let mut path = std::path::PathBuf::from(&self.address.root);
        let parts: Vec<&str> = key.split('/').collect();
        for (index, part) in parts.iter().enumerate() {
            path.push(part);
            let metadata = match std::fs::symlink_metadata(&path) {
                Ok(metadata) => metadata,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(_) => return Err(refuse("it cannot be looked at in the store's directory")),
            };
            if metadata.file_type().is_symlink() {
                return Err(refuse("it is a link in the store's directory"));
            }
            if index + 1 == parts.len() && !metadata.is_file() {
                return Err(refuse("it is not a regular file in the store's directory"));
            }
        }
        Ok(())
    }

    /// Writes `bytes` under `key`, whole (see the module's header).
    pub fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        if self.read_only {
            return Err(StoreError::ReadOnly {
                store: self.shown().to_string(),
            });
        }
        let value = bytes.to_vec();
        self.run("write", key, async {
            if self.operator.info().full_capability().rename {
                let temp = format!("{key}.tmp-{:016x}", fastrand::u64(..));
                self.operator.write(&temp, value).await?;
                let renamed = self.operator.rename(&temp, key).await;
                if renamed.is_err() {
                    let _ = self.operator.delete(&temp).await;
                }
                renamed
            } else {
                self.operator.write(key, value).await.map(drop)
            }
        })
    }

    /// Stores bytes as a blob unless one of their size is already under their hash; returns
    /// the hash and whether anything was sent.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<(String, bool), StoreError> {
        let hash = hash_bytes(bytes);
        let key = blob_key(&hash);
        let stored = self.runtime.block_on(self.stored_size(&key));
        if stored == Stored::Size(bytes.len() as u64) {
            return Ok((hash, false));
        }
        match self.put(&key, bytes) {
            Ok(()) => Ok((hash, true)),
            // Pushers of the same bytes race to rename them into place, and a service may
            // refuse the loser's rename (WsgiDAV answers 500 to two MOVEs onto one name): the
            // blob is stored either way, since its name is its hash.
            Err(error) => match self.runtime.block_on(self.stored_size(&key)) {
                Stored::Size(size) if size == bytes.len() as u64 => Ok((hash, false)),
                _ => Err(error),
            },
        }
    }

    /// Reads a blob of at most `max_bytes` and checks its bytes against its hash; a bigger one
    /// is corrupt and is not read past the limit.
    pub fn get_blob(&self, hash: &str, max_bytes: u64) -> Result<BlobRead, StoreError> {
        if !is_hash(hash) {
            return Err(StoreError::BadKey {
                key: hash.escape_debug().to_string(),
                reason: "a blob is named by a blake3 hash, 64 lowercase hex digits",
            });
        }
        Ok(match self.get(&blob_key(hash), max_bytes) {
            Ok(None) => BlobRead::Missing,
            Ok(Some(bytes)) if hash_bytes(&bytes) == hash => BlobRead::Intact(bytes),
            Ok(Some(_)) | Err(StoreError::BadKey { .. } | StoreError::TooBig { .. }) => {
                BlobRead::Corrupt
            }
            Err(err) => return Err(err),
        })
    }
}

/// An error and its causes, each said once, on one line: OpenDAL's message leaves out its
/// source's causes (`Connection refused`).
fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    // One line, even where a server answered with a page of HTML.
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Connects to Redis once, with the handshake (user, password, database) and a PING.
fn check_redis(endpoint: &str, db: i64, user: &str, password: &str) -> redis::RedisResult<()> {
    let (host, port) = endpoint
        .trim_start_matches("tcp://")
        .rsplit_once(':')
        .expect("redis endpoints are tcp://host:port");
    let non_empty = |text: &str| (!text.is_empty()).then(|| text.to_string());
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp(
            host.trim_matches(['[', ']']).to_string(),
            port.parse().expect("redis endpoints have a numeric port"),
        ),
        redis: redis::RedisConnectionInfo {
            db,
            username: non_empty(user),
            password: non_empty(password),
            ..Default::default()
        },
    };
    let mut connection = redis::Client::open(info)?.get_connection_with_timeout(REQUEST_TIMEOUT)?;
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .map(drop)
}

/// The OpenDAL operator for an address, with timeouts and a few retries.
fn operator(address: &Address) -> opendal::Result<Operator> {
    let root = address.root.as_str();
    let operator = match &address.service {
        Service::S3 {
            bucket,
            endpoint,
            region,
        } => {
            // Credentials come from the AWS variables or profile; the EC2 metadata service is
            // never asked, so a machine off AWS does not wait on it.
            let mut builder = services::S3::default()
                .bucket(bucket)
                .root(root)
                .region(region)
                .disable_ec2_metadata()
                .allow_anonymous();
            if let Some(endpoint) = endpoint {
                builder = builder.endpoint(endpoint);
            }
            Operator::new(builder)?.finish()
        }
        Service::Redis {
            endpoint,
            db,
            user,
            password,
        } => Operator::new(
            services::Redis::default()
                .endpoint(endpoint)
                .db(*db)
                .username(user)
                .password(password)
                .root(root),
        )?
        .finish(),
        Service::Webdav {
            endpoint,
            user,
            password,
        } => Operator::new(
            services::Webdav::default()
                .endpoint(endpoint)
                .username(user)
                .password(password)
                .root(root),
        )?
        .finish(),
        Service::Fs => Operator::new(services::Fs::default().root(root))?.finish(),
    };
    Ok(operator
        .layer(
            TimeoutLayer::new()
                .with_timeout(REQUEST_TIMEOUT)
                .with_io_timeout(IO_TIMEOUT),
        )
        // Retries say nothing: the final error is reported once, redacted.
        .layer(
            RetryLayer::new()
                .with_max_times(RETRIES)
                .with_min_delay(Duration::from_millis(50))
                .with_notify(|_: &opendal::Error, _: Duration| {}),
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_dir() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/store", dir.path().display());
        let store = Store::open(&url, false).unwrap();
        (dir, store)
    }

    #[test]
    fn keys_that_could_escape_or_confuse_are_refused() {
        for key in [
            "",
            "/etc/passwd",
            "kernels/../../x",
            "kernels/./x",
            "kernels//x",
            "a\\b",
            "a\0b",
            "kernels/x y",
        ] {
            assert!(check_key(key).is_err(), "{key:?}");
        }
        check_key("kernels/v2/hip/add/gfx942_sramecc+_xnack-.json").unwrap();
    }

    #[test]
    fn blobs_round_trip_and_a_flipped_byte_is_corrupt() {
        let (dir, store) = open_dir();
        let (hash, sent) = store.put_blob(b"artifact").unwrap();
        assert!(sent);
        assert_eq!(store.put_blob(b"artifact").unwrap(), (hash.clone(), false));
        assert_eq!(
            store.get_blob(&hash, 1 << 20).unwrap(),
            BlobRead::Intact(b"artifact".to_vec())
        );
        let path = dir.path().join("store").join(blob_key(&hash));
        std::fs::write(&path, b"artifacT").unwrap();
        assert_eq!(store.get_blob(&hash, 1 << 20).unwrap(), BlobRead::Corrupt);
        std::fs::write(&path, b"art").unwrap();
        assert_eq!(store.get_blob(&hash, 1 << 20).unwrap(), BlobRead::Corrupt);
        assert_eq!(
            store.get_blob(&hash_bytes(b"other"), 1 << 20).unwrap(),
            BlobRead::Missing
        );
        assert!(store.get_blob("../../etc/passwd", 1 << 20).is_err());
    }

    #[test]
    fn links_and_special_files_in_a_directory_store_are_refused() {
        let (dir, store) = open_dir();
        let (hash, _) = store.put_blob(b"artifact").unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"artifact").unwrap();
        let blob = dir.path().join("store").join(blob_key(&hash));
        std::fs::remove_file(&blob).unwrap();
        std::os::unix::fs::symlink(&outside, &blob).unwrap();
        assert_eq!(store.get_blob(&hash, 1 << 20).unwrap(), BlobRead::Corrupt);

        std::fs::create_dir_all(dir.path().join("elsewhere/kernels")).unwrap();
        std::fs::write(dir.path().join("elsewhere/kernels/x.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("elsewhere/kernels"),
            dir.path().join("store/kernels"),
        )
        .unwrap();
        let err = store
            .get("kernels/x.json", 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a link"), "{err}");
        std::fs::create_dir_all(dir.path().join("store/dir.json")).unwrap();
        let err = store.get("dir.json", 1 << 20).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_value_over_the_limit_is_refused_and_an_empty_one_reads_empty() {
        let (_dir, store) = open_dir();
        store.put("kernels/x.json", &[b' '; 1000]).unwrap();
        assert_eq!(
            store.get("kernels/x.json", 1000).unwrap().unwrap().len(),
            1000
        );
        let err = store.get("kernels/x.json", 999).unwrap_err();
        assert!(
            matches!(err, StoreError::TooBig { limit: 999, .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("more than 999 bytes under `kernels/x.json`"),
            "{err}"
        );
        store.put("kernels/empty", b"").unwrap();
        assert_eq!(store.get("kernels/empty", 0).unwrap(), Some(Vec::new()));
        assert_eq!(store.get("kernels/none", 10).unwrap(), None);
    }

    #[test]
    fn writes_leave_no_temp_keys_and_read_only_refuses_them() {
        let (dir, store) = open_dir();
        store.put("kernels/x.json", b"{}").unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path().join("store/kernels"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["x.json"]);
        let url = format!("file://{}/store?read-only", dir.path().display());
        let read_only = Store::open(&url, false).unwrap();
        assert_eq!(
            read_only.get("kernels/x.json", 1 << 20).unwrap().unwrap(),
            b"{}"
        );
        let err = read_only.put("kernels/x.json", b"[]").unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly { .. }), "{err}");
        assert!(err.to_string().contains("read-only"), "{err}");
    }
}
