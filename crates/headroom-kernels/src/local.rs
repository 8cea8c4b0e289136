//! `--device local`: the GPU this process would run on, asked of the CUDA driver
//! (`libcuda.so.1`, loaded at run time), so that resolving needs no device name on a GPU
//! machine while headroom still builds with no GPU SDK and runs where there is no GPU.
//!
//! The driver, not NVML, answers: it numbers devices as a CUDA program sees them, after
//! `CUDA_VISIBLE_DEVICES`, and a program loads its kernels on device 0 unless it picks another.

use std::ffi::{c_int, c_uint};

use crate::resolve::Device;
use crate::target::ComputeCapability;

/// The `--device` value that asks for this machine's GPU.
pub const LOCAL: &str = "local";

/// Why `--device local` found no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--device local found no GPU here: {reason}; name the device instead, e.g. --device sm_90 (a CUDA compute capability), --device gfx1100 (AMD) or --device apple9")]
pub struct NoLocalDevice {
    pub reason: String,
}

type CuResult = c_int;
const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// The device a CUDA program on this machine runs on by default: device 0 of the driver.
pub fn local_device() -> Result<Device, NoLocalDevice> {
    let failed = |reason: String| NoLocalDevice { reason };
    // SAFETY: loading the vendor's driver runs its initialisers, as every CUDA program does;
    // the symbols are looked up with their C signatures from cuda.h, and each is called with
    // pointers to live locals of the types it writes.
    unsafe {
        let library = libloading::Library::new("libcuda.so.1").map_err(|err| {
            failed(format!(
                "the NVIDIA driver's libcuda.so.1 does not load ({err})"
            ))
        })?;
        let symbol_error = |err: libloading::Error| failed(format!("libcuda.so.1: {err}"));
        let init: libloading::Symbol<unsafe extern "C" fn(c_uint) -> CuResult> =
            library.get(b"cuInit\0").map_err(symbol_error)?;
        let device_get: libloading::Symbol<unsafe extern "C" fn(*mut c_int, c_int) -> CuResult> =
            library.get(b"cuDeviceGet\0").map_err(symbol_error)?;
        let attribute: libloading::Symbol<
            unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult,
        > = library
            .get(b"cuDeviceGetAttribute\0")
            .map_err(symbol_error)?;
        match init(0) {
            CUDA_SUCCESS => {}
            CUDA_ERROR_NO_DEVICE => {
                return Err(failed(
                    "the CUDA driver sees no device (check CUDA_VISIBLE_DEVICES)".into(),
                ))
            }
            status => return Err(failed(format!("cuInit failed with CUresult {status}"))),
        }
        let mut device: c_int = 0;
        let status = device_get(&mut device, 0);
        if status != CUDA_SUCCESS {
            return Err(failed(format!(
                "cuDeviceGet(0) failed with CUresult {status}"
            )));
        }
        let read = |which: c_int| -> Result<u8, NoLocalDevice> {
            let mut value: c_int = 0;
            let status = attribute(&mut value, which, device);
            if status != CUDA_SUCCESS {
                return Err(failed(format!(
                    "cuDeviceGetAttribute failed with CUresult {status}"
                )));
            }
            u8::try_from(value).map_err(|_| {
                failed(format!(
                    "the driver reports compute capability part {value}"
                ))
            })
        };
        let major = read(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = read(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok(Device::Cuda(ComputeCapability { major, minor }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where no GPU is found (this machine), the error names the flag and the fix.
    #[test]
    fn without_a_gpu_the_error_says_to_name_the_device() {
        match local_device() {
            Ok(device) => {
                headroom_testkit::skip("no-gpu", format!("this machine has a GPU ({device})"))
            }
            Err(err) => {
                let message = err.to_string();
                assert!(
                    message.starts_with("--device local found no GPU here: ")
                        && message.contains("; name the device instead, e.g. --device sm_90"),
                    "{message}"
                );
            }
        }
    }
}
