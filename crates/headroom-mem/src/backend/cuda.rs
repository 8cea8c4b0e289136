//! CUDA device memory through the driver API, which cudarc loads at run time, so building
//! with `--features cuda` needs no CUDA SDK and a machine without a driver gets an error
//! instead of a link failure.

use std::collections::HashMap;

use cudarc::driver::{result, sys};
use parking_lot::Mutex;

use super::{Backend, BackendError, BackendKind};
use crate::layout::{align_up, Scope};

/// `cuMemAlloc` guarantees this alignment; larger ones are served by over-allocating.
const DRIVER_ALIGNMENT: u64 = 256;

/// Global memory of one CUDA device. Shared and local memory are per-kernel resources that
/// the driver does not allocate, so only [`Scope::Global`] is supported.
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: u32,
    context: sys::CUcontext,
    total: u64,
    /// Aligned address handed out -> raw driver pointer, for over-aligned reservations.
    over_aligned: Mutex<HashMap<u64, u64>>,
}

// SAFETY: a CUcontext is a driver handle that may be made current on any thread.
unsafe impl Send for CudaDevice {}
// SAFETY: every call makes the context current on the calling thread first.
unsafe impl Sync for CudaDevice {}

fn driver_error(error: result::DriverError) -> BackendError {
    BackendError::Driver(format!("{error:?}"))
}

impl CudaDevice {
    /// Opens device `ordinal` through its primary context. Fails with a message naming the
    /// missing piece when `libcuda.so` is absent or the device does not exist.
    pub fn new(ordinal: u32) -> Result<Self, BackendError> {
        // SAFETY: only probes for the library with dlopen.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::Driver(
                "libcuda.so was not found; install the NVIDIA driver or add its directory to LD_LIBRARY_PATH".into(),
            ));
        }
        result::init().map_err(driver_error)?;
        let device = result::device::get(ordinal as i32).map_err(driver_error)?;
        // SAFETY: `device` was returned by cuDeviceGet.
        let (context, total) = unsafe {
            let context = result::primary_ctx::retain(device).map_err(driver_error)?;
            (
                context,
                result::device::total_mem(device).map_err(driver_error)? as u64,
            )
        };
        Ok(CudaDevice {
            ordinal,
            context,
            total,
            over_aligned: Mutex::new(HashMap::new()),
        })
    }

    fn make_current(&self) -> Result<(), BackendError> {
        // SAFETY: the context was retained in `new` and is released never before drop.
        unsafe { result::ctx::set_current(self.context) }.map_err(driver_error)
    }
}

impl Backend for CudaDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_index(&self) -> u32 {
        self.ordinal
    }

    fn capacity(&self, scope: Scope) -> Option<u64> {
        (scope == Scope::Global).then_some(self.total)
    }

    fn free_bytes(&self, scope: Scope) -> u64 {
        if scope != Scope::Global || self.make_current().is_err() {
            return 0;
        }
        result::mem_get_info()
            .map(|(free, _)| free as u64)
            .unwrap_or(0)
    }

    fn reserve(&self, scope: Scope, bytes: u64, align: u64) -> Result<u64, BackendError> {
        if scope != Scope::Global {
            return Err(BackendError::UnsupportedScope {
                backend: "cuda",
                scope,
            });
        }
        self.make_current()?;
        let padding = if align > DRIVER_ALIGNMENT { align } else { 0 };
        // SAFETY: plain allocation in the current context.
        let raw =
            unsafe { result::malloc_sync((bytes + padding) as usize) }.map_err(
                |error| match error.0 {
                    sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => BackendError::Exhausted {
                        scope,
                        bytes,
                        free: self.free_bytes(scope),
                    },
                    _ => driver_error(error),
                },
            )?;
        let address = align_up(raw, align);
        if address != raw {
            self.over_aligned.lock().insert(address, raw);
        }
        Ok(address)
    }

    unsafe fn release(&self, _scope: Scope, address: u64, _bytes: u64, _align: u64) {
        let raw = self.over_aligned.lock().remove(&address).unwrap_or(address);
        if self.make_current().is_ok() {
            // SAFETY: the caller guarantees `address` is a live reservation; `raw` is the
            // pointer the driver returned for it. A failure here can only leak.
            let _ = unsafe { result::free_sync(raw) };
        }
    }

    unsafe fn write_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        self.make_current()?;
        // SAFETY: the caller guarantees the destination range is live and exclusive.
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(driver_error)
    }

    unsafe fn read_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        self.make_current()?;
        // SAFETY: the caller guarantees the source range is live.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(driver_error)
    }

    unsafe fn copy_within(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        self.make_current()?;
        // SAFETY: the caller guarantees both ranges are live and disjoint.
        unsafe { result::memcpy_dtod_sync(dst, src, bytes as usize) }.map_err(driver_error)
    }
}
