//! What the reliability tests (crash points, full disk, concurrent load) share: a scratch
//! project isolated in its own directories, the processes a run leaves behind, and the files
//! that must not outlive the next run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use headroom_kernels::cache::{BlobCheck, Cache};
use headroom_probe::procs::{self, ProcStat};

/// A CUDA and a HIP kernel that clang builds without a vendor SDK.
const MANIFEST: &str = r#"
[kernel.vector_add]
language = "cuda"
sources = ["vector_add.cu"]
targets = ["sm_80", "sm_90a", "compute_90"]
toolchain = ["clang"]

[kernel.vector_add_hip]
language = "hip"
sources = ["vector_add.cu"]
targets = ["gfx90a:xnack-", "gfx1100"]
toolchain = ["clang"]
"#;
/// The (kernel, target) pairs of `MANIFEST`.
pub const KERNEL_PAIRS: usize = 5;
const SOURCE: &str = "extern \"C\" __global__ void vector_add(float *o, const float *a, const float *b, int n) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) o[i] = a[i] + b[i];\n}\n";

/// How long a stopped process may stay stopped before it counts as left behind.
const STOPPED_FOR: Duration = Duration::from_secs(5);
/// How long the processes of a killed run may take to finish on their own.
const SETTLE: Duration = Duration::from_secs(60);

/// A scratch project in `dir`: `bin/g++` (the fake compiler), a Makefile of `jobs` fake
/// compiles with `recipe` (which `make -B` does not try to remake itself), a kernel manifest with its source, and empty `state/`, `run/` and
/// `tmp/` directories for `isolate`.
pub fn project(dir: &Path, jobs: usize, recipe: &str) {
    for sub in ["bin", "state", "run", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::os::unix::fs::symlink(super::fakecc::path(), dir.join("bin/g++")).unwrap();
    let objects: Vec<String> = (0..jobs).map(|i| format!("o{i}.o")).collect();
    let makefile = format!(
        ".PHONY: all\nall: {}\nMakefile: ;\n%.o:\n\tg++ {recipe} -c $*.cpp -o $@\n",
        objects.join(" ")
    );
    std::fs::write(dir.join("Makefile"), makefile).unwrap();
    std::fs::write(dir.join("kernels.toml"), MANIFEST).unwrap();
    std::fs::write(dir.join("vector_add.cu"), SOURCE).unwrap();
}

/// `headroom ARGS…` in the project `dir`, with everything of its own there (see [`isolate`]).
pub fn headroom(dir: &Path, args: &[&str]) -> Command {
    let mut command = super::headroom(args);
    isolate(&mut command, dir);
    command
}

/// Runs `command` in `dir` with everything of its own there: state (`state/`), runtime
/// directory (`run/`), temporary directory (`tmp/`), home, and `bin/` first on PATH.
pub fn isolate(command: &mut Command, dir: &Path) {
    crate::support::in_project(command, dir);
    command
        .env("TMPDIR", dir.join("tmp"))
        .env("HOME", dir)
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH");
}

/// Makes this process the reaper of its descendants' orphans, so what a killed CLI leaves
/// running stays below it, to be found and waited for. It holds for the whole test process,
/// every test's orphans alike: a test reaps only the processes of its own project
/// ([`reap`], [`reap_and_wait`]), never any child (`waitpid(-1)`), which would take the exit
/// status of another test's command from under it.
pub fn become_subreaper() {
    // SAFETY: prctl with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
}

/// Reaps those of `pids` that are exited children of this process (orphans that came to it),
/// without blocking; any other pid is left alone.
pub fn reap(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: waitpid(2) on one pid, without blocking; not a child of ours is ECHILD.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// Whether `pid` was started for the project in `dir`: [`isolate`] puts `HOME=dir` in the
/// environment of a project's command, and every process below it inherits it.
fn of_project(pid: i32, dir: &Path) -> bool {
    let home = format!("HOME={}", dir.display());
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
        environ
            .split(|&byte| byte == 0)
            .any(|entry| entry == home.as_bytes())
    })
}

