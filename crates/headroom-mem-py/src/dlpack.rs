//! DLPack both ways, so NumPy, torch and CuPy share a buffer's memory without a copy, and
//! host copies read and write their arrays in place.
//!
//! The structs are those of `dlpack.h` v1.0 (github.com/dmlc/dlpack, include/dlpack/dlpack.h),
//! and the capsule protocol is the Python specification's
//! (dmlc.github.io/dlpack/latest/python_spec.html): `__dlpack__` returns a capsule named
//! `"dltensor"` holding a `DLManagedTensor*` (or, when the consumer passes
//! `max_version >= (1, 0)`, `"dltensor_versioned"` holding a `DLManagedTensorVersioned*`).
//! A consumer renames the capsule to `"used_dltensor"` (`"used_dltensor_versioned"`) and
//! calls the deleter when it lets go; a capsule never consumed calls it from its own
//! destructor.
//!
//! - Export (`Buffer.__dlpack__`): the tensor owns a [`View`], so the memory stays allocated
//!   until the deleter runs.
//! - Lending ([`lend_host`]): a host copy takes another producer's capsule without
//!   consuming it, reads the tensor for the length of one copy, and lets the capsule's
//!   destructor hand the memory back.
//!
//! No registry crate fits: dlpark 0.10 needs Rust 1.88 (the workspace builds with 1.85) and
//! its older releases target older PyO3.

use std::ffi::{c_void, CStr};

use headroom_mem::{Alignment, BackendKind, DType, Scope};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::IntoPyDict;
use pyo3::{ffi, PyErr};

use crate::buffer::View;
use crate::errors::{alloc_error, copy_error};
use crate::host::{self, Lent};

/// `DLDeviceType` values this package exports (CPU, CUDA) or reads on the host (CUDA host:
/// pinned memory).
const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;

/// The DLPack version written into versioned capsules.
const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write.
const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy for this export.
const FLAG_IS_COPIED: u64 = 1 << 1;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// The two managed-tensor layouts, for code shared between them.
trait Managed: Sized {
    /// The capsule name before a consumer takes it.
    const NAME: &'static CStr;
    fn new(dl_tensor: DLTensor, flags: u64) -> Self;
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
    fn tensor_mut(&mut self) -> &mut DLTensor;
}

impl Managed for DLManagedTensor {
    const NAME: &'static CStr = c"dltensor";
    fn new(dl_tensor: DLTensor, _flags: u64) -> Self {
        DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete::<DLManagedTensor>),
        }
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn tensor_mut(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
}

impl Managed for DLManagedTensorVersioned {
    const NAME: &'static CStr = c"dltensor_versioned";
    fn new(dl_tensor: DLTensor, flags: u64) -> Self {
        DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete::<DLManagedTensorVersioned>),
            flags,
            dl_tensor,
        }
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn tensor_mut(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
}

/// A managed tensor followed by what its pointers point into and what keeps the memory
/// alive. `managed` comes first, so a pointer to it is a pointer to the whole export.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _memory: View,
}

/// The deleter a consumer calls when done: frees the export and its hold on the memory.
unsafe extern "C" fn delete<M: Managed>(managed: *mut M) {
    if !managed.is_null() {
        // SAFETY: `managed` is the first field of a `#[repr(C)]` `Export<M>` made by
        // `Box::into_raw` in `capsule`, and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(managed.cast::<Export<M>>()) });
    }
}

/// The capsule's destructor: deletes the tensor unless a consumer took it (and renamed the
/// capsule), in which case the consumer calls the deleter.
unsafe extern "C" fn capsule_destructor<M: Managed>(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule; a valid name check sets no error.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()).cast::<M>();
            if let Some(deleter) = (*managed).deleter() {
                deleter(managed);
            }
        }
    }
}

fn data_type(dtype: DType) -> DLDataType {
    // DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
    let code = match dtype {
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
        DType::U8 => 1,
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::BF16 => 4,
        DType::Bool => 6,
    };
    DLDataType {
        code,
        bits: (dtype.size_of() * 8) as u8,
        lanes: 1,
    }
}

