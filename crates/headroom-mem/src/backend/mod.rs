//! Where segments of memory come from. The pool above only asks a backend for large
//! segments and hands them back; everything device-specific (host RAM, a simulated
//! device with fixed tiers, CUDA device memory and pinned host memory) lives behind
//! [`Backend`].

mod host;
mod simulated;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod pinned;

pub use host::HostMemory;
pub use simulated::{SimulatedDevice, TierCapacities};

#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
#[cfg(feature = "cuda")]
pub use pinned::PinnedHostMemory;

use crate::layout::Scope;

/// A backend could not serve a request.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BackendError {
    /// The tier has no room for a contiguous range of this size.
    #[error("the {scope} tier has no contiguous {bytes} bytes free ({free} bytes free in total)")]
    Exhausted { scope: Scope, bytes: u64, free: u64 },
    /// The backend has no such tier (e.g. CUDA has no allocatable local tier).
    #[error("the {backend} backend has no {scope} tier; allocate in Scope::Global instead")]
    UnsupportedScope { backend: &'static str, scope: Scope },
    /// The simulated device was built without backing memory, so bytes cannot be read or written.
    #[error("this simulated device has no backing memory; build it with SimulatedDevice::new instead of SimulatedDevice::unbacked to copy data")]
    Unbacked,
    /// A copy touched bytes outside any live segment.
    #[error("address range {address:#x}+{bytes} is not inside a live segment")]
    OutOfBounds { address: u64, bytes: u64 },
    /// The driver reported an error.
    #[error("device driver error: {0}")]
    Driver(String),
    /// The backend cannot give memory back while keeping its addresses.
    #[error("the {backend} backend cannot evict memory and keep its addresses; use HostMemory, or CudaDevice::evictable for CUDA")]
    EvictionUnsupported { backend: &'static str },
}

/// Which implementation a backend is, for snapshots and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Host,
    Simulated,
    Cuda,
    /// Page-locked host memory that a CUDA device reads and writes by DMA.
    PinnedHost,
}

impl BackendKind {
    /// The name errors and snapshots use.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Simulated => "simulated",
            BackendKind::Cuda => "cuda",
            BackendKind::PinnedHost => "pinned host",
        }
    }
}

/// A source of device memory segments.
///
/// Addresses are plain `u64` device addresses. Reserving is safe; releasing and copying are
/// `unsafe` because the backend cannot always check that the caller owns the range (the
/// buffer layer above guarantees it through ownership and borrows).
pub trait Backend: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> BackendKind;

    /// Device ordinal, as it appears in snapshots.
    fn device_index(&self) -> u32 {
        0
    }

    /// Total bytes the tier can hold, or `None` when the backend has no such tier.
    fn capacity(&self, scope: Scope) -> Option<u64>;

    /// Bytes not currently reserved in the tier.
    fn free_bytes(&self, scope: Scope) -> u64;

    /// Whether the CPU reads and writes this backend's addresses directly (host RAM, pinned
    /// host memory). Copies between such memory and a device skip the staging copy.
    fn host_accessible(&self) -> bool {
        false
    }

    /// Reserves `bytes` (> 0) whose start is a multiple of the power of two `align`.
    fn reserve(&self, scope: Scope, bytes: u64, align: u64) -> Result<u64, BackendError>;

    /// Returns a segment.
    ///
    /// # Safety
    /// `address`, `bytes` and `align` must be exactly those of a live reservation from this
    /// backend in `scope`, and nothing may use the range afterwards.
    unsafe fn release(&self, scope: Scope, address: u64, bytes: u64, align: u64);

    /// Copies `src.len()` host bytes to `dst`.
    ///
    /// # Safety
    /// `dst..dst+src.len()` must lie in one live reservation that nobody else accesses now.
    unsafe fn write_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError>;

    /// Copies `dst.len()` bytes from `src` to the host.
    ///
    /// # Safety
    /// `src..src+dst.len()` must lie in one live reservation that nobody writes now.
    unsafe fn read_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), BackendError>;

    /// Copies `bytes` between two ranges of this device.
    ///
    /// # Safety
    /// Both ranges must lie in live reservations, must not overlap, and `dst` must not be
    /// accessed by anyone else now.
    unsafe fn copy_within(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError>;

    /// Gives back the memory behind `bytes` at `address` while the addresses stay reserved,
    /// so pointers into the range remain valid names for it. The contents are lost: copy
    /// them out first (see [`crate::offload`]).
    ///
    /// # Safety
    /// The range must lie in one live reservation of `scope` that nobody accesses until
    /// [`Backend::restore`] has brought it back.
    unsafe fn evict(&self, scope: Scope, address: u64, bytes: u64) -> Result<(), BackendError> {
        let _ = (scope, address, bytes);
        Err(BackendError::EvictionUnsupported {
            backend: self.kind().name(),
        })
    }

    /// Backs an evicted range with memory again, at the same addresses. The contents are
    /// undefined until written.
    ///
    /// # Safety
    /// `address` and `bytes` must be exactly those of an earlier [`Backend::evict`].
    unsafe fn restore(&self, scope: Scope, address: u64, bytes: u64) -> Result<(), BackendError> {
        let _ = (scope, address, bytes);
        Err(BackendError::EvictionUnsupported {
            backend: self.kind().name(),
        })
    }
}
