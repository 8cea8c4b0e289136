//! Buffers that Python owns. A Rust buffer borrows its pool; here each allocation is a
//! [`Storage`] that owns an `Arc` of the pool beside the buffer borrowing it (`self_cell`,
//! no lifetime transmutes), and every handle to the memory (the `Buffer`, its aliases,
//! DLPack consumers) holds an `Arc` of that storage.
//!
//! The rule for freeing: `MemoryPool.free(buf)` (or the end of `with pool.allocate(...)`)
//! makes that handle unusable at once, and the memory goes back to the pool when the last
//! handle lets go: an alias, or a NumPy array or torch tensor made with `from_dlpack`, keeps
//! it alive, so nothing ever reads memory the pool has handed to someone else.

use std::sync::Arc;

use headroom_mem::{
    copy_from_host, copy_to_host, BackendKind, BufferView, BufferViewMut, CopyError, DType, Scope,
    Shape,
};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyTuple};

use crate::dlpack;
use crate::dtype;
use crate::errors::{alias_error, copy_error};
use crate::host;

/// A buffer behind a lock: Python cannot prove exclusive access at compile time, so writes
/// take the lock that a Rust `&mut Buffer` stands for.
type LockedBuffer<'pool> = Mutex<headroom_mem::Buffer<'pool>>;

self_cell::self_cell!(
    /// One allocation and the pool it came from; the pool lives as long as the allocation.
    pub struct Storage {
        owner: Arc<headroom_mem::MemoryPool>,
        #[not_covariant]
        dependent: LockedBuffer,
    }
);

/// A typed window onto a storage: the whole allocation, or an alias of part of it. Views
/// are checked against the allocation when made, so their accesses cannot fail.
#[derive(Clone)]
pub struct View {
    storage: Arc<Storage>,
    offset: u64,
    shape: Shape,
    dtype: DType,
    address: u64,
}

/// Bytes of a contiguous `shape` of `dtype` (checked not to overflow when allocated).
fn byte_size(shape: &Shape, dtype: DType) -> u64 {
    shape.dims().iter().product::<usize>() as u64 * dtype.size_of() as u64
}

const CHECKED: &str = "a view's bounds are checked when it is made";

impl View {
    /// Allocates a new buffer of `dtype` in `scope` with the first of `shapes` that fits
    /// (headroom-mem's `alloc_buffer_with_fallback`; one shape is the plain case).
    pub fn allocate(
        pool: &Arc<headroom_mem::MemoryPool>,
        shapes: &[Shape],
        dtype: DType,
        scope: Scope,
        alignment: headroom_mem::Alignment,
    ) -> Result<View, headroom_mem::AllocError> {
        let storage = Storage::try_new(pool.clone(), |pool| {
            pool.alloc_buffer_with_fallback(shapes.iter().cloned(), dtype, scope, alignment)
                .map(Mutex::new)
        })?;
        let (address, shape) = storage.with_dependent(|_, buffer| {
            let buffer = buffer.lock();
            (buffer.address(), buffer.shape().clone())
        });
        Ok(View {
            storage: Arc::new(storage),
            offset: 0,
            shape,
            dtype,
            address,
        })
    }

    pub fn pool(&self) -> &Arc<headroom_mem::MemoryPool> {
        self.storage.borrow_owner()
    }

