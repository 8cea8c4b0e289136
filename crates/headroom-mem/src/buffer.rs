//! Buffers whose lifetimes the borrow checker enforces: a buffer borrows its pool, `free`
//! consumes it, and aliases borrow it, so use-after-free, double free and an alias that
//! outlives its memory are compile errors rather than `T.free`-style discipline.
//!
//! ```compile_fail
//! use std::sync::Arc;
//! use headroom_mem::*;
//! let pool = MemoryPool::new(Arc::new(HostMemory::new()));
//! let buffer = pool.alloc_buffer([4], DType::F32, Scope::Global, Alignment::DEFAULT).unwrap();
//! buffer.free();
//! buffer.free(); // error: use of moved value
//! ```
//!
//! ```compile_fail
//! use std::sync::Arc;
//! use headroom_mem::*;
//! let pool = MemoryPool::new(Arc::new(HostMemory::new()));
//! let buffer = pool.alloc_buffer([4, 4], DType::F32, Scope::Global, Alignment::DEFAULT).unwrap();
//! let view = buffer_alias(&buffer, [16]).unwrap();
//! buffer.free(); // error: cannot move out of `buffer` because it is borrowed
//! view.shape();
//! ```

use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::Backend;
use crate::error::AllocError;
use crate::layout::{address_is_aligned, Alignment, DType, Scope, Shape, TensorLayout};
use crate::pool::{BlockId, MemoryPool};

/// Raw bytes from a pool, returned to it on drop.
#[derive(Debug)]
#[must_use = "dropping an allocation frees it at once"]
pub struct Allocation<'pool> {
    pool: &'pool MemoryPool,
    scope: Scope,
    block: BlockId,
    address: u64,
    bytes: u64,
}

impl Allocation<'_> {
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes requested (the block behind it may be larger).
    pub fn len(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Returns the memory now; the same as dropping, but says so.
    pub fn free(self) {}
}

impl Drop for Allocation<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pool.release(self.scope, self.block);
    }
}

/// A typed device buffer: shape, dtype, strides, scope and alignment, freed on drop.
#[derive(Debug)]
#[must_use = "dropping a buffer frees it at once"]
pub struct Buffer<'pool> {
    allocation: Allocation<'pool>,
    layout: TensorLayout,
    alignment: Alignment,
}

/// Which bytes a buffer or view covers, for copies.
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    pub backend: &'a Arc<dyn Backend>,
    pub scope: Scope,
    pub address: u64,
    pub bytes: u64,
    pub dtype: DType,
}

