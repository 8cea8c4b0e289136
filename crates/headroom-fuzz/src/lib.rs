//! The bodies of the fuzz targets: one function per parser or decoder that reads what
//! headroom does not write itself. `fuzz/fuzz_targets/*.rs` hand libFuzzer's inputs to them,
//! and `tests/replay.rs` runs every corpus and regression input through them under plain
//! `cargo test`, so a crash once found stays fixed on the stable toolchain.
//!
//! Each body calls what the binary calls on such input, in the same order, and panics only
//! where the code under test does or where a property that must hold fails.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use headroom_config::{BuildOverrides, BuildSettings, FileConfig};
use headroom_diagnose::ExitInfo;
use headroom_govern::compiler::expand_response_files;
use headroom_govern::job::JobIdentity;
use headroom_govern::portable::Places;
use headroom_govern::protocol::{read_frame, write_frame, Reply, Request};
use headroom_kernels::cache::{hash_bytes, Cache};
use headroom_kernels::manifest::Manifest;
use headroom_kernels::resolve::{explain, Device, ResolveOptions};
use headroom_report::BuildReport;
use headroom_sim::import::{trace_from_report, ImportOptions};
use headroom_sim::{compare, Machine, SimConfig, Trace, Workload, ALL_POLICIES};

/// A fuzz target: its name (the file under `fuzz/fuzz_targets/` and the folders under
/// `fuzz/corpus/` and `fuzz/regressions/`) and its body.
pub struct Target {
    pub name: &'static str,
    pub body: fn(&[u8]),
}

/// Every target.
pub const TARGETS: [Target; 10] = [
    Target {
        name: "manifest",
        body: manifest,
    },
    Target {
        name: "bundle_import",
        body: bundle_import,
    },
    Target {
        name: "cache_entry",
        body: cache_entry,
    },
    Target {
        name: "sim_trace",
        body: sim_trace,
    },
    Target {
        name: "report_json",
        body: report_json,
    },
    Target {
        name: "sizes",
        body: sizes,
    },
    Target {
        name: "settings",
        body: settings,
    },
    Target {
        name: "wire_frame",
        body: wire_frame,
    },
    Target {
        name: "compiler_argv",
        body: compiler_argv,
    },
    Target {
        name: "diagnose",
        body: diagnose,
    },
];

/// Traces with more jobs than this, or more seconds of jobs in all than `SIMULATED_SECONDS`,
/// are parsed and checked but not simulated, so one input stays within a fuzzer's time per
/// run: the simulator samples every running job each simulated tick, so its cost grows with
/// the simulated time (a job mutated to 26 days took 10 s).
const SIMULATED_JOBS: usize = 16;
const SIMULATED_SECONDS: f64 = 100_000.0;

/// Whether a trace is small enough to simulate in a fuzzer's run (see `SIMULATED_JOBS`).
fn small_enough(trace: &Trace) -> bool {
    trace.jobs.len() <= SIMULATED_JOBS
        && trace.jobs.iter().map(|job| job.duration).sum::<f64>() <= SIMULATED_SECONDS
}

/// A machine for simulations and imports: small, so that fuzzed peaks matter.
const MACHINE: Machine = Machine {
    cores: 4,
    memory: 8 << 30,
};

/// A fresh directory for a body that needs files; the fuzzer cannot go on without one.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory for the fuzz input")
}

/// `kernels.toml`: parsed as `headroom kernels` parses it.
pub fn manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(manifest) = Manifest::parse(text, Path::new("/project/kernels.toml")) {
        manifest.names();
    }
}

/// A bundle for `headroom kernels import`. Input that is not already a zstd frame is taken as
/// the tar inside one and compressed first, so the fuzzer can reach the tar members and
/// the bundle manifest as well as the decoder.
pub fn bundle_import(data: &[u8]) {
    const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    let dir = scratch();
    let bundle = dir.path().join("fuzz.tar.zst");
    let bytes = if data.starts_with(&ZSTD_MAGIC) {
        data.to_vec()
    } else {
        zstd::encode_all(data, 1).expect("compressing bytes in memory")
    };
    fs::write(&bundle, bytes).expect("writing the bundle into the scratch directory");
    let cache = Cache::open(&dir.path().join("cache")).expect("a scratch kernel cache");
    if headroom_kernels::bundle::import(&cache, &bundle).is_ok() {
        // Whatever an import accepted must read back as well-formed entries.
        for entry in cache.entries().expect("listing the imported entries") {
            assert!(
                entry.is_well_formed(),
                "imported a malformed entry {entry:?}"
            );
        }
    }
}

/// A key record and a layout entry of the kernel cache: the same bytes are written as both,
/// beside one intact blob that seeds can name, then read as `headroom kernels` reads them.
/// The files are written plainly, not through the cache's fsynced writes, which would cost
/// most of each run.
pub fn cache_entry(data: &[u8]) {
    const KEY: &str = "0000000000000000000000000000000000000000000000000000000000000000";
    const BLOB: &[u8] = b"fuzz blob";
    let dir = scratch();
    let cache = Cache::open(dir.path()).expect("a scratch kernel cache");
    let blob = hash_bytes(BLOB);
    for (relative, bytes) in [
        (format!("blobs/{}/{blob}", &blob[..2]), BLOB),
        (format!("keys/{}/{KEY}.json", &KEY[..2]), data),
        ("cuda/fuzz/sm_80.json".to_string(), data),
    ] {
        let path = dir.path().join(relative);
        fs::create_dir_all(path.parent().expect("a file in a folder"))
            .expect("creating a folder in the scratch cache");
        fs::write(&path, bytes).expect("writing into the scratch cache");
    }
    let _ = cache.lookup_key(KEY);
    let entries = cache.entries().expect("listing the scratch cache");
    let candidates: Vec<_> = entries.iter().map(|entry| entry.candidate()).collect();
    for entry in &entries {
        entry.artifact_path();
        if entry.is_well_formed() {
            let _ = cache.lookup_key(&entry.key);
        }
    }
    for device in ["sm_80", "gfx90a:xnack-", "apple-m3"] {
        let device: Device = device.parse().expect("a valid device");
        explain(&candidates, &device, &ResolveOptions::default());
    }
}