/// The dtype whose DLPack type is `data`, if any.
fn dtype_of(data: DLDataType) -> Option<DType> {
    use DType::*;
    [Bool, U8, I8, I16, I32, I64, F16, BF16, F32, F64]
        .into_iter()
        .find(|&dtype| data_type(dtype) == data)
}

/// `(device_type, device_id)` of the memory behind `view`, as `__dlpack_device__` returns.
pub fn device_of(view: &View) -> PyResult<(i32, i32)> {
    match view.backend_kind() {
        // Pinned memory is host memory that CUDA also reaches: CPU consumers read it.
        BackendKind::Host | BackendKind::PinnedHost => Ok((KDL_CPU, 0)),
        BackendKind::Cuda => Ok((KDL_CUDA, view.device_index() as i32)),
        BackendKind::Simulated => Err(PyBufferError::new_err(
            "a simulated device's buffers live at simulated addresses, which no DLPack consumer can read; \
             use to_host() to copy them out, or a \"host\" pool to share memory",
        )),
    }
}

fn capsule<'py, M: Managed>(
    py: Python<'py>,
    view: View,
    flags: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let (device_type, device_id) = device_of(&view)?;
    let shape: Vec<i64> = view.shape().dims().iter().map(|&d| d as i64).collect();
    let strides: Vec<i64> = view
        .shape()
        .contiguous_strides()
        .iter()
        .map(|&s| s as i64)
        .collect();
    let dl_tensor = DLTensor {
        data: view.address() as *mut c_void,
        device: DLDevice {
            device_type,
            device_id,
        },
        ndim: shape.len() as i32,
        dtype: data_type(view.dtype()),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let export = Box::into_raw(Box::new(Export {
        managed: M::new(dl_tensor, flags),
        shape,
        strides,
        _memory: view,
    }));
    // SAFETY: `export` was just boxed; the vectors' heap buffers do not move with the box.
    let managed = unsafe {
        let tensor = (*export).managed.tensor_mut();
        tensor.shape = (*export).shape.as_mut_ptr();
        tensor.strides = (*export).strides.as_mut_ptr();
        export.cast::<M>()
    };
    // SAFETY: the pointer stays valid until the deleter runs, which only the destructor or
    // the consumer calls.
    let capsule = unsafe {
        ffi::PyCapsule_New(
            managed.cast::<c_void>(),
            M::NAME.as_ptr(),
            Some(capsule_destructor::<M>),
        )
    };
    if capsule.is_null() {
        // SAFETY: no capsule took ownership, so the export is still ours to delete.
        unsafe { delete(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// `Buffer.__dlpack__`. `stream` is accepted and not waited on: every headroom-mem copy has
/// finished when it returns, so the memory is ready on any stream.
pub fn export<'py>(
    py: Python<'py>,
    view: View,
    scope: Scope,
    _stream: Option<Bound<'py, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let device = device_of(&view)?;
    if let Some(requested) = dl_device.filter(|&requested| requested != device) {
        return Err(PyBufferError::new_err(format!(
            "this buffer is on DLPack device {device:?} and cannot be exported to {requested:?}; \
             copy it to a pool on that device first"
        )));
    }
    let (view, flags) = if copy == Some(true) {
        let pool = view.pool().clone();
        let fresh = View::allocate(
            &pool,
            std::slice::from_ref(view.shape()),
            view.dtype(),
            scope,
            Alignment::DEFAULT,
        )
        .map_err(|error| alloc_error(py, &pool, error))?;
        fresh.copy_from(&view).map_err(copy_error)?;
        (fresh, FLAG_IS_COPIED)
    } else {
        (view, 0)
    };
    if max_version.is_some_and(|(major, _)| major >= 1) {
        capsule::<DLManagedTensorVersioned>(py, view, flags)
    } else {
        capsule::<DLManagedTensor>(py, view, flags)
    }
}

/// The host memory behind `source`'s DLPack export, lent for one copy, or `None` when
/// `source` has no `__dlpack__`. `writable` asks for memory the copy may write.
pub fn lend_host<'py>(source: &Bound<'py, PyAny>, writable: bool) -> PyResult<Option<Lent<'py>>> {
    let py = source.py();
    if !source.hasattr("__dlpack__")? {
        return Ok(None);
    }
    // A versioned capsule says whether the memory is read-only; producers older than
    // DLPack 1.0 take no max_version.
    let versioned = [("max_version", (1u32, 0u32))].into_py_dict(py)?;
    let capsule = match source.call_method("__dlpack__", (), Some(&versioned)) {
        Ok(capsule) => capsule,
        Err(error) if error.is_instance_of::<PyTypeError>(py) => {
            source.call_method0("__dlpack__")?
        }
        Err(error) => return Err(error),
    };
    let (tensor, read_only) = borrowed_tensor(&capsule)?;
    if !matches!(tensor.device.device_type, KDL_CPU | KDL_CUDA_HOST) {
        return Err(PyTypeError::new_err(format!(
            "that {} is in device memory (DLPack device type {}), not host memory; bring it to the host first (tensor.cpu(), cupy.asnumpy)",
            source.get_type().name()?,
            tensor.device.device_type
        )));
    }
    if writable && read_only {
        return Err(PyValueError::new_err(
            "the target is read-only; pass a writable array (numpy.empty_like, a copy)",
        ));
    }
    let shape = tensor_slice(tensor, tensor.shape);
    let element = tensor.dtype;
    if element.lanes != 1 || element.bits % 8 != 0 {
        return Err(PyValueError::new_err(format!(
            "the DLPack dtype (code {}, {} bits, {} lanes) is not whole bytes per element; headroom_mem copies plain dtypes",
            element.code, element.bits, element.lanes
        )));
    }
    if !tensor.strides.is_null() {
        let strides = tensor_slice(tensor, tensor.strides);
        let mut expected = 1i64;
        for (&extent, &stride) in shape.iter().zip(strides).rev() {
            if extent != 1 && stride != expected {
                return Err(host::not_contiguous());
            }
            expected *= extent;
        }
    }
    let dtype = match dtype_of(element) {
        Some(DType::U8) => None, // raw bytes fill any dtype
        Some(dtype) => Some(dtype),
        None => {
            return Err(PyValueError::new_err(format!(
                "the DLPack dtype (code {}, {} bits) has no headroom_mem dtype; pass raw bytes or a supported dtype",
                element.code, element.bits
            )))
        }
    };
    let len = shape
        .iter()
        .map(|&extent| extent as usize)
        .product::<usize>()
        * usize::from(element.bits / 8);
    // SAFETY: a DLPack producer's data stays valid, and writable unless flagged read-only,
    // until its deleter runs, which happens when `capsule` (kept by the loan) is destroyed.
    let data = unsafe { tensor.data.cast::<u8>().add(tensor.byte_offset as usize) };
    Ok(Some(unsafe {
        Lent::new(capsule.clone(), data, len, dtype, writable)
    }))
}

/// The tensor inside an unconsumed capsule, and whether it is marked read-only.
fn borrowed_tensor<'a>(capsule: &'a Bound<'_, PyAny>) -> PyResult<(&'a DLTensor, bool)> {
    let pointer = capsule.as_ptr();
    // SAFETY: `pointer` is a live object; a capsule valid under a name holds that name's
    // struct (the DLPack protocol), which lives while the capsule does.
    unsafe {
        if ffi::PyCapsule_IsValid(pointer, DLManagedTensorVersioned::NAME.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(pointer, DLManagedTensorVersioned::NAME.as_ptr())
                    .cast::<DLManagedTensorVersioned>();
            return Ok((
                &(*managed).dl_tensor,
                (*managed).flags & FLAG_READ_ONLY != 0,
            ));
        }
        if ffi::PyCapsule_IsValid(pointer, DLManagedTensor::NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(pointer, DLManagedTensor::NAME.as_ptr())
                .cast::<DLManagedTensor>();
            return Ok((&(*managed).dl_tensor, false));
        }
    }
    Err(PyTypeError::new_err(
        "__dlpack__ returned no unconsumed DLPack capsule",
    ))
}

/// `tensor`'s shape or strides (`values`): `ndim` values that live as long as it does.
fn tensor_slice(tensor: &DLTensor, values: *const i64) -> &[i64] {
    if tensor.ndim <= 0 || values.is_null() {
        return &[];
    }
    // SAFETY: DLPack's shape and strides hold `ndim` values while the tensor lives.
    unsafe { std::slice::from_raw_parts(values, tensor.ndim as usize) }
}
