//! Store URLs: which service a URL names, where in it, with which credentials, and how to
//! show it. A URL is shown without its userinfo, and every message about a store goes through
//! [`Address::redact`], which also hides the credentials taken from the environment, so no
//! password or key reaches a log or an error.

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

use crate::store::{check_key, StoreError};

/// The WebDAV user when the URL has no userinfo.
pub const WEBDAV_USER_ENV: &str = "HEADROOM_WEBDAV_USER";
/// The WebDAV password when the URL has no userinfo.
pub const WEBDAV_PASSWORD_ENV: &str = "HEADROOM_WEBDAV_PASSWORD";

/// Variables whose values are credentials: they never appear in a message.
const SECRET_ENV: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    WEBDAV_PASSWORD_ENV,
];

/// The service a URL names, with what its OpenDAL builder needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Service {
    /// `s3://bucket/prefix[?endpoint=URL&region=NAME]`, else `AWS_ENDPOINT_URL` and
    /// `AWS_REGION`; credentials come from the AWS variables or profile, which OpenDAL reads.
    S3 {
        bucket: String,
        endpoint: Option<String>,
        region: String,
    },
    /// `redis://[user:password@]host[:port][/db]`.
    Redis {
        endpoint: String,
        db: i64,
        user: String,
        password: String,
    },
    /// `webdav+http(s)://[user:password@]host[:port]/path`.
    Webdav {
        endpoint: String,
        user: String,
        password: String,
    },
    /// `file:///absolute/directory`.
    Fs,
}

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub struct Address {
    pub(crate) service: Service,
    /// The directory inside the service that holds the store, `/` or `/a/b/`.
    pub(crate) root: String,
    /// `?read-only` was in the URL.
    pub(crate) read_only: bool,
    shown: String,
    secrets: Vec<String>,
}

