//! `headroom-fakecc`: a stand-in compiler for tests and benchmarks. It grows to a given amount
//! of really touched memory over a given time, holds it briefly, and writes its `-o` output,
//! which names the CPU niceness, the scheduler slice and the `cpu` cgroup it ran in.
//!
//! `headroom-fakecc [--mem MIB | --mem-file FILE] [--ms MILLIS] [--cpu-ms MILLIS [--threads N]] [--oom-unless=FLAG] [--fail-once MARKER] [-o OUT] [ANY…]`
//! - `--mem-file FILE`: read `MIB [MILLIS]` from FILE, so a job's flags (and so its identity
//!   in the history) stay the same while its memory and time change between builds;
//! - `--cpu-ms MILLIS`: once at its memory, burn MILLIS of CPU time on `--threads` threads
//!   (default 1), as a compiler's code generation would: under contention it takes longer;
//! - `--oom-unless=FLAG`: print gcc's "virtual memory exhausted" and exit 1 unless FLAG is
//!   among the arguments, or for a FLAG of several words (`--threads 1`) those words in a row
//!   (to exercise the lower-memory flag ladder);
//! - `--fail-once MARKER`: the first run (when MARKER does not exist) creates MARKER and dies
//!   like a kernel OOM kill (SIGKILL on itself) once it reached its memory;
//! - `-E`: preprocess, as distcc's client asks of a compiler before it sends the job to a
//!   node: print one line and exit at once, using no memory to speak of.
//!
//! Other arguments are ignored, as a compiler's flags would be.

use std::time::{Duration, Instant};

use rustix::time::ClockId;

const PAGE: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-E") {
        println!("int preprocessed_by_headroom_fakecc;");
        return;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let number = |flag: &str| {
        value(flag).map(|v| {
            v.parse::<u64>()
                .unwrap_or_else(|_| usage(&format!("{flag} takes a whole number, not `{v}`")))
        })
    };
    let from_file: Option<Vec<u64>> = value("--mem-file").map(|file| {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| usage(&format!("cannot read {file}: {e}")));
        let numbers: Result<Vec<u64>, _> = text.split_whitespace().map(str::parse).collect();
        numbers
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| usage(&format!("{file} must hold `MIB [MILLIS]`")))
    });
    let mem_mib = from_file
        .as_ref()
        .map(|n| n[0])
        .or_else(|| number("--mem"))
        .unwrap_or(16);
    let millis = from_file
        .as_ref()
        .and_then(|n| n.get(1).copied())
        .or_else(|| number("--ms"))
        .unwrap_or(100);
    if let Some(flag) = args.iter().find_map(|a| a.strip_prefix("--oom-unless=")) {
        let words: Vec<&str> = flag.split(' ').collect();
        let given = args
            .windows(words.len())
            .any(|run| run.iter().map(String::as_str).eq(words.iter().copied()));
        if !given {
            eprintln!(
                "cc1plus: out of memory allocating 1048576 bytes after a total of {mem_mib} MiB"
            );
            eprintln!("virtual memory exhausted: Cannot allocate memory");
            std::process::exit(1);
        }
    }
    let memory = grow(mem_mib as usize * (1 << 20), Duration::from_millis(millis));
    if let Some(cpu_ms) = number("--cpu-ms") {
        burn(
            Duration::from_millis(cpu_ms),
            number("--threads").unwrap_or(1).max(1),
        );
    }
    if let Some(marker) = value("--fail-once") {
        if std::fs::metadata(marker).is_err() {
            std::fs::write(marker, b"failed once\n")
                .unwrap_or_else(|e| usage(&format!("cannot write {marker}: {e}")));
            // SAFETY: raising SIGKILL on ourselves, as the kernel's OOM killer would.
            unsafe { libc::raise(libc::SIGKILL) };
        }
    }
    if let Some(out) = value("-o") {
        let nice = rustix::process::getpriority_process(None).unwrap_or(0);
        let checksum: u64 = memory
            .iter()
            .flat_map(|chunk| chunk.iter().step_by(PAGE))
            .map(|&b| b as u64)
            .sum();
        std::fs::write(
            out,
            format!(
                "fake object, {mem_mib} MiB, nice {nice}, slice {}, cpu {}, checksum {checksum}\n",
                scheduler_slice(),
                cpu_cgroup()
            ),
        )
        .unwrap_or_else(|e| usage(&format!("cannot write {out}: {e}")));
    }
}

/// This process's scheduler slice in nanoseconds, as `/proc/self/sched` names it; `?` where
/// it does not (a kernel before EEVDF).
fn scheduler_slice() -> String {
    let sched = std::fs::read_to_string("/proc/self/sched").unwrap_or_default();
    sched
        .lines()
        .find_map(|line| line.strip_prefix("se.slice")?.split(':').nth(1))
        .map_or_else(|| "?".to_string(), |slice| slice.trim().to_string())
}

/// The path of this process's `cpu` cgroup (v1 `cpu` hierarchy, else v2), as
/// `/proc/self/cgroup` names it; `?` where it does not.
fn cpu_cgroup() -> String {
    let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v1 = membership.lines().find_map(|line| {
        let (_id, rest) = line.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        controllers.split(',').any(|c| c == "cpu").then_some(path)
    });
    v1.or_else(|| membership.lines().find_map(|line| line.strip_prefix("0::")))
        .unwrap_or("?")
        .to_string()
}

/// Allocates `bytes` in steady steps over `duration`, writing every byte so every page is
/// resident, and holds it all to the end.
fn grow(bytes: usize, duration: Duration) -> Vec<Vec<u8>> {
    let start = Instant::now();
    let steps = (duration.as_millis() / 10).max(1) as usize;
    let mut memory = Vec::with_capacity(steps);
    let mut allocated = 0;
    for step in 1..=steps {
        let target = bytes * step / steps;
        memory.push(vec![1u8; target - allocated]);
        allocated = target;
        let due = duration * step as u32 / steps as u32;
        std::thread::sleep(due.saturating_sub(start.elapsed()));
    }
    memory
}

/// Burns `cpu` of CPU time in all on `threads` threads, each until its own share is used.
fn burn(cpu: Duration, threads: u64) {
    let share = cpu / threads as u32;
    let thread_cpu = || Duration::try_from(rustix::time::clock_gettime(ClockId::ThreadCPUTime));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let start = thread_cpu().unwrap_or_default();
                let mut state = 1u64;
                while thread_cpu().map_or(true, |now| now - start < share) {
                    for _ in 0..10_000 {
                        state = std::hint::black_box(state.wrapping_mul(6364136223846793005) + 1);
                    }
                }
            });
        }
    });
}

fn usage(message: &str) -> ! {
    eprintln!("headroom-fakecc: {message}");
    std::process::exit(2)
}
