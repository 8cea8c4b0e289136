//! Offloading on the host backend: the contents survive the round trip at the same address,
//! and while offloaded the range no longer counts in the process's resident memory.

use std::sync::Arc;

use headroom_mem::*;

/// Resident bytes of this process (`/proc/self/statm`), or `None` off Linux.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn an_offloaded_range_leaves_resident_memory_and_comes_back_intact() {
    let Some(_) = resident_bytes() else {
        headroom_testkit::skip("statm", "no /proc/self/statm to read resident memory from");
        return;
    };
    let device: Arc<dyn Backend> = Arc::new(HostMemory::new());
    let staging = MemoryPool::new(Arc::new(HostMemory::new()));
    let bytes: u64 = 256 << 20;
    let address = device.reserve(Scope::Global, bytes, 4096).unwrap();
    let data: Vec<u8> = (0..bytes).map(|v| (v % 251) as u8).collect();
    // SAFETY: the range is ours and nobody else touches it.
    unsafe { device.write_from_host(address, &data).unwrap() };

    let before = resident_bytes().unwrap();
    // SAFETY: a whole reservation that nothing accesses until restored.
    let offloaded = unsafe { offload(&device, Scope::Global, address, bytes, &staging) }.unwrap();
    let during = resident_bytes().unwrap();
    // The copy added `bytes`; eviction gave the device range's pages back.
    assert!(
        during < before + bytes / 4,
        "resident memory grew from {before} to {during} bytes: the device range was not given back"
    );
    assert_eq!((offloaded.address(), offloaded.bytes()), (address, bytes));

    offloaded.restore().map_err(|(error, _)| error).unwrap();
    let mut read = vec![0u8; bytes as usize];
    // SAFETY: restored at the same address.
    unsafe { device.read_to_host(address, &mut read).unwrap() };
    assert!(read == data, "the contents came back changed");
    // SAFETY: our reservation, no longer used.
    unsafe { device.release(Scope::Global, address, bytes, 4096) };
}

#[test]
fn offloading_needs_host_accessible_staging_and_an_evictable_device() {
    let host: Arc<dyn Backend> = Arc::new(HostMemory::new());
    let simulated = Arc::new(SimulatedDevice::new(TierCapacities::DATACENTER_GPU));
    let simulated_pool = MemoryPool::new(simulated.clone());
    // SAFETY: nothing is reserved, and both calls fail before touching memory.
    let error = unsafe { offload(&host, Scope::Global, 0, 4096, &simulated_pool) }.unwrap_err();
    assert!(matches!(
        error,
        OffloadError::HostNotAccessible(BackendKind::Simulated)
    ));
    assert!(error.to_string().contains("simulated"), "{error}");

    let staging = MemoryPool::new(Arc::new(HostMemory::new()));
    let device: Arc<dyn Backend> = simulated;
    let address = device.reserve(Scope::Global, 4096, 512).unwrap();
    // SAFETY: a whole reservation nobody else touches.
    let error = unsafe { offload(&device, Scope::Global, address, 4096, &staging) }.unwrap_err();
    assert!(
        matches!(
            error,
            OffloadError::Backend(BackendError::EvictionUnsupported {
                backend: "simulated"
            })
        ),
        "{error}"
    );
    // SAFETY: our reservation, no longer used.
    unsafe { device.release(Scope::Global, address, 4096, 512) };
}
