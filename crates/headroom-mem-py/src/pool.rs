//! `headroom_mem.MemoryPool`: a caching pool on one device, with TileLang's names for
//! buffers (`alloc_buffer`, `allocate`, `free`, `alias`, `workspace`) and PyTorch's for
//! statistics (`memory_stats`, `reset_peak_memory_stats`, `empty_cache`, snapshots).

use std::collections::BTreeMap;
use std::sync::Arc;

use headroom_mem::{Alignment, DType, PoolConfig, Scope, Shape};
use headroom_size::parse_size;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer::{alias, Buffer, View};
use crate::device::{canonical_name, DeviceSpec};
use crate::dtype;
use crate::errors::{alloc_error, config_error, device_error};
use crate::workspace::{TraceStage, Workspace};

/// A caching allocator over one device.
#[pyclass(frozen, module = "headroom_mem")]
pub struct MemoryPool {
    pool: Arc<headroom_mem::MemoryPool>,
    device: String,
}

/// A size given as bytes (`1 << 20`) or as text (`"512M"`, `"2GiB"`).
fn size_argument(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(value) = value.filter(|value| !value.is_none()) else {
        return Ok(None);
    };
    if let Ok(bytes) = value.extract::<u64>() {
        return Ok(Some(bytes));
    }
    let text: String = value.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a number of bytes or a size such as \"512M\", not {}",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    parse_size(&text)
        .map(Some)
        .map_err(|error| PyValueError::new_err(format!("{name}: {error}")))
}

/// A scope by name: `"global"`, `"shared"` or `"local"`.
pub fn scope_argument(name: &str) -> PyResult<Scope> {
    Scope::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "scope {name:?} is not one of \"global\", \"shared\", \"local\""
        ))
    })
}

