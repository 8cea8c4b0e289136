//! Offloading on the host backend: the contents survive the round trip at the same address,
//! and while offloaded the range's pages are no longer resident.
//!
//! Residency is read per page of the range (`mincore`), not from the process's resident
//! memory, which the other tests of this binary move while they run beside this one.

use std::sync::Arc;

use headroom_mem::*;

/// How many of the pages of `[address, address + bytes)` (page-aligned) are resident, and
/// how many pages the range has.
fn resident_pages(address: u64, bytes: u64) -> (usize, usize) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    assert_eq!(address % page, 0, "the range starts on a page");
    let mut residency = vec![0u8; bytes.div_ceil(page) as usize];
    // SAFETY: the range is mapped (a live reservation), and `residency` has a byte per page.
    let status = unsafe {
        libc::mincore(
            address as *mut libc::c_void,
            bytes as usize,
            residency.as_mut_ptr().cast(),
        )
    };
    assert_eq!(status, 0, "mincore: {}", std::io::Error::last_os_error());
    let resident = residency.iter().filter(|&&page| page & 1 == 1).count();
    (resident, residency.len())
}

#[test]
fn an_offloaded_range_leaves_resident_memory_and_comes_back_intact() {
    let device: Arc<dyn Backend> = Arc::new(HostMemory::new());
    let staging = MemoryPool::new(Arc::new(HostMemory::new()));
    let bytes: u64 = 256 << 20;
    let address = device.reserve(Scope::Global, bytes, 4096).unwrap();
    let data: Vec<u8> = (0..bytes).map(|v| (v % 251) as u8).collect();
    // SAFETY: the range is ours and nobody else touches it.
    unsafe { device.write_from_host(address, &data).unwrap() };

    let (before, pages) = resident_pages(address, bytes);
    assert!(
        before > pages / 2,
        "only {before} of {pages} written pages are resident before offloading"
    );
    // SAFETY: a whole reservation that nothing accesses until restored.
    let offloaded = unsafe { offload(&device, Scope::Global, address, bytes, &staging) }.unwrap();
    let (during, _) = resident_pages(address, bytes);
    assert_eq!(
        during, 0,
        "{during} of the device range's {pages} pages are still resident: it was not given back"
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
