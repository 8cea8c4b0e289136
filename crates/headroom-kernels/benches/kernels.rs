//! Speed targets of issue 4: `resolve` in-process (<= 1 us) and a no-op rebuild of
//! 50 kernels x 6 targets (<= 50 ms). The rebuild uses a scripted nvcc that writes 8 KiB
//! artifacts, so it runs on any machine; a no-op rebuild never starts a compiler anyway.

use std::os::unix::fs::PermissionsExt;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use headroom_kernels::build::{build, BuildOptions, PairStatus};
use headroom_kernels::cache::Cache;
use headroom_kernels::manifest::Manifest;
use headroom_kernels::resolve::{resolve, Candidate, Device, Format, ResolveOptions};

fn candidates(targets: &[(&str, Format)]) -> Vec<Candidate> {
    targets
        .iter()
        .map(|(target, format)| Candidate {
            target: target.parse().unwrap(),
            format: *format,
            ptx_isa: Some("8.0".parse().unwrap()),
        })
        .collect()
}

fn bench_resolve(c: &mut Criterion) {
    let cuda = candidates(&[
        ("sm_75", Format::Cubin),
        ("sm_80", Format::Cubin),
        ("sm_86", Format::Cubin),
        ("sm_87", Format::Cubin),
        ("sm_89", Format::Cubin),
        ("sm_90", Format::Cubin),
        ("sm_90a", Format::Cubin),
        ("compute_90", Format::Ptx),
    ]);
    let amd = candidates(&[
        ("gfx1030", Format::CodeObject),
        ("gfx1100", Format::CodeObject),
        ("gfx1101", Format::CodeObject),
        ("gfx1102", Format::CodeObject),
        ("gfx90a:xnack-", Format::CodeObject),
        ("gfx90a:xnack+", Format::CodeObject),
        ("gfx942", Format::CodeObject),
        ("gfx11-generic", Format::CodeObject),
    ]);
    let options = ResolveOptions {
        driver_ptx: Some("8.4".parse().unwrap()),
    };
    for (name, set, device) in [
        ("resolve/cuda_8_candidates_sm_89", &cuda, "sm_89"),
        ("resolve/cuda_8_candidates_sm_100", &cuda, "sm_100"),
        (
            "resolve/amd_8_candidates_gfx90a_xnack-",
            &amd,
            "gfx90a:xnack-",
        ),
    ] {
        let device: Device = device.parse().unwrap();
        c.bench_function(name, |b| {
            b.iter(|| resolve(black_box(set), black_box(&device), black_box(&options)))
        });
    }
}

const FAKE_NVCC: &str = r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 12.4, V12.4.131"; exit 0; fi
out=; arch=
while [ $# -gt 0 ]; do case "$1" in -o) shift; out=$1 ;; -arch=*) arch=$1 ;; esac; shift; done
{ echo "$arch"; head -c 8192 /dev/zero | tr '\0' 'x'; } > "$out"
"#;

const TARGETS: &str = r#"["sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "compute_90"]"#;

fn bench_noop_rebuild(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("nvcc"), FAKE_NVCC).unwrap();
    std::fs::set_permissions(bin.join("nvcc"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.path().join("include")).unwrap();
    std::fs::write(
        dir.path().join("include/common.h"),
        "#pragma once\n#define BLOCK 256\n",
    )
    .unwrap();
    let mut manifest_text = String::new();
    for index in 0..50 {
        std::fs::write(dir.path().join(format!("k{index}.cu")), format!("#include \"common.h\"\n__global__ void k{index}(float *x) {{ x[threadIdx.x] *= {index}; }}\n")).unwrap();
        manifest_text.push_str(&format!(
            "[kernel.k{index}]\nlanguage = \"cuda\"\nsources = [\"k{index}.cu\"]\ntargets = {TARGETS}\ninclude-dirs = [\"include\"]\ntoolchain = [\"nvcc\"]\n\n"
        ));
    }
    std::fs::write(dir.path().join("kernels.toml"), manifest_text).unwrap();
    let manifest = Manifest::load(&dir.path().join("kernels.toml")).unwrap();
    let cache = Cache::open(&dir.path().join("cache")).unwrap();
    let search_path = std::env::join_paths([bin, "/usr/bin".into(), "/bin".into()]).unwrap();
    let options = BuildOptions {
        search_path: Some(search_path),
        ..BuildOptions::default()
    };
    let cold = build(&manifest, &cache, &options).unwrap();
    assert!(cold.all_succeeded() && cold.pairs.len() == 300);

    c.bench_function("noop_rebuild/50_kernels_x_6_targets", |b| {
        b.iter(|| {
            let report = build(&manifest, &cache, &options).unwrap();
            debug_assert!(report
                .pairs
                .iter()
                .all(|pair| pair.status == PairStatus::UpToDate));
            report
        })
    });
}

criterion_group!(benches, bench_resolve, bench_noop_rebuild);
criterion_main!(benches);
