//! Scratch memory reused across compute stages: one allocation up front, a bump pointer per
//! stage, and a reset when the stage ends, so a pipeline of kernels needs no further device
//! allocations. Views borrow their stage, so none survives the reset.

use std::cell::Cell;

use crate::buffer::{Allocation, BufferViewMut};
use crate::error::AllocError;
use crate::layout::{Alignment, DType, Scope, Shape, TensorLayout};
use crate::pool::MemoryPool;
use crate::trace::StageGuard;

/// A stage asked for more scratch than the workspace holds.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkspaceError {
    #[error("stage `{stage}` needs {needed} workspace bytes but the workspace holds {capacity}; create it with Workspace::new(.., capacity >= {needed})")]
    Exhausted {
        stage: String,
        needed: u64,
        capacity: u64,
    },
    #[error("shape {shape} of {dtype:?} is too large to address")]
    ShapeTooLarge { shape: Shape, dtype: DType },
}

/// A fixed scratch arena carved from one pool allocation.
#[derive(Debug)]
pub struct Workspace<'pool> {
    pool: &'pool MemoryPool,
    memory: Allocation<'pool>,
    peak_used: u64,
    stages_run: u64,
}

impl<'pool> Workspace<'pool> {
    /// Allocates `capacity` bytes of scratch in `scope`.
    pub fn new(pool: &'pool MemoryPool, scope: Scope, capacity: u64) -> Result<Self, AllocError> {
        let memory = pool.allocate_bytes(capacity, scope, Alignment::DEFAULT)?;
        Ok(Workspace {
            pool,
            memory,
            peak_used: 0,
            stages_run: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.memory.len()
    }

    /// Most bytes any stage used: the capacity the workspace really needs.
    pub fn peak_used(&self) -> u64 {
        self.peak_used
    }

    pub fn stages_run(&self) -> u64 {
        self.stages_run
    }

    /// Starts a stage: allocations start from the beginning of the workspace again, and the
    /// pool's trace is annotated with `name` until the stage is dropped.
    pub fn stage(&mut self, name: &str) -> Stage<'_, 'pool> {
        self.stages_run += 1;
        Stage {
            _annotation: self.pool.stage(name),
            name: name.to_string(),
            workspace: self,
            used: Cell::new(0),
        }
    }
}

/// One stage's use of a workspace; dropping it resets the workspace.
#[derive(Debug)]
pub struct Stage<'ws, 'pool> {
    workspace: &'ws mut Workspace<'pool>,
    name: String,
    used: Cell<u64>,
    /// Held for its drop, which ends the trace annotation.
    _annotation: StageGuard<'pool>,
}

impl Stage<'_, '_> {
    /// Carves a writable buffer of `shape` and `dtype`, starting at a multiple of
    /// `alignment`, from the workspace. No device allocation happens.
    pub fn alloc(
        &self,
        shape: impl Into<Shape>,
        dtype: DType,
        alignment: Alignment,
    ) -> Result<BufferViewMut<'_>, WorkspaceError> {
        let shape = shape.into();
        let Some(layout) = TensorLayout::contiguous(shape.clone(), dtype) else {
            return Err(WorkspaceError::ShapeTooLarge { shape, dtype });
        };
        let base = self.workspace.memory.address();
        let carved = carve(
            &self.name,
            base,
            self.used.get(),
            layout.size_bytes(),
            alignment,
            self.workspace.capacity(),
        )?;
        self.used.set(carved.end);
        let start = carved.start;
        let backend = self.workspace.pool.backend();
        // Each call hands out bytes after every earlier one, so views never overlap.
        Ok(BufferViewMut::new_unique(
            backend,
            self.workspace.memory.scope(),
            base + start,
            layout,
        ))
    }

    /// Bytes this stage has carved so far.
    pub fn used(&self) -> u64 {
        self.used.get()
    }
}

/// The bump rule of a stage: where its next buffer of `bytes` goes, after the `used` bytes
/// already carved from a workspace that starts at device address `base` and holds
/// `capacity` bytes, at a multiple of `alignment`. Returns the buffer's byte range as offsets
/// into the workspace; its end is the stage's new `used`.
pub fn carve(
    stage: &str,
    base: u64,
    used: u64,
    bytes: u64,
    alignment: Alignment,
    capacity: u64,
) -> Result<std::ops::Range<u64>, WorkspaceError> {
    let end = (base + used)
        .checked_next_multiple_of(alignment.bytes())
        .and_then(|start| start.checked_add(bytes))
        .map(|end| end - base)
        .unwrap_or(u64::MAX);
    if end > capacity {
        return Err(WorkspaceError::Exhausted {
            stage: stage.to_string(),
            needed: end,
            capacity,
        });
    }
    Ok(end - bytes..end)
}

impl Drop for Stage<'_, '_> {
    fn drop(&mut self) {
        self.workspace.peak_used = self.workspace.peak_used.max(self.used.get());
    }
}
