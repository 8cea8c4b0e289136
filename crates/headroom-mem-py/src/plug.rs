//! The allocator PyTorch calls. `torch.cuda.memory.CUDAPluggableAllocator` loads
//! `headroom_mem_torch_alloc` and `headroom_mem_torch_free` from this extension's own shared
//! library; inside a `torch.cuda.MemPool` PyTorch's caching allocator asks them for its
//! segments, and when installed as the whole allocator, for every tensor.
//!
//! Each device's memory comes from a headroom-mem pool that Python configures first
//! (`headroom_mem.torch`). Under a MemPool the pool does not cache: PyTorch caches above
//! it, a freed segment goes back to the driver at once, and every allocation is a segment of
//! its own, which is what lets the memory of one tag (the tag current on the allocating
//! thread) be offloaded to pinned host memory and restored at the same addresses while
//! tensors keep pointing at it. As PyTorch's whole allocator the pool caches, because then
//! every tensor's allocation reaches it; offloading is refused there.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use headroom_mem::{
    offload, Alignment, Allocation, HostMemory, MemoryPool, OffloadError, Offloaded, PoolConfig,
    Scope,
};
use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::device::{cuda, DeviceSpec, TorchMemory};

/// One PyTorch segment (or tensor) handed out, and what became of it.
struct Segment {
    allocation: Allocation<'static>,
    tag: Option<Arc<str>>,
    /// Set while the contents wait in host memory.
    offloaded: Option<Offloaded<'static>>,
}

/// What one device serves PyTorch from.
struct DevicePlug {
    device: String,
    /// Whether the pool caches (PyTorch's whole allocator) or not (under a MemPool).
    caching: bool,
    pool: &'static MemoryPool,
    /// Host memory the CPU and the device both address: pinned for CUDA.
    staging: &'static MemoryPool,
    live: HashMap<u64, Segment>,
    /// The last allocation PyTorch asked for and did not get, as a message.
    last_failure: Option<String>,
}

/// Devices by the index PyTorch passes. Pools live as long as the process: PyTorch may
/// free a segment during interpreter shutdown.
static PLUGS: Mutex<BTreeMap<i32, DevicePlug>> = Mutex::new(BTreeMap::new());

thread_local! {
    static CURRENT_TAG: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// The backends behind a device string: the device's memory and its staging memory.
fn open(device: &str) -> PyResult<TorchMemory> {
    let spec =
        DeviceSpec::parse(device).map_err(|error| PyValueError::new_err(error.to_string()))?;
    match spec {
        DeviceSpec::Host => Ok(TorchMemory {
            device: Arc::new(HostMemory::new()),
            staging: Arc::new(HostMemory::new()),
        }),
        DeviceSpec::Cuda(ordinal) => cuda::open_for_torch(device, ordinal)
            .map_err(|error| PyRuntimeError::new_err(error.to_string())),
        DeviceSpec::Simulated(_) | DeviceSpec::Pinned(_) => Err(PyValueError::new_err(format!(
            "device {device:?} cannot serve PyTorch's CUDA tensors; give \"cuda:N\", or \"host\" to exercise the allocator functions without a GPU"
        ))),
    }
}

/// Serves PyTorch's requests for device index `index` from `device` ("cuda:N", or "host"
/// to exercise the functions without a GPU), from a caching pool (PyTorch's whole allocator)
/// or not (under a MemPool). Asking again for the same is a no-op; serving an index from
/// another device or mode is refused while it has live memory.
#[pyfunction]
pub fn plug_configure(index: i32, device: &str, caching: bool) -> PyResult<()> {
    let mut plugs = PLUGS.lock();
    if let Some(existing) = plugs.get(&index) {
        // Every MemPool of a device shares its plug, so asking for the same one again is
        // normal (one MemPool per tag) and keeps the live memory.
        if existing.device == device && existing.caching == caching {
            return Ok(());
        }
        if !existing.live.is_empty() {
            return Err(PyRuntimeError::new_err(format!(
                "device index {index} already serves PyTorch from {:?} ({}) with {} live allocations; free them (delete the MemPools and their tensors) before serving it from {device:?} ({})",
                existing.device,
                mode(existing.caching),
                existing.live.len(),
                mode(caching),
            )));
        }
    }
    let TorchMemory {
        device: memory,
        staging,
    } = open(device)?;
    let leak = |backend, config| -> PyResult<&'static MemoryPool> {
        let pool = MemoryPool::with_config(backend, config)
            .map_err(|error| PyValueError::new_err(error.to_string()))?;
        Ok(Box::leak(Box::new(pool)))
    };
    // As PyTorch's whole allocator, cache as PyTorch's own allocator does.
    let config = if caching {
        PoolConfig::pytorch()
    } else {
        PoolConfig::no_cache()
    };
    let plug = DevicePlug {
        device: device.to_string(),
        caching,
        pool: leak(memory, config)?,
        staging: leak(staging, PoolConfig::default())?,
        live: HashMap::new(),
        last_failure: None,
    };
    plugs.insert(index, plug);
    Ok(())
}

