//! Device memory management for kernel authors: backends (host, a simulated device with
//! fixed tiers, CUDA behind the `cuda` feature), a caching pool with PyTorch's design and
//! statistics, buffers whose lifetimes the borrow checker enforces, aliases, workspaces,
//! copies, offloading to host memory at unchanged addresses, and traces that PyTorch's
//! memory_viz and RMM's tools read.
//!
//! ```
//! use std::sync::Arc;
//! use headroom_mem::*;
//!
//! let device = Arc::new(SimulatedDevice::new(TierCapacities::DATACENTER_GPU));
//! let pool = MemoryPool::new(device);
//! let mut activations = pool.alloc_buffer([8, 1024], DType::F32, Scope::Global, Alignment::DEFAULT)?;
//! copy_from_host(&mut activations, &vec![1.0f32; 8 * 1024])?;
//! let flat = buffer_alias(&activations, [8 * 1024])?;
//! assert!(is_aligned(&flat, Alignment::DEFAULT));
//! assert_eq!(pool.memory_stats().get("requested_bytes.all.current"), Some(32 * 1024));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod backend;
pub mod buffer;
pub mod copy;
pub mod error;
pub mod layout;
pub mod offload;
pub mod pool;
pub mod replay;
pub mod stats;
pub mod trace;
pub mod workload;
pub mod workspace;

pub use backend::{
    Backend, BackendError, BackendKind, HostMemory, SimulatedDevice, TierCapacities,
};
#[cfg(feature = "cuda")]
pub use backend::{CudaDevice, PinnedHostMemory};
pub use buffer::{
    address_of, buffer_alias, is_aligned, AliasError, Allocation, Buffer, BufferView,
    BufferViewMut, DeviceMemory, DeviceMemoryMut,
};
pub use copy::{copy, copy_from_host, copy_to_host, CopyError, Event, Stream, StreamScope};
pub use error::{AllocError, ConfigError, OutOfMemory};
pub use layout::{Alignment, DType, Element, Scope, Shape};
pub use offload::{offload, OffloadError, Offloaded};
pub use pool::{MemoryPool, PoolConfig};
pub use stats::{MemoryStats, PoolKind, Stat, StatArray};
pub use trace::{Snapshot, StageGuard, TraceAction, TraceEvent};
pub use workspace::{Stage, Workspace, WorkspaceError};
