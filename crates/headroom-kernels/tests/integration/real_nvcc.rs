//! Real builds with nvcc 13.2 from PyPI, which compiles without a GPU. `bash .ci/cuda.sh`
//! installs it (CI runs it) and leaves a CUDA_HOME in `$HEADROOM_CUDA_ENV/cuda-home`, by
//! default `~/.cache/headroom-ci/cuda-home`; where it is missing, the tests skip and say so.
//!
//! A small manifest (cubins for sm_80, sm_90a and sm_100f, PTX for compute_80, a fatbin for
//! sm_80) is built through the crate's API with that nvcc first on the toolchain path and no
//! scripted stand-in anywhere. Every artifact is checked for what it really is (cubins by their
//! ELF header and notes, PTX by its `.target`/`.version` lines, the fatbin by its entries), then
//! the resolver picks among them for a range of devices and drivers.
//!
//! What nvcc 13.2 writes in a cubin's ELF header, read from its output for sm_75 to sm_120
//! (the field names are LLVM's, `llvm/BinaryFormat/ELF.h`):
//! - `e_machine` EM_CUDA (190), `EI_OSABI` 0x41, `EI_ABIVERSION` 8 (ELFABIVERSION_CUDA_V2)
//!   for every SM, not only for Blackwell, and `e_type` ET_EXEC;
//! - the SM number in bits 8-15 of `e_flags` (EF_CUDA_SM_MASK): sm_75 0x06004b04, sm_80
//!   0x06005004, sm_86 0x06005604, sm_90 0x06005a04, sm_100 0x06006402, sm_120 0x06007802.
//!   The older ABI (`EI_ABIVERSION` 7, ELFABIVERSION_CUDA_V1) kept it in the low byte
//!   (EF_CUDA_SM, 0xff), where ABI 8 has small flags (0x04 up to sm_90, 0x02 from sm_100);
//! - nothing of the `a`/`f` variant: sm_90 and sm_90a, and sm_100, sm_100a and sm_100f, have
//!   equal `e_flags` (EF_CUDA_ACCELERATORS, 0x8, is never set). The variant shows in the
//!   `.note.nv.tkinfo` note, which records ptxas's release and options (`-arch sm_90a -m 64`),
//!   and in the `.nv.compat` attributes; the test reads the note.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use headroom_kernels::build::{build, BuildOptions, BuildReport, PairStatus};
use headroom_kernels::cache::{Cache, Origin};
use headroom_kernels::inspect::{ptx_target, ptx_version};
use headroom_kernels::manifest::Manifest;
use headroom_kernels::resolve::{Format, PtxIsa, Rejection, ResolveOptions, Verdict};
use headroom_kernels::target::Backend;
use headroom_kernels::toolchain::{ToolchainKind, Toolchains};

/// The CUDA_HOME `.ci/cuda.sh` makes, found the way `crates/headroom/tests/build_cuda.rs`
/// finds it.
fn cuda_home() -> Option<PathBuf> {
    let dir = std::env::var_os("HEADROOM_CUDA_ENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/headroom-ci"))
        });
    let Some(dir) = dir else {
        headroom_testkit::skip("nvcc", "neither HEADROOM_CUDA_ENV nor HOME is set (run `bash .ci/cuda.sh`, or set HEADROOM_CUDA_ENV)");
        return None;
    };
    let home = dir.join("cuda-home");
    if home.join("bin/nvcc").exists() {
        Some(home)
    } else {
        headroom_testkit::skip(
            "nvcc",
            format!(
                "no nvcc in {} (run `bash .ci/cuda.sh`, or set HEADROOM_CUDA_ENV)",
                home.join("bin").display()
            ),
        );
        None
    }
}