/// A shape: one int or a sequence of ints.
pub fn shape_argument(value: &Bound<'_, PyAny>) -> PyResult<Shape> {
    if let Ok(length) = value.extract::<usize>() {
        return Ok(Shape::from([length]));
    }
    value.extract::<Vec<usize>>().map(Shape::from).map_err(|_| {
        PyValueError::new_err(format!(
            "shape must be an int or a sequence of non-negative ints, not {}",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

pub fn alignment_argument(bytes: u64) -> PyResult<Alignment> {
    Alignment::new(bytes).ok_or_else(|| {
        PyValueError::new_err(format!(
            "alignment {bytes} is not a power of two; use e.g. 512 (the default) or 4096"
        ))
    })
}

impl MemoryPool {
    pub fn inner(&self) -> &Arc<headroom_mem::MemoryPool> {
        &self.pool
    }

    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// Allocates a buffer handle with the first of `shapes` that fits, raising
    /// `OutOfMemoryError` with the pool's figures when none does.
    pub fn new_buffer(
        &self,
        py: Python<'_>,
        shapes: &[Shape],
        dtype: DType,
        scope: Scope,
        alignment: Alignment,
    ) -> PyResult<Buffer> {
        let view = View::allocate(&self.pool, shapes, dtype, scope, alignment)
            .map_err(|error| alloc_error(py, &self.pool, error))?;
        Ok(Buffer::new(view, scope, self.device.clone()))
    }

    /// [`MemoryPool::new_buffer`] from Python's arguments: dtype, scope and alignment as
    /// `alloc_buffer` and its siblings take them.
    fn buffer_from_arguments(
        &self,
        py: Python<'_>,
        shapes: &[Shape],
        dtype: &Bound<'_, PyAny>,
        scope: &str,
        alignment: u64,
    ) -> PyResult<Buffer> {
        self.new_buffer(
            py,
            shapes,
            dtype::extract(dtype)?,
            scope_argument(scope)?,
            alignment_argument(alignment)?,
        )
    }
}

#[pymethods]
impl MemoryPool {
    /// `device`: "host", "sim:datacenter", "sim:global=SIZE[,shared=SIZE][,local=SIZE]",
    /// "cuda" or "cuda:N". Sizes are bytes or text such as "512M". `pytorch_defaults`
    /// takes PyTorch's settings (no oversize limit, cached segments kept on a miss).
    #[new]
    #[pyo3(signature = (device="host", *, max_size=None, memory_limit=None, caching=true, record_trace=false, pytorch_defaults=false))]
    fn new(
        device: &str,
        max_size: Option<&Bound<'_, PyAny>>,
        memory_limit: Option<&Bound<'_, PyAny>>,
        caching: bool,
        record_trace: bool,
        pytorch_defaults: bool,
    ) -> PyResult<Self> {
        let spec = DeviceSpec::parse(device).map_err(device_error)?;
        let memory_limit = size_argument("memory_limit", memory_limit)?;
        let backend = spec.open(device, memory_limit).map_err(device_error)?;
        let base = if pytorch_defaults {
            PoolConfig::pytorch()
        } else {
            PoolConfig::default()
        };
        let config = PoolConfig {
            max_size: size_argument("max_size", max_size)?,
            caching,
            record_trace,
            ..base
        };
        let device = canonical_name(device, backend.as_ref());
        let pool = headroom_mem::MemoryPool::with_config(backend, config).map_err(config_error)?;
        Ok(MemoryPool {
            pool: Arc::new(pool),
            device,
        })
    }

    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    fn __repr__(&self) -> String {
        format!("MemoryPool(device={:?})", self.device)
    }

    /// A buffer of `shape` and `dtype` in `scope`, at a multiple of `alignment` bytes. It
    /// is freed by `free`, at the end of a `with` block, or when the last handle goes.
    #[pyo3(signature = (shape, dtype, scope="global", *, alignment=512))]
    fn alloc_buffer(
        &self,
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        scope: &str,
        alignment: u64,
    ) -> PyResult<Buffer> {
        self.buffer_from_arguments(py, &[shape_argument(shape)?], dtype, scope, alignment)
    }

    /// The recovery path for out-of-memory: a buffer with the first of `shapes` that fits
    /// (largest first, e.g. halving a batch), trying the next only when the previous ran out
    /// of memory. Raises the last `OutOfMemoryError` when none fits.
    #[pyo3(signature = (shapes, dtype, scope="global", *, alignment=512))]
    fn alloc_buffer_with_fallback(
        &self,
        py: Python<'_>,
        shapes: Vec<Bound<'_, PyAny>>,
        dtype: &Bound<'_, PyAny>,
        scope: &str,
        alignment: u64,
    ) -> PyResult<Buffer> {
        let shapes: Vec<Shape> = shapes.iter().map(shape_argument).collect::<PyResult<_>>()?;
        self.buffer_from_arguments(py, &shapes, dtype, scope, alignment)
    }

    /// `alloc_buffer` for `with pool.allocate(shape, dtype) as buf:`, which frees at exit.
    #[pyo3(signature = (shape, dtype, scope="global", *, alignment=512))]
    fn allocate(
        &self,
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        scope: &str,
        alignment: u64,
    ) -> PyResult<Buffer> {
        self.alloc_buffer(py, shape, dtype, scope, alignment)
    }

    /// Makes `buffer` unusable now; its memory returns to the pool once no alias or DLPack
    /// consumer holds it.
    fn free(&self, buffer: &Bound<'_, Buffer>) {
        buffer.get().release();
    }

    /// A buffer sharing `buffer`'s memory with another `shape` (and `dtype`) at
    /// `offset` bytes; it keeps the memory alive like the buffer does.
    #[pyo3(signature = (buffer, shape, dtype=None, *, offset=0))]
    fn alias(
        &self,
        buffer: &Bound<'_, Buffer>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        offset: u64,
    ) -> PyResult<Buffer> {
        let base = buffer.get();
        let dtype = match dtype {
            Some(dtype) => dtype::extract(dtype)?,
            None => base.live()?.dtype(),
        };
        alias(base, shape_argument(shape)?, dtype, offset)
    }

    /// Scratch memory of `capacity` bytes whose stages carve buffers without allocating:
    /// `with pool.workspace(1 << 20) as ws:` then `with ws.stage("attn") as stage:`.
    #[pyo3(signature = (capacity, scope="global"))]
    fn workspace(
        slf: &Bound<'_, Self>,
        capacity: &Bound<'_, PyAny>,
        scope: &str,
    ) -> PyResult<Workspace> {
        let capacity = size_argument("capacity", Some(capacity))?.unwrap_or_default();
        Workspace::new(slf.get(), slf.py(), capacity, scope_argument(scope)?)
    }

    /// Marks recorded events with `name` inside `with pool.stage(name):` (with
    /// `record_trace=True`); memory_viz shows it as the events' frame.
    fn stage(&self, name: &str) -> TraceStage {
        TraceStage::enter(&self.pool, name)
    }

    /// PyTorch's `memory_stats()` keys and values for one tier.
    #[pyo3(signature = (scope="global"))]
    fn memory_stats(&self, scope: &str) -> PyResult<BTreeMap<String, u64>> {
        Ok(self.pool.memory_stats_for(scope_argument(scope)?).to_map())
    }

    /// Bytes allocated to live buffers (`memory_allocated()`).
    #[pyo3(signature = (scope="global"))]
    fn memory_allocated(&self, scope: &str) -> PyResult<u64> {
        let stats = self.pool.memory_stats_for(scope_argument(scope)?);
        Ok(stats.allocated_bytes.all.current)
    }

    /// Bytes reserved from the device (`memory_reserved()`).
    #[pyo3(signature = (scope="global"))]
    fn reserved_bytes(&self, scope: &str) -> PyResult<u64> {
        Ok(self.pool.reserved_bytes(scope_argument(scope)?))
    }

    /// `1 - largest free block / cached free bytes` of a tier: 0 when the cache is one block.
    #[pyo3(signature = (scope="global"))]
    fn fragmentation(&self, scope: &str) -> PyResult<f64> {
        Ok(self.pool.fragmentation(scope_argument(scope)?))
    }

    /// Sets every peak to its current value.
    fn reset_peak_memory_stats(&self) {
        self.pool.reset_peak();
    }

    /// Returns every wholly free cached segment to the device.
    fn empty_cache(&self) {
        self.pool.empty_cache();
    }

    /// The pool's segments and recorded events as `torch.cuda.memory._snapshot()` returns
    /// them; also written as a pickle to `path` when given, which
    /// `torch.cuda._memory_viz` and pytorch.org/memory_viz read.
    #[pyo3(signature = (path=None))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        path: Option<std::path::PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut pickle = Vec::new();
        self.pool
            .snapshot()
            .write_pickle(&mut pickle)
            .map_err(|error| PyValueError::new_err(error.to_string()))?;
        if let Some(path) = path {
            std::fs::write(&path, &pickle).map_err(|error| {
                PyOSError::new_err(format!(
                    "could not write the snapshot to {}: {error}",
                    path.display()
                ))
            })?;
        }
        py.import("pickle")?
            .call_method1("loads", (PyBytes::new(py, &pickle),))
    }
}