fn mode(caching: bool) -> &'static str {
    if caching {
        "whole allocator, caching"
    } else {
        "MemPool, not caching"
    }
}

/// Sets the tag that this thread's next allocations carry (`None` clears it) and returns
/// the previous one, so a context manager can put it back.
#[pyfunction]
#[pyo3(signature = (tag))]
pub fn plug_set_tag(tag: Option<&str>) -> Option<String> {
    CURRENT_TAG.with(|current| {
        current
            .replace(tag.map(Arc::from))
            .map(|previous| previous.to_string())
    })
}

fn with_plug<T>(index: i32, body: impl FnOnce(&mut DevicePlug) -> PyResult<T>) -> PyResult<T> {
    let mut plugs = PLUGS.lock();
    let plug = plugs.get_mut(&index).ok_or_else(|| {
        PyKeyError::new_err(format!(
            "device index {index} does not serve PyTorch yet; create headroom_mem.torch.MemPool(device=...) or call headroom_mem.torch.allocator(...) first"
        ))
    })?;
    body(plug)
}

/// Offloads every live allocation tagged `tag` to host memory; returns the bytes moved.
/// The tensors in them must not be used until [`plug_restore`].
#[pyfunction]
pub fn plug_offload(py: Python<'_>, index: i32, tag: &str) -> PyResult<u64> {
    py.detach(|| {
        with_plug(index, |plug| {
            if plug.caching {
                return Err(PyRuntimeError::new_err(
                    "offloading needs each allocation in a segment of its own, which PyTorch's whole allocator mode does not give; allocate the tag's tensors in a headroom_mem.torch.MemPool",
                ));
            }
            let mut moved = 0;
            for segment in plug.live.values_mut() {
                if segment.tag.as_deref() != Some(tag) || segment.offloaded.is_some() {
                    continue;
                }
                let (address, bytes) = (segment.allocation.address(), segment.allocation.len());
                // SAFETY: a no-cache pool gives every allocation its own reservation, and the
                // caller promises nothing uses the tag's tensors until they are restored.
                let offloaded =
                    unsafe { offload(plug.pool.backend(), Scope::Global, address, bytes, plug.staging) }
                        .map_err(|error| offload_error(tag, error))?;
                segment.offloaded = Some(offloaded);
                moved += bytes;
            }
            Ok(moved)
        })
    })
}

/// Brings every offloaded allocation tagged `tag` back to the device, at the same
/// addresses; returns the bytes moved.
#[pyfunction]
pub fn plug_restore(py: Python<'_>, index: i32, tag: &str) -> PyResult<u64> {
    py.detach(|| {
        with_plug(index, |plug| {
            let mut moved = 0;
            for segment in plug.live.values_mut() {
                if segment.tag.as_deref() != Some(tag) {
                    continue;
                }
                let Some(offloaded) = segment.offloaded.take() else {
                    continue;
                };
                let bytes = offloaded.bytes();
                if let Err((error, offloaded)) = offloaded.restore() {
                    segment.offloaded = Some(*offloaded);
                    return Err(offload_error(tag, error));
                }
                moved += bytes;
            }
            Ok(moved)
        })
    })
}

