//! Workspaces and trace stages as context managers.
//!
//! headroom-mem's `Workspace` hands out views that borrow a stage that borrows the
//! workspace, which Python cannot hold across calls. Here a workspace is one pool buffer,
//! and a stage carves aliases of it with headroom-mem's bump rule (`workspace::carve`);
//! when the stage ends its buffers become unusable, as the Rust borrows make them, and the
//! next stage starts from the beginning again.

use std::sync::Arc;

use headroom_mem::workspace::carve;
use headroom_mem::{Alignment, DType, Scope, Shape, StageGuard, WorkspaceError};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::buffer::Buffer;
use crate::dtype;
use crate::errors::{alias_error, workspace_error};
use crate::pool::{alignment_argument, shape_argument, MemoryPool};

self_cell::self_cell!(
    /// A trace annotation and the pool whose recorder it marks.
    struct OwnedStageGuard {
        owner: Arc<headroom_mem::MemoryPool>,
        #[covariant]
        dependent: StageGuard,
    }
);

/// `with pool.stage("forward"):` marks the events recorded inside with the stage's name.
#[pyclass(frozen, module = "headroom_mem")]
pub struct TraceStage {
    guard: Mutex<Option<OwnedStageGuard>>,
}

impl TraceStage {
    pub fn enter(pool: &Arc<headroom_mem::MemoryPool>, name: &str) -> Self {
        TraceStage {
            guard: Mutex::new(Some(OwnedStageGuard::new(pool.clone(), |pool| {
                pool.stage(name)
            }))),
        }
    }
}

#[pymethods]
impl TraceStage {
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) {
        drop(self.guard.lock().take());
    }
}

#[derive(Default)]
struct WorkspaceState {
    peak_used: u64,
    stages_run: u64,
    /// The stage now running, if any: one at a time, as `&mut Workspace` allows in Rust.
    open_stage: Option<String>,
}

/// Scratch memory reused by stage after stage without further allocations.
#[pyclass(frozen, module = "headroom_mem")]
pub struct Workspace {
    memory: Buffer,
    capacity: u64,
    state: Mutex<WorkspaceState>,
}

impl Workspace {
    pub fn new(pool: &MemoryPool, py: Python<'_>, capacity: u64, scope: Scope) -> PyResult<Self> {
        let length = usize::try_from(capacity).unwrap_or(usize::MAX);
        let memory = pool.new_buffer(
            py,
            &[Shape::from([length])],
            DType::U8,
            scope,
            Alignment::DEFAULT,
        )?;
        Ok(Workspace {
            memory,
            capacity,
            state: Mutex::new(WorkspaceState::default()),
        })
    }
}

#[pymethods]
impl Workspace {
    #[getter]
    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Most bytes any finished stage used: the capacity the workspace really needs.
    #[getter]
    fn peak_used(&self) -> u64 {
        self.state.lock().peak_used
    }

    #[getter]
    fn stages_run(&self) -> u64 {
        self.state.lock().stages_run
    }

    /// Starts a stage named `name` (also the trace annotation while it runs).
    fn stage(slf: &Bound<'_, Self>, name: &str) -> PyResult<Stage> {
        let workspace = slf.get();
        let pool = workspace.memory.live()?.pool().clone();
        let mut state = workspace.state.lock();
        if let Some(open) = &state.open_stage {
            return Err(PyRuntimeError::new_err(format!(
                "workspace stage {open:?} is still running; end it (leave its `with` block) before starting {name:?}: a workspace runs one stage at a time"
            )));
        }
        state.open_stage = Some(name.to_string());
        state.stages_run += 1;
        Ok(Stage {
            workspace: slf.clone().unbind(),
            name: name.to_string(),
            state: Mutex::new(Some(StageState {
                used: 0,
                buffers: Vec::new(),
                _annotation: OwnedStageGuard::new(pool, |pool| pool.stage(name)),
            })),
        })
    }

    /// Frees the workspace's memory (once the buffers of a running stage are gone too).
    fn free(&self) {
        self.memory.release();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) {
        self.free();
    }
}

struct StageState {
    used: u64,
    buffers: Vec<Py<Buffer>>,
    /// Held for its drop, which ends the trace annotation.
    _annotation: OwnedStageGuard,
}

/// One stage of a workspace; its buffers become unusable when it ends.
#[pyclass(frozen, module = "headroom_mem")]
pub struct Stage {
    workspace: Py<Workspace>,
    name: String,
    /// `None` once ended.
    state: Mutex<Option<StageState>>,
}

impl Stage {
    fn end(&self) {
        let Some(state) = self.state.lock().take() else {
            return;
        };
        for buffer in &state.buffers {
            buffer.get().release();
        }
        let mut workspace = self.workspace.get().state.lock();
        workspace.peak_used = workspace.peak_used.max(state.used);
        workspace.open_stage = None;
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.end();
    }
}

#[pymethods]
impl Stage {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Bytes this stage has carved so far.
    #[getter]
    fn used(&self) -> u64 {
        self.state.lock().as_ref().map_or(0, |state| state.used)
    }

    /// A buffer of `shape` and `dtype` carved from the workspace at a multiple of
    /// `alignment`; no device allocation happens.
    #[pyo3(signature = (shape, dtype, *, alignment=512))]
    fn alloc(
        &self,
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        alignment: u64,
    ) -> PyResult<Py<Buffer>> {
        let (shape, dtype) = (shape_argument(shape)?, dtype::extract(dtype)?);
        let alignment = alignment_argument(alignment)?;
        let mut guard = self.state.lock();
        let state = guard.as_mut().ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "workspace stage {:?} has ended; start a new stage to carve buffers",
                self.name
            ))
        })?;
        let workspace = self.workspace.get();
        let memory = workspace.memory.live()?;
        let Some(bytes) = shape
            .checked_numel()
            .and_then(|numel| numel.checked_mul(dtype.size_of()))
        else {
            return Err(workspace_error(WorkspaceError::ShapeTooLarge {
                shape,
                dtype,
            }));
        };
        let carved = carve(
            &self.name,
            memory.address(),
            state.used,
            bytes as u64,
            alignment,
            workspace.capacity,
        )
        .map_err(workspace_error)?;
        let view = memory
            .alias(shape, dtype, carved.start)
            .map_err(alias_error)?;
        state.used = carved.end;
        let buffer = Py::new(
            py,
            Buffer::new(
                view,
                workspace.memory.scope(),
                workspace.memory.device_name().to_string(),
            ),
        )?;
        state.buffers.push(buffer.clone_ref(py));
        Ok(buffer)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) {
        self.end();
    }
}