impl<'a> Region<'a> {
    /// The bytes that `layout` covers from `address` of `backend`'s memory in `scope`.
    fn of(
        backend: &'a Arc<dyn Backend>,
        scope: Scope,
        address: u64,
        layout: &TensorLayout,
    ) -> Self {
        Region {
            backend,
            scope,
            address,
            bytes: layout.size_bytes(),
            dtype: layout.dtype(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Memory that may be read: buffers and views.
pub trait DeviceMemory: sealed::Sealed {
    fn region(&self) -> Region<'_>;
}

/// Memory that may be written: owned buffers and mutable views. Sealed, because writing
/// through it is only sound for types whose borrows guarantee exclusive access.
pub trait DeviceMemoryMut: DeviceMemory {}

/// The device address where `memory` starts.
pub fn address_of(memory: &impl DeviceMemory) -> u64 {
    memory.region().address
}

/// Whether `memory` starts at a multiple of `alignment`.
pub fn is_aligned(memory: &impl DeviceMemory, alignment: Alignment) -> bool {
    address_is_aligned(address_of(memory), alignment)
}

/// Why an alias could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AliasError {
    #[error("alias {shape} of {dtype:?} at byte offset {offset} needs {needed} bytes but the buffer has {available}; pick a smaller shape or offset")]
    OutOfBounds {
        shape: Shape,
        dtype: DType,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("alias offset {offset} is not a multiple of the {dtype:?} element size {element}; use an offset aligned to the element size")]
    Misaligned {
        offset: u64,
        dtype: DType,
        element: usize,
    },
}

fn checked_alias_layout(
    base: Region<'_>,
    offset: u64,
    shape: Shape,
    dtype: DType,
) -> Result<TensorLayout, AliasError> {
    if offset % dtype.size_of() as u64 != 0 {
        return Err(AliasError::Misaligned {
            offset,
            dtype,
            element: dtype.size_of(),
        });
    }
    let out_of_bounds = |shape: Shape, needed| AliasError::OutOfBounds {
        shape,
        dtype,
        offset,
        needed,
        available: base.bytes,
    };
    let Some(layout) = TensorLayout::contiguous(shape.clone(), dtype) else {
        return Err(out_of_bounds(shape, u64::MAX));
    };
    let needed = offset.saturating_add(layout.size_bytes());
    if needed > base.bytes {
        return Err(out_of_bounds(shape, needed));
    }
    Ok(layout)
}

/// A read-only view of a buffer's memory with its own shape; it cannot outlive the buffer.
#[derive(Debug, Clone)]
pub struct BufferView<'b> {
    backend: &'b Arc<dyn Backend>,
    scope: Scope,
    address: u64,
    layout: TensorLayout,
}

/// A writable view; while it lives nothing else can touch the bytes it covers.
#[derive(Debug)]
pub struct BufferViewMut<'b> {
    backend: &'b Arc<dyn Backend>,
    scope: Scope,
    address: u64,
    layout: TensorLayout,
    _exclusive: PhantomData<&'b mut ()>,
}

impl<'b> BufferViewMut<'b> {
    /// A view of `layout` at `address`.
    ///
    /// Callers must hand out each byte range to at most one live mutable view.
    pub(crate) fn new_unique(
        backend: &'b Arc<dyn Backend>,
        scope: Scope,
        address: u64,
        layout: TensorLayout,
    ) -> Self {
        BufferViewMut {
            backend,
            scope,
            address,
            layout,
            _exclusive: PhantomData,
        }
    }
}

/// Shape accessors shared by buffers and views.
macro_rules! tensor_accessors {
    ($($ty:ident),*) => {$(
        impl $ty<'_> {
            pub fn shape(&self) -> &Shape {
                self.layout.shape()
            }
            pub fn dtype(&self) -> DType {
                self.layout.dtype()
            }
            /// Row-major strides in elements.
            pub fn strides(&self) -> &[usize] {
                self.layout.strides()
            }
            pub fn numel(&self) -> usize {
                self.layout.numel()
            }
            pub fn size_bytes(&self) -> u64 {
                self.layout.size_bytes()
            }
            pub fn scope(&self) -> Scope {
                self.region().scope
            }
            pub fn address(&self) -> u64 {
                self.region().address
            }
            /// A read-only alias of these bytes with another shape and dtype at `byte_offset`.
            pub fn alias(
                &self,
                shape: impl Into<Shape>,
                dtype: DType,
                byte_offset: u64,
            ) -> Result<BufferView<'_>, AliasError> {
                let base = self.region();
                let layout = checked_alias_layout(base, byte_offset, shape.into(), dtype)?;
                Ok(BufferView {
                    backend: base.backend,
                    scope: base.scope,
                    address: base.address + byte_offset,
                    layout,
                })
            }
        }
        impl sealed::Sealed for $ty<'_> {}
    )*};
}
tensor_accessors!(Buffer, BufferView, BufferViewMut);

impl DeviceMemory for Buffer<'_> {
    fn region(&self) -> Region<'_> {
        let allocation = &self.allocation;
        Region::of(
            allocation.pool.backend(),
            allocation.scope,
            allocation.address,
            &self.layout,
        )
    }
}

