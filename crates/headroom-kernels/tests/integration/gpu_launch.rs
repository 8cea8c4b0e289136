//! On a machine with an NVIDIA GPU: build the example kernel with clang, let the resolver
//! pick the artifact for the real device, load it through the driver API and launch it.
//! Everywhere else (no libcuda, no device, no clang) it prints why it skips.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::Path;

use headroom_kernels::build::{build, BuildOptions};
use headroom_kernels::cache::Cache;
use headroom_kernels::manifest::Manifest;
use headroom_kernels::resolve::ResolveOptions;
use headroom_kernels::toolchain::{ToolchainKind, Toolchains};

type CuResult = c_int;
type CuDevicePtr = u64;

/// The few driver API entry points the test needs, loaded at run time.
struct Driver {
    _library: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult,
    ctx_create: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult,
    module_get_function:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    ctx_synchronize: unsafe extern "C" fn() -> CuResult,
}

impl Driver {
    fn load() -> Result<Self, String> {
        // SAFETY: libcuda's initialisers have no preconditions; the symbol types below match
        // the CUDA driver API headers (cuda.h, v2 entry points).
        unsafe {
            let library = libloading::Library::new("libcuda.so.1")
                .map_err(|err| format!("libcuda.so.1 does not load: {err}"))?;
            macro_rules! symbol {
                ($name:literal) => {
                    *library
                        .get(concat!($name, "\0").as_bytes())
                        .map_err(|err| format!("{}: {err}", $name))?
                };
            }
            Ok(Driver {
                init: symbol!("cuInit"),
                device_get: symbol!("cuDeviceGet"),
                device_get_attribute: symbol!("cuDeviceGetAttribute"),
                ctx_create: symbol!("cuCtxCreate_v2"),
                module_load_data: symbol!("cuModuleLoadData"),
                module_get_function: symbol!("cuModuleGetFunction"),
                mem_alloc: symbol!("cuMemAlloc_v2"),
                memcpy_htod: symbol!("cuMemcpyHtoD_v2"),
                memcpy_dtoh: symbol!("cuMemcpyDtoH_v2"),
                launch_kernel: symbol!("cuLaunchKernel"),
                ctx_synchronize: symbol!("cuCtxSynchronize"),
                _library: library,
            })
        }
    }
}

fn check(what: &str, result: CuResult) {
    assert_eq!(result, 0, "{what} failed with CUresult {result}");
}

const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

#[test]
fn a_resolved_ptx_artifact_loads_and_runs_on_the_gpu() {
    let driver = match Driver::load() {
        Ok(driver) => driver,
        Err(reason) => {
            headroom_testkit::skip("gpu", format!("no NVIDIA driver ({reason})"));
            return;
        }
    };
    // SAFETY: plain driver API calls with valid out-pointers.
    let (device, major, minor) = unsafe {
        if (driver.init)(0) != 0 {
            headroom_testkit::skip("gpu", "cuInit failed (no usable NVIDIA GPU)");
            return;
        }
        let mut device = 0;
        check("cuDeviceGet", (driver.device_get)(&mut device, 0));
        let (mut major, mut minor) = (0, 0);
        check(
            "cuDeviceGetAttribute",
            (driver.device_get_attribute)(
                &mut major,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                device,
            ),
        );
        check(
            "cuDeviceGetAttribute",
            (driver.device_get_attribute)(
                &mut minor,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                device,
            ),
        );
        (device, major, minor)
    };
    if Toolchains::new(None, None)
        .get(ToolchainKind::Clang)
        .ok()
        .flatten()
        .is_none()
    {
        headroom_testkit::skip("clang", "no clang on PATH to build the PTX");
        return;
    }

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels/kernels.toml");
    let mut manifest = Manifest::load(&example).unwrap();
    manifest
        .kernels
        .retain(|kernel| kernel.name == "vector_add");
    manifest.kernels[0].toolchains = vec![ToolchainKind::Clang];
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(cache_dir.path()).unwrap();
    assert!(build(&manifest, &cache, &BuildOptions::default())
        .unwrap()
        .all_succeeded());

    let device_name = format!("sm_{major}{minor}");
    let (entries, explanation) = cache
        .resolve(
            "vector_add",
            &device_name.parse().unwrap(),
            &ResolveOptions::default(),
        )
        .unwrap();
    let chosen = &entries[explanation
        .chosen
        .unwrap_or_else(|| panic!("nothing resolves for {device_name}"))];
    eprintln!(
        "{device_name}: loading {}",
        chosen.artifact_path().display()
    );
    let ptx = CString::new(std::fs::read(cache_dir.path().join(chosen.artifact_path())).unwrap())
        .unwrap();

    const N: usize = 4096;
    let a: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    let mut out = vec![0f32; N];
    let bytes = N * std::mem::size_of::<f32>();
    // SAFETY: every pointer handed to the driver points at live buffers of `bytes` bytes, and
    // the kernel parameters match `vector_add(float*, const float*, const float*, int)`.
    unsafe {
        let mut context = std::ptr::null_mut();
        check("cuCtxCreate", (driver.ctx_create)(&mut context, 0, device));
        let mut module = std::ptr::null_mut();
        check(
            "cuModuleLoadData",
            (driver.module_load_data)(&mut module, ptx.as_ptr().cast()),
        );
        let mut function = std::ptr::null_mut();
        check(
            "cuModuleGetFunction",
            (driver.module_get_function)(&mut function, module, c"vector_add".as_ptr()),
        );
        let (mut d_out, mut d_a, mut d_b) = (0u64, 0u64, 0u64);
        for pointer in [&mut d_out, &mut d_a, &mut d_b] {
            check("cuMemAlloc", (driver.mem_alloc)(pointer, bytes));
        }
        check(
            "cuMemcpyHtoD",
            (driver.memcpy_htod)(d_a, a.as_ptr().cast(), bytes),
        );
        check(
            "cuMemcpyHtoD",
            (driver.memcpy_htod)(d_b, b.as_ptr().cast(), bytes),
        );
        let mut n = N as c_int;
        let mut params: [*mut c_void; 4] = [
            (&mut d_out as *mut u64).cast(),
            (&mut d_a as *mut u64).cast(),
            (&mut d_b as *mut u64).cast(),
            (&mut n as *mut c_int).cast(),
        ];
        let block = 128;
        check(
            "cuLaunchKernel",
            (driver.launch_kernel)(
                function,
                (N as c_uint).div_ceil(block),
                1,
                1,
                block,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        );
        check("cuCtxSynchronize", (driver.ctx_synchronize)());
        check(
            "cuMemcpyDtoH",
            (driver.memcpy_dtoh)(out.as_mut_ptr().cast(), d_out, bytes),
        );
    }
    for (index, value) in out.iter().enumerate() {
        assert_eq!(*value, 3.0 * index as f32, "element {index}");
    }
}