/// `root` and every process below it.
pub fn descendants(root: i32) -> Vec<ProcStat> {
    let all = procs::snapshot().unwrap_or_default();
    procs::tree(&all, root).into_iter().cloned().collect()
}

/// How long any state a test waits for may take to appear on a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `done` holds, at most [`PATIENCE`]; fails the test naming `what` past that.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit, at most [`PATIENCE`], and returns its status with what it wrote
/// to stderr (piped, or empty); past that, kills it and its process group and fails the test.
/// Its stderr is read for as long: processes it left holding the pipe must not hang the test.
pub fn output_within_patience(mut child: Child) -> Output {
    let stderr = child.stderr.take().map(|mut stderr| {
        let (sender, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = std::io::Read::read_to_end(&mut stderr, &mut text);
            let _ = sender.send(text);
        });
        received
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > PATIENCE {
            // SAFETY: kill(2) on the test's own child and on the group it may lead.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} did not end within {PATIENCE:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = stderr.map_or_else(Vec::new, |received| {
        received
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| b"(its stderr is still held open by what it left)".to_vec())
    });
    Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

/// The live processes below `root` (not `root` itself) whose command line contains `needle`.
pub fn below(root: u32, needle: &str) -> Vec<i32> {
    descendants(root as i32)
        .into_iter()
        .map(|process| process.pid)
        .filter(|&pid| pid != root as i32 && process_state(pid).is_some_and(|s| s != 'Z'))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                // Arguments end in NULs: as spaces, a needle may span several.
                let line: Vec<u8> = line
                    .into_iter()
                    .map(|byte| if byte == 0 { b' ' } else { byte })
                    .collect();
                String::from_utf8_lossy(&line).contains(needle)
            })
        })
        .collect()
}

/// The shims below `root`: one per compiler call the build made, waiting or running.
pub fn shims(root: u32) -> Vec<i32> {
    descendants(root as i32)
        .into_iter()
        .filter(|process| process.comm == "headroom-shim")
        .map(|process| process.pid)
        .collect()
}

/// The compilers below `root`: each shim's child, which leads a process group of its own.
pub fn compilers(root: u32) -> Vec<i32> {
    let tree = descendants(root as i32);
    let shims: Vec<i32> = tree
        .iter()
        .filter(|process| process.comm == "headroom-shim")
        .map(|process| process.pid)
        .collect();
    tree.iter()
        .filter(|process| shims.contains(&process.ppid) && process.pgid == process.pid)
        .map(|process| process.pid)
        .collect()
}

/// The state letter of `pid` in /proc (`R`, `S`, `T` for stopped, `Z`…).
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// What a run left behind.
#[derive(Default, Debug)]
pub struct Leftovers {
    /// Processes that stayed stopped (`pid comm`).
    pub stopped: Vec<String>,
    /// Processes still running once the run's processes had time to finish.
    pub running: Vec<String>,
    /// Temporary files, sockets or directories nothing removed.
    pub temp_files: Vec<PathBuf>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.stopped.is_empty() && self.running.is_empty() && self.temp_files.is_empty()
    }

    pub fn add(&mut self, other: &Leftovers) {
        self.stopped.extend(other.stopped.iter().cloned());
        self.running.extend(other.running.iter().cloned());
        self.temp_files.extend(other.temp_files.iter().cloned());
    }
}

