//! Page-locked ("pinned") host memory from `cuMemHostAlloc`: the tier that copies to and
//! from a CUDA device stage through. The device reads and writes it by DMA at the full
//! bandwidth of the bus, where pageable memory first goes through the driver's own bounce
//! buffers; the CPU reads and writes it like any host memory.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::host::{direct, Limit};
use super::{Backend, BackendError, BackendKind, CudaDevice};
use crate::layout::Scope;

/// Pinned host memory, registered with the CUDA driver of `device` and visible as pinned to
/// every context (`CU_MEMHOSTALLOC_PORTABLE`). Every tier maps to it, all counted against one
/// optional limit, as in [`super::HostMemory`].
#[derive(Debug)]
pub struct PinnedHostMemory {
    device: Arc<CudaDevice>,
    limit: Limit,
}

impl PinnedHostMemory {
    /// Pinned memory without a limit of its own. Pinning takes memory from the OS that it
    /// cannot swap out, so large pools deserve [`PinnedHostMemory::with_limit`].
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self::with_limit(device, u64::MAX)
    }

    /// Pinned memory that refuses to reserve more than `limit` bytes in total.
    pub fn with_limit(device: Arc<CudaDevice>, limit: u64) -> Self {
        PinnedHostMemory {
            device,
            limit: Limit::new(limit),
        }
    }
}

impl Backend for PinnedHostMemory {
    fn kind(&self) -> BackendKind {
        BackendKind::PinnedHost
    }

    fn device_index(&self) -> u32 {
        self.device.device_index()
    }

    fn capacity(&self, _scope: Scope) -> Option<u64> {
        Some(self.limit.capacity())
    }

    fn free_bytes(&self, _scope: Scope) -> u64 {
        self.limit.free()
    }

    fn host_accessible(&self) -> bool {
        true
    }

    fn reserve(&self, scope: Scope, bytes: u64, align: u64) -> Result<u64, BackendError> {
        let exhausted = |free| BackendError::Exhausted { scope, bytes, free };
        if !self.limit.take(bytes) {
            return Err(exhausted(self.free_bytes(scope)));
        }
        let reserved = self.device.make_current().and_then(|()| {
            // cuMemHostAlloc returns page-aligned memory; larger alignments are not offered.
            if align > 4096 {
                return Err(BackendError::Driver(format!(
                    "pinned host memory is page-aligned; {align}-byte alignment is not available"
                )));
            }
            // SAFETY: a plain allocation in the current context.
            unsafe { result::malloc_host(bytes as usize, sys::CU_MEMHOSTALLOC_PORTABLE) }
                .map(|pointer| pointer as u64)
                .map_err(|error| match error.0 {
                    sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => exhausted(0),
                    _ => BackendError::Driver(format!("cuMemHostAlloc: {error:?}")),
                })
        });
        if reserved.is_err() {
            self.limit.give_back(bytes);
        }
        reserved
    }

    unsafe fn release(&self, _scope: Scope, address: u64, bytes: u64, _align: u64) {
        if self.device.make_current().is_ok() {
            // SAFETY: the caller guarantees a live reservation from cuMemHostAlloc that
            // nothing uses any more. A failure can only leak.
            let _ = unsafe { result::free_host(address as *mut std::ffi::c_void) };
        }
        self.limit.give_back(bytes);
    }

    unsafe fn write_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees the destination range is live and exclusive.
        unsafe { direct::write(dst, src) };
        Ok(())
    }

    unsafe fn read_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees the source range is live.
        unsafe { direct::read(src, dst) };
        Ok(())
    }

    unsafe fn copy_within(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees both ranges are live and do not overlap.
        unsafe { direct::within(dst, src, bytes) };
        Ok(())
    }
}
