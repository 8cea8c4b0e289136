//! A full disk under the kernel cache and the state directory (a small tmpfs, mounted as
//! root): `headroom kernels build` fails with a message that names the cache, `headroom build`
//! still builds (headroom fails open), nothing half-written is published, and once there is
//! space again both work. Skips where it cannot mount (not root, no tmpfs).

use crate::support::{self, reliability};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use support::{stderr, HEADROOM};

const JOBS: usize = 20;

/// A tmpfs mounted for the test, unmounted when dropped, also when the test fails.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            headroom_testkit::skip("root", "mounting a small tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Tmpfs {
                path: path.to_path_buf(),
            }),
            Ok(output) => {
                headroom_testkit::skip(
                    "root",
                    format!(
                        "cannot mount a tmpfs: {}",
                        String::from_utf8_lossy(&output.stderr)
                    ),
                );
                None
            }
            Err(err) => {
                headroom_testkit::skip("root", format!("cannot run mount: {err}"));
                None
            }
        }
    }

    /// Fills the file system with one file, `filler`.
    fn fill(&self) {
        let mut file = std::fs::File::create(self.path.join("filler")).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
        // Tail room smaller than a chunk.
        while file.write_all(&[0u8; 512]).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.path.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

fn run(project: &Path, disk: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(HEADROOM);
    command.args(args);
    reliability::isolate(&mut command, project);
    command
        .env("HEADROOM_STATE_DIR", disk.join("state"))
        .env("HEADROOM_KERNEL_CACHE", disk.join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command.output().unwrap()
}

const KERNELS: &[&str] = &["kernels", "--manifest", "kernels.toml", "build"];
const BUILD: &[&str] = &[
    "build",
    "--report",
    "report.json",
    "--",
    "make",
    "-B",
    "-s",
    "-j4",
];

/// The report's job rows, from the history.
fn recorded_jobs(project: &Path) -> usize {
    std::fs::read(project.join("report.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<headroom_store::BuildReport>(&bytes).ok())
        .map_or(0, |report| report.jobs.len())
}

#[test]
fn a_full_disk_fails_kernel_builds_cleanly_and_builds_go_on() {
    if !support::have(&["make", "clang-19", "mount", "umount"]) {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let project = project.path();
    reliability::project(project, JOBS, "--mem 4 --ms 10");
    let Some(disk) = Tmpfs::mount(&project.join("disk"), "4m") else {
        return;
    };
    let cache = disk.path.join("cache");

    // With space: both work and fill the state directory and the cache.
    let first = run(project, &disk.path, KERNELS);
    assert!(first.status.success(), "{}", stderr(&first));
    let built = run(project, &disk.path, BUILD);
    assert!(built.status.success(), "{}", stderr(&built));

    // A new source: every kernel must be built and written again, into a full disk.
    std::fs::write(
        project.join("vector_add.cu"),
        std::fs::read_to_string(project.join("vector_add.cu")).unwrap() + "// changed\n",
    )
    .unwrap();
    disk.fill();
    let full = run(project, &disk.path, KERNELS);
    assert!(
        !full.status.success(),
        "a kernel build into a full disk cannot succeed"
    );
    assert!(
        stderr(&full).contains("No space left on device") && stderr(&full).contains("cache"),
        "the error says what is full and where: {}",
        stderr(&full)
    );
    eprintln!("kernels build into a full disk:\n{}", stderr(&full));
    let governed = run(project, &disk.path, BUILD);
    eprintln!(
        "build with its state on a full disk:\n{}",
        stderr(&governed)
    );
    assert!(
        governed.status.success(),
        "headroom fails open: {}",
        stderr(&governed)
    );
    for object in (0..JOBS).map(|i| format!("o{i}.o")) {
        assert!(project.join(&object).exists(), "{object} was built");
    }
    assert_eq!(reliability::check_cache(&cache), Vec::<String>::new());
    assert_eq!(reliability::temp_files(&disk.path), Vec::<PathBuf>::new());

    // Space again: both work, and the cache holds the new artifacts, all intact.
    disk.free();
    let again = run(project, &disk.path, KERNELS);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(reliability::check_cache(&cache), Vec::<String>::new());
    let entries = headroom_kernels::cache::Cache::open(&cache)
        .unwrap()
        .entries()
        .unwrap();
    // The build of the first sources stays beside the new one: builds are kept by origin.
    assert_eq!(entries.len(), 2 * reliability::KERNEL_PAIRS);
    let rebuilt = run(project, &disk.path, BUILD);
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
    assert_eq!(recorded_jobs(project), JOBS, "{}", stderr(&rebuilt));
    let mut left = reliability::leftover_files(&disk.path);
    left.extend(reliability::leftover_files(project));
    assert_eq!(left, Vec::<PathBuf>::new());
}

/// The history's disk fills while a build runs: the build succeeds, its summary and `--report`
/// count every job (they come from memory), and what the history could not take is said once.
#[test]
fn a_disk_that_fills_mid_build_leaves_the_summary_whole() {
    const SLOW_JOBS: usize = 8;
    if !support::have(&["make", "mount", "umount"]) {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let project = project.path();
    reliability::project(project, SLOW_JOBS, "--mem 4 --ms 1500");
    let Some(disk) = Tmpfs::mount(&project.join("disk"), "2m") else {
        return;
    };
    let mut command = Command::new(HEADROOM);
    command.args(BUILD);
    reliability::isolate(&mut command, project);
    let history = disk.path.join("state/history.sqlite");
    let build = command
        .env("HEADROOM_STATE_DIR", disk.path.join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !headroom_store::History::open(&history).is_ok_and(|h| h.last_build_id().is_ok()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the build never began"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    disk.fill();
    let built = build.wait_with_output().unwrap();
    let told = stderr(&built);
    eprintln!("{told}");
    assert!(built.status.success(), "{told}");
    assert!(
        told.contains(&format!("headroom: {SLOW_JOBS} jobs in")),
        "{told}"
    );
    assert!(
        !told.contains(" in ?") && !told.contains("peak ?"),
        "{told}"
    );
    assert_eq!(recorded_jobs(project), SLOW_JOBS, "{told}");
    assert!(told.matches("warning").count() <= 1, "said once: {told}");
}
