//! Real store servers on loopback for the tests of shared stores: moto's S3 server,
//! redis-server, the wsgidav WebDAV server, and a plain directory. Each test starts its server
//! on loopback and stops it after: moto and wsgidav pick their own port; redis-server, for
//! which port 0 turns TCP off, is started again on another port if its port was taken; where a server is not installed, `Server::start` says
//! so and returns `None`, and the test passes (`bash .ci/stores.sh` installs them all).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{self, ClosedPort, Listening};

/// Passwords the servers ask for; no output may ever contain them.
pub const REDIS_PASSWORD: &str = "redis-s3cr3t/p@ss";
pub const DAV_PASSWORD: &str = "dav-s3cr3t";
pub const AWS_SECRET: &str = "aws-s3cr3t-key";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    S3,
    Redis,
    Webdav,
    Directory,
}

/// The virtual environment `.ci/stores.sh` installs moto and wsgidav into.
pub fn stores_venv_bin() -> PathBuf {
    let env = std::env::var_os("HEADROOM_STORES_ENV").map_or_else(
        || Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/headroom-stores"),
        PathBuf::from,
    );
    env.join("venv/bin")
}

/// A program from the stores' venv, else from PATH.
pub fn program(name: &str) -> Option<PathBuf> {
    let in_venv = stores_venv_bin().join(name);
    if in_venv.is_file() {
        return Some(in_venv);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Creates a bucket on moto's S3 server that anyone may read and write, so that the test
/// itself reaches it without credentials; returns the status line.
pub fn create_public_bucket(port: u16, bucket: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-amz-acl: public-read-write\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.lines().next().unwrap_or_default().to_string()
}

/// Runs `moto_server`'s own `main` with werkzeug's server unthreaded; takes its arguments.
const MOTO_ONE_REQUEST_AT_A_TIME: &str = "
import sys, moto.server as server
run_simple = server.run_simple
server.run_simple = lambda *args, **kwargs: run_simple(*args, **{**kwargs, 'threaded': False})
server.main(sys.argv[1:])
";

/// A store for one test: its server (none for a directory) and its URL.
pub struct Server {
    /// The server's process, killed when the store is dropped; none for a directory.
    _server: Option<Listening>,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts the server of a kind, or says why it cannot and returns `None`.
    pub fn start(kind: Kind) -> Option<Server> {
        let dir = tempfile::tempdir().unwrap();
        let program_name = match kind {
            Kind::Directory => {
                let url = format!("file://{}/store", dir.path().display());
                return Some(Server {
                    _server: None,
                    url,
                    dir,
                });
            }
            Kind::S3 => "moto_server",
            Kind::Redis => "redis-server",
            Kind::Webdav => "wsgidav",
        };
        let Some(program) = program(program_name) else {
            let requirement = match program_name {
                "redis-server" => "redis",
                "moto_server" => "s3",
                other => other,
            };
            headroom_testkit::skip(
                requirement,
                format!("{program_name} is not installed (bash .ci/stores.sh installs it)"),
            );
            return None;
        };
        let log = dir.path().join(format!("{program_name}.log"));
        let server = match kind {
            // moto's S3 server, one request at a time: threaded, it races on concurrent PUTs
            // of one key (a request reads a body another closed: HTTP 500), which real S3
            // does not. Concurrent clients still interleave their requests. `moto_server` is
            // found to say whether moto is installed; its Python runs it.
            Kind::S3 => {
                let mut command = Command::new(program.with_file_name("python3"));
                command
                    .args(["-c", MOTO_ONE_REQUEST_AT_A_TIME])
                    .args(["-H", "127.0.0.1", "-p", "0"])
                    .current_dir(dir.path());
                support::start_on_its_own_port(program_name, command, &log)
            }
            Kind::Webdav => {
                let root = dir.path().join("dav");
                std::fs::create_dir(&root).unwrap();
                let config = serde_json::json!({
                    "host": "127.0.0.1",
                    "port": 0,
                    "provider_mapping": { "/": root },
                    "simple_dc": { "user_mapping": { "*": { "ci": { "password": DAV_PASSWORD } } } },
                    "http_authenticator": { "domain_controller": null, "accept_basic": true, "accept_digest": false, "default_to_digest": false },
                    "verbose": 0,
                    "logging": { "enable": false },
                });
                let config_path = dir.path().join("wsgidav.json");
                std::fs::write(&config_path, config.to_string()).unwrap();
                let mut command = Command::new(program);
                command
                    .arg("--config")
                    .arg(&config_path)
                    .current_dir(dir.path());
                support::start_on_its_own_port(program_name, command, &log)
            }
            // `--port 0` turns redis-server's TCP listener off.
            Kind::Redis => support::start_on_a_free_port(
                program_name,
                |port| {
                    let mut command = Command::new(&program);
                    command
                        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                        .args(["--save", "", "--appendonly", "no"])
                        .args(["--requirepass", REDIS_PASSWORD, "--dir"])
                        .arg(dir.path())
                        .current_dir(dir.path());
                    command
                },
                &log,
            ),
            Kind::Directory => unreachable!("returned above"),
        };
        let port = server.port;
        let url = match kind {
            Kind::S3 => {
                let status = create_public_bucket(port, "kernels");
                assert!(status.contains(" 200 "), "creating the bucket: {status}");
                format!("s3://kernels/team/ci?endpoint=http://127.0.0.1:{port}")
            }
            Kind::Redis => redis_url(REDIS_PASSWORD, port),
            Kind::Webdav => format!("webdav+http://ci:{DAV_PASSWORD}@127.0.0.1:{port}/store"),
            Kind::Directory => unreachable!("returned above"),
        };
        Some(Server {
            _server: Some(server),
            url,
            dir,
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

pub fn redis_url(password: &str, port: u16) -> String {
    let encoded = password.replace('/', "%2F").replace('@', "%40");
    format!("redis://:{encoded}@127.0.0.1:{port}/0")
}

/// A URL of the kind whose server is down: nothing listens on its port (held closed for as
/// long as the returned [`ClosedPort`] lives), or its directory cannot exist.
pub fn down_url(kind: Kind, dir: &Path) -> (String, ClosedPort) {
    let closed = ClosedPort::new();
    let port = closed.port;
    let url = match kind {
        Kind::S3 => format!("s3://kernels/ci?endpoint=http://127.0.0.1:{port}"),
        Kind::Redis => redis_url(REDIS_PASSWORD, port),
        Kind::Webdav => format!("webdav+http://ci:{DAV_PASSWORD}@127.0.0.1:{port}/store"),
        Kind::Directory => {
            std::fs::write(dir.join("a-file"), "").unwrap();
            format!("file://{}/a-file/store", dir.display())
        }
    };
    (url, closed)
}
