//! The promise of `headroom build`, inside a real memory-limited cgroup: the same `make -j4`
//! that the kernel OOM-kills on its own completes under headroom with zero OOM kills.
//! Uses cgroup v1 or v2, whichever this machine has; skips, saying why, where none can be made.

use std::process::Command;

use headroom_probe::cgroup::Cgroup;

const LIMIT: u64 = 600 << 20;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_headroom-fakecc"),
        dir.path().join("bin/g++"),
    )
    .unwrap();
    let mut makefile = String::from("all: a.o b.o c.o d.o\n");
    for object in ["a.o", "b.o", "c.o", "d.o"] {
        makefile += &format!("{object}:\n\tg++ --mem 250 --ms 800 -c {object}.cpp -o {object}\n");
    }
    std::fs::write(dir.path().join("Makefile"), makefile).unwrap();
    dir
}

fn limited_cgroup(name: &str) -> Option<Cgroup> {
    let name = format!("headroom-test-{name}-{}", std::process::id());
    match Cgroup::create_under_self(&name, Some(LIMIT)) {
        Ok(cgroup) => Some(cgroup),
        Err(err) => {
            eprintln!("skipping: cannot make a memory-limited cgroup here: {err}");
            None
        }
    }
}

fn command_in(dir: &std::path::Path, program: &str) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(dir)
        .env(
            "PATH",
            format!(
                "{}:{}",
                dir.join("bin").display(),
                std::env::var("PATH").unwrap()
            ),
        )
        .env("HEADROOM_STATE_DIR", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env_remove("MAKEFLAGS");
    command
}

#[test]
fn make_j4_is_oom_killed_alone_and_completes_under_headroom() {
    let Some(bare) = limited_cgroup("bare") else {
        return;
    };
    let dir = project();
    let mut make = command_in(dir.path(), "make");
    make.args(["-j4", "-k"]);
    bare.attach(&mut make);
    let without = make.output().unwrap();
    assert!(
        !without.status.success(),
        "4 × 250 MiB cannot fit in 600 MiB"
    );
    assert!(bare.oom_kills() >= 1, "the kernel OOM-killed a job");
    bare.remove().unwrap();

    let Some(governed) = limited_cgroup("governed") else {
        return;
    };
    let dir = project();
    let mut headroom = command_in(dir.path(), env!("CARGO_BIN_EXE_headroom"));
    headroom.args(["build", "--", "make", "-j4"]);
    governed.attach(&mut headroom);
    let with = headroom.output().unwrap();
    let stderr = String::from_utf8_lossy(&with.stderr);
    assert!(with.status.success(), "{stderr}");
    assert_eq!(governed.oom_kills(), 0, "{stderr}");
    assert!(
        stderr.contains("cgroup limit 600.0 MiB"),
        "the budget came from the cgroup: {stderr}"
    );
    for object in ["a.o", "b.o", "c.o", "d.o"] {
        assert!(dir.path().join(object).exists());
    }
    governed.remove().unwrap();
}