fn offload_error(tag: &str, error: OffloadError) -> PyErr {
    PyRuntimeError::new_err(format!("tag {tag:?}: {error}"))
}

/// The device pool's statistics in PyTorch's key names, plus `tags.<tag>.live_bytes` and
/// `tags.<tag>.offloaded_bytes` for each tag ("untagged" for the rest).
#[pyfunction]
pub fn plug_memory_stats(index: i32) -> PyResult<BTreeMap<String, u64>> {
    with_plug(index, |plug| {
        let mut stats = plug.pool.memory_stats().to_map();
        for segment in plug.live.values() {
            let tag = segment.tag.as_deref().unwrap_or("untagged");
            let state = match segment.offloaded {
                Some(_) => "offloaded_bytes",
                None => "live_bytes",
            };
            for key in ["live_bytes", "offloaded_bytes"] {
                stats.entry(format!("tags.{tag}.{key}")).or_insert(0);
            }
            *stats.entry(format!("tags.{tag}.{state}")).or_insert(0) += segment.allocation.len();
        }
        Ok(stats)
    })
}

/// Why the last request PyTorch made could not be served, if one could not.
#[pyfunction]
pub fn plug_last_failure(index: i32) -> PyResult<Option<String>> {
    with_plug(index, |plug| Ok(plug.last_failure.clone()))
}

/// Returns the pool's cached free segments to the device; returns the bytes released.
#[pyfunction]
pub fn plug_empty_cache(index: i32) -> PyResult<u64> {
    with_plug(index, |plug| {
        let before = plug.pool.reserved_bytes(Scope::Global);
        plug.pool.empty_cache();
        Ok(before - plug.pool.reserved_bytes(Scope::Global))
    })
}

fn allocate(index: i32, size: isize) -> Option<u64> {
    let bytes = u64::try_from(size).ok()?;
    let tag = CURRENT_TAG.with(|current| current.borrow().clone());
    let mut plugs = PLUGS.lock();
    let plug = plugs.get_mut(&index)?;
    match plug
        .pool
        .allocate_bytes(bytes.max(1), Scope::Global, Alignment::DEFAULT)
    {
        Ok(allocation) => {
            let address = allocation.address();
            let segment = Segment {
                allocation,
                tag,
                offloaded: None,
            };
            plug.live.insert(address, segment);
            Some(address)
        }
        Err(error) => {
            let fragmentation = plug.pool.fragmentation(Scope::Global);
            plug.last_failure = Some(format!("{error} (fragmentation {fragmentation:.2})"));
            None
        }
    }
}

/// PyTorch's `alloc_fn`: `void* alloc(ssize_t size, int device, cudaStream_t stream)`.
/// Returns null when the device has no room or was never configured; PyTorch then raises its
/// out-of-memory error, and `headroom_mem.torch.memory_stats()` says why.
#[no_mangle]
pub extern "C" fn headroom_mem_torch_alloc(
    size: isize,
    device: c_int,
    _stream: *mut c_void,
) -> *mut c_void {
    // A panic must not unwind into PyTorch's C++ frames.
    std::panic::catch_unwind(|| allocate(device, size))
        .ok()
        .flatten()
        .map_or(std::ptr::null_mut(), |address| address as *mut c_void)
}

/// PyTorch's `free_fn`: `void free(void* ptr, size_t size, int device, cudaStream_t stream)`.
/// An offloaded allocation is freed where it is: its host copy and its addresses go back.
#[no_mangle]
pub extern "C" fn headroom_mem_torch_free(
    pointer: *mut c_void,
    _size: usize,
    device: c_int,
    _stream: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        let segment = PLUGS
            .lock()
            .get_mut(&device)
            .and_then(|plug| plug.live.remove(&(pointer as u64)));
        drop(segment);
    });
}