    pub fn address(&self) -> u64 {
        self.address
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn nbytes(&self) -> u64 {
        byte_size(&self.shape, self.dtype)
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.pool().backend().kind()
    }

    pub fn device_index(&self) -> u32 {
        self.pool().backend().device_index()
    }

    /// A view of `shape` and `dtype` at `byte_offset` into this one, bounds-checked by
    /// headroom-mem's alias.
    pub fn alias(
        &self,
        shape: Shape,
        dtype: DType,
        byte_offset: u64,
    ) -> Result<View, headroom_mem::AliasError> {
        self.with_view(false, |view| {
            view.alias(shape.clone(), dtype, byte_offset).map(drop)
        })?;
        Ok(View {
            storage: self.storage.clone(),
            offset: self.offset + byte_offset,
            shape,
            dtype,
            address: self.address + byte_offset,
        })
    }

    /// Runs `body` on a read-only view of these bytes, typed, or as `uint8` when `raw`.
    fn with_view<R>(&self, raw: bool, body: impl FnOnce(&BufferView<'_>) -> R) -> R {
        let (shape, dtype) = self.layout(raw);
        self.storage.with_dependent(|_, buffer| {
            let buffer = buffer.lock();
            body(&buffer.alias(shape, dtype, self.offset).expect(CHECKED))
        })
    }

    /// Runs `body` on a writable view of these bytes, typed, or as `uint8` when `raw`.
    fn with_view_mut<R>(&self, raw: bool, body: impl FnOnce(&mut BufferViewMut<'_>) -> R) -> R {
        let (shape, dtype) = self.layout(raw);
        self.storage.with_dependent(|_, buffer| {
            let mut buffer = buffer.lock();
            body(&mut buffer.alias_mut(shape, dtype, self.offset).expect(CHECKED))
        })
    }

    fn layout(&self, raw: bool) -> (Shape, DType) {
        if raw {
            (Shape::from([self.nbytes() as usize]), DType::U8)
        } else {
            (self.shape.clone(), self.dtype)
        }
    }

    /// Copies the bytes out.
    pub fn read(&self, into: &mut [u8]) -> Result<(), CopyError> {
        self.with_view(true, |view| copy_to_host(view, into))
    }

    /// Copies bytes in; `from` must have exactly [`View::nbytes`] bytes.
    pub fn write(&self, from: &[u8]) -> Result<(), CopyError> {
        self.with_view_mut(true, |view| copy_from_host(view, from))
    }

    /// Copies `src` into this view (same or different pools and devices).
    pub fn copy_from(&self, src: &View) -> Result<(), CopyError> {
        if Arc::ptr_eq(&self.storage, &src.storage) {
            // One lock guards both: stage the bytes through the host.
            if self.nbytes() != src.nbytes() {
                return Err(CopyError::LengthMismatch {
                    dst: self.nbytes(),
                    src: src.nbytes(),
                });
            }
            let overlap =
                self.offset < src.offset + src.nbytes() && src.offset < self.offset + self.nbytes();
            if overlap && self.nbytes() > 0 {
                return Err(CopyError::Overlap);
            }
            let mut staging = vec![0u8; src.nbytes() as usize];
            src.read(&mut staging)?;
            return self.write(&staging);
        }
        self.storage.with_dependent(|_, dst| {
            src.storage.with_dependent(|_, source| {
                // Lock in a fixed order, so two threads copying both ways cannot deadlock.
                let dst_first = Arc::as_ptr(&self.storage) < Arc::as_ptr(&src.storage);
                let (mut dst, source) = if dst_first {
                    let dst = dst.lock();
                    (dst, source.lock())
                } else {
                    let source = source.lock();
                    (dst.lock(), source)
                };
                let mut dst = dst
                    .alias_mut(self.shape.clone(), self.dtype, self.offset)
                    .expect(CHECKED);
                let source = source
                    .alias(src.shape.clone(), src.dtype, src.offset)
                    .expect(CHECKED);
                headroom_mem::copy(&mut dst, &source)
            })
        })
    }
}

/// A typed buffer from a `MemoryPool`, or an alias of one.
#[pyclass(frozen, module = "headroom_mem")]
pub struct Buffer {
    /// `None` once freed.
    view: Mutex<Option<View>>,
    shape: Shape,
    dtype: DType,
    scope: Scope,
    device: String,
}

impl Buffer {
    pub fn new(view: View, scope: Scope, device: String) -> Self {
        Buffer {
            shape: view.shape.clone(),
            dtype: view.dtype,
            view: Mutex::new(Some(view)),
            scope,
            device,
        }
    }

    /// The view, or the error every use of a freed buffer raises.
    pub fn live(&self) -> PyResult<View> {
        self.view.lock().clone().ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "this Buffer ({}) was freed (by MemoryPool.free, the end of its `with` block or the end of its workspace stage); allocate a new one",
                self.describe()
            ))
        })
    }

    /// Makes this handle unusable; the memory goes back when no other handle holds it.
    pub fn release(&self) {
        drop(self.view.lock().take());
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    pub fn device_name(&self) -> &str {
        &self.device
    }

    fn describe(&self) -> String {
        format!(
            "shape {}, {}, {} scope on {}",
            self.shape,
            dtype::name(self.dtype),
            self.scope,
            self.device
        )
    }
}