/// Waits for every process of the project in `dir` ([`isolate`]) below this one (a
/// subreaper: orphans come here) to end, reaping them; what stays stopped for `STOPPED_FOR`,
/// or lives past `SETTLE`, is reported and killed. Other tests' processes are left alone.
pub fn reap_and_wait(dir: &Path) -> Leftovers {
    let me = std::process::id() as i32;
    let start = Instant::now();
    let mut stopped_since: Option<Instant> = None;
    let mut leftovers = Leftovers::default();
    let mut seen: Vec<i32> = Vec::new();
    loop {
        reap(&seen);
        let alive: Vec<ProcStat> = descendants(me)
            .into_iter()
            .filter(|p| p.pid != me && process_state(p.pid).is_some_and(|s| s != 'Z'))
            .filter(|p| of_project(p.pid, dir))
            .collect();
        seen.extend(alive.iter().map(|p| p.pid));
        if alive.is_empty() {
            reap(&seen);
            return leftovers;
        }
        let stopped: Vec<&ProcStat> = alive
            .iter()
            .filter(|p| matches!(process_state(p.pid), Some('T' | 't')))
            .collect();
        stopped_since = match (stopped.is_empty(), stopped_since) {
            (true, _) => None,
            (false, None) => Some(Instant::now()),
            (false, since) => since,
        };
        let stuck = stopped_since.is_some_and(|since| since.elapsed() > STOPPED_FOR);
        if stuck || start.elapsed() > SETTLE {
            for process in &alive {
                let name = format!("{} {}", process.pid, process.comm);
                if stopped.iter().any(|s| s.pid == process.pid) {
                    leftovers.stopped.push(name);
                } else {
                    leftovers.running.push(name);
                }
                // SAFETY: kill(2) on a process this test's commands started.
                unsafe {
                    libc::kill(process.pid, libc::SIGKILL);
                    libc::kill(process.pid, libc::SIGCONT);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Files under `dir` named like a cache write in progress (`.tmp…`).
pub fn temp_files(dir: &Path) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|path| name_of(path).starts_with(".tmp"))
        .collect()
}

/// What a project directory holds that no finished run should leave: anything in the runtime
/// and temporary directories, anything hidden in the cache and the state directory (temp
/// files, temp links, work directories), and a history set aside as corrupt.
pub fn leftover_files(project: &Path) -> Vec<PathBuf> {
    let mut left = walk(&project.join("run"));
    left.extend(walk(&project.join("tmp")));
    for root in [project.join("cache"), project.join("state")] {
        left.extend(walk(&root).into_iter().filter(|path| {
            let hidden = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .components()
                .any(|part| part.as_os_str().to_string_lossy().starts_with('.'));
            hidden || name_of(path).contains(".corrupt-")
        }));
    }
    left
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every file, link or socket under `dir`, at any depth.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(walk(&entry.path())),
            _ => found.push(entry.path()),
        }
    }
    found
}

/// Every entry of the cache points at a blob that exists and hashes to its name, of the size
/// it records, through a layout link that resolves; every blob hashes to its name.
pub fn check_cache(root: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    let Ok(cache) = Cache::open(root) else {
        return vec!["the cache does not open".into()];
    };
    let entries = match cache.entries() {
        Ok(entries) => entries,
        Err(err) => return vec![format!("the cache's entries do not list: {err}")],
    };
    for entry in entries {
        let name = format!("{} {}", entry.kernel, entry.target);
        match cache.check_blob(&entry.record.blob) {
            Ok(BlobCheck::Valid) => {}
            Ok(BlobCheck::Missing) => wrong.push(format!("{name}: its blob is missing")),
            Ok(BlobCheck::Corrupt) => wrong.push(format!("{name}: its blob is corrupt")),
            Err(err) => wrong.push(format!("{name}: {err}")),
        }
        match std::fs::read(root.join(entry.artifact_path())) {
            Ok(bytes) if bytes.len() as u64 == entry.record.size => {}
            Ok(bytes) => wrong.push(format!(
                "{name}: {} bytes, not {}",
                bytes.len(),
                entry.record.size
            )),
            Err(err) => wrong.push(format!("{name}: layout link: {err}")),
        }
    }
    for shard in read_dir(&root.join("blobs")) {
        for blob in read_dir(&shard) {
            let name = blob.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let bytes = std::fs::read(&blob).unwrap_or_default();
            if headroom_kernels::cache::hash_bytes(&bytes) != name {
                wrong.push(format!("blob {name} does not hash to its name"));
            }
        }
    }
    wrong
}

fn read_dir(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|read| read.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}
