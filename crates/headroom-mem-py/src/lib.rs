//! The `headroom_mem._native` extension module: headroom-mem's pools, buffers, copies,
//! statistics and snapshots for Python (`import headroom_mem`, python/headroom_mem/).
//!
//! - `device.rs`: device strings to backends;
//! - `dtype.rs`: dtype names, NumPy and torch dtypes;
//! - `pool.rs`: `MemoryPool`;
//! - `buffer.rs`: `Buffer`, the owner design that keeps a pool alive under its buffers,
//!   `copy` and host copies;
//! - `dlpack.rs`: `__dlpack__` and `__dlpack_device__`;
//! - `workspace.rs`: workspaces, their stages and trace stages;
//! - `errors.rs`: Rust errors as Python exceptions.

mod buffer;
mod device;
mod dlpack;
mod dtype;
mod errors;
mod pool;
mod workspace;

use pyo3::prelude::*;

#[pymodule(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add_class::<pool::MemoryPool>()?;
    module.add_class::<buffer::Buffer>()?;
    module.add_class::<workspace::Workspace>()?;
    module.add_class::<workspace::Stage>()?;
    module.add_class::<workspace::TraceStage>()?;
    module.add_function(wrap_pyfunction!(buffer::copy, module)?)?;
    module.add(
        "OutOfMemoryError",
        py.get_type::<errors::OutOfMemoryError>(),
    )?;
    module.add("CUDA", cfg!(feature = "cuda"))?;
    Ok(())
}
