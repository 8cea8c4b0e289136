//! Device strings (`"host"`, `"sim:datacenter"`, `"cuda:0"`) to headroom-mem backends, parsed
//! in one place so every message about a bad device lists the same accepted forms.

use std::sync::Arc;

use headroom_mem::{Backend, BackendKind, HostMemory, SimulatedDevice, TierCapacities};
use headroom_size::parse_size;

/// The forms `MemoryPool(device=...)` accepts, for error messages.
pub const ACCEPTED: &str =
    "\"host\", \"sim:datacenter\", \"sim:global=SIZE[,shared=SIZE][,local=SIZE]\" \
     (tiers left out take the datacenter figures), \"cuda\" or \"cuda:N\"";

/// A parsed device string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    Host,
    Simulated(TierCapacities),
    Cuda(u32),
    /// Pinned host memory registered with CUDA device N.
    Pinned(u32),
}

/// Why a device string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    #[error("device {device:?} is not understood ({reason}); accepted forms: {ACCEPTED}")]
    Malformed { device: String, reason: String },
    #[cfg(not(feature = "cuda"))]
    #[error("device {device:?} needs CUDA, but this headroom_mem was built without the `cuda` feature; install a wheel (which has it) or build with `maturin build --features cuda`")]
    CudaNotBuilt { device: String },
    #[cfg(feature = "cuda")]
    #[error("device {device:?} could not be opened: {reason}")]
    Unavailable { device: String, reason: String },
    #[error("memory_limit applies to the \"host\" and \"pinned\" devices only, not {device:?}; for a simulated device give its tiers (\"sim:global=SIZE\"), for any device max_size")]
    LimitNotHost { device: String },
}

impl DeviceSpec {
    /// Parses a device string; see [`ACCEPTED`].
    pub fn parse(device: &str) -> Result<Self, DeviceError> {
        let malformed = |reason: String| DeviceError::Malformed {
            device: device.to_string(),
            reason,
        };
        let (kind, argument) = match device.split_once(':') {
            Some((kind, argument)) => (kind, Some(argument)),
            None => (device, None),
        };
        match (kind, argument) {
            ("host", None) => Ok(DeviceSpec::Host),
            ("cuda", None) => Ok(DeviceSpec::Cuda(0)),
            ("pinned", None) => Ok(DeviceSpec::Pinned(0)),
            ("cuda" | "pinned", Some(ordinal)) => {
                let ordinal = ordinal.parse().map_err(|_| {
                    malformed(format!("the CUDA ordinal {ordinal:?} is not a number"))
                })?;
                Ok(match kind {
                    "cuda" => DeviceSpec::Cuda(ordinal),
                    _ => DeviceSpec::Pinned(ordinal),
                })
            }
            ("sim", Some("datacenter")) => {
                Ok(DeviceSpec::Simulated(TierCapacities::DATACENTER_GPU))
            }
            ("sim", Some(tiers)) => parse_tiers(tiers)
                .map(DeviceSpec::Simulated)
                .map_err(malformed),
            ("sim", None) => Err(malformed("a simulated device names its tiers".into())),
            _ => Err(malformed(format!("unknown kind {kind:?}"))),
        }
    }

    /// Opens the backend. `memory_limit` caps a host or pinned device.
    pub fn open(
        &self,
        device: &str,
        memory_limit: Option<u64>,
    ) -> Result<Arc<dyn Backend>, DeviceError> {
        if memory_limit.is_some() && !matches!(self, DeviceSpec::Host | DeviceSpec::Pinned(_)) {
            return Err(DeviceError::LimitNotHost {
                device: device.to_string(),
            });
        }
        match self {
            DeviceSpec::Host => Ok(Arc::new(match memory_limit {
                Some(limit) => HostMemory::with_limit(limit),
                None => HostMemory::new(),
            })),
            DeviceSpec::Simulated(tiers) => Ok(Arc::new(SimulatedDevice::new(*tiers))),
            DeviceSpec::Cuda(ordinal) => cuda::open(device, *ordinal),
            DeviceSpec::Pinned(ordinal) => cuda::open_pinned(device, *ordinal, memory_limit),
        }
    }
}

