//! The `headroom_mem._native` extension module: headroom-mem's pools, buffers, copies,
//! statistics and snapshots for Python (`import headroom_mem`, python/headroom_mem/).
//!
//! - `device.rs`: device strings to backends;
//! - `dtype.rs`: dtype names, NumPy and torch dtypes;
//! - `pool.rs`: `MemoryPool`;
//! - `buffer.rs`: `Buffer`, the owner design that keeps a pool alive under its buffers,
//!   `copy` and host copies;
//! - `dlpack.rs`: `__dlpack__` and `__dlpack_device__`, and lending other producers' host
//!   memory to copies;
//! - `host.rs`: host objects (NumPy arrays, torch CPU tensors, bytes) as copy sources and
//!   targets;
//! - `workspace.rs`: workspaces, their stages and trace stages;
//! - `errors.rs`: Rust errors as Python exceptions;
//! - `plug.rs`: the C functions PyTorch's `CUDAPluggableAllocator` calls, and their
//!   configuration, tags, offloading and statistics (`headroom_mem.torch`).

mod buffer;
mod device;
mod dlpack;
mod dtype;
mod errors;
mod host;
mod plug;
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
    for function in [
        wrap_pyfunction!(plug::plug_configure, module)?,
        wrap_pyfunction!(plug::plug_set_tag, module)?,
        wrap_pyfunction!(plug::plug_offload, module)?,
        wrap_pyfunction!(plug::plug_restore, module)?,
        wrap_pyfunction!(plug::plug_memory_stats, module)?,
        wrap_pyfunction!(plug::plug_last_failure, module)?,
        wrap_pyfunction!(plug::plug_empty_cache, module)?,
    ] {
        module.add_function(function)?;
    }
    module.add(
        "OutOfMemoryError",
        py.get_type::<errors::OutOfMemoryError>(),
    )?;
    module.add("CUDA", cfg!(feature = "cuda"))?;
    Ok(())
}