impl DeviceMemory for BufferView<'_> {
    fn region(&self) -> Region<'_> {
        Region::of(self.backend, self.scope, self.address, &self.layout)
    }
}

impl DeviceMemory for BufferViewMut<'_> {
    fn region(&self) -> Region<'_> {
        Region::of(self.backend, self.scope, self.address, &self.layout)
    }
}

impl DeviceMemoryMut for Buffer<'_> {}
impl DeviceMemoryMut for BufferViewMut<'_> {}

impl<'pool> Buffer<'pool> {
    /// The alignment the buffer was allocated with (its address is a multiple of it).
    pub fn alignment(&self) -> Alignment {
        self.alignment
    }

    /// Returns the memory to the pool now. Consumes the buffer, so it cannot be used or
    /// freed again.
    pub fn free(self) {}

    /// A writable alias of these bytes with another shape and dtype at `byte_offset`. The
    /// buffer stays mutably borrowed while the alias lives.
    pub fn alias_mut(
        &mut self,
        shape: impl Into<Shape>,
        dtype: DType,
        byte_offset: u64,
    ) -> Result<BufferViewMut<'_>, AliasError> {
        let base = self.region();
        let layout = checked_alias_layout(base, byte_offset, shape.into(), dtype)?;
        let address = base.address + byte_offset;
        let scope = base.scope;
        Ok(BufferViewMut::new_unique(
            self.allocation.pool.backend(),
            scope,
            address,
            layout,
        ))
    }
}

/// A bounds-checked read-only view of `buffer` with `shape` and the same dtype.
pub fn buffer_alias<'b>(
    buffer: &'b Buffer<'_>,
    shape: impl Into<Shape>,
) -> Result<BufferView<'b>, AliasError> {
    buffer.alias(shape, buffer.dtype(), 0)
}

impl MemoryPool {
    /// Allocates `bytes` of untyped memory in `scope`, starting at a multiple of `alignment`.
    #[inline]
    pub fn allocate_bytes(
        &self,
        bytes: u64,
        scope: Scope,
        alignment: Alignment,
    ) -> Result<Allocation<'_>, AllocError> {
        let placement = self.allocate(scope, bytes, alignment)?;
        Ok(Allocation {
            pool: self,
            scope,
            block: placement.block,
            address: placement.address,
            bytes,
        })
    }

    /// Allocates a contiguous buffer of `shape` and `dtype` in `scope`. Its address is a
    /// multiple of `alignment` (and always of `PoolConfig::block_size`).
    #[inline]
    pub fn alloc_buffer(
        &self,
        shape: impl Into<Shape>,
        dtype: DType,
        scope: Scope,
        alignment: Alignment,
    ) -> Result<Buffer<'_>, AllocError> {
        let shape = shape.into();
        let Some(layout) = TensorLayout::contiguous(shape.clone(), dtype) else {
            return Err(AllocError::ShapeTooLarge { shape, dtype });
        };
        let allocation = self.allocate_bytes(layout.size_bytes(), scope, alignment)?;
        Ok(Buffer {
            allocation,
            layout,
            alignment,
        })
    }

    /// The documented recovery path for out-of-memory: tries each shape in order (largest
    /// first, e.g. halving a batch), moving on only when the previous one ran out of memory.
    /// Every attempt already released the pool's cache and retried once before failing.
    /// Returns the last out-of-memory error when no shape fits.
    pub fn alloc_buffer_with_fallback<S: Into<Shape>>(
        &self,
        shapes: impl IntoIterator<Item = S>,
        dtype: DType,
        scope: Scope,
        alignment: Alignment,
    ) -> Result<Buffer<'_>, AllocError> {
        let mut last_error = None;
        for shape in shapes {
            match self.alloc_buffer(shape, dtype, scope, alignment) {
                Err(error @ AllocError::OutOfMemory(_)) => last_error = Some(error),
                other => return other,
            }
        }
        Err(last_error.unwrap_or(AllocError::NoShapes))
    }
}
