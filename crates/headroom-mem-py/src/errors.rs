//! headroom-mem's typed errors as Python exceptions carrying the Rust message: an
//! out-of-memory error becomes `headroom_mem.OutOfMemoryError` (a `MemoryError`) with the
//! sizes as attributes and the pool's fragmentation in its message; mistakes in arguments
//! become `ValueError`; failures of the device become `RuntimeError`.

use headroom_mem::{AliasError, AllocError, BackendError, ConfigError, CopyError, MemoryPool};
use headroom_mem::{OutOfMemory, WorkspaceError};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

use crate::device::DeviceError;

pyo3::create_exception!(
    headroom_mem,
    OutOfMemoryError,
    PyMemoryError,
    "A pool could not allocate even after releasing its cache. Attributes: scope, requested, \
     rounded, device_free, device_capacity, reserved, allocated, largest_free_block, \
     fragmentation, max_size."
);

/// The error of an allocation from `pool`, which is asked for its fragmentation when the
/// allocation ran out of memory.
pub fn alloc_error(py: Python<'_>, pool: &MemoryPool, error: AllocError) -> PyErr {
    match error {
        AllocError::OutOfMemory(oom) => out_of_memory(py, &oom, pool.fragmentation(oom.scope)),
        AllocError::Backend(error) => backend_error(error),
        other @ (AllocError::ShapeTooLarge { .. }
        | AllocError::SizeOverflow { .. }
        | AllocError::NoShapes) => PyValueError::new_err(other.to_string()),
    }
}

fn out_of_memory(py: Python<'_>, oom: &OutOfMemory, fragmentation: f64) -> PyErr {
    let message = format!(
        "{oom} (fragmentation of the {} tier's cached free bytes: {fragmentation:.2}, \
         0 when they form one block)",
        oom.scope
    );
    let error = OutOfMemoryError::new_err(message);
    let value = error.value(py);
    let attributes = [
        ("requested", oom.requested.into_bound_py_any(py)),
        ("rounded", oom.rounded.into_bound_py_any(py)),
        ("device_free", oom.device_free.into_bound_py_any(py)),
        ("device_capacity", oom.device_capacity.into_bound_py_any(py)),
        ("reserved", oom.reserved.into_bound_py_any(py)),
        ("allocated", oom.allocated.into_bound_py_any(py)),
        (
            "largest_free_block",
            oom.largest_free_block.into_bound_py_any(py),
        ),
        ("fragmentation", fragmentation.into_bound_py_any(py)),
        ("max_size", oom.max_size.into_bound_py_any(py)),
        ("scope", oom.scope.name().into_bound_py_any(py)),
    ];
    for (name, attribute) in attributes {
        if let Err(failed) = attribute.and_then(|attribute| value.setattr(name, attribute)) {
            return failed;
        }
    }
    error
}

pub fn backend_error(error: BackendError) -> PyErr {
    match error {
        BackendError::UnsupportedScope { .. } => PyValueError::new_err(error.to_string()),
        _ => PyRuntimeError::new_err(error.to_string()),
    }
}

pub fn copy_error(error: CopyError) -> PyErr {
    match error {
        CopyError::Backend(error) => backend_error(error),
        CopyError::StreamStopped => PyRuntimeError::new_err(error.to_string()),
        _ => PyValueError::new_err(error.to_string()),
    }
}

pub fn device_error(error: DeviceError) -> PyErr {
    match error {
        #[cfg(feature = "cuda")]
        DeviceError::Unavailable { .. } => PyRuntimeError::new_err(error.to_string()),
        _ => PyValueError::new_err(error.to_string()),
    }
}

pub fn alias_error(error: AliasError) -> PyErr {
    PyValueError::new_err(error.to_string())
}

pub fn config_error(error: ConfigError) -> PyErr {
    PyValueError::new_err(error.to_string())
}

pub fn workspace_error(error: WorkspaceError) -> PyErr {
    PyValueError::new_err(error.to_string())
}
