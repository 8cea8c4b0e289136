//! Offloading: the contents of a device range move to host memory and the device memory
//! is given back while the addresses stay reserved; restoring maps memory back at the same
//! addresses and copies the contents home. Code that holds raw device pointers (a PyTorch
//! tensor's `data_ptr`) keeps working across the round trip, which is what "sleep" and
//! "wake" mean in vLLM's and torch_memory_saver's allocators.

use std::sync::Arc;

use crate::backend::{Backend, BackendError, BackendKind};
use crate::buffer::Allocation;
use crate::error::AllocError;
use crate::layout::{Alignment, Scope};
use crate::pool::MemoryPool;

/// Why a range could not be offloaded or restored.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error("offloading needs a host pool whose memory the CPU addresses directly (host or pinned); this pool is {} memory", .0.name())]
    HostNotAccessible(BackendKind),
    #[error("no host memory for the offloaded copy: {0}")]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// A device range whose contents wait in host memory; see [`offload`].
#[derive(Debug)]
#[must_use = "dropping an offloaded range loses its contents; call restore"]
pub struct Offloaded<'host> {
    device: Arc<dyn Backend>,
    scope: Scope,
    address: u64,
    bytes: u64,
    copy: Allocation<'host>,
}

/// Copies `bytes` at `address` of `device` into a new allocation from `host`, then gives the
/// device memory back ([`Backend::evict`]), keeping the addresses.
///
/// # Safety
/// The range must be one whole live reservation of `device` in `scope` (a segment the
/// caller got from [`Backend::reserve`], or an allocation of a non-caching pool), and nothing
/// may access it until [`Offloaded::restore`] returns.
pub unsafe fn offload<'host>(
    device: &Arc<dyn Backend>,
    scope: Scope,
    address: u64,
    bytes: u64,
    host: &'host MemoryPool,
) -> Result<Offloaded<'host>, OffloadError> {
    if !host.backend().host_accessible() {
        return Err(OffloadError::HostNotAccessible(host.backend().kind()));
    }
    let copy = host.allocate_bytes(bytes, Scope::Global, Alignment::DEFAULT)?;
    // SAFETY: `copy` is a live host-accessible allocation of `bytes` that only we hold; the
    // device range is live and unaccessed (the caller's promise).
    unsafe {
        let saved = std::slice::from_raw_parts_mut(copy.address() as *mut u8, bytes as usize);
        device.read_to_host(address, saved)?;
        device.evict(scope, address, bytes)?;
    }
    Ok(Offloaded {
        device: Arc::clone(device),
        scope,
        address,
        bytes,
        copy,
    })
}

impl<'host> Offloaded<'host> {
    pub fn address(&self) -> u64 {
        self.address
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Maps device memory back at the same addresses and copies the contents home. On
    /// failure (the device has no room yet) the contents stay offloaded and come back with
    /// the error, to try again later.
    pub fn restore(self) -> Result<(), (OffloadError, Box<Self>)> {
        // SAFETY: the range was evicted by `offload`, whose caller keeps it unaccessed until
        // now; `copy` holds exactly `bytes` of host-accessible memory.
        let restored = unsafe {
            self.device
                .restore(self.scope, self.address, self.bytes)
                .and_then(|()| {
                    let saved = std::slice::from_raw_parts(
                        self.copy.address() as *const u8,
                        self.bytes as usize,
                    );
                    self.device.write_from_host(self.address, saved)
                })
        };
        restored.map_err(|error| (error.into(), Box::new(self)))
    }
}