/// A trace for `headroom sim`: parsed and checked; a small valid one is simulated under every
/// policy as `headroom sim` does.
pub fn sim_trace(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(trace) = Trace::parse(text, Path::new("fuzz.json")) else {
        return;
    };
    if small_enough(&trace) {
        simulate(&trace);
    }
}

fn simulate(trace: &Trace) {
    let config = SimConfig::default();
    let workload = Workload::new(trace, &config);
    let _ = compare(&workload, MACHINE, &ALL_POLICIES, &config);
}

/// A `--report` JSON, read as `headroom report FILE` and `headroom sim import` read it: the
/// summary, the build page, the Chrome trace and the imported simulator trace.
pub fn report_json(data: &[u8]) {
    let Ok(report) = serde_json::from_slice::<BuildReport>(data) else {
        return;
    };
    headroom_report::summary::render(&report);
    headroom_report::chart::render_html(&headroom_report::build_page::timeline(&report));
    headroom_report::chrome_trace::build_trace(&report);
    let options = ImportOptions {
        name: "fuzz".to_string(),
        machine: MACHINE,
        jobs_flag: MACHINE.cores,
        named_inputs: headroom_govern::last_build::named_inputs(&report.jobs),
    };
    let trace = trace_from_report(&report, &options);
    if trace.validate().is_ok() && small_enough(&trace) {
        simulate(&trace);
    }
}

/// Byte sizes (`--memory`, `--machine`, sizes in settings) and `--budget`; a size that
/// parses prints as a size that parses back to at most 1% off.
pub fn sizes(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = text.parse::<headroom_sim::BudgetSpec>();
    if let Ok(bytes) = headroom_size::parse_size(text) {
        let printed = headroom_size::format_size(bytes);
        let again = headroom_size::parse_size(&printed)
            .unwrap_or_else(|err| panic!("{bytes} printed as {printed:?}, which fails: {err}"));
        assert!(
            again.abs_diff(bytes) <= bytes / 100,
            "{bytes} printed as {printed:?}, which reads back as {again}"
        );
    }
}

/// `headroom.toml` (and the user's settings), as the project's and as the user's file,
/// merged as `headroom build` merges them.
pub fn settings(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = FileConfig::parse(text, Path::new("headroom.toml")) else {
        return;
    };
    let none = FileConfig::default();
    let flags = BuildOverrides::default();
    let _ = BuildSettings::merge(&flags, &file, &none, 4);
    let _ = BuildSettings::merge(&flags, &none, &file, 4);
}

/// The governor's wire: frames read one after another, as requests and as replies, until
/// the input ends or one fails; each frame read writes back the same.
pub fn wire_frame(data: &[u8]) {
    read_frames::<Request>(data);
    read_frames::<Reply>(data);
}

fn read_frames<T>(mut wire: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    while let Ok(message) = read_frame::<T>(&mut wire) {
        let mut written = Vec::new();
        write_frame(&mut written, &message).expect("writing a frame into memory");
        let again: T = read_frame(written.as_slice()).expect("reading back a written frame");
        let mut rewritten = Vec::new();
        write_frame(&mut rewritten, &again).expect("writing a frame into memory");
        assert_eq!(
            rewritten, written,
            "a frame changed through a write and a read"
        );
    }
}

/// A compiler's argv as the governor keys it. The input is NUL-separated parts: the first
/// holds the arguments, one per line; each further part becomes the file `0`, `1`, … in the
/// job's working directory, which `@0`, `@1`, … name.
pub fn compiler_argv(data: &[u8]) {
    let dir = scratch();
    let mut parts = data.split(|&byte| byte == 0);
    let args: Vec<String> = String::from_utf8_lossy(parts.next().unwrap_or_default())
        .lines()
        .map(String::from)
        .collect();
    for (index, contents) in parts.enumerate() {
        fs::write(dir.path().join(index.to_string()), contents)
            .expect("writing a response file into the scratch directory");
    }
    let cwd = dir.path().to_string_lossy();
    let expanded = expand_response_files("/usr/bin/g++", &args, dir.path());
    let identity = JobIdentity::new("/usr/bin/g++", &expanded, &cwd);
    identity.portable_key("g++ 12.2.0", &cwd, &Places::new(&cwd, Some("/home/fuzz")));
}

/// Arbitrary output, as `headroom run` and the governor classify a failed command's output
/// and `headroom diagnose` scans a log (streamed in small reads, as from a pipe).
pub fn diagnose(data: &[u8]) {
    for exit in [
        ExitInfo::exited(1),
        ExitInfo::signaled(9),
        ExitInfo {
            kernel_oom_evidence: Some("memory.events oom_kill 0 -> 1".to_string()),
            ..ExitInfo::signaled(9)
        },
    ] {
        headroom_diagnose::classify(data, &exit);
    }
    let streamed = headroom_diagnose::scan(Trickle(data)).expect("reading from memory");
    assert_eq!(streamed.bytes, data.len() as u64, "the scan missed bytes");
}

/// A reader that hands out at most 7 bytes a read, as a pipe may.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let length = buffer.len().min(self.0.len()).min(7);
        buffer[..length].copy_from_slice(&self.0[..length]);
        self.0 = &self.0[length..];
        Ok(length)
    }
}
