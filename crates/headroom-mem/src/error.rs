//! Errors of allocation, with an out-of-memory report that explains where the bytes went
//! and what to do next, because "CUDA out of memory" alone is the top complaint about device
//! allocators.

use std::fmt;

use headroom_size::Size;

use crate::backend::BackendError;
use crate::layout::{DType, Scope, Shape};

/// Everything needed to understand an out-of-memory failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    pub scope: Scope,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The block size that was needed after rounding and alignment.
    pub rounded: u64,
    /// Bytes the backend still had unreserved in this tier.
    pub device_free: u64,
    /// Capacity of the tier, when the backend knows it.
    pub device_capacity: Option<u64>,
    /// Largest free block cached by the pool in this tier.
    pub largest_free_block: u64,
    /// Bytes the pool holds from the backend in this tier.
    pub reserved: u64,
    /// Bytes of those currently allocated to buffers.
    pub allocated: u64,
    /// `PoolConfig::max_size`, when it is what stopped the allocation.
    pub max_size: Option<u64>,
}

impl OutOfMemory {
    /// Bytes the pool holds but no buffer uses.
    pub fn cached_free(&self) -> u64 {
        self.reserved - self.allocated
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory in the {} tier: tried to allocate {} (a {} block)",
            self.scope,
            Size(self.requested),
            Size(self.rounded)
        )?;
        match self.device_capacity {
            Some(capacity) => write!(
                f,
                "; the device has {} unreserved of {}",
                Size(self.device_free),
                Size(capacity)
            )?,
            None => write!(f, "; the device has {} unreserved", Size(self.device_free))?,
        }
        write!(
            f,
            "; this pool has reserved {}, of which {} is allocated to live buffers and {} is cached free (largest free block {})",
            Size(self.reserved),
            Size(self.allocated),
            Size(self.cached_free()),
            Size(self.largest_free_block)
        )?;
        if self.cached_free() >= self.rounded {
            write!(f, ": enough cached bytes exist but no single block is large enough, so the cache is fragmented")?;
        }
        if let Some(max_size) = self.max_size {
            write!(
                f,
                "; the pool limit PoolConfig::max_size = {} stopped it",
                Size(max_size)
            )?;
        }
        write!(
            f,
            ". The cache was already released and the allocation retried. To recover: drop buffers you no longer need, \
             allocate a smaller fallback with MemoryPool::alloc_buffer_with_fallback"
        )?;
        if self.max_size.is_some() {
            write!(f, ", or raise PoolConfig::max_size")?;
        }
        Ok(())
    }
}

impl std::error::Error for OutOfMemory {}

/// Why an allocation failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocError {
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// The shape's byte size overflows.
    #[error("shape {shape} of {dtype:?} is too large to address; use fewer or smaller dimensions")]
    ShapeTooLarge { shape: Shape, dtype: DType },
    /// The request cannot be rounded and aligned without overflowing a 64-bit size.
    #[error("{bytes} bytes aligned to {alignment} cannot be addressed; request fewer bytes or a smaller alignment")]
    SizeOverflow { bytes: u64, alignment: u64 },
    /// `alloc_buffer_with_fallback` was given no shape to try.
    #[error("alloc_buffer_with_fallback needs at least one shape to try")]
    NoShapes,
    /// The backend cannot allocate in this tier at all.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl AllocError {
    /// The out-of-memory report, when that is what happened.
    pub fn out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            AllocError::OutOfMemory(oom) => Some(oom),
            _ => None,
        }
    }
}

/// A pool configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("PoolConfig::block_size = {0} must be a power of two of at least 8 bytes (512 is PyTorch's)")]
    BlockSize(u64),
    #[error("PoolConfig::{name} = {value} must be a multiple of block_size = {block_size}")]
    NotMultiple {
        name: &'static str,
        value: u64,
        block_size: u64,
    },
    #[error(
        "PoolConfig::small_size = {small_size} must not exceed small_segment = {small_segment}"
    )]
    SmallSegment { small_size: u64, small_segment: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_explains_fragmentation_and_recovery() {
        let oom = OutOfMemory {
            scope: Scope::Global,
            requested: 3 << 30,
            rounded: 3 << 30,
            device_free: 1 << 30,
            device_capacity: Some(16 << 30),
            largest_free_block: 512 << 20,
            reserved: 15 << 30,
            allocated: 11 << 30,
            max_size: None,
        };
        let message = oom.to_string();
        assert!(message.contains("tried to allocate 3.00 GiB"), "{message}");
        assert!(message.contains("4.00 GiB is cached free"), "{message}");
        assert!(message.contains("fragmented"), "{message}");
        assert!(message.contains("alloc_buffer_with_fallback"), "{message}");
        assert!(!message.contains("max_size"), "{message}");
    }
}