/// Hides `user:password@` in every `scheme://user:password@host` of some text. The userinfo
/// runs to the last `@` of the word, so that a password with `/` or `@` that was not
/// percent-encoded is hidden too.
pub fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let word_end = after.find(char::is_whitespace).unwrap_or(after.len());
        match after[..word_end].rfind('@') {
            Some(user_end) => {
                out.push_str("***");
                rest = &after[user_end..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

fn decode(text: &str) -> Cow<'_, str> {
    percent_decode_str(text).decode_utf8_lossy()
}

impl Address {
    /// Parses a store URL, taking credentials and S3 settings from the process environment.
    pub fn parse(url: &str) -> Result<Address, StoreError> {
        Address::parse_with_env(url, |name| std::env::var(name).ok())
    }

    /// Parses a store URL with `env` standing for the environment.
    pub(crate) fn parse_with_env(
        url: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Address, StoreError> {
        let invalid = |reason: String| StoreError::Url {
            url: redact_userinfo(url),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|err| invalid(err.to_string()))?;
        let is_s3 = parsed.scheme() == "s3";
        let (mut read_only, mut endpoint, mut region) = (false, None, None);
        for (name, value) in parsed.query_pairs() {
            match (name.as_ref(), value.as_ref()) {
                ("read-only", "" | "1" | "true" | "yes") => read_only = true,
                ("read-only", "0" | "false" | "no") => read_only = false,
                ("endpoint", value) if is_s3 => endpoint = Some(value.to_string()),
                ("region", value) if is_s3 => region = Some(value.to_string()),
                _ => {
                    return Err(invalid(format!(
                        "`{name}={value}` is not an option; the options are `read-only`, and `endpoint` and `region` for s3://"
                    )))
                }
            }
        }
        let segments: Vec<String> = parsed
            .path_segments()
            .into_iter()
            .flatten()
            .filter(|segment| !segment.is_empty())
            .map(|segment| decode(segment).into_owned())
            .collect();
        let host = parsed.host_str().unwrap_or_default().to_string();
        let host_port = match parsed.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        let user = decode(parsed.username()).into_owned();
        let password = decode(parsed.password().unwrap_or_default()).into_owned();
        let needs_host = || {
            if host.is_empty() {
                Err(invalid(format!(
                    "it names no host after `{}://`",
                    parsed.scheme()
                )))
            } else {
                Ok(())
            }
        };
        let (service, root_segments) = match parsed.scheme() {
            "s3" => {
                needs_host()?;
                let service = Service::S3 {
                    bucket: host.clone(),
                    endpoint: endpoint
                        .clone()
                        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
                        .or_else(|| env("AWS_ENDPOINT_URL")),
                    region: region
                        .clone()
                        .or_else(|| env("AWS_REGION"))
                        .or_else(|| env("AWS_DEFAULT_REGION"))
                        .unwrap_or_else(|| "us-east-1".to_string()),
                };
                (service, segments)
            }
            "redis" => {
                needs_host()?;
                let db = match segments.as_slice() {
                    [] => 0,
                    [db] => db.parse().map_err(|_| {
                        invalid(format!("`{db}` is not a database number (redis://host:port/0)"))
                    })?,
                    _ => return Err(invalid("a redis URL's path is one database number (redis://host:port/0)".into())),
                };
                let port = parsed.port().unwrap_or(6379);
                let service = Service::Redis {
                    endpoint: format!("tcp://{host}:{port}"),
                    db,
                    user: user.clone(),
                    password: password.clone(),
                };
                (service, Vec::new())
            }
            "webdav+http" | "webdav+https" => {
                needs_host()?;
                let scheme = &parsed.scheme()["webdav+".len()..];
                let (user, password) = if user.is_empty() && password.is_empty() {
                    (
                        env(WEBDAV_USER_ENV).unwrap_or_default(),
                        env(WEBDAV_PASSWORD_ENV).unwrap_or_default(),
                    )
                } else {
                    (user.clone(), password.clone())
                };
                let service = Service::Webdav {
                    endpoint: format!("{scheme}://{host_port}"),
                    user,
                    password,
                };
                (service, segments)
            }
            "file" => {
                if !host.is_empty() && host != "localhost" {
                    return Err(invalid(
                        "a file URL names a local directory: file:///absolute/path".into(),
                    ));
                }
                (Service::Fs, segments)
            }
            other => {
                return Err(invalid(format!(
                    "`{other}` is not a store scheme; use s3://bucket/prefix, redis://host:port/db, webdav+https://host/path or file:///absolute/path"
                )))
            }
        };
        let root = if root_segments.is_empty() {
            "/".to_string()
        } else {
            let joined = root_segments.join("/");
            check_key(&joined).map_err(|err| invalid(err.to_string()))?;
            format!("/{joined}/")
        };
        let mut secrets: Vec<String> = SECRET_ENV.iter().filter_map(|name| env(name)).collect();
        secrets.extend([user, password]);
        secrets
            .extend([parsed.username(), parsed.password().unwrap_or_default()].map(str::to_string));
        secrets.retain(|secret| !secret.is_empty());
        let userinfo = if parsed.username().is_empty() && parsed.password().is_none() {
            ""
        } else {
            "***@"
        };
        let location = match &service {
            Service::Fs => String::new(),
            _ => host_port,
        };
        let path = match &service {
            Service::Redis { db, .. } => format!("/{db}"),
            _ => root.trim_end_matches('/').to_string(),
        };
        let options: Vec<String> = [
            endpoint.map(|endpoint| format!("endpoint={}", redact_userinfo(&endpoint))),
            region.map(|region| format!("region={region}")),
            read_only.then(|| "read-only".to_string()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let query = if options.is_empty() {
            String::new()
        } else {
            format!("?{}", options.join("&"))
        };
        let shown = format!("{}://{userinfo}{location}{path}{query}", parsed.scheme());
        Ok(Address {
            service,
            root,
            read_only,
            shown,
            secrets,
        })
    }

    /// The URL as it may be shown: no userinfo.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with every credential of this store replaced by `***`.
    pub fn redact(&self, text: &str) -> String {
        self.secrets
            .iter()
            .fold(redact_userinfo(text), |text, secret| {
                text.replace(secret, "***")
            })
    }

    /// What to check when the store fails, for its kind of service.
    pub(crate) fn advice(&self) -> &'static str {
        match self.service {
            Service::S3 { .. } => "that the endpoint (AWS_ENDPOINT_URL) answers, the bucket exists, and AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION",
            Service::Redis { .. } => "that redis-server answers at that host and port, and the user and password in the URL",
            Service::Webdav { .. } => "that the WebDAV server answers at that URL, and the user and password (in the URL, or HEADROOM_WEBDAV_USER and HEADROOM_WEBDAV_PASSWORD)",
            Service::Fs => "that the directory exists and that you may read and write it",
        }
    }
}

impl std::fmt::Debug for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str, env: &[(&str, &str)]) -> Result<Address, StoreError> {
        Address::parse_with_env(url, |name| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn each_scheme_names_its_service_and_root() {
        let s3 = parse(
            "s3://kernels/team/ci?read-only",
            &[("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")],
        )
        .unwrap();
        let minio = parse(
            "s3://kernels?endpoint=http://127.0.0.1:9001&region=eu-west-1",
            &[("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")],
        )
        .unwrap();
        assert_eq!(
            minio.service,
            Service::S3 {
                bucket: "kernels".into(),
                endpoint: Some("http://127.0.0.1:9001".into()),
                region: "eu-west-1".into()
            }
        );
        assert_eq!(
            minio.shown(),
            "s3://kernels?endpoint=http://127.0.0.1:9001&region=eu-west-1"
        );
        assert_eq!(
            s3.service,
            Service::S3 {
                bucket: "kernels".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: "us-east-1".into()
            }
        );
        assert_eq!((s3.root.as_str(), s3.read_only), ("/team/ci/", true));
        assert_eq!(s3.shown(), "s3://kernels/team/ci?read-only");

        let redis = parse("redis://:pw@cache.local/3", &[]).unwrap();
        assert_eq!(
            redis.service,
            Service::Redis {
                endpoint: "tcp://cache.local:6379".into(),
                db: 3,
                user: String::new(),
                password: "pw".into()
            }
        );
        assert_eq!(redis.shown(), "redis://***@cache.local/3");

        let dav = parse(
            "webdav+https://dav.local:8443/store",
            &[(WEBDAV_USER_ENV, "ci"), (WEBDAV_PASSWORD_ENV, "secret")],
        )
        .unwrap();
        assert_eq!(
            dav.service,
            Service::Webdav {
                endpoint: "https://dav.local:8443".into(),
                user: "ci".into(),
                password: "secret".into()
            }
        );
        assert_eq!(dav.root, "/store/");

        let fs = parse("file:///srv/kernels", &[]).unwrap();
        assert_eq!(
            (fs.service, fs.root.as_str()),
            (Service::Fs, "/srv/kernels/")
        );
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason_and_without_the_password() {
        for (url, expected) in [
            ("ftp://host/x", "not a store scheme"),
            ("redis://host/zero", "not a database number"),
            ("s3:///prefix", "names no host"),
            ("s3://bucket/x?readonly", "not an option"),
            ("redis://host/0?endpoint=x", "not an option"),
            ("file://server/share", "local directory"),
            ("s3://bucket/a%2F..%2Fb", "`..`"),
            ("webdav+http://u:hunter2@host/a%5Cb", "backslash"),
        ] {
            let err = parse(url, &[]).unwrap_err().to_string();
            assert!(err.contains(expected), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn credentials_are_redacted_from_any_text() {
        let address = parse(
            "redis://admin:p%40ss@db.local:7000/1",
            &[("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI")],
        )
        .unwrap();
        let text = "failed: redis://admin:p%40ss@db.local:7000 said p@ss and wJalrXUtnFEMI";
        let redacted = address.redact(text);
        assert_eq!(
            redacted,
            "failed: redis://***@db.local:7000 said *** and ***"
        );
        assert_eq!(
            redact_userinfo("see http://a:b@host/x and s3://bucket/y"),
            "see http://***@host/x and s3://bucket/y"
        );
        assert_eq!(
            redact_userinfo("`redis://:pa/ss@word@host:1/0`: empty host"),
            "`redis://***@host:1/0`: empty host"
        );
    }
}
