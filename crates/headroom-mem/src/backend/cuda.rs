//! CUDA device memory through the driver API, which cudarc loads at run time, so building
//! with `--features cuda` needs no CUDA SDK and a machine without a driver gets an error
//! instead of a link failure.
//!
//! Segments come from `cuMemAlloc`, or, for an evictable device, from the virtual memory
//! API: an address range (`cuMemAddressReserve`) with physical memory mapped into it
//! (`cuMemCreate`, `cuMemMap`). Eviction unmaps and releases the physical memory and keeps
//! the range, so pointers held elsewhere (a PyTorch tensor's) stay valid names for memory
//! that [`Backend::restore`] maps back at the same addresses.

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
    /// Set for an evictable device: how segments map physical memory.
    virtual_memory: Option<VirtualMemory>,
}

/// Segments of an evictable device: the mapping granularity, and for each segment (by the
/// address handed out) its reserved range and, while mapped, its physical memory handle.
#[derive(Debug)]
struct VirtualMemory {
    granularity: u64,
    segments: Mutex<HashMap<u64, MappedSegment>>,
}

#[derive(Debug, Clone, Copy)]
struct MappedSegment {
    /// Start and length of the reserved range (a multiple of the granularity).
    base: u64,
    size: u64,
    /// `None` while evicted.
    physical: Option<sys::CUmemGenericAllocationHandle>,
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
        Self::open(ordinal, false)
    }

    /// Opens device `ordinal` with segments from the virtual memory API, so that
    /// [`Backend::evict`] can give a segment's memory back and keep its addresses. Fails when
    /// the device does not support virtual memory management.
    pub fn evictable(ordinal: u32) -> Result<Self, BackendError> {
        Self::open(ordinal, true)
    }

    fn open(ordinal: u32, evictable: bool) -> Result<Self, BackendError> {
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
        let mut device = CudaDevice {
            ordinal,
            context,
            total,
            over_aligned: Mutex::new(HashMap::new()),
            virtual_memory: None,
        };
        if evictable {
            device.make_current()?;
            let mut granularity = 0usize;
            // SAFETY: the property describes this device; the out pointer is valid.
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &device.physical_properties(),
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            }
            .result()
            .map_err(|error| {
                BackendError::Driver(format!(
                    "device {ordinal} does not support virtual memory management ({error:?}); use CudaDevice::new, which cannot evict"
                ))
            })?;
            device.virtual_memory = Some(VirtualMemory {
                granularity: granularity.max(1) as u64,
                segments: Mutex::new(HashMap::new()),
            });
        }
        Ok(device)
    }

    /// Whether segments come from the virtual memory API and can be evicted.
    pub fn is_evictable(&self) -> bool {
        self.virtual_memory.is_some()
    }

    pub(super) fn make_current(&self) -> Result<(), BackendError> {
        // SAFETY: the context was retained in `new` and is released never before drop.
        unsafe { result::ctx::set_current(self.context) }.map_err(driver_error)
    }

    /// Physical memory on this device, as `cuMemCreate` and its granularity query take it.
    fn physical_properties(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType(0),
            location: self.location(),
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal as i32,
        }
    }

    /// Creates physical memory of `size` bytes and maps it, readable and writable, at `base`.
    fn map_physical(
        &self,
        base: u64,
        size: u64,
    ) -> Result<sys::CUmemGenericAllocationHandle, BackendError> {
        let mut handle = 0;
        // SAFETY: the property describes this device; the out pointer is valid.
        unsafe { sys::cuMemCreate(&mut handle, size as usize, &self.physical_properties(), 0) }
            .result()
            .map_err(|error| self.exhausted_or(error, size))?;
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `base..base+size` is a range we reserved and nothing maps now; `handle`
        // holds exactly `size` bytes.
        let mapped = unsafe {
            sys::cuMemMap(base, size as usize, 0, handle, 0)
                .result()
                .and_then(|()| sys::cuMemSetAccess(base, size as usize, &access, 1).result())
        };
        if let Err(error) = mapped {
            // SAFETY: unmapping a range we may have mapped, then dropping our only handle.
            unsafe {
                let _ = sys::cuMemUnmap(base, size as usize);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(driver_error(error));
        }
        Ok(handle)
    }

    /// Unmaps `base..base+size` and releases the physical memory behind it, once the work
    /// queued on the device has finished.
    ///
    /// Unlike `cuMemFree`, unmapping does not wait for kernels that still use the range, and
    /// callers free while such kernels are queued: PyTorch hands a segment back when the
    /// host drops it, not when the stream is done with it. So the context is synchronised
    /// first, which is what `cuMemFree` does implicitly.
    ///
    /// # Safety
    /// `handle` must be mapped at exactly that range, and no work queued after this call may
    /// use the range.
    unsafe fn unmap_physical(
        &self,
        base: u64,
        size: u64,
        handle: sys::CUmemGenericAllocationHandle,
    ) {
        // SAFETY: forwarded from the caller; a failure can only leak.
        unsafe {
            let _ = sys::cuCtxSynchronize();
            let _ = sys::cuMemUnmap(base, size as usize);
            let _ = sys::cuMemRelease(handle);
        }
    }

    fn exhausted_or(&self, error: result::DriverError, bytes: u64) -> BackendError {
        match error.0 {
            sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => BackendError::Exhausted {
                scope: Scope::Global,
                bytes,
                free: self.free_bytes(Scope::Global),
            },
            _ => driver_error(error),
        }
    }

    /// A segment of an evictable device: a reserved range with physical memory mapped in.
    fn reserve_mapped(
        &self,
        memory: &VirtualMemory,
        bytes: u64,
        align: u64,
    ) -> Result<u64, BackendError> {
        let size = bytes.next_multiple_of(memory.granularity);
        let mut base = 0;
        // SAFETY: reserves addresses only; the out pointer is valid.
        unsafe {
            sys::cuMemAddressReserve(
                &mut base,
                size as usize,
                align.max(memory.granularity) as usize,
                0,
                0,
            )
        }
        .result()
        .map_err(driver_error)?;
        match self.map_physical(base, size) {
            Ok(handle) => {
                let segment = MappedSegment {
                    base,
                    size,
                    physical: Some(handle),
                };
                memory.segments.lock().insert(base, segment);
                Ok(base)
            }
            Err(error) => {
                // SAFETY: the range was reserved above and nothing is mapped in it.
                let _ = unsafe { sys::cuMemAddressFree(base, size as usize) };
                Err(error)
            }
        }
    }

    fn evictable_memory(&self) -> Result<&VirtualMemory, BackendError> {
        self.virtual_memory
            .as_ref()
            .ok_or(BackendError::EvictionUnsupported { backend: "cuda" })
    }

    /// The segment an eviction names, which must be a whole segment.
    fn whole_segment(
        &self,
        memory: &VirtualMemory,
        address: u64,
        bytes: u64,
    ) -> Result<MappedSegment, BackendError> {
        let segments = memory.segments.lock();
        match segments.get(&address) {
            Some(segment) if bytes <= segment.size => Ok(*segment),
            _ => Err(BackendError::OutOfBounds { address, bytes }),
        }
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
        if let Some(memory) = &self.virtual_memory {
            return self.reserve_mapped(memory, bytes, align);
        }
        let padding = if align > DRIVER_ALIGNMENT { align } else { 0 };
        // SAFETY: plain allocation in the current context.
        let raw = unsafe { result::malloc_sync((bytes + padding) as usize) }
            .map_err(|error| self.exhausted_or(error, bytes))?;
        let address = align_up(raw, align);
        if address != raw {
            self.over_aligned.lock().insert(address, raw);
        }
        Ok(address)
    }

    unsafe fn release(&self, _scope: Scope, address: u64, _bytes: u64, _align: u64) {
        if let Some(memory) = &self.virtual_memory {
            let segment = memory.segments.lock().remove(&address);
            if let (Some(segment), Ok(())) = (segment, self.make_current()) {
                // SAFETY: the caller guarantees nothing uses the segment any more.
                unsafe {
                    if let Some(handle) = segment.physical {
                        self.unmap_physical(segment.base, segment.size, handle);
                    }
                    let _ = sys::cuMemAddressFree(segment.base, segment.size as usize);
                }
            }
            return;
        }
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

    unsafe fn evict(&self, _scope: Scope, address: u64, bytes: u64) -> Result<(), BackendError> {
        let memory = self.evictable_memory()?;
        let segment = self.whole_segment(memory, address, bytes)?;
        let Some(handle) = segment.physical else {
            return Ok(());
        };
        self.make_current()?;
        // SAFETY: the caller guarantees nobody uses the segment until it is restored.
        unsafe { self.unmap_physical(segment.base, segment.size, handle) };
        if let Some(segment) = memory.segments.lock().get_mut(&address) {
            segment.physical = None;
        }
        Ok(())
    }

    unsafe fn restore(&self, _scope: Scope, address: u64, bytes: u64) -> Result<(), BackendError> {
        let memory = self.evictable_memory()?;
        let segment = self.whole_segment(memory, address, bytes)?;
        if segment.physical.is_some() {
            return Ok(());
        }
        self.make_current()?;
        let handle = self.map_physical(segment.base, segment.size)?;
        if let Some(segment) = memory.segments.lock().get_mut(&address) {
            segment.physical = Some(handle);
        }
        Ok(())
    }
}