/// What PyTorch's allocator functions serve a device from: the device's memory, and host
/// memory both the CPU and the device address, to offload into.
pub struct TorchMemory {
    pub device: Arc<dyn Backend>,
    pub staging: Arc<dyn Backend>,
}

/// The CUDA backends, or for a build without the `cuda` feature, errors that say so.
#[cfg(feature = "cuda")]
pub mod cuda {
    use std::sync::Arc;

    use headroom_mem::{Backend, BackendError, CudaDevice, PinnedHostMemory};

    use super::{DeviceError, TorchMemory};

    fn unavailable(device: &str) -> impl FnOnce(BackendError) -> DeviceError + '_ {
        move |error| DeviceError::Unavailable {
            device: device.to_string(),
            reason: error.to_string(),
        }
    }

    pub fn open(device: &str, ordinal: u32) -> Result<Arc<dyn Backend>, DeviceError> {
        Ok(Arc::new(
            CudaDevice::new(ordinal).map_err(unavailable(device))?,
        ))
    }

    pub fn open_pinned(
        device: &str,
        ordinal: u32,
        limit: Option<u64>,
    ) -> Result<Arc<dyn Backend>, DeviceError> {
        let cuda = Arc::new(CudaDevice::new(ordinal).map_err(unavailable(device))?);
        Ok(Arc::new(PinnedHostMemory::with_limit(
            cuda,
            limit.unwrap_or(u64::MAX),
        )))
    }

    /// What PyTorch's allocator functions serve device `ordinal` from: its memory, from the
    /// virtual memory API so a tag can be offloaded, and pinned memory to offload into.
    pub fn open_for_torch(device: &str, ordinal: u32) -> Result<TorchMemory, DeviceError> {
        let cuda = Arc::new(CudaDevice::evictable(ordinal).map_err(unavailable(device))?);
        let pinned = PinnedHostMemory::new(Arc::clone(&cuda));
        Ok(TorchMemory {
            device: cuda,
            staging: Arc::new(pinned),
        })
    }
}

/// The CUDA backends, or for a build without the `cuda` feature, errors that say so.
#[cfg(not(feature = "cuda"))]
pub mod cuda {
    use std::sync::Arc;

    use headroom_mem::Backend;

    use super::{DeviceError, TorchMemory};

    fn not_built(device: &str) -> DeviceError {
        DeviceError::CudaNotBuilt {
            device: device.to_string(),
        }
    }

    pub fn open(device: &str, _ordinal: u32) -> Result<Arc<dyn Backend>, DeviceError> {
        Err(not_built(device))
    }

    pub fn open_pinned(
        device: &str,
        _ordinal: u32,
        _limit: Option<u64>,
    ) -> Result<Arc<dyn Backend>, DeviceError> {
        Err(not_built(device))
    }

    pub fn open_for_torch(device: &str, _ordinal: u32) -> Result<TorchMemory, DeviceError> {
        Err(not_built(device))
    }
}

/// `global=256M,shared=64K,local=0`; tiers left out take [`TierCapacities::DATACENTER_GPU`]'s.
fn parse_tiers(text: &str) -> Result<TierCapacities, String> {
    let mut tiers = TierCapacities::DATACENTER_GPU;
    for part in text.split(',') {
        let Some((name, size)) = part.split_once('=') else {
            return Err(format!("{part:?} is not TIER=SIZE"));
        };
        let bytes = parse_size(size).map_err(|error| error.to_string())?;
        match name.trim() {
            "global" => tiers.global = bytes,
            "shared" => tiers.shared = bytes,
            "local" => tiers.local = bytes,
            other => return Err(format!("tier {other:?} is not global, shared or local")),
        }
    }
    Ok(tiers)
}

/// The device string a pool reports, canonical for its backend (`"cuda"` becomes `"cuda:0"`).
pub fn canonical_name(device: &str, backend: &dyn Backend) -> String {
    match backend.kind() {
        BackendKind::Cuda => format!("cuda:{}", backend.device_index()),
        BackendKind::PinnedHost => format!("pinned:{}", backend.device_index()),
        BackendKind::Host | BackendKind::Simulated => device.to_string(),
    }
}
