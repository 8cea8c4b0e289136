//! Host memory that a Python object lends to one copy, so `copy_from_host` and
//! `to_host(out=...)` move bytes between a buffer and a NumPy array or torch CPU tensor
//! directly, with the GIL released, instead of through a temporary `bytes`.
//!
//! The stable ABI of CPython 3.9 has no buffer protocol, so the pointer comes from DLPack
//! (NumPy >= 1.22, torch, CuPy's host arrays) or from `bytes` itself; other buffer-protocol
//! objects (bytearray, array.array, older NumPy) are copied once through `memoryview.tobytes`.

use headroom_mem::DType;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer::Buffer;
use crate::dlpack;

/// Bytes some Python object lends: `owner` keeps them alive (a `bytes` object, or a DLPack
/// capsule whose destructor hands the memory back to its producer).
pub struct Lent<'py> {
    _owner: Bound<'py, PyAny>,
    data: *mut u8,
    len: usize,
    /// The elements' dtype; `None` for unsigned bytes, which fit any buffer.
    dtype: Option<DType>,
    writable: bool,
}

impl<'py> Lent<'py> {
    /// # Safety
    /// `data` must point to `len` bytes that stay valid while `owner` lives, writable
    /// when `writable` is set.
    pub unsafe fn new(
        owner: Bound<'py, PyAny>,
        data: *mut u8,
        len: usize,
        dtype: Option<DType>,
        writable: bool,
    ) -> Self {
        Lent {
            _owner: owner,
            data,
            len,
            dtype,
            writable,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `new`'s contract; the owner lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// The bytes to write into. Python code on other threads may touch them meanwhile,
    /// as with any NumPy operation that releases the GIL; that is the caller's race.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(self.writable, "only writable loans are written");
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `new`'s contract, and `writable` says the producer allows writes.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }

    /// Checks that the lent elements can fill (or be filled from) a buffer of `buffer`.
    pub fn check_dtype(&self, buffer: DType) -> PyResult<()> {
        match self.dtype {
            Some(host) if host != buffer => Err(crate::errors::copy_error(
                headroom_mem::CopyError::DTypeMismatch { host, buffer },
            )),
            _ => Ok(()),
        }
    }
}

/// The bytes of `source` to copy from: `bytes`, a DLPack producer in host memory, or any
/// other buffer-protocol object (copied once).
pub fn readable<'py>(py: Python<'py>, source: &Bound<'py, PyAny>) -> PyResult<Lent<'py>> {
    refuse_buffers(source)?;
    if let Ok(bytes) = source.cast::<PyBytes>() {
        return Ok(lend_bytes(bytes.clone()));
    }
    match dlpack::lend_host(source, false) {
        Ok(Some(lent)) => return Ok(lent),
        Ok(None) => {}
        // NumPy before 2.1 exports no read-only array through DLPack 0.x (BufferError); the
        // buffer protocol still reads it.
        Err(error) if error.is_instance_of::<PyBufferError>(py) => {}
        Err(error) => return Err(error),
    }
    let memory = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((source,))
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "cannot copy from {}: it supports neither the buffer protocol nor DLPack",
                type_name(source)
            ))
        })?;
    if !memory.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(not_contiguous());
    }
    let format: String = memory.getattr("format")?.extract()?;
    let itemsize: usize = memory.getattr("itemsize")?.extract()?;
    let dtype = format_dtype(&format, itemsize).ok_or_else(|| {
        PyValueError::new_err(format!(
            "the source's element format {format:?} ({itemsize} bytes) has no headroom_mem dtype; pass raw bytes or a supported dtype"
        ))
    })?;
    let bytes = memory.call_method0("tobytes")?.cast_into::<PyBytes>()?;
    Ok(Lent {
        dtype,
        ..lend_bytes(bytes)
    })
}

/// The memory of `target` to copy into: a writable DLPack producer in host memory.
pub fn writable<'py>(target: &Bound<'py, PyAny>) -> PyResult<Lent<'py>> {
    refuse_buffers(target)?;
    dlpack::lend_host(target, true)?.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "cannot copy into {}: out= takes a writable NumPy array or torch CPU tensor (anything with __dlpack__ in host memory)",
            type_name(target)
        ))
    })
}

pub fn not_contiguous() -> PyErr {
    PyValueError::new_err(
        "the host memory is not C-contiguous; pass a contiguous copy (numpy.ascontiguousarray, tensor.contiguous())",
    )
}

fn refuse_buffers(object: &Bound<'_, PyAny>) -> PyResult<()> {
    if object.cast::<Buffer>().is_ok() {
        return Err(PyTypeError::new_err(
            "that is a headroom_mem Buffer; use headroom_mem.copy(dst, src) between buffers",
        ));
    }
    Ok(())
}

fn lend_bytes(bytes: Bound<'_, PyBytes>) -> Lent<'_> {
    let data = bytes.as_bytes();
    let (pointer, len) = (data.as_ptr().cast_mut(), data.len());
    // SAFETY: a `bytes` object's contents are immutable and live as long as it does.
    unsafe { Lent::new(bytes.into_any(), pointer, len, None, false) }
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map(|name| name.to_string())
        .unwrap_or_else(|_| "that object".to_string())
}

/// The dtype of a buffer-protocol element format: `Some(None)` for raw bytes (`B`), which
/// fit any dtype; `None` when no dtype matches.
fn format_dtype(format: &str, itemsize: usize) -> Option<Option<DType>> {
    let code = format.trim_start_matches(['@', '=', '<', '>', '!']);
    let dtype = match (code, itemsize) {
        ("B", 1) => return Some(None),
        ("?", 1) => DType::Bool,
        ("b", 1) => DType::I8,
        ("h", 2) => DType::I16,
        ("i" | "l", 4) => DType::I32,
        ("l" | "q", 8) => DType::I64,
        ("e", 2) => DType::F16,
        ("f", 4) => DType::F32,
        ("d", 8) => DType::F64,
        _ => return None,
    };
    Some(Some(dtype))
}