/// The toolchain search path: the real nvcc first, then this process's PATH.
fn search_path(cuda_home: &Path) -> OsString {
    let mut dirs = vec![cuda_home.join("bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap()
}

const MANIFEST: &str = r#"
[kernel.add]
language = "cuda"
sources = ["add.cu", "scale.cu"]
targets = ["sm_80", "sm_90a", "sm_100f", "compute_80"]
flags = ["-O3"]
defines = { FACTOR = "2.0f" }
include-dirs = ["include"]
toolchain = ["nvcc"]

[kernel.add_fat]
language = "cuda"
sources = ["add.cu"]
targets = ["sm_80"]
defines = { FACTOR = "2.0f" }
include-dirs = ["include"]
toolchain = ["nvcc"]
cuda-output = "fatbin"
"#;

const SOURCES: &[(&str, &str)] = &[
    (
        "include/common.h",
        r#"#pragma once
#ifndef FACTOR
#error "FACTOR comes from the manifest's defines"
#endif
__device__ __forceinline__ float scaled(float x) { return x * FACTOR; }
"#,
    ),
    (
        "add.cu",
        r#"#include "common.h"
extern "C" __global__ void add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = scaled(a[i]) + b[i];
}
"#,
    ),
    (
        "scale.cu",
        r#"#include "common.h"
extern "C" __global__ void scale(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = scaled(x[i]);
}
"#,
    ),
];

/// What a cubin says about itself.
#[derive(Debug)]
struct Cubin {
    abi_version: u8,
    e_flags: u32,
    /// The SM number from `e_flags` (80 for sm_80).
    sm: u32,
    /// ptxas's options from `.note.nv.tkinfo` (`-arch sm_90a -m 64`).
    ptxas_options: String,
    /// ptxas's release from the same note (`Cuda compilation tools, release 13.2, V13.2.86`).
    ptxas_release: String,
    /// The kernels, from the `.text.<name>` sections.
    functions: Vec<String>,
}

fn read_cubin(bytes: &[u8]) -> Cubin {
    use object::read::elf::{ElfFile64, FileHeader};
    use object::{Object, ObjectSection};
    let file = ElfFile64::<object::Endianness>::parse(bytes).expect("a cubin is an ELF64 file");
    let endian = file.endian();
    let header = file.elf_header();
    assert_eq!(header.e_machine(endian), object::elf::EM_CUDA, "EM_CUDA");
    assert_eq!(header.e_type(endian), object::elf::ET_EXEC);
    let abi_version = header.e_ident().abi_version;
    let e_flags = header.e_flags(endian);
    let sm = match abi_version {
        7 => e_flags & 0xff,
        8 => (e_flags >> 8) & 0xff,
        other => panic!("unknown CUDA ELF ABI version {other} (e_flags {e_flags:#010x})"),
    };
    let tkinfo = file
        .section_by_name(".note.nv.tkinfo")
        .expect("ptxas writes a .note.nv.tkinfo note")
        .data()
        .unwrap();
    let strings: Vec<&str> = tkinfo
        .split(|byte| *byte == 0)
        .filter_map(|part| std::str::from_utf8(part).ok())
        .collect();
    let find = |prefix: &str| {
        strings
            .iter()
            .find(|text| text.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}...` in .note.nv.tkinfo: {strings:?}"))
            .trim()
            .to_string()
    };
    let functions = file
        .sections()
        .filter_map(|section| Some(section.name().ok()?.strip_prefix(".text.")?.to_string()))
        .collect();
    Cubin {
        abi_version,
        e_flags,
        sm,
        ptxas_options: find("-arch "),
        ptxas_release: find("Cuda compilation tools"),
        functions,
    }
}

/// Checks a cubin is machine code for `arch` (`sm_90a`) holding `kernels`.
fn check_cubin(bytes: &[u8], arch: &str, kernels: &[&str]) {
    let cubin = read_cubin(bytes);
    let digits = arch.trim_start_matches("sm_").trim_end_matches(['a', 'f']);
    assert_eq!(
        cubin.sm.to_string(),
        digits,
        "{arch}: e_flags {:#010x}",
        cubin.e_flags
    );
    // nvcc 13 writes the new ABI for every SM.
    assert_eq!(cubin.abi_version, 8, "{arch}: {cubin:?}");
    let options: Vec<&str> = cubin.ptxas_options.split_whitespace().collect();
    assert!(
        options.windows(2).any(|pair| pair == ["-arch", arch]),
        "{arch}: ptxas options {:?}",
        cubin.ptxas_options
    );
    assert!(
        cubin.ptxas_release.contains("release 13.2,"),
        "{arch}: {cubin:?}"
    );
    for kernel in kernels {
        assert!(
            cubin.functions.iter().any(|name| name == kernel),
            "{arch}: no .text.{kernel} in {:?}",
            cubin.functions
        );
    }
}

/// Checks PTX text is for `arch` (`sm_80`) and holds `kernels`; returns its ISA version.
fn check_ptx(ptx: &str, arch: &str, kernels: &[&str]) -> PtxIsa {
    assert_eq!(ptx_target(ptx), Some(arch), "{ptx}");
    for kernel in kernels {
        assert!(
            ptx.contains(&format!(".visible .entry {kernel}(")),
            "no entry {kernel}: {ptx}"
        );
    }
    ptx_version(ptx).expect("PTX has a .version line")
}

/// One entry of an nvcc fatbin.
struct FatbinEntry {
    /// 1 = PTX, 2 = ELF (a cubin).
    kind: u16,
    /// The SM number (80 for sm_80 and compute_80).
    sm: u32,
    /// For PTX, the ISA version from the entry header.
    isa: PtxIsa,
    payload: Vec<u8>,
}

/// The entries of an nvcc fatbin (`fatbinary`'s layout as nvcc 13.2 writes it: a 16-byte
/// header, magic 0xba55ed50, u16 version, u16 header size, u64 size of the entries; then per
/// entry u16 kind, u32 header size at 4, u64 padded payload size at 8, u16 minor and major
/// at 24 and 26, u32 SM at 28, u64 flags at 40, and the payload; PTX is zstd-compressed).
fn read_fatbin(bytes: &[u8]) -> Vec<FatbinEntry> {
    let field = |at: usize, width: usize| {
        bytes[at..at + width]
            .iter()
            .rev()
            .fold(0u64, |value, byte| (value << 8) | u64::from(*byte))
    };
    assert_eq!(field(0, 4), 0xba55_ed50, "fatbin magic");
    let start = field(6, 2) as usize;
    let end = start + field(8, 8) as usize;
    assert_eq!(end, bytes.len(), "the fatbin header covers the file");
    let mut entries = Vec::new();
    let mut at = start;
    while at < end {
        let header = field(at + 4, 4) as usize;
        let padded = field(at + 8, 8) as usize;
        let raw = &bytes[at + header..at + header + padded];
        let payload = if raw.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            let mut text = Vec::new();
            zstd::stream::read::Decoder::new(raw)
                .unwrap()
                .single_frame()
                .read_to_end(&mut text)
                .unwrap();
            text
        } else {
            raw.to_vec()
        };
        entries.push(FatbinEntry {
            kind: field(at, 2) as u16,
            sm: field(at + 28, 4) as u32,
            isa: PtxIsa {
                major: field(at + 26, 2) as u8,
                minor: field(at + 24, 2) as u8,
            },
            payload,
        });
        at += header + padded;
    }
    entries
}

fn assert_all(report: &BuildReport, wanted: &PairStatus) {
    for pair in &report.pairs {
        assert_eq!(
            &pair.status, wanted,
            "{} {}: {report:#?}",
            pair.kernel, pair.target
        );
    }
}

#[test]
fn the_toolchain_is_the_real_nvcc_13_2() {
    let Some(cuda_home) = cuda_home() else {
        return;
    };
    let mut toolchains = Toolchains::new(None, Some(search_path(&cuda_home)));
    let nvcc = toolchains.get(ToolchainKind::Nvcc).unwrap().unwrap();
    assert_eq!(nvcc.program, cuda_home.join("bin/nvcc"));
    assert!(
        nvcc.version
            .starts_with("nvcc: NVIDIA (R) Cuda compiler driver"),
        "{}",
        nvcc.version
    );
    assert!(
        nvcc.short_version()
            .starts_with("Cuda compilation tools, release 13.2, V13.2."),
        "{}",
        nvcc.version
    );
}

#[test]
fn nvcc_builds_real_cubins_ptx_and_fatbins_that_resolve() {
    let Some(cuda_home) = cuda_home() else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    for (path, text) in SOURCES {
        let path = project.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::write(project.path().join("kernels.toml"), MANIFEST).unwrap();
    let manifest = Manifest::load(&project.path().join("kernels.toml")).unwrap();
    let cache = Cache::open(&project.path().join("cache")).unwrap();
    let options = BuildOptions {
        search_path: Some(search_path(&cuda_home)),
        ..BuildOptions::default()
    };

    let started = Instant::now();
    let report = build(&manifest, &cache, &options).unwrap();
    eprintln!(
        "{} nvcc compiles in {:.1?}",
        report.pairs.len(),
        started.elapsed()
    );
    assert_all(&report, &PairStatus::Built);
    for pair in &report.pairs {
        let toolchain = pair.toolchain.as_deref().unwrap();
        assert!(
            toolchain.starts_with("nvcc Cuda compilation tools, release 13.2, V13.2."),
            "{toolchain}"
        );
    }

    // What each artifact really is.
    let entry = |kernel: &str, target: &str| {
        cache
            .origin_entries(Backend::Cuda, kernel, &Origin::Newest)
            .unwrap()
            .into_iter()
            .find(|entry| entry.target.to_string() == target)
            .unwrap_or_else(|| panic!("no entry for {kernel} {target}"))
    };
    let read = |kernel: &str, target: &str| {
        let entry = entry(kernel, target);
        std::fs::read(cache.root().join(entry.artifact_path())).unwrap()
    };
    for arch in ["sm_80", "sm_90a", "sm_100f"] {
        let entry = entry("add", arch);
        assert_eq!(entry.record.format, Format::Cubin, "{arch}");
        assert_eq!(
            entry.artifact_path(),
            Path::new("cuda/add")
                .join(&entry.origin)
                .join(format!("{arch}.cubin"))
        );
        assert!(
            entry.record.toolchain.contains("release 13.2,"),
            "{entry:?}"
        );
        check_cubin(&read("add", arch), arch, &["add", "scale"]);
    }
    let ptx_entry = entry("add", "compute_80");
    assert_eq!(ptx_entry.record.format, Format::Ptx);
    let ptx = String::from_utf8(read("add", "compute_80")).unwrap();
    let isa = check_ptx(&ptx, "sm_80", &["add", "scale"]);
    assert!(
        ptx.contains("Cuda compilation tools, release 13.2,"),
        "nvcc's header comment: {ptx}"
    );
    assert_eq!(ptx_entry.record.ptx_isa, Some(isa));
    // CUDA 13 writes PTX ISA 9.x: too new for a CUDA 12.4 driver (8.4).
    let old_driver = PtxIsa { major: 8, minor: 4 };
    assert!(isa > old_driver, "{isa}");

    let fat_entry = entry("add_fat", "sm_80");
    assert_eq!(fat_entry.record.format, Format::Fatbin);
    let fatbin = read_fatbin(&read("add_fat", "sm_80"));
    let kinds: Vec<(u16, u32)> = fatbin.iter().map(|entry| (entry.kind, entry.sm)).collect();
    assert_eq!(
        kinds,
        [(2, 80), (1, 80)],
        "an sm_80 cubin and compute_80 PTX"
    );
    check_cubin(&fatbin[0].payload, "sm_80", &["add"]);
    // The embedded PTX has its comments stripped and a NUL at the end.
    let fat_ptx = String::from_utf8(fatbin[1].payload.clone()).unwrap();
    let fat_ptx = fat_ptx.trim_end_matches('\0');
    let fat_isa = check_ptx(fat_ptx, "sm_80", &["add"]);
    assert_eq!(fatbin[1].isa, fat_isa, "the entry header names the PTX ISA");
    assert_eq!(
        fat_entry.record.ptx_isa,
        Some(fat_isa),
        "the build records the fatbin's PTX ISA for the resolver"
    );

    // The resolver picks them by the vendors' rules.
    let resolve = |kernel: &str, device: &str, driver: Option<PtxIsa>| {
        let (entries, explanation) = cache
            .resolve(
                kernel,
                &device.parse().unwrap(),
                &ResolveOptions { driver_ptx: driver },
            )
            .unwrap();
        let chosen = explanation.chosen.map(|index| {
            let entry = &entries[index];
            assert!(cache.root().join(entry.artifact_path()).is_file());
            (
                entry.target.to_string(),
                entry.record.format,
                explanation.verdicts[index],
            )
        });
        let sm_90a = entries
            .iter()
            .position(|entry| entry.target.to_string() == "sm_90a")
            .map(|index| explanation.verdicts[index]);
        (chosen, sm_90a)
    };
    let target_of = |kernel: &str, device: &str, driver: Option<PtxIsa>| {
        resolve(kernel, device, driver)
            .0
            .map(|(target, format, _)| (target, format))
    };
    let cubin = |target: &str| Some((target.to_string(), Format::Cubin));
    for device in ["sm_80", "sm_86", "sm_89"] {
        assert_eq!(target_of("add", device, None), cubin("sm_80"), "{device}");
    }
    for device in ["sm_90", "sm_90a"] {
        assert_eq!(target_of("add", device, None), cubin("sm_90a"), "{device}");
    }
    for device in ["sm_89", "sm_100", "sm_120"] {
        assert!(
            matches!(
                resolve("add", device, Some(isa)).1,
                Some(Verdict::Rejected(Rejection::ArchSpecific { .. }))
            ),
            "sm_90a code runs only on 9.0, not on {device}"
        );
    }
    for device in ["sm_100", "sm_103"] {
        assert_eq!(target_of("add", device, None), cubin("sm_100f"), "{device}");
    }
    // No cubin fits a newer device: the compute_80 PTX is JIT-compiled, if the driver can.
    let (chosen, _) = resolve("add", "sm_120", Some(isa));
    assert!(
        matches!(&chosen, Some((target, Format::Ptx, Verdict::Jit { .. })) if target == "compute_80"),
        "{chosen:?}"
    );
    assert_eq!(target_of("add", "sm_120", Some(old_driver)), None);
    // Nor does anything run on an older one: PTX JIT-compiles forward only.
    assert_eq!(target_of("add", "sm_75", Some(isa)), None);

    let fat = Some(("sm_80".to_string(), Format::Fatbin));
    assert_eq!(target_of("add_fat", "sm_86", Some(old_driver)), fat);
    let (chosen, _) = resolve("add_fat", "sm_90", Some(fat_isa));
    assert!(
        matches!(chosen, Some((_, Format::Fatbin, Verdict::Jit { .. }))),
        "{chosen:?}"
    );
    assert_eq!(
        target_of("add_fat", "sm_90", Some(old_driver)),
        None,
        "the fatbin's PTX is too new for the driver"
    );

    // Nothing changed: nothing recompiles.
    let again = build(&manifest, &cache, &options).unwrap();
    assert_all(&again, &PairStatus::UpToDate);
}