#[pymethods]
impl Buffer {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.dims())
    }

    /// The dtype's name, e.g. `"float32"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype::name(self.dtype)
    }

    #[getter]
    fn itemsize(&self) -> usize {
        self.dtype.size_of()
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        byte_size(&self.shape, self.dtype)
    }

    /// Row-major strides in elements, as DLPack and torch count them.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.contiguous_strides().as_slice())
    }

    /// The device address of the first element (a simulated address on a `sim:` device).
    #[getter]
    fn data_ptr(&self) -> PyResult<u64> {
        Ok(self.live()?.address())
    }

    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    #[getter(scope)]
    fn scope_name(&self) -> &'static str {
        self.scope.name()
    }

    /// Whether this handle was freed.
    #[getter]
    fn freed(&self) -> bool {
        self.view.lock().is_none()
    }

    fn __repr__(&self) -> String {
        let state = if self.freed() { ", freed" } else { "" };
        format!("Buffer({}{state})", self.describe())
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
        self.release();
    }

    /// Copies host data in: a NumPy array, torch CPU tensor or other DLPack producer in
    /// host memory (read in place, without the GIL), or `bytes` and other buffer-protocol
    /// objects; C-contiguous, with exactly `nbytes` bytes and this dtype (raw bytes fit any).
    fn copy_from_host(&self, py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<()> {
        let view = self.live()?;
        let source = host::readable(py, source)?;
        source.check_dtype(self.dtype)?;
        let bytes = source.bytes();
        py.detach(|| view.write(bytes)).map_err(copy_error)
    }

    /// A host copy. With `out` (a writable, C-contiguous NumPy array or torch CPU tensor of
    /// `nbytes` bytes and this dtype, or of bytes), written in place and returned; otherwise a
    /// new NumPy array of this shape and dtype when NumPy is installed and has the dtype,
    /// else `bytes`.
    #[pyo3(signature = (out=None))]
    fn to_host<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = self.live()?;
        if let Some(out) = out {
            let mut target = host::writable(out)?;
            target.check_dtype(self.dtype)?;
            let bytes = target.bytes_mut();
            py.detach(|| view.read(bytes)).map_err(copy_error)?;
            return Ok(out.clone());
        }
        let mut result = Ok(());
        let bytes = PyByteArray::new_with(py, view.nbytes() as usize, |into| {
            result = view.read(into);
            Ok(())
        })?;
        result.map_err(copy_error)?;
        let numpy = match py.import("numpy") {
            Ok(numpy) if self.dtype != DType::BF16 => numpy,
            _ => return Ok(PyBytes::new(py, &bytes.to_vec()).into_any()),
        };
        numpy
            .call_method1("frombuffer", (bytes, dtype::name(self.dtype)))?
            .call_method1("reshape", (self.shape(py)?,))
    }

    /// DLPack export: the consumer shares this memory and keeps it alive until it lets go.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = self.live()?;
        dlpack::export(py, view, self.scope, stream, max_version, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        dlpack::device_of(&self.live()?)
    }
}

/// `headroom_mem.copy(dst, src)`: copies between two buffers of equal byte size, on the
/// same or different pools and devices.
#[pyfunction]
pub fn copy(py: Python<'_>, dst: &Bound<'_, Buffer>, src: &Bound<'_, Buffer>) -> PyResult<()> {
    let (dst, src) = (dst.get().live()?, src.get().live()?);
    py.detach(|| dst.copy_from(&src)).map_err(copy_error)
}

/// An alias handle of `base` with `shape` and `dtype` at `byte_offset`.
pub fn alias(base: &Buffer, shape: Shape, dtype: DType, byte_offset: u64) -> PyResult<Buffer> {
    let view = base
        .live()?
        .alias(shape, dtype, byte_offset)
        .map_err(alias_error)?;
    Ok(Buffer::new(view, base.scope, base.device.clone()))
}
